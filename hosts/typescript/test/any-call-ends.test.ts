// How a `withPolicy` call ends when the policy, the caller's mapping or the
// caller's function misbehaves: every end leaves the run report and the
// metrics agreeing (docs/events.md), and no call is left open or hangs.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallTimedOut, Escalated } from '../src/errors.js';
import { RetryMetrics } from '../src/metrics.js';
import { FakeClock } from '../src/testing.js';
import { ROOT } from './demo-server.js';

const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-any-call-ends-cache-'));
let runs = 0;

async function newRun(config: object, wasmPath?: string): Promise<Run> {
  runs += 1;
  const component = await PolicyComponent.load({ cacheDir, ...(wasmPath ? { wasmPath } : {}) });
  const instance = await component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy({ 'base-delay-ms': 20, ...config }).startRun(`RUN-ENDS-${runs}`);
}

type Line = Record<string, unknown>;

test('a first send the guard refuses: attempt 0, the attempt line first, counted as the report counts it', async () => {
  // The liar admits the call after an hour, past the account's wait cap (0 ms here).
  const run = await newRun({ 'x-liar': { 'start-delay-ms': 3_600_000 }, tools: { read_config: { effect: 'read' } } },
    join(ROOT, 'target/hostile/liar.wasm'));
  const lines: Line[] = [];
  const metrics = new RetryMetrics();
  let sent = 0;
  await assert.rejects(withPolicy(run, 'read_config', () => { sent += 1; return 'config'; }, {
    clock: new FakeClock(0), metrics, log: (l) => lines.push(JSON.parse(l) as Line),
  }), (e: unknown) => e instanceof Escalated && e.reason === 'unclassified-failure' && e.message.includes("the account's wait cap is 0 ms"));
  assert.equal(sent, 0);
  assert.deepEqual(lines.map((l) => [l.event, l.attempt, l.outcome ?? null, l.action ?? null]),
    [['agent_retry.attempt', 0, 'not sent', 'escalate'], ['agent_retry.escalation', 0, null, null]]);
  assert.equal(run.report().attempts, 1);
  assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
});

test('an observation the run cannot read (the caller\'s observe) abandons the call, with its stop line', async () => {
  const run = await newRun({ tools: { read_config: { effect: 'read' } } });
  const lines: Line[] = [];
  const metrics = new RetryMetrics();
  const malformed = () => ({ kind: { tag: 'http-status', val: 'five hundred' } }) as never;
  await assert.rejects(withPolicy(run, 'read_config', () => { throw new Error('down'); }, {
    clock: new FakeClock(0), metrics, observe: malformed, log: (l) => lines.push(JSON.parse(l) as Line),
  }), (e: unknown) => e instanceof Error && /five hundred/.test(e.message));
  const report = run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.deepEqual(lines.map((l) => [l.event, l.attempt, l.outcome, l.action]), [['agent_retry.attempt', 1, 'unmapped error', 'stop']]);
  assert.match(String(lines[0].reason), /^ValueConversionError thrown reporting the call's outcome \(http five hundred\)/);
  assert.match(String(lines[0].ts), /^\d/);
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
});

test('with a fake clock, an attempt that never answers still ends at the call\'s limit', async () => {
  const run = await newRun({ tools: { read_config: { effect: 'read' } } });
  const lines: Line[] = [];
  const metrics = new RetryMetrics();
  const started = Date.now();
  for (const hang of [() => new Promise<never>(() => undefined), () => ({ then: () => undefined }) as unknown as Promise<never>]) {
    await assert.rejects(withPolicy(run, 'read_config', hang, {
      clock: new FakeClock(0), metrics, callTimeoutMs: 100, log: (l) => lines.push(JSON.parse(l) as Line),
    }), (e: unknown) => e instanceof CallTimedOut && e.attemptsSent === 1);
  }
  assert.ok(Date.now() - started < 5_000);
  assert.deepEqual(lines.map((l) => [l.attempt, l.outcome, l.action]), [[1, 'call-timeout', 'stop'], [1, 'call-timeout', 'stop']]);
  assert.equal(run.report().abandonedCalls, 2);
  assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
});
