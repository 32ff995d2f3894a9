// Contract 0.7.0: `run.abandonCall`, a call the host stopped (cancelled, or
// past its deadline) that no longer counts as open.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PolicyComponent } from '../src/component.js';
import { RunMisuse } from '../src/errors.js';

const NOW = 1_764_460_800_000n;
const TOOLS = { tools: { lookup_order: { effect: 'read' }, issue_refund: { effect: 'write' } } };

async function freshRun() {
  return (await (await PolicyComponent.load()).instantiate()).loadPolicy(TOOLS).startRun('r');
}

test('an abandoned write on the wire is closed, counted, and an unknown effect', async () => {
  const run = await freshRun();
  const call = run.beginCall(undefined, 'issue_refund', undefined, undefined, NOW);
  run.abandonCall(call.callId, 1, true, 'deadline');
  assert.throws(() => run.recordSuccess(call.callId, 1, NOW),
    (e: unknown) => e instanceof RunMisuse && e.error.tag === 'call-finished' && e.error.val === call.callId);
  const report = run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.deepEqual(report.effects.map((e) => [e.tool, e.status]), [['issue_refund', 'unknown']]);
});

test('abandoning another attempt or an unknown call is a typed misuse that changes nothing', async () => {
  const run = await freshRun();
  const call = run.beginCall(undefined, 'lookup_order', undefined, undefined, NOW);
  assert.throws(() => run.abandonCall(call.callId, 2, false, 'cancelled'),
    (e: unknown) => e instanceof RunMisuse && e.error.tag === 'attempt-mismatch');
  assert.throws(() => run.abandonCall(99, 1, false, 'cancelled'), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'unknown-call');
  assert.throws(() => run.abandonCall(call.callId, 1, false, 'later' as never), /abandon-call argument 4/);
  assert.equal(run.report().abandonedCalls, 0);
  assert.equal(run.recordSuccess(call.callId, 1, NOW).action, 'succeed');
});
