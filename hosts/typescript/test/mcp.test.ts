// The MCP wrapper end to end: the policy component (jco), the official MCP
// TypeScript SDK client, and the demo MCP server (`target/release/agent-retry
// serve`, demo-server.ts) over streamable HTTP on 127.0.0.1, failing on each
// test's fault script (demo-server/src/faults.rs). What the server applied is
// read from its ledger; what the client sent, and when, is recorded by the
// fetch under the capturing one (`posts`).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import type { Outcome } from '../src/mcp/caller.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, locateComponent } from '../src/component.js';
import { CONTRACT_VERSION } from '../src/contract.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallCancelled, CallTimedOut, Escalated, RunMisuse } from '../src/errors.js';
import { Integrity, LivePolicy } from '../src/live.js';
import { RetryingToolCaller, createCapturingFetch, type RetryingToolCallerOptions, type StatusCheckRequest } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { DemoServer, type Fault, type FaultRule } from './demo-server.js';
import { isAddedEventLine } from './event-lines.js';

// Small delays so the tests are quick; tools are resolved from the server's MCP
// annotations (no `tools` entries), as a host that knows nothing else would.
const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };

let server: DemoServer;
let client: Client;
/** Every tools/call the client sent, in order: the tool, when (performance.now()), its arguments. */
let posts: Array<{ tool: string; at: number; arguments: Record<string, unknown> }>;
/** What a test started, ended after it: its clients first, then its servers. */
const clients: Client[] = [];
const servers: Array<{ stop(): Promise<void> }> = [];
let lines: Array<Record<string, unknown>>;
/** Every line logged, the pseudo-calls' (`tools/list`, `initialize`: step null) too. */
let allLines: Array<Record<string, unknown>>;

/** Logs into `allLines`, and the model's calls' lines (and other events) into `lines`. */
const collect = (line: string) => {
  const parsed = JSON.parse(line) as Record<string, unknown>;
  if (isAddedEventLine(parsed)) return; // the 0.8 event lines: not what these tests read
  allLines.push(parsed);
  if (parsed.step !== null) lines.push(parsed);
};

beforeEach(() => {
  posts = [];
  lines = [];
  allLines = [];
});

afterEach(async () => {
  for (const open of clients.splice(0)) await open.close();
  for (const running of servers.splice(0)) await running.stop();
});

/** Records a tools/call the client sends (under the capturing fetch: what goes out, when), then sends it. */
const recordingFetch: FetchLike = async (url, init) => {
  if ((init?.method ?? 'GET').toUpperCase() === 'POST' && typeof init?.body === 'string') {
    let message: { method?: string; params?: { name?: string; arguments?: Record<string, unknown> } } | undefined;
    try {
      message = JSON.parse(init.body) as typeof message;
    } catch {
      message = undefined;
    }
    if (message?.method === 'tools/call') posts.push({ tool: message.params?.name ?? '', at: performance.now(), arguments: message.params?.arguments ?? {} });
  }
  return fetch(url, init);
};

/** Connects `client` to the MCP server at `url`. */
async function connect(url: string): Promise<void> {
  client = new Client({ name: 'agent-retry-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: createCapturingFetch(recordingFetch) }));
  clients.push(client);
}

/** Starts the demo server failing on these rules (its ledger in a file) and connects `client` to it. */
async function serve(...faults: FaultRule[]): Promise<void> {
  server = await DemoServer.start({ faults, ledger: true });
  servers.push(server);
  await connect(server.url);
}

const postsOf = (tool: string) => posts.filter((p) => p.tool === tool);
/** The refunds the server applied, as [order, paise]. */
const refunds = () => server.ledger().refunds.map((r) => [r.order_id, r.amount_paise]);
const http = (status: number, body = '', headers: Array<[string, string]> = []): Fault => ({ kind: 'http', status, headers, body });
const toolText = (text: string, structured?: unknown): Fault => ({ kind: 'tool-text', text, ...(structured === undefined ? {} : { structured }) });
const timeoutAfterApply = (ms: number): Fault => ({ kind: 'timeout-after-apply', 'delay-ms': ms });

async function newCaller(options: RetryingToolCallerOptions = {}, runId = 'CASE-5016'): Promise<RetryingToolCaller> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(CONFIG).startRun(runId);
  return new RetryingToolCaller(client, run, { entropy: new SplitMix64(3n), log: collect, ...options });
}

const textOf = (result: CallToolResult) => result.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');

test('a 503 then success is retried and the caller sees only the success', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') });
  const caller = await newCaller();
  const result = await caller.callTool('lookup_order', { order_id: 'A1' });
  assert.ok(!result.isError);
  assert.match(textOf(result), /"order_id":"A1"/);
  assert.equal(postsOf('lookup_order').length, 2);
  const report = caller.run.report();
  assert.equal(report.retries, 1);
  assert.deepEqual(report.statuses, [{ status: 503, count: 1 }]);
  assert.deepEqual(lines.map((l) => [l.attempt, l.outcome, l.class, l.action]), [
    [1, 'http 503', 'transient', 'retry'],
    [2, 'success', 'success', 'succeed'],
  ]);
});

test('a 429 with Retry-After waits at least the hint', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: http(429, 'slow down', [['retry-after', '1']]) });
  const result = await (await newCaller()).callTool('lookup_order', { order_id: 'A1' });
  assert.ok(!result.isError);
  const sent = postsOf('lookup_order');
  assert.equal(sent.length, 2);
  assert.ok(sent[1].at - sent[0].at >= 1000, `the retry came ${sent[1].at - sent[0].at} ms later, before Retry-After allowed it`);
  assert.equal(lines[0].class, 'throttled');
  assert.ok((lines[0].delay_ms as number) >= 1000);
});

test('a 400 is not retried and the model sees the error', async () => {
  await serve({ tool: 'issue_refund', call: 1, fault: http(400, 'amount must be an integer number of paise') });
  const result = await (await newCaller()).callTool('issue_refund', { order_id: 'A1', amount_paise: 12 });
  assert.ok(result.isError);
  assert.match(textOf(result), /HTTP 400/);
  assert.match(textOf(result), /integer number of paise/);
  assert.equal(postsOf('issue_refund').length, 1);
  assert.deepEqual(refunds(), []);
});

test('an isError result is not retried and replans', async () => {
  // A read whose tool refuses the arguments with an `isError` result.
  await serve({ tool: 'check_refund_policy', fault: toolText('amount must be at most 5000 paise, got 9000') });
  const caller = await newCaller();
  const result = await caller.callTool('check_refund_policy', { order_id: 'A1', amount_paise: 9000 });
  assert.ok(result.isError);
  assert.match(textOf(result), /at most 5000 paise/);
  assert.equal(postsOf('check_refund_policy').length, 1);
  assert.equal(caller.run.report().replans, 1);
});

test('an empty result is shown to the model as an error', async () => {
  await serve({ tool: 'lookup_order', when: { order_id: 'A9' }, fault: { kind: 'empty' } });
  const result = await (await newCaller()).callTool('lookup_order', { order_id: 'A9' });
  assert.ok(result.isError);
  assert.match(textOf(result), /empty/);
  assert.equal(postsOf('lookup_order').length, 1);
});

test('a 403 escalates at once with the body in the note', async () => {
  await serve({ tool: 'issue_refund', call: 1, fault: http(403, 'refunds above 5000 rupees need a person') });
  const caller = await newCaller();
  await assert.rejects(caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 600000 }), (e: unknown) => {
    assert.ok(e instanceof Escalated);
    assert.equal(e.reason, 'permission-denied');
    assert.match(e.note, /refunds above 5000 rupees need a person/);
    assert.equal(e.tool, 'issue_refund');
    return true;
  });
  // The scripted HTTP 403, not the tool's own refusal of the amount.
  assert.deepEqual(lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => l.outcome), ['http 403']);
  assert.equal(postsOf('issue_refund').length, 1);
  assert.deepEqual(refunds(), []);
});

test('a keyed write that timed out is resent with the same key and applied once', async () => {
  // The server applies the refund but answers after the client gave up.
  await serve({ tool: 'issue_refund', call: 1, fault: timeoutAfterApply(1000) });
  const caller = await newCaller({ attemptTimeoutMs: 300 });
  const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 });
  assert.ok(!result.isError);
  const key = caller.run.instance.deriveIdempotencyKey('CASE-5016', 'step-1');
  assert.deepEqual(postsOf('issue_refund').map((p) => p.arguments.idempotency_key), [key, key]);
  assert.deepEqual(server.ledger().refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, key]]);
});

test('a key the application put in the arguments is kept, sent unchanged with every attempt', async () => {
  // The first attempt is applied but answered too late: the retry must carry the application's key.
  await serve({ tool: 'issue_refund', call: 1, fault: timeoutAfterApply(1000) });
  const caller = await newCaller({ attemptTimeoutMs: 300 });
  const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500, idempotency_key: 'mine-1' });
  assert.ok(!result.isError, textOf(result));
  assert.deepEqual(postsOf('issue_refund').map((p) => p.arguments.idempotency_key), ['mine-1', 'mine-1']);
  assert.deepEqual(server.ledger().refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, 'mine-1']]);
  // The policy was told the key sent: every attempt's line names it.
  const attempts = lines.filter((l) => l.event === 'agent_retry.attempt');
  assert.equal(attempts.length, 2);
  assert.deepEqual(attempts.map((l) => l.key), ['mine-1', 'mine-1']);
});

test('a given key the policy cannot be told (empty, over 256 bytes, not a string) is still sent unchanged', async () => {
  await serve();
  const caller = await newCaller();
  const fits = 'é'.repeat(128); // 256 UTF-8 bytes: the call's key
  const given: unknown[] = ['', 'é'.repeat(128) + 'x', 42, fits];
  for (const key of given) await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 100, idempotency_key: key });
  // Never replaced: the server decides what the value means; the policy counts such a call as an unkeyed write.
  assert.deepEqual(postsOf('issue_refund').map((p) => p.arguments.idempotency_key), given);
  const derived = [1, 2, 3, 4].map((step) => caller.run.instance.deriveIdempotencyKey('CASE-5016', `step-${step}`));
  assert.ok(!postsOf('issue_refund').some((p) => derived.includes(p.arguments.idempotency_key as string)));
});

test('a key given as undefined or null is none: the derived key is sent', async () => {
  await serve();
  const caller = await newCaller();
  for (const key of [undefined, null]) {
    const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 100, idempotency_key: key });
    assert.ok(!result.isError, textOf(result));
  }
  const derived = [1, 2].map((step) => caller.run.instance.deriveIdempotencyKey('CASE-5016', `step-${step}`));
  assert.deepEqual(postsOf('issue_refund').map((p) => p.arguments.idempotency_key), derived);
});

const NOTE = 'refund of 700 paise approved';

test('an unkeyed write that timed out is checked, not resent', async () => {
  // record_note takes no idempotency key.
  await serve({ tool: 'record_note', call: 1, fault: timeoutAfterApply(1000) });
  const checks: StatusCheckRequest[] = [];
  const noteListed = async (request: StatusCheckRequest) => {
    checks.push(request);
    await new Promise((resolve) => setTimeout(resolve, 800)); // let the slow first attempt finish on the server
    const listed = (await request.client.callTool({ name: 'list_notes', arguments: { order_id: request.arguments.order_id } })) as CallToolResult;
    const { notes } = JSON.parse(textOf(listed)) as { notes: Array<{ text: string }> };
    return notes.some((note) => note.text === request.arguments.text) ? 'found' as const : 'absent' as const;
  };
  const caller = await newCaller({ attemptTimeoutMs: 300, statusCheck: noteListed });
  const result = await caller.callTool('record_note', { order_id: 'A1', text: NOTE });
  assert.ok(!result.isError);
  assert.match(textOf(result), /already applied/);
  assert.equal(checks.length, 1);
  assert.equal(checks[0].idempotencyKey, undefined);
  assert.equal(postsOf('record_note').length, 1);
  assert.deepEqual(server.ledger().notes.map((n) => [n.order_id, n.text]), [['A1', NOTE]]);
  assert.equal(caller.run.report().statusChecks, 1);
});

test('an unkeyed write with no status check escalates instead of resending', async () => {
  await serve({ tool: 'record_note', call: 1, fault: timeoutAfterApply(1000) });
  const caller = await newCaller({ attemptTimeoutMs: 300 });
  await assert.rejects(caller.callTool('record_note', { order_id: 'A1', text: NOTE }),
    (e: unknown) => e instanceof Escalated && e.reason === 'status-unknown');
  assert.equal(postsOf('record_note').length, 1);
});

test('a server that goes away is retried then escalated', async () => {
  await serve();
  const caller = await newCaller();
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  await server.stop(); // the process is gone: nothing listens on its port
  await assert.rejects(caller.callTool('lookup_order', { order_id: 'A2' }),
    (e: unknown) => e instanceof Escalated && e.reason === 'call-attempts-spent');
  // 4 attempts per call by default. The first may reuse a kept-alive socket the
  // server closed (a reset); after that nobody listens (refused).
  const outcomes = lines.slice(1).map((l) => l.outcome);
  assert.equal(outcomes.length, 4);
  assert.ok(outcomes.every((o) => o === 'transport connection-reset' || o === 'transport connection-refused'), outcomes.join());
  assert.equal(outcomes[3], 'transport connection-refused');
});

test('retries wait the policy delay', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: http(502) }, { tool: 'lookup_order', call: 2, fault: http(504) });
  assert.ok(!(await (await newCaller()).callTool('lookup_order', { order_id: 'A1' })).isError);
  const sent = postsOf('lookup_order');
  const delays = lines.filter((l) => l.action === 'retry').map((l) => l.delay_ms as number);
  assert.equal(sent.length, 3);
  assert.equal(delays.length, 2);
  for (let i = 0; i < 2; i++) assert.ok(sent[i + 1].at - sent[i].at >= delays[i] - 5);
});

// Upstream failures that a tool relays as an `isError` result: the MCP server
// answers HTTP 200 and no upstream status or header reaches the client; the
// policy reads the text and the structured content the wrapper passes on.

/** The outcomes the wrapper reported on the single path (`recordSuccess`,
 *  `recordEmptyResult`, `recordFailure`, `recordStatusCheck`), with the
 *  attempt each reported. */
function recordedWith<T>(caller: RetryingToolCaller, as: (attempt: number, outcome: Outcome) => T): T[] {
  const seen: T[] = [];
  const pseudo = pseudoCallIds(caller);
  const run = caller.run;
  const success = run.recordSuccess.bind(run);
  run.recordSuccess = (callId, attempt, now) => {
    if (!pseudo.has(callId)) seen.push(as(attempt, { tag: 'success' }));
    return success(callId, attempt, now);
  };
  const empty = run.recordEmptyResult.bind(run);
  run.recordEmptyResult = (callId, attempt, detail, now) => {
    if (!pseudo.has(callId)) seen.push(as(attempt, { tag: 'empty-result', val: detail }));
    return empty(callId, attempt, detail, now);
  };
  const failure = run.recordFailure.bind(run);
  run.recordFailure = (callId, attempt, failed, left, now, entropy) => {
    if (!pseudo.has(callId)) seen.push(as(attempt, { tag: 'failure', val: structuredClone(failed) }));
    return failure(callId, attempt, failed, left, now, entropy);
  };
  const checked = run.recordStatusCheck.bind(run);
  run.recordStatusCheck = (callId, attempt, found, left, now, entropy) => {
    if (!pseudo.has(callId)) seen.push(as(attempt, { tag: 'status-check', val: found }));
    return checked(callId, attempt, found, left, now, entropy);
  };
  return seen;
}

/** The outcomes the wrapper recorded, as the component received them. */
function recordedOutcomes(caller: RetryingToolCaller): Outcome[] {
  return recordedWith(caller, (_attempt, outcome) => outcome);
}

/** The ids of the pseudo-calls (`initialize`, `tools/list`) the caller begins from now on. */
function pseudoCallIds(caller: RetryingToolCaller): Set<number> {
  const ids = new Set<number>();
  const run = caller.run;
  const begin = run.beginCall.bind(run);
  run.beginCall = (server, tool, key, hints, now) => {
    const start = begin(server, tool, key, hints, now);
    if ((tool === 'initialize' || tool === 'tools/list') && start.admitted) ids.add(start.callId);
    return start;
  };
  return ids;
}

test('a relayed "HTTP 503" in a tool error is retried and the model sees only the success', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: toolText('upstream returned HTTP 503 Service Unavailable') });
  const caller = await newCaller();
  const outcomes = recordedOutcomes(caller);
  const result = await caller.callTool('lookup_order', { order_id: 'T-7' });
  assert.ok(!result.isError);
  assert.match(textOf(result), /"order_id":"T-7"/);
  assert.equal(postsOf('lookup_order').length, 2);
  assert.deepEqual(lines.map((l) => [l.attempt, l.outcome, l.class, l.action]), [
    [1, 'tool error', 'transient', 'retry'],
    [2, 'success', 'success', 'succeed'],
  ]);
  // The wrapper read no status itself: tool-error(none), the text as the body.
  assert.deepEqual(outcomes[0], {
    tag: 'failure',
    val: {
      kind: { tag: 'tool-error', val: undefined }, headers: '', body: 'upstream returned HTTP 503 Service Unavailable', structuredContent: undefined,
      sessionIdSent: false, delivery: 'answer-started',
    },
  });
  assert.equal(caller.run.report().retries, 1);
});

test('a relayed rate limit with "try again in 1s" waits at least 1 s', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: toolText('Rate limit reached for gpt-4o. Please try again in 1s.') });
  const result = await (await newCaller()).callTool('lookup_order', { order_id: 'T-7' });
  assert.ok(!result.isError);
  const sent = postsOf('lookup_order');
  assert.equal(sent.length, 2);
  assert.ok(sent[1].at - sent[0].at >= 1000, `the retry came ${sent[1].at - sent[0].at} ms later, before the hint allowed it`);
  assert.equal(lines[0].class, 'throttled');
  assert.equal(lines[0].hint_ms, 1000);
  assert.ok((lines[0].delay_ms as number) >= 1000);
});

test('a relayed "403 Forbidden" escalates as permission-denied and is not shown to the model', async () => {
  // A keyed write relaying its upstream's refusal.
  await serve({ tool: 'issue_refund', call: 1, fault: toolText('403 Forbidden: Resource not accessible by integration') });
  const caller = await newCaller();
  let shown: CallToolResult | undefined;
  await assert.rejects((async () => { shown = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 }); })(), (e: unknown) => {
    assert.ok(e instanceof Escalated, String(e));
    assert.equal(e.reason, 'permission-denied');
    assert.match(e.note, /Resource not accessible by integration/);
    return true;
  });
  assert.equal(shown, undefined);
  assert.equal(postsOf('issue_refund').length, 1);
  assert.deepEqual(refunds(), []);
  assert.deepEqual([lines[0].class, lines[0].action, lines[0].escalation], ['permission', 'escalate', 'permission-denied']);
  assert.equal(caller.run.report().escalation, 'permission-denied');
});

test("a provider's overloaded_error in structuredContent is throttled and retried", async () => {
  // Keys in the order the demo server sends them (serde_json sorts them).
  const overloaded = toolText('the model call failed', { error: { message: 'Overloaded', type: 'overloaded_error' } });
  await serve({ tool: 'lookup_order', call: 1, fault: overloaded });
  const caller = await newCaller();
  const outcomes = recordedOutcomes(caller);
  const result = await caller.callTool('lookup_order', { order_id: 'T-8' });
  assert.ok(!result.isError);
  assert.match(textOf(result), /T-8/);
  assert.equal(postsOf('lookup_order').length, 2);
  assert.deepEqual([lines[0].class, lines[0].action], ['throttled', 'retry']);
  const failure = outcomes[0].tag === 'failure' ? outcomes[0].val : undefined;
  assert.equal(failure?.structuredContent, '{"error":{"message":"Overloaded","type":"overloaded_error"}}');
  assert.equal(failure?.body, 'the model call failed');
});

test('"Cannot reserve 429 items" is the tool refusing the arguments: replanned, not throttled', async () => {
  // A keyed write whose tool refuses these arguments, every time they are sent.
  await serve({ tool: 'issue_refund', when: { amount_paise: 429 }, fault: toolText('Cannot reserve 429 items: only 200 left in stock') });
  const caller = await newCaller();
  const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 429 });
  assert.ok(result.isError);
  assert.match(textOf(result), /Cannot reserve 429 items: only 200 left in stock/);
  assert.equal(postsOf('issue_refund').length, 1);
  assert.deepEqual(lines.map((l) => [l.class, l.action, l.delay_ms]), [['deterministic', 'replan', null]]);
  assert.equal(caller.run.report().replans, 1);
  // The model changes its arguments; the next call goes through.
  assert.ok(!(await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 200 })).isError);
  assert.deepEqual(refunds(), [['A1', 200]]);
});

test("a JSON-RPC error's data reaches the policy as structured content", async () => {
  // -32603 alone is transient; its data says the upstream refused with a 403.
  const data = { error: { status: 403, message: 'Resource not accessible by integration' } };
  await serve({ tool: 'issue_refund', call: 1, fault: { kind: 'json-rpc-error', code: -32603, message: 'Internal error', data } });
  const caller = await newCaller();
  const outcomes = recordedOutcomes(caller);
  await assert.rejects(caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 100 }),
    (e: unknown) => e instanceof Escalated && e.reason === 'permission-denied');
  assert.equal(postsOf('issue_refund').length, 1);
  assert.deepEqual(refunds(), []);
  assert.deepEqual(outcomes[0], {
    tag: 'failure',
    val: {
      kind: { tag: 'protocol-error', val: -32603 }, headers: '', body: 'Internal error',
      // serde_json writes the server's object with its keys sorted.
      structuredContent: '{"error":{"message":"Resource not accessible by integration","status":403}}',
      sessionIdSent: false, delivery: 'answer-started',
    },
  });
});

test('a tool error\'s text blocks are joined with newlines for the policy', async () => {
  const fake = {
    listTools: async () => ({ tools: [{ name: 'lookup', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } }] }),
    callTool: async () => ({
      content: [{ type: 'text', text: 'upstream said:' }, { type: 'image', data: '', mimeType: 'image/png' }, { type: 'text', text: 'quota exceeded' }],
      structuredContent: { error: { status: 503 } },
      isError: true,
    }),
  } as unknown as Client;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const caller = new RetryingToolCaller(fake, instance.loadPolicy({ ...CONFIG, 'max-attempts-per-call': 1 }).startRun('r'),
    { log: () => undefined, sleep: async () => undefined });
  const outcomes = recordedOutcomes(caller);
  await caller.callTool('lookup').catch(() => undefined);
  assert.deepEqual(outcomes[0], {
    tag: 'failure',
    val: {
      kind: { tag: 'tool-error', val: undefined }, headers: '', body: 'upstream said:\nquota exceeded', structuredContent: '{"error":{"status":503}}',
      sessionIdSent: false, delivery: 'answer-started',
    },
  });
});

test('the log names escalation reasons as the contract does (run-steps-spent)', async () => {
  await serve({ tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') });
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  // Two steps: the `tools/list` pseudo-call, then the one attempt.
  const run = instance.loadPolicy({ ...CONFIG, 'max-steps-per-run': 2 }).startRun('CASE-5017');
  const caller = new RetryingToolCaller(client, run, { log: collect });
  await assert.rejects(caller.callTool('lookup_order', { order_id: 'A1' }), (e: unknown) => e instanceof Escalated && e.reason === 'run-steps-spent');
  assert.deepEqual(lines.map((l) => [l.outcome, l.class, l.rule, l.action, l.escalation]),
    [['http 503', 'transient', 'http-status', 'escalate', 'run-steps-spent']]);
  // The run has ended: a further call is a misuse, not sent.
  await assert.rejects(caller.callTool('lookup_order', { order_id: 'A2' }),
    (e: unknown) => e instanceof RunMisuse && e.error.tag === 'run-ended' && e.error.val === 'run-steps-spent');
  assert.equal(postsOf('lookup_order').length, 1);
});

/** The attempt each report (`record-outcome`, `record-success`, `record-failure`) gave, with what it reported. */
function recordedAttempts(caller: RetryingToolCaller): Array<[number, string]> {
  return recordedWith(caller, (attempt, outcome): [number, string] =>
    [attempt, outcome.tag === 'status-check' ? `status-check ${outcome.val}` : outcome.tag]);
}

test('each outcome reports its attempt: 1, then each retry plan\'s; a status check the attempt it checked', async () => {
  await serve(
    { tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'lookup_order', call: 2, fault: http(503, 'again') },
    // An unkeyed write: a 503, then a timeout.
    { tool: 'record_note', call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'record_note', call: 2, fault: timeoutAfterApply(1000) },
  );
  const reader = await newCaller();
  const readAttempts = recordedAttempts(reader);
  assert.ok(!(await reader.callTool('lookup_order', { order_id: 'A1' })).isError);
  assert.deepEqual(readAttempts, [[1, 'failure'], [2, 'failure'], [3, 'success']]);
  assert.deepEqual(lines.map((l) => l.attempt), [1, 2, 3]);

  // An unkeyed write: a 503 and a timeout, each checked by a read (absent) before it is sent again.
  const writer = await newCaller({ attemptTimeoutMs: 300, statusCheck: async () => 'absent' });
  const writeAttempts = recordedAttempts(writer);
  lines = [];
  const result = await writer.callTool('record_note', { order_id: 'A2', text: 'refund of 300 paise approved' });
  assert.ok(!result.isError, JSON.stringify(lines));
  assert.deepEqual(writeAttempts, [[1, 'failure'], [1, 'status-check absent'], [2, 'failure'], [2, 'status-check absent'], [3, 'success']]);
  assert.equal(writer.run.report().statusChecks, 2);
});

/** The .wasm in force (the repository's build) and its SHA-256, computed here from its bytes. */
function componentInForce(): { wasm: string; sha256: string } {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  return { wasm, sha256: createHash('sha256').update(readFileSync(wasm)).digest('hex') };
}

test("every attempt line names the policy: by default the component's identity (contract version, .wasm digest)", async () => {
  const { sha256 } = componentInForce();
  const expected = `agent-retry:policy@${CONTRACT_VERSION} wasm ${sha256.slice(0, 12)}`;
  const component = await PolicyComponent.load();
  assert.equal(component.identity, expected);
  assert.equal(component.wasmSha256, sha256);
  assert.equal(component.contractVersion, CONTRACT_VERSION);
  await serve(
    { tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'issue_refund', call: 1, fault: http(403, 'refunds above 5000 rupees need a person') },
  );
  const caller = await newCaller();
  assert.equal(caller.run.instance.policyIdentity, expected);
  assert.equal(caller.policyIdentity, expected);
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  await assert.rejects(caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 600000 }), Escalated);
  assert.deepEqual(lines.map((l) => [l.action, l.policy]), [['retry', expected], ['succeed', expected], ['escalate', expected]]);
});

test('a wrapper given policyIdentity logs it on every attempt line, the admission escalation and a failed status check too', async () => {
  const identity = 'generation 7 (wasm 0123456789ab, config ba9876543210)';
  await serve(
    { tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'lookup_order', call: 2, fault: http(503, 'again') },
    { tool: 'record_note', call: 1, fault: timeoutAfterApply(1000) },
  );
  const caller = await newCaller({ policyIdentity: identity, attemptTimeoutMs: 300, statusCheck: async () => { throw new Error('the ledger is down'); } });
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  await assert.rejects(caller.callTool('record_note', { order_id: 'A1', text: NOTE }),
    (e: unknown) => e instanceof Escalated && e.reason === 'status-unknown');
  assert.deepEqual(lines.map((l) => [l.event, l.action ?? null]), [
    ['agent_retry.attempt', 'retry'], ['agent_retry.attempt', 'retry'], ['agent_retry.attempt', 'succeed'],
    ['agent_retry.attempt', 'check-status'], ['agent_retry.status_check_failed', null], ['agent_retry.attempt', 'escalate'],
  ]);
  assert.ok(lines.every((l) => l.policy === identity), JSON.stringify(lines.map((l) => l.policy)));

  // An escalation at admission (the run's steps spent) is an attempt line too.
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy({ ...CONFIG, 'max-steps-per-run': 2 }).startRun('CASE-5018'); // tools/list, then one call
  lines = [];
  const short = new RetryingToolCaller(client, run, { policyIdentity: identity, log: collect });
  assert.ok(!(await short.callTool('lookup_order', { order_id: 'A1' })).isError);
  await assert.rejects(short.callTool('lookup_order', { order_id: 'A2' }), Escalated);
  assert.deepEqual(lines.map((l) => [l.outcome, l.action, l.escalation, l.policy]),
    [['success', 'succeed', null, identity], ['not sent', 'escalate', 'run-steps-spent', identity]]);
});

test('policyIdentity must be a non-empty string', async () => {
  await serve();
  const run = (await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts() })).loadPolicy(CONFIG).startRun('CASE-5019');
  assert.throws(() => new RetryingToolCaller(client, run, { policyIdentity: '' }), TypeError);
  const notAString = { toString: () => 'generation 1' } as unknown as string;
  assert.throws(() => new RetryingToolCaller(client, run, { policyIdentity: notAString }), /non-empty string/);
});

test("a wrapper built with a LivePolicy's current identity logs it, and the next generation's after an update", async () => {
  // lookup_order's calls: a 503 then a success (generation 1), then two 503s (generation 2, two attempts per call).
  await serve(
    { tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'lookup_order', call: 3, fault: http(503, 'a') },
    { tool: 'lookup_order', call: 4, fault: http(503, 'b') },
  );
  const { wasm, sha256 } = componentInForce();
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-mcp-live-'));
  copyFileSync(wasm, join(dir, 'policy.wasm'));
  const config = (attempts: number) => JSON.stringify({ ...CONFIG, 'default-effect': 'read', 'max-attempts-per-call': attempts });
  writeFileSync(join(dir, 'policy.json'), config(4));
  const live = await LivePolicy.open({ wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity: Integrity.unchecked() },
    { log: () => {} });
  try {
    const callerFor = async (runId: string) => {
      const loaded = live.current();
      const run = (await loaded.component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) }))
        .loadPolicy(loaded.configJson).startRun(runId);
      return new RetryingToolCaller(client, run, { entropy: new SplitMix64(3n), log: collect, policyIdentity: loaded.identity.toString() });
    };
    const configDigest = (attempts: number) => createHash('sha256').update(config(attempts)).digest('hex').slice(0, 12);
    const first = `generation 1 (wasm ${sha256.slice(0, 12)}, config ${configDigest(4)})`;
    assert.equal(live.current().identity.toString(), first);
    assert.ok(!(await (await callerFor('CASE-5020')).callTool('lookup_order', { order_id: 'A1' })).isError);
    assert.deepEqual(lines.map((l) => [l.action, l.policy]), [['retry', first], ['succeed', first]]);

    writeFileSync(join(dir, 'policy.json'), config(2));
    await live.reload();
    const second = `generation 2 (wasm ${sha256.slice(0, 12)}, config ${configDigest(2)})`;
    assert.equal(live.current().identity.toString(), second);
    lines = [];
    await assert.rejects((await callerFor('CASE-5021')).callTool('lookup_order', { order_id: 'A1' }),
      (e: unknown) => e instanceof Escalated && e.reason === 'call-attempts-spent');
    assert.deepEqual(lines.map((l) => [l.action, l.policy]), [['retry', second], ['escalate', second]]);
  } finally {
    live.close();
  }
});

/** The attempt line's fields, in order: the same in the Rust, Python and Node hosts. */
const ATTEMPT_FIELDS = ['event', 'ts', 'run', 'policy', 'step', 'call', 'tool', 'attempt', 'key', 'outcome', 'class', 'rule', 'action',
  'delay_ms', 'hint_ms', 'escalation', 'reason'];

test('an attempt line and a not-sent line have the same fields, in order, with the step and the key sent', async () => {
  await serve({ tool: 'issue_refund', call: 1, fault: http(503, 'upstream unavailable', [['retry-after', '1']]) });
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy({ ...CONFIG, 'max-steps-per-run': 4 }).startRun('CASE-5022'); // tools/list is a step too
  const raw: string[] = [];
  const caller = new RetryingToolCaller(client, run, { entropy: new SplitMix64(3n), log: (line) => { if (!isAddedEventLine(line)) raw.push(line); }, sleep: async () => undefined });
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError); // step 1: no key
  assert.ok(!(await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 })).isError); // step 2: a 503, then sent again
  await assert.rejects(caller.callTool('issue_refund', { order_id: 'A2', amount_paise: 700 }), // step 3: the run's steps are spent
    (e: unknown) => e instanceof Escalated && e.reason === 'run-steps-spent');
  const parsed = raw.map((line) => JSON.parse(line) as Record<string, unknown>);
  for (const line of parsed) assert.deepEqual(Object.keys(line), ATTEMPT_FIELDS, JSON.stringify(line));

  const sent = postsOf('issue_refund').map((p) => p.arguments.idempotency_key);
  const key = run.instance.deriveIdempotencyKey('CASE-5022', 'step-2');
  assert.deepEqual(sent, [key, key]);
  assert.deepEqual(parsed.map((l) => [l.step, l.call, l.tool, l.attempt, l.key, l.outcome, l.action]), [
    [null, 1, 'tools/list', 1, null, 'success', 'succeed'], // the pseudo-call: no step of the model's
    [1, 2, 'lookup_order', 1, null, 'success', 'succeed'],
    [2, 3, 'issue_refund', 1, key, 'http 503', 'retry'],
    [2, 3, 'issue_refund', 2, key, 'success', 'succeed'],
    [3, null, 'issue_refund', 0, run.instance.deriveIdempotencyKey('CASE-5022', 'step-3'), 'not sent', 'escalate'],
  ]);
  const [, read, retried, , notSent] = parsed;
  assert.equal(read.hint_ms, null);
  assert.equal(retried.hint_ms, 1000);
  assert.ok((retried.delay_ms as number) >= 1000);
  assert.equal(retried.escalation, null);
  assert.deepEqual([notSent.class, notSent.rule, notSent.delay_ms, notSent.hint_ms, notSent.escalation],
    [null, null, null, null, 'run-steps-spent']);
  assert.equal(notSent.run, 'CASE-5022');
  assert.equal(notSent.tool, 'issue_refund');
  assert.equal(typeof notSent.ts, 'number');
});

test('the wrapper asks for a decision\'s words only when it needs them (always for a line, with log: null only for the model or a person)', async () => {
  const asked = (caller: RetryingToolCaller) => {
    const calls = { flat: 0, rich: 0, lastDecision: 0, escalation: 0 };
    const run = caller.run;
    for (const name of ['recordSuccess', 'recordFailure', 'recordEmptyResult', 'recordStatusCheck'] as const) {
      const original = run[name].bind(run) as (...a: unknown[]) => unknown;
      (run as unknown as Record<string, unknown>)[name] = (...a: unknown[]) => { calls.flat += 1; return original(...a); };
    }
    const last = run.lastDecision.bind(run);
    run.lastDecision = (callId) => { calls.lastDecision += 1; return last(callId); };
    return calls;
  };
  await serve(
    { tool: 'lookup_order', when: { order_id: 'A1' }, call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'lookup_order', when: { order_id: 'A2' }, call: 1, fault: http(503, 'upstream unavailable') },
    { tool: 'lookup_order', when: { order_id: 7 }, fault: http(400, 'order_id must be a string') },
    { tool: 'lookup_order', when: { order_id: 'A3' }, fault: http(403, 'needs approval') },
  );
  // With lines: every decision's line carries its reason (asked for with lastDecision), as before.
  const logged = await newCaller();
  const loggedCalls = asked(logged);
  assert.ok(!(await logged.callTool('lookup_order', { order_id: 'A1' })).isError);
  assert.deepEqual(loggedCalls, { flat: 3, rich: 0, lastDecision: 3, escalation: 0 }); // tools/list's success, the 503, the success
  assert.deepEqual(lines.map((l) => [l.outcome, l.class, l.rule, l.action, typeof l.reason]), [['http 503', 'transient', 'http-status', 'retry', 'string'], ['success', 'success', 'success', 'succeed', 'string']]);
  assert.ok((lines[0].reason as string).length > 0);

  // Without lines: a retry and a success need no words; a replan's message and an escalation do.
  lines = [];
  const quiet = await newCaller({ log: null });
  const quietCalls = asked(quiet);
  assert.ok(!(await quiet.callTool('lookup_order', { order_id: 'A2' })).isError);
  assert.deepEqual(quietCalls, { flat: 3, rich: 0, lastDecision: 0, escalation: 0 });
  const replanned = await quiet.callTool('lookup_order', { order_id: 7 });
  assert.ok(replanned.isError && textOf(replanned).length > 0);
  assert.equal(quietCalls.lastDecision, 1);
  await assert.rejects(quiet.callTool('lookup_order', { order_id: 'A3' }), (e: unknown) => e instanceof Escalated && e.reason === 'permission-denied' && /needs approval/.test(e.message + e.note));
  assert.equal(quietCalls.lastDecision, 2);
  assert.deepEqual(lines, [], 'log: null writes no line');
});

// A call the wrapper stops in its admission wait, before its first attempt, is
// ended in the run at attempt 1 (contract 0.7.0's abandon-call; a hostile review
// found attempt 0 told, refused by the run, and the call left open).
async function tokenStarvedCaller(account: string, refillMs: number) {
  // A burst of two (the wrapper's tools/list and the first call), then one token a `refillMs`.
  const budget = { 'account-budget': { 'account-id': account, capacity: 2, 'refill-interval-ms': refillMs, 'max-wait-ms': refillMs } };
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(1n) });
  return new RetryingToolCaller(client, instance.loadPolicy(budget).startRun(account), { entropy: new SplitMix64(2n), log: collect });
}

test('a call cancelled while it waits to be admitted is abandoned in the run at its first attempt', async () => {
  await serve();
  const caller = await tokenStarvedCaller('abandon-1', 60_000);
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 200);
  let stopped: unknown;
  await caller.callTool('lookup_order', { order_id: 'A2' }, { signal: controller.signal }).catch((e: unknown) => { stopped = e; });
  assert.ok(stopped instanceof CallCancelled, String(stopped));
  assert.equal(stopped.attemptsSent, 0);
  assert.equal(caller.run.report().abandonedCalls, 1);
  const callId = stopped.callId as number;
  assert.throws(() => caller.run.recordSuccess(callId, 1, 0), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'call-finished');
  assert.equal(postsOf('lookup_order').length, 1);
});

test('a call whose admission wait would pass the run limit is abandoned in the run at its first attempt', async () => {
  await serve();
  const caller = await tokenStarvedCaller('abandon-2', 3_600_000); // an hour's wait, past the 30-minute run limit
  assert.ok(!(await caller.callTool('lookup_order', { order_id: 'B1' })).isError);
  let stopped: unknown;
  await caller.callTool('lookup_order', { order_id: 'B2' }).catch((e: unknown) => { stopped = e; });
  assert.ok(stopped instanceof CallTimedOut, String(stopped));
  assert.deepEqual([stopped.cause, stopped.attemptsSent], ['run-timeout', 0]);
  assert.equal(caller.run.report().abandonedCalls, 1);
  assert.equal(postsOf('lookup_order').length, 1);
});
