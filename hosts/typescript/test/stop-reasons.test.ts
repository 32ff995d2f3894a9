// The reason of a stop line (docs/events.md, "Stop reasons"): `stopReason`
// against every case of tests/events/stop_reasons.json (the vectors every host
// checks), and `withPolicy`'s stops written in those words, in its line and in
// the error's message (`{tool}: {reason}`). The MCP wrapper's are checked in
// pseudo-call-stop.test.ts and transport-faults.test.ts (T9).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallCancelled, CallTimedOut, ObservedFailure } from '../src/errors.js';
import { stopReason, type StopApplied, type StopWhere } from '../src/stop-reason.js';
import type { StopCause } from '../src/errors.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');

interface Inputs {
  cause: StopCause;
  limit_ms: number | null;
  where: StopWhere;
  attempt: number | null;
  during: string | null;
  attempts_sent: number;
  applied: StopApplied;
}

const VECTORS = JSON.parse(readFileSync(resolve(ROOT, 'tests/events/stop_reasons.json'), 'utf8')) as {
  cases: Array<{ inputs: Inputs; reason: string }>;
};

const camel = (i: Inputs) => ({
  cause: i.cause, limitMs: i.limit_ms, where: i.where, attempt: i.attempt, during: i.during, attemptsSent: i.attempts_sent, applied: i.applied,
});

test('stopReason gives every vector\'s reason', () => {
  assert.ok(VECTORS.cases.length >= 12);
  for (const [n, { inputs, reason }] of VECTORS.cases.entries()) assert.equal(stopReason(camel(inputs)), reason, `case ${n}`);
});

test('the vectors cover every cause, place and effect', () => {
  const inputs = VECTORS.cases.map((c) => c.inputs);
  const values = (key: keyof Inputs) => new Set(inputs.map((i) => i[key]));
  assert.deepEqual(values('cause'), new Set(['call-timeout', 'run-timeout', 'cancelled']));
  assert.deepEqual(values('where'), new Set(['in-flight', 'between-attempts', 'before-send']));
  assert.deepEqual(values('applied'), new Set(['nothing-sent', 'not-a-write', 'may-have-applied', 'not-applied']));
  for (const during of [null, 'initialize', 'tools/list']) assert.ok(values('during').has(during), String(during));
  for (const i of inputs) assert.deepEqual(Object.keys(i).sort(), ['applied', 'attempt', 'attempts_sent', 'cause', 'during', 'limit_ms', 'where']);
});

test('inputs that cannot be worded are refused', () => {
  assert.throws(() => stopReason({ cause: 'call-timeout', where: 'between-attempts', attemptsSent: 1, applied: 'not-applied' }), /limitMs/);
  assert.throws(() => stopReason({ cause: 'cancelled', where: 'in-flight', attemptsSent: 1, applied: 'not-applied' }), /attempt/);
  assert.throws(() => stopReason({ cause: 'cancelled', where: 'somewhere' as StopWhere, attemptsSent: 1, applied: 'not-applied' }), TypeError);
  assert.throws(() => stopReason({ cause: 'cancelled', where: 'between-attempts', attemptsSent: 1, applied: 'perhaps' as StopApplied }), TypeError);
});

let runs = 0;
async function newRun(): Promise<Run> {
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy({ tools: { get_quote: { effect: 'read' }, send_payment: { effect: 'write' } } }).startRun(`RUN-STOPS-${runs}`);
}

type Line = Record<string, unknown>;
const stopLine = (lines: Line[]) => {
  const stops = lines.filter((l) => l.event === 'agent_retry.attempt' && l.action === 'stop');
  assert.equal(stops.length, 1);
  return stops[0];
};

test('withPolicy: a call limit with a write in flight', async () => {
  const lines: Line[] = [];
  const slow = ({ signal }: { signal: AbortSignal }) => new Promise((_resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('not stopped')), 5_000);
    signal.addEventListener('abort', () => { clearTimeout(timer); reject(signal.reason); }, { once: true });
  });
  const ended = await withPolicy(await newRun(), 'send_payment', slow, { callTimeoutMs: 100, log: (l) => lines.push(JSON.parse(l) as Line) })
    .catch((e: unknown) => e);
  const reason = 'the call\'s limit of 100 ms passed while attempt 1 was in flight (1 sent); '
    + 'the write may have been applied: check before sending it again';
  assert.ok(ended instanceof CallTimedOut, String(ended));
  assert.equal(ended.message, `send_payment: ${reason}`);
  const line = stopLine(lines);
  assert.deepEqual([line.outcome, line.attempt, line.reason], ['call-timeout', 1, reason]);
});

test('withPolicy: a cancellation during a backoff', async () => {
  const lines: Line[] = [];
  const controller = new AbortController();
  // A clock whose waits do not end: the call is cancelled during its first one.
  const clock = { nowMs: () => 0, sleep: () => { setTimeout(() => controller.abort(), 10); return new Promise<void>(() => undefined); } };
  const unavailable = () => {
    throw new ObservedFailure({ kind: { tag: 'http-status', val: 503 }, headers: '', body: 'unavailable', sessionIdSent: false, delivery: 'answer-started' });
  };
  const ended = await withPolicy(await newRun(), 'get_quote', unavailable, {
    clock, callTimeoutMs: 60_000, signal: controller.signal, log: (l) => lines.push(JSON.parse(l) as Line),
  }).catch((e: unknown) => e);
  const reason = 'the call was cancelled between attempts (1 sent); it is not a write';
  assert.ok(ended instanceof CallCancelled, String(ended));
  assert.equal(ended.message, `get_quote: ${reason}`);
  const line = stopLine(lines);
  assert.deepEqual([line.outcome, line.attempt, line.reason], ['cancelled', 2, reason]);
});
