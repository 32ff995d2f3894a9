// Tasks (MCP 2026-07-28 Tasks extension, contract 0.7.0): the wrapper (SDK v2)
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
import { CallCancelled, CallTimedOut, Escalated } from '../src/errors.js';
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

/** A request the client sent, with what it may be answered by instead of the server (`undefined`: the server answers). */
type Answerer = (message: { id?: unknown; method: string; params: Record<string, unknown> }, signal: AbortSignal | undefined) =>
  Promise<Response> | Response | undefined;

/** A JSON-RPC answer `result` to the request `id`, as the server would send it. */
const rpcAnswer = (id: unknown, result: unknown): Response =>
  new Response(JSON.stringify({ jsonrpc: '2.0', id, result }), { status: 200, headers: { 'content-type': 'application/json' } });

/** Never answers: rejects when the request is given up (its signal). */
const neverAnswered = (signal: AbortSignal | undefined): Promise<Response> =>
  new Promise((_, reject) => signal?.addEventListener('abort', () => reject(signal.reason), { once: true }));

async function setUp(args: string[], faults: FaultRule[] = [],
  options: { config?: object; caller?: RetryingToolCallerOptions; http?: McpHttpOptions; answer?: Answerer } = {}) {
  const server = await DemoServer.start({ ledger: true, faults, args: ['--era', 'modern', ...args], require: FLAGS });
  servers.push(server);
  const sent: Sent[] = [];
  // What the client sends, under the capturing fetch.
  const recording: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string') {
      let message: { id?: unknown; method?: string; params?: Record<string, unknown> } | undefined;
      try {
        message = JSON.parse(init.body) as typeof message;
      } catch {
        // not JSON
      }
      if (typeof message?.method === 'string') {
        const request = { id: message.id, method: message.method, params: message.params ?? {} };
        sent.push(request);
        const instead = options.answer?.(request, init.signal ?? undefined);
        if (instead !== undefined) return instead;
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

// What a hostile server may answer to `tasks/get`: each is reported once to
// the policy as a poll failure (protocol-error -32603, the raw answer as its
// body), and polled again only as a verdict says: as many polls as verdicts.
const UNUSABLE: Array<[string, (taskId: string) => Record<string, unknown> | string]> = [
  ['completed without a result', (taskId) => ({ taskId, status: 'completed', resultType: 'complete' })],
  ['failed without an error', (taskId) => ({ taskId, status: 'failed', resultType: 'complete' })],
  ['a status the extension does not define', (taskId) => ({ taskId, status: 'paused', resultType: 'complete', pollIntervalMs: 0 })],
  ['no task', () => ({ resultType: 'complete' })],
  ['a body that does not parse', () => 'this is { not json'],
];
for (const [what, answerOf] of UNUSABLE) {
  test(`a tasks/get answer the wrapper cannot use (${what}) is reported once a poll, as a poll failure: no poll without a verdict`, { timeout: 20_000 }, async () => {
    const answers: string[] = [];
    const { caller, verdicts, methods } = await setUp(['--task-work-ms', '200', '--task-poll-interval-ms', '50'], [], {
      caller: { callTimeoutMs: 10_000 },
      answer: (message) => {
        if (message.method !== 'tasks/get') return undefined;
        const result = answerOf(String(message.params.taskId));
        if (typeof result === 'string') {
          answers.push(result);
          return new Response(result, { status: 200, headers: { 'content-type': 'application/json' } });
        }
        answers.push(JSON.stringify(result));
        return rpcAnswer(message.id, result);
      },
    });
    await assert.rejects(caller.callTool('issue_refund', refund('A2010')), (e: unknown) => {
      assert.ok(e instanceof Escalated, String(e));
      return true;
    });
    const reports = verdicts.filter((v) => v.tool === 'issue_refund');
    assert.equal(reports[0].reported.tag, 'task');
    // Every poll has its verdict: the first report is the tools/call's.
    assert.equal(methods('tasks/get').length, reports.length - 1, JSON.stringify(reports.map((v) => v.reported.tag)));
    assert.ok(reports.length >= 2);
    for (const [i, v] of reports.slice(1).entries()) {
      assert.equal(v.reported.tag, 'poll-failure');
      assert.ok(v.reported.tag === 'poll-failure');
      assert.deepEqual(v.reported.val.kind, { tag: 'protocol-error', val: -32603 });
      assert.equal(v.reported.val.delivery, 'answer-started');
      assert.equal(v.reported.val.body, answers[i], 'the raw answer is the body');
    }
    assert.equal(methods('tools/call').length, 1);
  });
}

for (const [what, error] of [['no code', { message: 'boom' }], ['a code past 32 bits', { code: 2 ** 40, message: 'boom' }],
  ['a fractional code', { code: 1.5, message: 'boom' }]] as const) {
  test(`a failed task whose error has ${what} is reported as protocol-error -32603`, async () => {
    const { caller, verdicts } = await setUp(['--task-work-ms', '200', '--task-poll-interval-ms', '50'], [], {
      config: { 'max-attempts-per-call': 1 },
      answer: (message) => message.method === 'tasks/get'
        ? rpcAnswer(message.id, { taskId: message.params.taskId, status: 'failed', resultType: 'complete', error }) : undefined,
    });
    await assert.rejects(caller.callTool('issue_refund', refund('A2011')));
    const failed = verdicts.find((v) => v.reported.tag === 'failure');
    assert.ok(failed?.reported.tag === 'failure', JSON.stringify(verdicts.map((v) => v.reported.tag)));
    assert.deepEqual(failed.reported.val.kind, { tag: 'protocol-error', val: -32603 });
    assert.equal(failed.reported.val.body, 'boom');
  });
}

test('numbers of the server that do not fit the contract are dropped: negative, fractional, a createdAt not RFC 3339', async () => {
  let polls = 0;
  const { caller, verdicts } = await setUp(['--task-work-ms', '200', '--task-poll-interval-ms', '50'], [], {
    answer: (message) => {
      if (message.method !== 'tasks/get' || (polls += 1) > 1) return undefined;
      return rpcAnswer(message.id, {
        taskId: message.params.taskId, status: 'working', resultType: 'complete', pollIntervalMs: -5, ttlMs: 1.5, createdAt: '2026-12-02',
      });
    },
  });
  const result = await caller.callTool('issue_refund', refund('A2012'));
  assert.notEqual(result.isError, true, JSON.stringify(result));
  const report = verdicts.filter((v) => v.tool === 'issue_refund')[1]?.reported;
  assert.ok(report?.tag === 'task', JSON.stringify(report));
  assert.equal(report.val.pollIntervalMs, undefined);
  assert.equal(report.val.ttlMs, undefined);
  assert.equal(report.val.ageMs, undefined);
});

test('the task id an answer names is the one polled next, and the one cancelled', async () => {
  // The server's first poll answer names another id; polls of it are the real task's.
  let real = '';
  const moved = (id: string) => `${id}-moved`;
  const { caller, verdicts, methods } = await setUp(['--task-work-ms', '3000', '--task-poll-interval-ms', '50', '--task-ttl-ms', '600'], [], {
    answer: (message) => {
      if (message.method !== 'tasks/get' && message.method !== 'tasks/cancel') return undefined;
      const id = String(message.params.taskId);
      if (id === real || real === '') {
        real = id;
        return rpcAnswer(message.id, { taskId: moved(id), status: 'working', resultType: 'complete', pollIntervalMs: 50 });
      }
      return undefined; // the moved id: the server's unknown-task error (a failed poll) or the cancel
    },
  });
  await assert.rejects(caller.callTool('issue_refund', refund('A2013')));
  const polls = methods('tasks/get');
  assert.ok(polls.length >= 2, JSON.stringify(polls));
  assert.equal(polls[0].params.taskId, real);
  assert.ok(polls.slice(1).every((p) => p.params.taskId === moved(real)), JSON.stringify(polls.map((p) => p.params.taskId)));
  const reported = verdicts.flatMap((v) => (v.reported.tag === 'task' ? [v.reported.val.taskId] : []));
  assert.deepEqual(reported, [real, moved(real)]);
  for (const cancel of methods('tasks/cancel')) assert.equal(cancel.params.taskId, moved(real));
});

test('a call cancelled while its task works sends tasks/cancel: the server sees it', async () => {
  const controller = new AbortController();
  const { server, caller } = await setUp(['--task-work-ms', '5000', '--task-poll-interval-ms', '100'], [], {
    caller: { onVerdict: (v) => { if (v.reported.tag === 'task') controller.abort(); } },
  });
  await assert.rejects(caller.callTool('issue_refund', refund('A2014'), { signal: controller.signal }), (e: unknown) => e instanceof CallCancelled);
  for (let i = 0; i < 100 && server.ledger().cancelled_tasks.length === 0; i += 1) await new Promise((r) => setTimeout(r, 20));
  assert.equal(server.ledger().cancelled_tasks.length, 1, 'the server saw the cancel');
  assert.equal(server.ledger().refunds.length, 0);
});

test('a call whose deadline passes during a poll sends tasks/cancel and does not wait for its answer', async () => {
  let cancelAnswered = false;
  let cancelled: string | undefined;
  const { caller, methods } = await setUp(['--task-work-ms', '5000', '--task-poll-interval-ms', '50'], [], {
    caller: { callTimeoutMs: 1000 },
    answer: (message, signal) => {
      if (message.method === 'tasks/get') return neverAnswered(signal);
      if (message.method !== 'tasks/cancel') return undefined;
      cancelled = String(message.params.taskId);
      // The server takes its time with the cancel; the call does not wait for it.
      return new Promise((resolve) => setTimeout(() => { cancelAnswered = true; resolve(rpcAnswer(message.id, {})); }, 1500));
    },
  });
  await assert.rejects(caller.callTool('issue_refund', refund('A2015')), (e: unknown) => e instanceof CallTimedOut);
  assert.equal(cancelAnswered, false, 'the call did not wait for the cancel');
  for (let i = 0; i < 100 && cancelled === undefined; i += 1) await new Promise((r) => setTimeout(r, 20));
  assert.equal(cancelled, methods('tasks/get')[0]?.params.taskId, 'tasks/cancel sent for the task');
});

test('a tasks/cancel the server does not answer is waited for at most 5 s, not the idle timeout', { timeout: 20_000 }, async () => {
  let cancelAborted = false;
  const { caller, verdicts } = await setUp(['--task-work-ms', '5000', '--task-poll-interval-ms', '50', '--task-ttl-ms', '300'], [], {
    answer: (message, signal) => {
      if (message.method !== 'tasks/cancel') return undefined;
      signal?.addEventListener('abort', () => { cancelAborted = true; }, { once: true });
      return neverAnswered(signal);
    },
  });
  await assert.rejects(caller.callTool('issue_refund', refund('A2016')), (e: unknown) => {
    assert.ok(e instanceof Escalated, String(e));
    assert.equal(e.escalation.reason, 'task-expired');
    return true;
  });
  assert.equal(verdicts.at(-1)?.verdict.cancelTask, true);
  assert.ok(cancelAborted, 'the unanswered cancel was given up');
});
