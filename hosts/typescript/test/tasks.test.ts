// Tasks (MCP 2026-07-28 Tasks extension, contract 0.6.0): the wrapper (SDK v2)
// declares the extension; a `tools/call` answered with a task is reported
// (`recordTaskStatus`), polled with `tasks/get` as the verdicts say, its
// completion reported as the attempt's outcome, a failed poll reported
// (`recordPollFailure`) and polled again, and `tasks/cancel` sent when a
// verdict says `cancelTask`. Against the demo server's `issue_refund` task
// (`--task-work-ms`, `--task-poll-interval-ms`, `--task-ttl-ms`); what the
// client sent is recorded under the capturing fetch, what was applied is the
// server's ledger.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import type { Client as ClientV2 } from '@modelcontextprotocol/client';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallTimedOut, Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type McpHttpOptions, type RetryingToolCallerOptions, type VerdictEvent } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { DemoServer, type FaultRule } from './demo-server.js';

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200, 'task-poll-base-delay-ms': 50, 'task-poll-max-delay-ms': 200 };
const FLAGS = ['--task-work-ms', '--task-poll-interval-ms', '--task-ttl-ms'];

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

interface Sent { method: string; params: Record<string, unknown> }

async function setUp(args: string[], faults: FaultRule[] = [], options: { config?: object; caller?: RetryingToolCallerOptions; http?: McpHttpOptions } = {}) {
  const server = await DemoServer.start({ ledger: true, faults, args: ['--era', 'modern', ...args], require: FLAGS });
  servers.push(server);
  const sent: Sent[] = [];
  // What the client sends, under the capturing fetch.
  const recording: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string') {
      try {
        const message = JSON.parse(init.body) as { method?: string; params?: Record<string, unknown> };
        if (typeof message.method === 'string') sent.push({ method: message.method, params: message.params ?? {} });
      } catch {
        // not JSON
      }
    }
    return fetch(url, init);
  };
  const connection = McpConnection.http(server.url, { sdk: 'v2', fetch: recording, ...options.http });
  connections.push(connection);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy({ ...CONFIG, ...options.config }).startRun('tasks');
  const verdicts: VerdictEvent[] = [];
  const caller = new RetryingToolCaller(connection, run, { log: null, onVerdict: (event) => verdicts.push(event), ...options.caller });
  const methods = (method: string) => sent.filter((m) => m.method === method);
  return { server, caller, run, verdicts, sent, methods };
}

const refund = (order: string) => ({ order_id: order, amount_paise: 50_000 });

test('a refund answered by a task is polled to completion: one refund, one attempt, the task reported then polled', async () => {
  const { server, caller, run, verdicts, methods } = await setUp(['--task-work-ms', '400', '--task-poll-interval-ms', '100']);
  const result = await caller.callTool('issue_refund', refund('A2001'));
  assert.notEqual(result.isError, true, JSON.stringify(result));
  assert.equal((result.structuredContent as { refund?: { order_id?: string } }).refund?.order_id, 'A2001');
  assert.equal(server.ledger().refunds.length, 1);
  assert.equal(methods('tools/call').length, 1, 'the tool is called once: its task is polled');
  const polls = methods('tasks/get');
  assert.ok(polls.length >= 1, 'polled');
  const taskId = polls[0].params.taskId;
  assert.ok(typeof taskId === 'string' && polls.every((p) => p.params.taskId === taskId));
  const reports = verdicts.filter((v) => v.tool === 'issue_refund');
  assert.equal(reports[0].reported.tag, 'task');
  assert.ok(reports[0].reported.tag === 'task' && reports[0].reported.val.status === 'working' && reports[0].reported.val.taskId === taskId);
  assert.equal(reports[0].verdict.action, 'poll');
  assert.ok(reports.every((v) => v.attempt === 1));
  assert.deepEqual(reports.at(-1)?.reported.tag, 'success');
  assert.equal(reports.at(-1)?.verdict.action, 'succeed');
  const report = run.report();
  assert.equal(report.retries, 0);
  assert.equal(report.tasks, 1);
  assert.equal(report.polls, polls.length);
});

for (const fault of [{ kind: 'drop' }, { kind: 'http', status: 503 }] as const) {
  test(`a poll that fails (${fault.kind === 'drop' ? 'the connection cut' : 'HTTP 503'}) is reported and polled again: still one refund`, async () => {
    const { server, caller, run, verdicts, methods } = await setUp(['--task-work-ms', '400', '--task-poll-interval-ms', '100'],
      [{ tool: 'tasks/get', call: 1, fault }]);
    const result = await caller.callTool('issue_refund', refund('A2002'));
    assert.notEqual(result.isError, true, JSON.stringify(result));
    assert.equal(server.ledger().refunds.length, 1);
    assert.equal(methods('tools/call').length, 1);
    const failed = verdicts.filter((v) => v.reported.tag === 'poll-failure');
    assert.equal(failed.length, 1, JSON.stringify(verdicts.map((v) => v.reported.tag)));
    assert.equal(failed[0].verdict.action, 'poll');
    assert.ok(methods('tasks/get').length >= 2);
    assert.equal(run.report().retries, 0);
    assert.ok(verdicts.filter((v) => v.tool === 'issue_refund').every((v) => v.attempt === 1));
  });
}

test('a task past its time to live: the policy stops waiting and the wrapper sends tasks/cancel; no refund', async () => {
  // The task works 3 s; it lives 500 ms.
  const { server, caller, verdicts, methods } = await setUp(['--task-work-ms', '3000', '--task-poll-interval-ms', '100', '--task-ttl-ms', '500']);
  await assert.rejects(caller.callTool('issue_refund', refund('A2003')), (e: unknown) => {
    assert.ok(e instanceof Escalated, String(e));
    assert.equal(e.escalation.reason, 'task-expired');
    return true;
  });
  const last = verdicts.at(-1);
  assert.equal(last?.verdict.cancelTask, true);
  const cancels = methods('tasks/cancel');
  assert.equal(cancels.length, 1);
  assert.equal(cancels[0].params.taskId, methods('tasks/get')[0]?.params.taskId ?? cancels[0].params.taskId);
  assert.deepEqual(server.ledger().cancelled_tasks, [cancels[0].params.taskId], 'the server saw the cancel');
  assert.equal(server.ledger().refunds.length, 0);
});

test('the call\'s deadline while its task works: the polls stop at the deadline', async () => {
  const { server, caller, methods } = await setUp(['--task-work-ms', '5000', '--task-poll-interval-ms', '100'], [],
    { caller: { callTimeoutMs: 800 } });
  await assert.rejects(caller.callTool('issue_refund', refund('A2004')), (e: unknown) => e instanceof CallTimedOut || e instanceof Escalated);
  assert.equal(methods('tools/call').length, 1);
  // Whichever stopped it (the policy's deadline-too-near or the wrapper's
  // timer), the task is cancelled and the server sees it.
  for (let i = 0; i < 50 && server.ledger().cancelled_tasks.length === 0; i += 1) await new Promise((r) => setTimeout(r, 20));
  assert.equal(server.ledger().cancelled_tasks.length, 1, 'the server saw the cancel at the deadline');
  assert.equal(server.ledger().refunds.length, 0);
});

test('a task that asks for input is answered through tasks/update by the application\'s handler: input-answered, one refund', async () => {
  const { server, caller, verdicts, methods } = await setUp(['--task-work-ms', '200', '--task-poll-interval-ms', '100'], [], {
    http: {
      clientOptions: { capabilities: { elicitation: { form: {} } } },
      onClient: (client) => (client as ClientV2).setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { approve: true } })),
    },
  });
  // Above the approval limit: the task asks a person.
  const result = await caller.callTool('issue_refund', { order_id: 'A2005', amount_paise: 5_000_000 });
  assert.notEqual(result.isError, true, JSON.stringify(result));
  assert.equal(methods('tasks/update').length, 1);
  assert.ok(verdicts.some((v) => v.reported.tag === 'task' && v.reported.val.status === 'input-answered'));
  assert.equal(server.ledger().refunds.length, 1);
});

test('a task that asks for input nobody answers escalates input-required and cancels the task', async () => {
  const { server, caller, verdicts, methods } = await setUp(['--task-work-ms', '200', '--task-poll-interval-ms', '100']);
  await assert.rejects(caller.callTool('issue_refund', { order_id: 'A2006', amount_paise: 5_000_000 }), (e: unknown) => {
    assert.ok(e instanceof Escalated, String(e));
    assert.equal(e.escalation.reason, 'input-required');
    assert.match(e.escalation.note, /Approve a refund/);
    return true;
  });
  assert.ok(verdicts.some((v) => v.reported.tag === 'task' && v.reported.val.status === 'input-required'));
  assert.equal(methods('tasks/update').length, 0);
  assert.equal(verdicts.at(-1)?.verdict.cancelTask, true, 'the task is still alive: the policy stops waiting for it');
  assert.equal(methods('tasks/cancel').length, 1);
  assert.equal(server.ledger().refunds.length, 0);
});
