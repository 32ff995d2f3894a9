// The embedded account budget keeps its buckets in the process's own time
// (issue 11, the clock row): one worker passing a clock in µs, a clock in the
// past or 0 cannot move the account's state for every worker of the process.
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
  const a = micro.startRun('micro').beginCall('lookup', undefined, undefined, processNowMs() * 1_000n);
  assert.ok(a.admitted, show(a));
  for (let i = 0; i < 2; i++) {
    const b = good.startRun(`good-${i}`).beginCall('lookup', undefined, undefined, processNowMs());
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

test('a clock within MAX_CLOCK_SKEW_MS (24 h) is believed; one just beyond is not', () => {
  assert.equal(MAX_CLOCK_SKEW_MS, 86_400_000n);
  const events: AccountClockEvent[] = [];
  const near = new EmbeddedAccounts({ log: (e) => events.push(e) });
  // Two tokens taken 23 h ahead (a sped-up clock, a skewed host): the caller's time is used,
  // so at the process's time the bucket is empty for 23 h.
  near.reserve('acct', 2, bucket, 0n, processNowMs() + 23n * 3_600_000n);
  const after = near.reserve('acct', 1, bucket, 0n, processNowMs());
  assert.ok(!after.granted && after.waitMs > 22n * 3_600_000n, show(after));
  assert.equal(events.length, 0, 'nothing to warn about');
  const far = new EmbeddedAccounts({ log: (e) => events.push(e) });
  far.reserve('acct', 2, bucket, 0n, processNowMs() + MAX_CLOCK_SKEW_MS + 60_000n);
  const now = far.reserve('acct', 1, bucket, 0n, processNowMs());
  assert.ok(!now.granted && now.waitMs <= 1_000n, `taken in the process's time: ${show(now)}`);
  assert.equal(events.length, 1);
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
  assert.match(events[0].message, /µs instead of ms\? a clock in the past\?.*process's clock; said once/);
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
