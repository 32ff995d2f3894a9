// The embedded account budget keeps its buckets on the process's own monotonic
// clock (issue 11's and issue 24's clock rows): one worker passing a clock in µs,
// a clock in the past, 0, or a clock an hour off cannot move the account's state
// for every worker of the process.
// The same cases as the Rust host's
// `a_bad_clock_cannot_poison_the_account_for_every_worker` (hosts/rust/src/accounts/mod.rs).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { EmbeddedAccounts, MAX_CLOCK_SKEW_MS, type AccountClockEvent } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { toJsonSafe } from '../src/json.js';

const processNowMs = (): bigint => BigInt(Date.now());
const DAY_MS = 24n * 3_600_000n;
const bucket = { capacity: 2, refillIntervalMs: 1_000n };
const show = (value: unknown) => JSON.stringify(toJsonSafe(value));

const BAD_CLOCKS: Array<[string, () => bigint]> = [
  ['in µs', () => processNowMs() * 1_000n],
  ['400 days in the past', () => processNowMs() - 400n * DAY_MS],
  ['0', () => 0n],
];

for (const [name, badClock] of BAD_CLOCKS) {
  test(`a clock ${name} cannot poison the account for every worker`, () => {
    const accounts = new EmbeddedAccounts({ log: () => {} });
    const bad = badClock();
    assert.deepEqual(accounts.reserve('acct', 1, bucket, 0n, bad), { granted: true, waitMs: 0n }, "a bad clock is served in the process's time");
    // The good workers see one token taken, as they should, and nothing else.
    // (Each reads the clock afresh: the bad call was served at the time it ran,
    // and an earlier reading is 1 ms short when the millisecond turns.)
    assert.deepEqual(accounts.reserve('acct', 1, bucket, 0n, processNowMs()), { granted: true, waitMs: 0n });
    const third = accounts.reserve('acct', 1, bucket, 0n, processNowMs());
    assert.ok(!third.granted && third.waitMs <= 1_000n, `room within one interval, got ${show(third)}`);
    // A refund with a bad clock cannot overfill or empty it either.
    accounts.refund('acct', 1, bucket, bad);
    assert.deepEqual(accounts.reserve('acct', 1, bucket, 0n, processNowMs()), { granted: true, waitMs: 0n });
  });
}

test('through the component: a worker passing µs does not make every worker of the account escalate', async () => {
  const component = await PolicyComponent.load();
  const accounts = new EmbeddedAccounts({ log: () => {} });
  const config = { 'account-budget': { 'account-id': 'acme', capacity: 2, 'refill-interval-ms': 1_000, 'max-wait-ms': 5_000 } };
  const worker = async (seed: bigint) => (await component.instantiate({ accounts, entropy: new SplitMix64(seed) })).loadPolicy(config);
  const [micro, good] = [await worker(1n), await worker(2n)];
  const a = micro.startRun('micro').beginCall(undefined, 'lookup', undefined, undefined, processNowMs() * 1_000n);
  assert.ok(a.admitted, show(a));
  for (let i = 0; i < 2; i++) {
    const b = good.startRun(`good-${i}`).beginCall(undefined, 'lookup', undefined, undefined, processNowMs());
    assert.ok(b.admitted, `the good workers' calls are admitted, got ${show(b)}`);
    assert.ok(b.delayMs <= 1_000n, `within one interval, got ${show(b)}`);
  }
});

test('onHostClock trusts the callers: one µs clock poisons it for every worker (why the default does not trust)', () => {
  const trusting = EmbeddedAccounts.onHostClock();
  assert.equal(trusting.trustsHostClock, true);
  assert.equal(new EmbeddedAccounts().trustsHostClock, false);
  trusting.reserve('acct', 2, bucket, 0n, processNowMs() * 1_000n);
  const next = trusting.reserve('acct', 1, bucket, 0n, processNowMs());
  assert.ok(!next.granted && next.waitMs > 1_000_000_000n, `poisoned: room in ${show(next.waitMs)} ms`);
  // Its simulated time is whatever the callers agree on, e.g. 0 (the vectors, the lab).
  const simulated = EmbeddedAccounts.onHostClock();
  assert.deepEqual([simulated.reserve('s', 2, bucket, 0n, 0n), simulated.reserve('s', 1, bucket, 0n, 0n)],
    [{ granted: true, waitMs: 0n }, { granted: false, waitMs: 1_000n }]);
  assert.deepEqual(simulated.reserve('s', 1, bucket, 0n, 1_000n), { granted: true, waitMs: 0n });
});

// Issue 24, row 7: one worker's clock an hour ahead once refused every worker of
// the process for the hour ("resets in 3,600,050 ms") and overran the limit
// itself. The same cases as the Rust host's
// `a_clock_an_hour_off_neither_locks_the_account_nor_widens_it`.
const HOUR_MS = 3_600_000n;
const wide = { capacity: 40, refillIntervalMs: 60_000n };
const takeAll = (accounts: EmbeddedAccounts, clock: () => bigint) =>
  Array.from({ length: 100 }, () => accounts.reserve('acct', 1, wide, 0n, clock())).filter((r) => r.granted).length;

for (const [name, skewed] of [['an hour ahead', () => processNowMs() + HOUR_MS], ['an hour behind', () => processNowMs() - HOUR_MS]] as const) {
  test(`a clock ${name} neither locks the account for the others nor widens it`, () => {
    const first = new EmbeddedAccounts({ log: () => {} });
    assert.equal(takeAll(first, skewed), 40, 'the skewed worker takes the burst');
    const after = first.reserve('acct', 1, wide, 0n, processNowMs());
    assert.ok(!after.granted && after.waitMs <= wide.refillIntervalMs, `room in one interval, not an hour: ${show(after)}`);
    const second = new EmbeddedAccounts({ log: () => {} });
    assert.equal(takeAll(second, processNowMs), 40);
    assert.equal(takeAll(second, skewed), 0, 'the skewed worker finds the bucket as the others left it (40 in the window, not 80)');
  });
}

test("a step back of the process's wall clock moves nothing: the buckets keep the monotonic clock", () => {
  assert.equal(MAX_CLOCK_SKEW_MS, 5_000n);
  const accounts = new EmbeddedAccounts({ log: () => {} });
  const before = Array.from({ length: 20 }, () => accounts.reserve('acct', 1, wide, 0n, processNowMs())).filter((r) => r.granted).length;
  const steppedBack = () => processNowMs() - HOUR_MS;
  assert.deepEqual([before, takeAll(accounts, steppedBack)], [20, 20], 'the burst is 40 across the step');
  const next = accounts.reserve('acct', 1, wide, 0n, steppedBack());
  assert.ok(!next.granted && next.waitMs <= wide.refillIntervalMs, show(next));
});

test('a clock that is not believed is warned about once per backend, through the log option or console.warn', (t) => {
  const events: AccountClockEvent[] = [];
  const accounts = new EmbeddedAccounts({ log: (e) => events.push(e) });
  const micro = processNowMs() * 1_000n;
  for (let i = 0; i < 3; i++) accounts.reserve('acct', 1, bucket, 60_000n, micro);
  accounts.refund('acct', 1, bucket, 0n);
  assert.equal(events.length, 1, 'said once');
  assert.equal(events[0].event, 'agent_retry.account_clock');
  assert.equal(events[0].level, 'warning');
  assert.equal(events[0].host_now_ms, Number(micro));
  assert.ok(Math.abs(events[0].process_now_ms - Date.now()) < 60_000);
  assert.match(events[0].message, /skewed or stepped clock\? µs instead of ms\?.*process's clock; said once/);
  // A logger that throws does not fail the reservation.
  const throwing = new EmbeddedAccounts({ log: () => { throw new Error('logger down'); } });
  assert.deepEqual(throwing.reserve('acct', 1, bucket, 0n, 0n), { granted: true, waitMs: 0n });
  // The default: one JSON line through console.warn, once.
  const warn = t.mock.method(console, 'warn', () => {});
  const quiet = new EmbeddedAccounts();
  quiet.reserve('acct', 1, bucket, 0n, 0n);
  quiet.reserve('acct', 1, bucket, 0n, 0n);
  assert.equal(warn.mock.callCount(), 1);
  const line = JSON.parse(String(warn.mock.calls[0].arguments[0])) as AccountClockEvent;
  assert.equal(line.event, 'agent_retry.account_clock');
  assert.equal(line.host_now_ms, 0);
  // An onHostClock backend never warns: it believes every time.
  EmbeddedAccounts.onHostClock().reserve('acct', 1, bucket, 0n, 0n);
  assert.equal(warn.mock.callCount(), 1);
});
