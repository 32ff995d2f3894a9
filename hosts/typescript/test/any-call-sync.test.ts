// `withPolicy` given a synchronous function: its value is the attempt's, what
// it throws at once is its failure (mapped as an async one's), and a value that
// is not a function is a TypeError naming what was given.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { ObservedFailure } from '../src/errors.js';
import { FakeClock } from '../src/testing.js';

let runs = 0;
async function newRun(): Promise<Run> {
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy({ tools: { read_config: { effect: 'read' } } }).startRun(`RUN-SYNC-${runs}`);
}

const unavailable = new ObservedFailure({
  kind: { tag: 'http-status', val: 503 }, headers: '', body: 'upstream unavailable', structuredContent: undefined, sessionIdSent: false, delivery: 'answer-started',
});

test('a synchronous function: its value is returned', async () => {
  const value = await withPolicy(await newRun(), 'read_config', ({ number }) => ({ attempt: number }), { clock: new FakeClock() });
  assert.deepEqual(value, { attempt: 1 });
});

test('a synchronous function that throws a failure is retried as an async one is', async () => {
  const lines: Array<Record<string, unknown>> = [];
  const value = await withPolicy(await newRun(), 'read_config', ({ number }) => {
    if (number === 1) throw unavailable;
    return 'config';
  }, { clock: new FakeClock(), log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) });
  assert.equal(value, 'config');
  assert.deepEqual(lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => [l.attempt, l.outcome, l.action]),
    [[1, 'http 503', 'retry'], [2, 'success', 'succeed']]);
});

test('a synchronous function that returns a Response that is not ok is a failure', async () => {
  let sent = 0;
  const value = await withPolicy(await newRun(), 'read_config', () => {
    sent += 1;
    return sent === 1 ? new Response('busy', { status: 503 }) : 'config';
  }, { clock: new FakeClock() });
  assert.equal(value, 'config');
  assert.equal(sent, 2);
});

test('an error of a synchronous function that no mapping knows is thrown unchanged, once', async () => {
  const bug = new RangeError('a bug in the caller');
  let sent = 0;
  await assert.rejects(withPolicy(await newRun(), 'read_config', () => {
    sent += 1;
    throw bug;
  }, { clock: new FakeClock() }), (e: unknown) => e === bug);
  assert.equal(sent, 1);
});

test('a value that is not a function is a TypeError naming what was given', async () => {
  const run = await newRun();
  await assert.rejects(withPolicy(run, 'read_config', 'config' as unknown as () => string),
    (e: unknown) => e instanceof TypeError && /fn must be a function of the attempt, not string/.test(e.message));
});
