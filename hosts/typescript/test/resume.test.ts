// Resuming an escalation (contract 0.9.0): the bindings (`Run.snapshot`,
// `Policy.resumeRun`, `Run.resumedCall`) on the real component, and the MCP
// wrapper end to end with the demo server (demo-server.ts) and its ledger:
// `Escalated.snapshot` when a run escalates, `caller.resume(snapshot, answer)`
// on a new caller and a new connection, and the `agent_retry.resume` line.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, ResumeAnswer, type Policy, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated, SnapshotError } from '../src/errors.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { McpConnection, RetryingToolCaller, type RetryingToolCallerOptions, type StatusCheckRequest } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { DemoServer, type FaultRule } from './demo-server.js';

const WRITE: Wit.ToolHints = { readOnly: false, destructive: false, idempotent: false };
const TIMEOUT: Wit.Observation = {
  kind: { tag: 'transport', val: 'timeout' }, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'sent',
};

async function policyOf(config: object = { 'max-attempts-per-call': 1 }): Promise<Policy> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  return instance.loadPolicy(config);
}

/** A run whose keyed write timed out on its only attempt: escalated (`call-attempts-spent`). */
function escalatedRun(policy: Policy): Run {
  const run = policy.startRun('RUN-RESUME-1');
  const start = run.beginCall(undefined, 'issue_refund', 'key-1', WRITE, 1_000n);
  const verdict = run.recordFailure(start.callId, 1, TIMEOUT, undefined, 2_000n, 5n);
  assert.equal(verdict.action, 'escalate');
  return run;
}

/** The SnapshotError `f` throws. */
function refusal(f: () => unknown): SnapshotError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof SnapshotError, `expected a SnapshotError, got ${String(e)}`);
    return e;
  }
  assert.fail('expected a SnapshotError, nothing was thrown');
}

test('a run that has not escalated has no snapshot (not-escalated)', async () => {
  const run = (await policyOf()).startRun('RUN-RESUME-0');
  const e = refusal(() => run.snapshot(undefined, 1_000n));
  assert.equal(e.kind, 'not-escalated');
  assert.match(e.message, /not escalated/);
});

test('a snapshot carries the arguments and the safe answers, and a resumed run keeps every counter', async () => {
  const policy = await policyOf();
  const run = escalatedRun(policy);
  const before = run.report();
  const snapshot = run.snapshot('{"order_id":"A1","amount_paise":500}', 3_000n);
  const document = JSON.parse(snapshot) as Record<string, unknown>;
  assert.equal(document.contract, '0.9.0');
  assert.equal(document['run-id'], 'RUN-RESUME-1');
  assert.equal(document.arguments, '{"order_id":"A1","amount_paise":500}');
  assert.deepEqual(document.answers, { retry: 'safe', done: 'check first', skip: 'check first', abort: 'safe' });

  const resumed = policy.resumeRun(snapshot, ResumeAnswer.retry(), 4_000n);
  assert.equal(resumed.runId, 'RUN-RESUME-1');
  assert.equal(resumed.policy, policy);
  const call = resumed.resumedCall();
  assert.ok(call);
  assert.equal(call.action, 'send');
  assert.equal(call.callId, 1);
  assert.equal(call.tool, 'issue_refund');
  assert.equal(call.idempotencyKey, 'key-1');
  assert.equal(call.argumentsJson, '{"order_id":"A1","amount_paise":500}');
  assert.equal(call.attempt, 2);
  assert.ok(call.ticket?.admitted);
  const after = resumed.report();
  // No answer gives a budget back: every count is at least what it was, and the retry is one more attempt.
  assert.ok(after.attempts >= before.attempts && after.retries >= before.retries && after.calls >= before.calls, JSON.stringify([before, after]));
  assert.equal(after.attempts, before.attempts + 1);
  assert.deepEqual(after.effects.map((e) => [e.callId, e.idempotencyKey, e.status]), [[1, 'key-1', 'unknown']]);
  // The resumed call's attempt 2 is reported as any attempt.
  assert.equal(resumed.recordSuccess(1, 2, 5_000n).action, 'succeed');
  assert.equal(resumed.report().succeededCalls, 1);
});

test('a snapshot changed after it was taken is refused (tampered), naming nothing it did not check', async () => {
  const policy = await policyOf();
  const snapshot = escalatedRun(policy).snapshot(undefined, 3_000n);
  assert.ok(snapshot.includes('"attempts":1'));
  const e = refusal(() => policy.resumeRun(snapshot.replace('"attempts":1', '"attempts":0'), ResumeAnswer.retry(), 4_000n));
  assert.equal(e.kind, 'tampered');
  // The untouched text still resumes: the refusal changed nothing.
  assert.equal(policy.resumeRun(snapshot, ResumeAnswer.abort(), 4_000n).resumedCall()?.action, 'escalate');
});

test('a snapshot of another contract is refused (other-contract), naming both versions', async () => {
  const policy = await policyOf();
  const snapshot = escalatedRun(policy).snapshot(undefined, 3_000n);
  const e = refusal(() => policy.resumeRun(snapshot.replace('"contract":"0.9.0"', '"contract":"0.8.0"'), ResumeAnswer.retry(), 4_000n));
  assert.equal(e.kind, 'other-contract');
  assert.match(e.message, /0\.8\.0/);
  assert.match(e.message, /0\.9\.0/);
});

test('not a snapshot is malformed; past 2 MiB it is too-large, refused before it crosses', async () => {
  const policy = await policyOf();
  assert.equal(refusal(() => policy.resumeRun('{"format":"something else"}', ResumeAnswer.skip(), 1n)).kind, 'malformed');
  assert.equal(refusal(() => policy.resumeRun('not json', ResumeAnswer.skip(), 1n)).kind, 'malformed');
  const big = refusal(() => policy.resumeRun(' '.repeat(2 * 1024 * 1024 + 1), ResumeAnswer.skip(), 1n));
  assert.equal(big.kind, 'too-large');
  assert.match(big.message, /2097153 bytes, more than the 2097152-byte limit/);
  const run = escalatedRun(policy);
  const args = refusal(() => run.snapshot(`"${'x'.repeat(1024 * 1024)}"`, 3_000n));
  assert.equal(args.kind, 'too-large');
  // The instance is fine after each refusal.
  assert.equal(run.snapshot(undefined, 3_000n).startsWith('{'), true);
  assert.throws(() => policy.resumeRun(run.snapshot(undefined, 3_000n), { kind: 'maybe' } as unknown as ResumeAnswer, 1n), TypeError);
});

test('the answers: done succeeds with the text, skip replans, abort escalates (aborted)', async () => {
  const policy = await policyOf();
  const snapshot = escalatedRun(policy).snapshot(undefined, 3_000n);
  const done = policy.resumeRun(snapshot, ResumeAnswer.done('refund R-1 issued'), 4_000n).resumedCall();
  assert.deepEqual([done?.action, done?.resultText, done?.ticket], ['succeed', 'refund R-1 issued', undefined]);
  const skipped = policy.resumeRun(snapshot, ResumeAnswer.skip(), 4_000n);
  assert.equal(skipped.resumedCall()?.action, 'replan');
  const decision = skipped.lastDecision(1);
  assert.equal(decision?.action.tag, 'replan');
  assert.equal(decision?.rule, 'resumed');
  const aborted = policy.resumeRun(snapshot, ResumeAnswer.abort(), 4_000n);
  assert.equal(aborted.resumedCall()?.action, 'escalate');
  assert.equal(aborted.escalation()?.reason, 'aborted');
  assert.equal(aborted.report().escalation, 'aborted');
});

test('a call still open refuses a snapshot (calls-open) until it is abandoned, which an escalated run takes', async () => {
  const policy = await policyOf({});
  const run = policy.startRun('RUN-RESUME-2');
  const open = run.beginCall(undefined, 'lookup_order', undefined, { readOnly: true, destructive: false, idempotent: true }, 1_000n);
  const stopper = run.beginCall(undefined, 'issue_refund', 'key-2', WRITE, 1_000n);
  const forbidden: Wit.Observation = { ...TIMEOUT, kind: { tag: 'http-status', val: 403 }, body: 'forbidden', delivery: 'answer-started' };
  assert.equal(run.recordFailure(stopper.callId, 1, forbidden, undefined, 2_000n, 5n).action, 'escalate');
  const e = refusal(() => run.snapshot(undefined, 3_000n));
  assert.equal(e.kind, 'calls-open');
  run.abandonCall(open.callId, 1, true, 'cancelled');
  const resumed = policy.resumeRun(run.snapshot(undefined, 3_000n), ResumeAnswer.retry(), 4_000n).resumedCall();
  assert.deepEqual([resumed?.callId, resumed?.tool, resumed?.idempotencyKey, resumed?.action], [stopper.callId, 'issue_refund', 'key-2', 'send']);
});

// The wrapper, end to end.

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200, 'max-attempts-per-call': 1 };

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
let lines: Array<Record<string, unknown>>;
/** Every tools/call sent: the connection it went on (its label), the tool, its arguments. */
let posts: Array<{ on: string; tool: string; arguments: Record<string, unknown> }>;

beforeEach(() => {
  lines = [];
  posts = [];
});

afterEach(async () => {
  for (const connection of connections.splice(0)) await connection.close();
  for (const server of servers.splice(0)) await server.stop();
});

async function serve(...faults: FaultRule[]): Promise<DemoServer> {
  const server = await DemoServer.start({ faults, ledger: true });
  servers.push(server);
  return server;
}

/** A fetch that records the tools/call requests sent through it, labelled `on`. */
function recording(on: string): FetchLike {
  return async (url, init) => {
    if ((init?.method ?? 'GET').toUpperCase() === 'POST' && typeof init?.body === 'string') {
      try {
        const message = JSON.parse(init.body) as { method?: string; params?: { name?: string; arguments?: Record<string, unknown> } };
        if (message.method === 'tools/call') posts.push({ on, tool: message.params?.name ?? '', arguments: message.params?.arguments ?? {} });
      } catch {
        // not JSON: not a call
      }
    }
    return fetch(url, init);
  };
}

/** A caller on a new connection to `server` (labelled `on`), its run started from a new policy instance of CONFIG. */
async function newCaller(server: DemoServer, on: string, options: RetryingToolCallerOptions = {}, runId = 'CASE-9001'): Promise<RetryingToolCaller> {
  const connection = McpConnection.http(server.url, { fetch: recording(on) });
  connections.push(connection);
  const policy = await policyOf(CONFIG);
  return new RetryingToolCaller(connection, policy.startRun(runId), {
    entropy: new SplitMix64(3n), log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>), ...options,
  });
}

const textOf = (result: CallToolResult) => result.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');
const resumeLines = () => lines.filter((l) => l.event === 'agent_retry.resume');

/** The escalation `promise` rejects with. */
async function escalation(promise: Promise<unknown>): Promise<Escalated> {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Escalated, `expected Escalated, got ${String(e)}`);
    return e;
  }
  assert.fail('expected Escalated, the call resolved');
}

/** A keyed refund whose only attempt was applied and then timed out: escalated, with its snapshot. */
async function escalatedRefund(server: DemoServer): Promise<{ escalated: Escalated; key: string; first: RetryingToolCaller }> {
  const first = await newCaller(server, 'first', { attemptTimeoutMs: 300 });
  const escalated = await escalation(first.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 }));
  const key = first.run.instance.deriveIdempotencyKey('CASE-9001', 'step-1');
  return { escalated, key, first };
}

test('a keyed write applied then timed out escalates with a snapshot; a new caller on a new connection resumes it with retry: the same key, one refund', async () => {
  const server = await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const { escalated, key } = await escalatedRefund(server);
  assert.equal(escalated.reason, 'call-attempts-spent');
  assert.match(escalated.note, /A person may answer \(resume-run\): retry \(safe\)/);
  assert.ok(escalated.snapshot, 'the escalation carries a snapshot');
  const document = JSON.parse(escalated.snapshot) as { answers: Record<string, string>; arguments: string; 'run-id': string; 'stopped-call': number };
  assert.equal(document.answers.retry, 'safe');
  // Calls 1 and 2 of the run were the connection's pseudo-calls (initialize, tools/list).
  const callId = document['stopped-call'];
  assert.equal(callId, 3);
  assert.equal(document['run-id'], 'CASE-9001');
  assert.deepEqual(JSON.parse(document.arguments), { order_id: 'A1', amount_paise: 500 });
  assert.deepEqual(posts.map((p) => [p.on, p.tool, p.arguments.idempotency_key]), [['first', 'issue_refund', key]]);
  await new Promise((resolve) => setTimeout(resolve, 900)); // the first attempt's answer is long gone; the refund was applied
  assert.deepEqual(server.ledger().refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, key]]);

  // A new caller (a new policy instance, another run) on a new connection: the snapshot is all it is given.
  const second = await newCaller(server, 'second', { attemptTimeoutMs: 3000 }, 'PLACEHOLDER');
  lines = [];
  const result = await second.resume(escalated.snapshot, ResumeAnswer.retry());
  assert.ok(!result.isError, textOf(result));
  assert.match(textOf(result), /"order_id":"A1"/);
  assert.match(textOf(result), /refund_id/);
  const resent = posts.filter((p) => p.on === 'second' && p.tool === 'issue_refund');
  assert.deepEqual(resent.map((p) => p.arguments), [{ order_id: 'A1', amount_paise: 500, idempotency_key: key }]);
  // The server saw the same key twice and applied the refund once.
  assert.deepEqual(server.ledger().refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, key]]);
  // The caller's run is the resumed one now.
  assert.equal(second.run.runId, 'CASE-9001');
  const report = second.run.report();
  assert.deepEqual([report.calls >= 1, report.attempts >= 2, report.retries >= 1, report.succeededCalls >= 1], [true, true, true, true]);
  assert.deepEqual(resumeLines().map((l) => [l.run, l.call, l.tool, l.answer, l.action, l.attempt]), [['CASE-9001', callId, 'issue_refund', 'retry', 'send', 2]]);
  // Attempt 2 with the same key (the server may answer with a task, polled under the same attempt), then its success.
  const attempts = lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'issue_refund');
  assert.ok(attempts.length >= 1);
  assert.ok(attempts.every((l) => l.attempt === 2 && l.key === key), JSON.stringify(attempts));
  assert.deepEqual(attempts.map((l) => l.action).at(-1), 'succeed');
  // Later calls go to the resumed run, with keys of their own.
  assert.ok(!(await second.callTool('lookup_order', { order_id: 'A1' })).isError);
  assert.equal(second.run.report().calls, report.calls + 1);
});

test('done, skip and abort through the wrapper: what the model gets, and the resume line', async () => {
  const server = await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const { escalated } = await escalatedRefund(server);
  const snapshot = escalated.snapshot;
  assert.ok(snapshot);
  const callId = (JSON.parse(snapshot) as { 'stopped-call': number })['stopped-call'];
  const sentBefore = posts.length;

  const done = await (await newCaller(server, 'done')).resume(snapshot, ResumeAnswer.done('refund R-77 confirmed by a person'));
  assert.deepEqual(done, { content: [{ type: 'text', text: 'refund R-77 confirmed by a person' }], isError: false });
  const doneEmpty = await (await newCaller(server, 'done-empty')).resume(snapshot, ResumeAnswer.done());
  assert.deepEqual(doneEmpty, { content: [{ type: 'text', text: '' }], isError: false });

  const skipCaller = await newCaller(server, 'skip');
  const skipped = await skipCaller.resume(snapshot, ResumeAnswer.skip());
  assert.equal(skipped.isError, true);
  const message = skipCaller.run.lastDecision(callId)?.action;
  assert.equal(message?.tag, 'replan');
  assert.equal(textOf(skipped), message?.tag === 'replan' ? message.val : undefined);
  assert.ok(textOf(skipped).length > 0);

  const abortCaller = await newCaller(server, 'abort');
  const aborted = await escalation(abortCaller.resume(snapshot, ResumeAnswer.abort()));
  assert.equal(aborted.reason, 'aborted');
  // An aborted run is over: no snapshot is asked for, no refusal logged, no answers offered.
  assert.equal(aborted.snapshot, undefined);
  assert.equal(aborted.snapshotError, undefined);
  assert.deepEqual(lines.filter((l) => l.event === 'agent_retry.snapshot_refused'), []);
  assert.doesNotMatch(aborted.note, /A person may answer/);
  assert.throws(() => abortCaller.run.snapshot(undefined, Date.now()), (e: unknown) => e instanceof SnapshotError && e.kind === 'not-escalated' && /aborted/.test(e.message));

  // Nothing was sent for any of them.
  assert.equal(posts.filter((p) => p.tool === 'issue_refund').length, sentBefore);
  assert.deepEqual(resumeLines().map((l) => [l.event, l.run, l.call, l.tool, l.answer, l.action, l.attempt]), [
    ['agent_retry.resume', 'CASE-9001', callId, 'issue_refund', 'done', 'succeed', 1],
    ['agent_retry.resume', 'CASE-9001', callId, 'issue_refund', 'done', 'succeed', 1],
    ['agent_retry.resume', 'CASE-9001', callId, 'issue_refund', 'skip', 'replan', 1],
    ['agent_retry.resume', 'CASE-9001', callId, 'issue_refund', 'abort', 'escalate', 1],
  ]);
  const line = resumeLines()[0];
  for (const field of ['event', 'run', 'policy', 'call', 'tool', 'answer', 'action', 'attempt']) assert.ok(field in line, `the resume line has ${field}`);
  assert.ok(lines.some((l) => l.event === 'agent_retry.replan' && l.rule === 'resumed'));
  assert.ok(lines.some((l) => l.event === 'agent_retry.escalation' && l.reason === 'aborted'));
});

test('a tampered snapshot is refused by resume (SnapshotError), nothing sent and the run unchanged', async () => {
  const server = await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const { escalated } = await escalatedRefund(server);
  assert.ok(escalated.snapshot);
  const caller = await newCaller(server, 'second', {}, 'MINE');
  const sent = posts.length;
  await assert.rejects(caller.resume(escalated.snapshot.replace('"amount_paise\\":500', '"amount_paise\\":50000'), ResumeAnswer.retry()),
    (e: unknown) => e instanceof SnapshotError && e.kind === 'tampered');
  await assert.rejects(caller.resume(escalated.snapshot.replace('"contract":"0.9.0"', '"contract":"0.8.0"'), ResumeAnswer.retry()),
    (e: unknown) => e instanceof SnapshotError && e.kind === 'other-contract' && /0\.8\.0/.test(e.message) && /0\.9\.0/.test(e.message));
  assert.equal(posts.length, sent);
  assert.equal(caller.run.runId, 'MINE');
  assert.deepEqual(resumeLines(), []);
});

test('a snapshot that kept no arguments is never sent by retry: SnapshotError malformed, nothing sent, the call closed', async () => {
  const server = await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const { first } = await escalatedRefund(server);
  const bare = first.run.snapshot(undefined, Date.now()); // taken by hand, without the call's arguments
  const caller = await newCaller(server, 'second');
  const sent = posts.length;
  await assert.rejects(caller.resume(bare, ResumeAnswer.retry()),
    (e: unknown) => e instanceof SnapshotError && e.kind === 'malformed' && /keeps no arguments for call \d+ \(issue_refund\)/.test(e.message));
  assert.equal(posts.length, sent, 'nothing reached the server');
  assert.equal(caller.run.report().abandonedCalls, 1, 'the resumed call was closed unsent');
});

test('an unkeyed write whose status check says unknown escalates with a snapshot whose retry is "check first"', async () => {
  const server = await serve({ tool: 'record_note', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const checks: StatusCheckRequest[] = [];
  const caller = await newCaller(server, 'first', { attemptTimeoutMs: 300, statusCheck: async (request) => { checks.push(request); return 'unknown'; } });
  const escalated = await escalation(caller.callTool('record_note', { order_id: 'A1', text: 'refund approved' }));
  assert.equal(escalated.reason, 'status-unknown');
  assert.equal(checks.length, 1);
  assert.ok(escalated.snapshot);
  const document = JSON.parse(escalated.snapshot) as { answers: Record<string, string>; calls: Array<{ key: string | null }> };
  assert.equal(document.answers.retry, 'check first');
  assert.deepEqual(document.calls.map((c) => c.key), [null]);
  assert.match(escalated.note, /retry \(check first\)/);

  // A person checked: not applied. Retry sends the same call, without a key.
  await new Promise((resolve) => setTimeout(resolve, 900));
  const second = await newCaller(server, 'second', { attemptTimeoutMs: 3000 });
  const result = await second.resume(escalated.snapshot, ResumeAnswer.retry());
  assert.ok(!result.isError, textOf(result));
  assert.deepEqual(posts.filter((p) => p.tool === 'record_note').map((p) => [p.on, p.arguments]), [
    ['first', { order_id: 'A1', text: 'refund approved' }],
    ['second', { order_id: 'A1', text: 'refund approved' }],
  ]);
});

test('an escalation not admitted at begin carries a snapshot too, and retry sends the call as its first attempt', async () => {
  const server = await serve();
  const connection = McpConnection.http(server.url, { fetch: recording('first') });
  connections.push(connection);
  const policy = await policyOf({ ...CONFIG, 'max-steps-per-run': 3 });
  const caller = new RetryingToolCaller(connection, policy.startRun('CASE-9002'), { log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>) });
  // initialize and tools/list are steps 1 and 2, lookup_order step 3; the next call is not admitted.
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  const escalated = await escalation(caller.callTool('issue_refund', { order_id: 'A2', amount_paise: 100 }));
  assert.equal(escalated.reason, 'run-steps-spent');
  assert.ok(escalated.snapshot, 'a call refused at begin has a snapshot');
  const document = JSON.parse(escalated.snapshot) as { begun: boolean; arguments: string };
  assert.equal(document.begun, false);
  assert.deepEqual(JSON.parse(document.arguments), { order_id: 'A2', amount_paise: 100 });
  assert.equal(posts.filter((p) => p.tool === 'issue_refund').length, 0);

  const second = await newCaller(server, 'second', {}, 'PLACEHOLDER');
  const result = await second.resume(escalated.snapshot, ResumeAnswer.retry());
  assert.ok(!result.isError, textOf(result));
  const key = caller.run.instance.deriveIdempotencyKey('CASE-9002', 'step-2');
  assert.deepEqual(posts.filter((p) => p.tool === 'issue_refund').map((p) => [p.on, p.arguments.idempotency_key]), [['second', key]]);
  assert.deepEqual(server.ledger().refunds.map((r) => [r.order_id, r.idempotency_key]), [['A2', key]]);
  assert.deepEqual(resumeLines().map((l) => [l.answer, l.action, l.attempt]), [['retry', 'send', 1]]);
});

test('a snapshot refused because another call of the run is in flight: no snapshot, one line saying why, no crash', async () => {
  const server = await serve(
    { tool: 'lookup_order', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1500 } },
    { tool: 'issue_refund', call: 1, fault: { kind: 'http', status: 403, body: 'forbidden: account suspended' } },
  );
  const caller = await newCaller(server, 'first', { attemptTimeoutMs: 5000 });
  await caller.listTools();
  const slow = caller.callTool('lookup_order', { order_id: 'A1' });
  await new Promise((resolve) => setTimeout(resolve, 300)); // the read is in flight
  const escalated = await escalation(caller.callTool('issue_refund', { order_id: 'A2', amount_paise: 100 }));
  assert.equal(escalated.reason, 'permission-denied');
  assert.equal(escalated.snapshot, undefined);
  assert.equal(escalated.snapshotError?.kind, 'calls-open');
  const refused = lines.filter((l) => l.event === 'agent_retry.snapshot_refused');
  assert.equal(refused.length, 1);
  assert.deepEqual([refused[0].tool, refused[0].kind], ['issue_refund', 'calls-open']);
  await Promise.allSettled([slow]);
});

test('resume-worker.js (the cross-host test\'s Node side) resumes a snapshot from a file and prints one JSON line', async () => {
  const server = await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
  const { escalated, key } = await escalatedRefund(server);
  assert.ok(escalated.snapshot);
  const dir = mkdtempSync(join(tmpdir(), 'resume-worker-'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(CONFIG));
  writeFileSync(join(dir, 'snapshot.json'), escalated.snapshot);
  await new Promise((resolve) => setTimeout(resolve, 900));
  const worker = join(dirname(fileURLToPath(import.meta.url)), 'resume-worker.js');
  const run = (...args: string[]) => spawnSync(process.execPath, [worker, ...args], { encoding: 'utf8', env: { ...process.env, NODE_TEST_CONTEXT: '' } });
  const callId = (JSON.parse(escalated.snapshot) as { 'stopped-call': number })['stopped-call'];

  const retried = run(server.url, join(dir, 'config.json'), join(dir, 'snapshot.json'), 'retry');
  assert.equal(retried.status, 0, retried.stderr);
  const lines = retried.stdout.trim().split('\n');
  assert.equal(lines.length, 1, retried.stdout);
  const line = JSON.parse(lines[0]) as Record<string, unknown>;
  assert.deepEqual([line.host, line.action, line.call_id, line.attempt, line.key], ['node', 'send', callId, 2, key]);
  assert.match(String(line.text), /refund_id/);
  assert.deepEqual(server.ledger().refunds.map((r) => r.idempotency_key), [key]);

  const done = run(server.url, join(dir, 'config.json'), join(dir, 'snapshot.json'), 'done:approved by a person');
  assert.equal(done.status, 0, done.stderr);
  assert.deepEqual(JSON.parse(done.stdout) as unknown, { host: 'node', action: 'succeed', text: 'approved by a person', call_id: callId, attempt: 1, key: null });

  const usage = run(server.url, join(dir, 'config.json'));
  assert.equal(usage.status, 1);
  assert.match(usage.stderr, /usage: node dist\/test\/resume-worker\.js URL CONFIG_PATH SNAPSHOT_PATH ANSWER/);
  assert.equal(run(server.url, join(dir, 'config.json'), join(dir, 'snapshot.json'), 'maybe').status, 1);
});

test('a resumed attempt goes on as any call: it fails, the run escalates again, with a new snapshot of attempt 2', async () => {
  const server = await serve(
    { tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } },
    { tool: 'issue_refund', call: 2, fault: { kind: 'http', status: 503, body: 'upstream unavailable' } },
  );
  const { escalated, key } = await escalatedRefund(server);
  assert.ok(escalated.snapshot);
  const second = await newCaller(server, 'second', { attemptTimeoutMs: 3000 });
  lines = [];
  const again = await escalation(second.resume(escalated.snapshot, ResumeAnswer.retry()));
  assert.equal(again.reason, 'call-attempts-spent');
  assert.match(again.note, /attempt 2/);
  assert.ok(again.snapshot, 'the second escalation has its own snapshot');
  assert.notEqual(again.snapshot, escalated.snapshot);
  const document = JSON.parse(again.snapshot) as { arguments: string; calls: Array<{ key: string | null; attempt: number }>; counters: Record<string, number> };
  assert.deepEqual(JSON.parse(document.arguments), { order_id: 'A1', amount_paise: 500 });
  assert.deepEqual(document.calls.filter((c) => c.key === key).map((c) => c.attempt), [2]);
  // The counts go on from the first snapshot's (the new connection's pseudo-calls are calls of the run too).
  const first = JSON.parse(escalated.snapshot) as { counters: Record<string, number> };
  assert.ok(document.counters.attempts >= first.counters.attempts + 1, JSON.stringify([first.counters, document.counters]));
  assert.ok(document.counters.retries >= first.counters.retries + 1);
  const attempt = lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'issue_refund');
  assert.deepEqual(attempt.map((l) => [l.attempt, l.key, l.outcome, l.action]), [[2, key, 'http 503', 'escalate']]);
  assert.deepEqual(posts.filter((p) => p.tool === 'issue_refund').map((p) => [p.on, p.arguments.idempotency_key]), [['first', key], ['second', key]]);
  // And once more, from the new snapshot: the third attempt applies nothing new (the key is the same).
  const third = await newCaller(server, 'third', { attemptTimeoutMs: 3000 });
  assert.ok(!(await third.resume(again.snapshot, ResumeAnswer.retry())).isError);
  assert.deepEqual(server.ledger().refunds.map((r) => r.idempotency_key), [key]);
});

test('an escalated connection (the initialize pseudo-call) resumes with retry: it connects again, and the model\'s call is made again', async () => {
  const server = await serve();
  // The server's front answers 503 to every request until it is let through.
  let down = true;
  const front: FetchLike = async (url, init) => (down ? new Response('upstream unavailable', { status: 503 }) : fetch(url, init));
  const connection = McpConnection.http(server.url, { fetch: front });
  connections.push(connection);
  const caller = new RetryingToolCaller(connection, (await policyOf(CONFIG)).startRun('CASE-9003'), { log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>) });
  const escalated = await escalation(caller.callTool('lookup_order', { order_id: 'A1' }));
  assert.equal(escalated.tool, 'initialize');
  assert.ok(escalated.snapshot, 'an escalated connection has a snapshot');
  const document = JSON.parse(escalated.snapshot) as { calls: Array<{ tool: string }>; arguments: string | null };
  assert.deepEqual(document.calls.map((c) => c.tool), ['initialize']);
  assert.equal(document.arguments, null);

  down = false;
  const second = await newCaller(server, 'second', {}, 'PLACEHOLDER');
  lines = [];
  assert.deepEqual(await second.resume(escalated.snapshot, ResumeAnswer.retry()), { content: [{ type: 'text', text: '' }], isError: false });
  assert.deepEqual(resumeLines().map((l) => [l.tool, l.answer, l.action, l.attempt]), [['initialize', 'retry', 'send', 2]]);
  const connected = lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'initialize');
  assert.deepEqual(connected.map((l) => [l.attempt, l.outcome, l.action]), [[2, 'success', 'succeed']]);
  const result = await second.callTool('lookup_order', { order_id: 'A1' });
  assert.ok(!result.isError, textOf(result));
  assert.equal(second.run.runId, 'CASE-9003');
});
