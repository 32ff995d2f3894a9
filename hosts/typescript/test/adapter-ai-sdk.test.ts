// The Vercel AI SDK (`ai` 7) adapter end to end: `generateText` with the SDK's
// own mock model (`MockLanguageModelV4` from `ai/test`, scripted per call, every
// prompt kept), the adapter's tools and stop condition, the real policy
// component, and the demo MCP server failing on each test's fault script. What
// the model saw is read from the prompts it was given; what was sent, from the
// fetch under the capturing one; what was applied, from the server's ledger.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult, LanguageModelV4StreamPart } from '@ai-sdk/provider';
import { generateText, simulateReadableStream, stepCountIs, streamText, type ModelMessage } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallTimedOut, Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type RetryingToolCallerOptions } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { retryingTools, stopOnEscalation } from '../src/adapters/ai-sdk.js';
import { DemoServer, type FaultRule } from './demo-server.js';

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
afterEach(async () => {
  for (const c of connections.splice(0)) await c.close();
  for (const s of servers.splice(0)) await s.stop();
});

let component: PolicyComponent | undefined;

/** The demo server on `faults`, a caller over the wrapper's connection (a
 *  recording fetch under the capturing one). */
async function setUp(faults: FaultRule[], options: RetryingToolCallerOptions = {}) {
  const server = await DemoServer.start({ faults, ledger: true });
  servers.push(server);
  const sent: string[] = [];
  const recording: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string' && init.body.includes('"tools/call"')) {
      sent.push((JSON.parse(init.body) as { params: { name: string } }).params.name);
    }
    return fetch(url, init);
  };
  const connection = McpConnection.http(server.url, { fetch: recording });
  connections.push(connection);
  component ??= await PolicyComponent.load();
  const instance = await component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(CONFIG).startRun('ADAPTER-AI');
  const lines: Array<Record<string, unknown>> = [];
  const sleeps: number[] = [];
  const caller = new RetryingToolCaller(connection, run, {
    entropy: new SplitMix64(3n), log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>),
    sleep: async (ms) => { sleeps.push(ms); }, ...options,
  });
  return { server, caller, run, sent, lines, sleeps };
}

const USAGE = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

const toolCall = (tool: string, args: Record<string, unknown>, id: string): LanguageModelV4GenerateResult => ({
  content: [{ type: 'tool-call', toolCallId: id, toolName: tool, input: JSON.stringify(args) }],
  finishReason: { unified: 'tool-calls', raw: undefined }, usage: USAGE, warnings: [],
});

const answer = (text: string): LanguageModelV4GenerateResult => ({
  content: [{ type: 'text', text }], finishReason: { unified: 'stop', raw: undefined }, usage: USAGE, warnings: [],
});

/** The mock model answering each call with the next of `script` (given the prompt so far); every prompt kept. */
function scripted(script: Array<(prompt: string) => LanguageModelV4GenerateResult>) {
  const prompts: string[] = [];
  const model = new MockLanguageModelV4({
    doGenerate: async (options: LanguageModelV4CallOptions) => {
      const prompt = JSON.stringify(options.prompt);
      prompts.push(prompt);
      const next = script[prompts.length - 1];
      assert.ok(next, `an unexpected model call (${prompts.length}): ${prompt}`);
      return next(prompt);
    },
  });
  return { model, prompts };
}

/** A model that calls `tool` with `args` once, then answers with what it was given. */
const callsOnce = (tool: string, args: Record<string, unknown>) =>
  scripted([() => toolCall(tool, args, 'call-1'), (prompt) => answer(`saw: ${prompt}`)]);

test('the tools are the server\'s, without the key argument the wrapper fills', async () => {
  const { caller } = await setUp([]);
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(3) });
  assert.ok(tools.issue_refund && tools.lookup_order, Object.keys(tools).join(', '));
  const schema = (tools.issue_refund.inputSchema as { jsonSchema: { properties: Record<string, unknown>; required: string[] } }).jsonSchema;
  assert.deepEqual(Object.keys(schema.properties).sort(), ['amount_paise', 'order_id']);
  assert.ok(!schema.required.includes('idempotency_key'));
  assert.equal(stopWhen.length, 2);
  assert.equal(stopWhen[0], stopOnEscalation);
});

test('a transient failure is invisible: the model sees the order, not the 503', async () => {
  const { caller, sent } = await setUp([{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503, body: 'upstream busy' } }]);
  const { model, prompts } = callsOnce('lookup_order', { order_id: 'A1' });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const result = await generateText({ model, tools, stopWhen, prompt: 'where is order A1?' });
  assert.deepEqual(sent, ['lookup_order', 'lookup_order'], 'the 503 was retried once');
  assert.equal(prompts.length, 2);
  assert.match(prompts[1], /Hansini/, 'the model got the order');
  assert.doesNotMatch(prompts[1], /503|upstream busy|error/i, 'the failure reached the model');
  assert.match(result.text, /^saw: /);
});

test('a replan reaches the model as a tool-error part, and the loop goes on', async () => {
  const { caller, sent } = await setUp([
    { tool: 'lookup_order', call: 1, fault: { kind: 'json-rpc-error', code: -32602, message: 'order_id must look like A1, not a1' } },
  ]);
  const { model, prompts } = scripted([
    () => toolCall('lookup_order', { order_id: 'a1' }, 'call-1'),
    () => toolCall('lookup_order', { order_id: 'A1' }, 'call-2'),
    (prompt) => answer(`saw: ${prompt}`),
  ]);
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const result = await generateText({ model, tools, stopWhen, prompt: 'look up a1' });
  assert.deepEqual(sent, ['lookup_order', 'lookup_order'], 'the replan was not retried by the wrapper; the model called again');
  assert.match(prompts[1], /order_id must look like A1, not a1/, 'the policy\'s message reached the model');
  assert.match(prompts[1], /error-text/, 'not shown to the model as a tool error');
  assert.equal(result.steps[0].content.filter((p) => p.type === 'tool-error').length, 1);
  assert.match(result.text, /Hansini/);
});

test('an escalation stops the loop: generateText rejects with Escalated, the model is not called again', async () => {
  const { caller, sent } = await setUp([{ tool: 'issue_refund', fault: { kind: 'http', status: 403, body: 'refunds above 5000 rupees need a person' } }]);
  const { model, prompts } = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 900_000 });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const error = await generateText({ model, tools, stopWhen, prompt: 'refund A1' }).then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof Escalated, `generateText ended with ${String(error)}`);
  assert.equal(error.reason, 'permission-denied');
  assert.match(error.note, /refunds above 5000 rupees need a person/);
  assert.equal(prompts.length, 1, 'the model was called again after the escalation');
  assert.deepEqual(sent, ['issue_refund']);
});

test('without stopOnEscalation the AI SDK shows the escalation to the model (why the adapter returns stopWhen)', async () => {
  const { caller } = await setUp([{ tool: 'issue_refund', fault: { kind: 'http', status: 403, body: 'refunds above 5000 rupees need a person' } }]);
  const { model, prompts } = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 900_000 });
  const { tools } = await retryingTools(caller);
  await generateText({ model, tools, stopWhen: stepCountIs(5), prompt: 'refund A1' });
  assert.equal(prompts.length, 2);
  assert.match(prompts[1], /need a person/);
});

test('a stopped call stops the loop too (CallTimedOut), not shown to the model', async () => {
  const { caller } = await setUp([{ tool: 'lookup_order', fault: { kind: 'timeout-after-apply', 'delay-ms': 3000 } }], { callTimeoutMs: 300 });
  const { model, prompts } = callsOnce('lookup_order', { order_id: 'A1' });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const error = await generateText({ model, tools, stopWhen, prompt: 'where is A1?' }).then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof CallTimedOut, String(error));
  assert.equal(prompts.length, 1);
});

test('a keyed write leaves one effect: the retry after a lost answer resends the same key', async () => {
  const { caller, server, sent, lines } = await setUp([{ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1500 } }],
    { attemptTimeoutMs: 400 });
  const { model, prompts } = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  await generateText({ model, tools, stopWhen, prompt: 'refund A1' });
  assert.equal(sent.filter((t) => t === 'issue_refund').length, 2, 'the timed-out write was retried');
  const refunds = server.ledger().refunds;
  assert.equal(refunds.length, 1, JSON.stringify(refunds));
  const keys = lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'issue_refund').map((l) => l.key);
  assert.ok(keys.length >= 2 && keys.every((k) => k === refunds[0].idempotency_key), JSON.stringify(keys));
  assert.doesNotMatch(prompts[1], /timeout|timed out/i);
});

test('the capture is wired: a 429\'s Retry-After is waited', async () => {
  const { caller, sent, sleeps, lines } = await setUp([
    { tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 429, headers: [['retry-after', '2']], body: 'slow down' } },
  ]);
  const { model } = callsOnce('lookup_order', { order_id: 'A1' });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  await generateText({ model, tools, stopWhen, prompt: 'where is A1?' });
  assert.deepEqual(sent, ['lookup_order', 'lookup_order']);
  assert.ok(sleeps.some((ms) => ms >= 2000), `no wait of Retry-After's 2 s: ${JSON.stringify(sleeps)}`);
  assert.equal(lines.find((l) => l.event === 'agent_retry.attempt' && l.outcome === 'http 429')?.hint_ms, 2000);
});

test('the capture is wired: a 503 with x-should-retry: false is not retried, and the loop stops', async () => {
  const { caller, sent } = await setUp([
    { tool: 'lookup_order', fault: { kind: 'http', status: 503, headers: [['x-should-retry', 'false']], body: 'down for maintenance' } },
  ]);
  const { model, prompts } = callsOnce('lookup_order', { order_id: 'A1' });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const error = await generateText({ model, tools, stopWhen, prompt: 'where is A1?' }).then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof Escalated, String(error));
  assert.equal(error.reason, 'retry-forbidden');
  assert.deepEqual(sent, ['lookup_order']);
  assert.equal(prompts.length, 1);
});

test('an approval is the AI SDK\'s toolApproval: nothing is sent until approved, then one refund', async () => {
  const { caller, server, sent } = await setUp([]);
  const { model } = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const messages: ModelMessage[] = [{ role: 'user', content: 'refund A1' }];
  const first = await generateText({ model, tools, stopWhen, toolApproval: { issue_refund: 'user-approval' }, messages });
  const request = first.content.find((p) => p.type === 'tool-approval-request');
  assert.ok(request, JSON.stringify(first.content));
  assert.deepEqual(sent, [], 'the call was sent before it was approved');
  assert.equal(server.ledger().refunds.length, 0);
  messages.push(...first.responseMessages,
    { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: request.approvalId, approved: true }] });
  await generateText({ model, tools, stopWhen, toolApproval: { issue_refund: 'user-approval' }, messages });
  assert.deepEqual(sent, ['issue_refund']);
  assert.equal(server.ledger().refunds.length, 1);
});

/** Counts how many `callTool`s of `caller` run at once. */
function watchOverlap(caller: RetryingToolCaller): { most: () => number } {
  const original = caller.callTool.bind(caller);
  let active = 0;
  let most = 0;
  caller.callTool = async (...args: Parameters<RetryingToolCaller['callTool']>) => {
    active += 1;
    most = Math.max(most, active);
    try {
      return await original(...args);
    } finally {
      active -= 1;
    }
  };
  return { most: () => most };
}

test('tool calls the AI SDK runs together go through the caller one at a time, each its own step', async () => {
  const { caller, lines } = await setUp([{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503, body: 'busy' } }]);
  const overlap = watchOverlap(caller);
  const both: LanguageModelV4GenerateResult = {
    ...toolCall('lookup_order', { order_id: 'A1' }, 'call-1'),
    content: [...toolCall('lookup_order', { order_id: 'A1' }, 'call-1').content, ...toolCall('list_refunds', { order_id: 'A1' }, 'call-2').content],
  };
  const { model, prompts } = scripted([() => both, (prompt) => answer(`saw: ${prompt}`)]);
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  await generateText({ model, tools, stopWhen, prompt: 'A1?' });
  assert.equal(overlap.most(), 1, 'two calls of one caller ran at once');
  assert.match(prompts[1], /Hansini/);
  assert.match(prompts[1], /refunds/);
  const steps = lines.filter((l) => l.event === 'agent_retry.attempt' && l.step !== null).map((l) => `${String(l.tool)}@${String(l.step)}`);
  assert.deepEqual([...new Set(steps)], ['lookup_order@1', 'list_refunds@2']);
});

test('streamText: an escalation ends the stream with Escalated, the model is not called again', async () => {
  const { caller, sent } = await setUp([{ tool: 'issue_refund', fault: { kind: 'http', status: 403, body: 'refunds above 5000 rupees need a person' } }]);
  let calls = 0;
  const model = new MockLanguageModelV4({
    doStream: async () => {
      calls += 1;
      const chunks: LanguageModelV4StreamPart[] = calls === 1
        ? [{ type: 'tool-call', toolCallId: 'call-1', toolName: 'issue_refund', input: JSON.stringify({ order_id: 'A1', amount_paise: 900_000 }) },
          { type: 'finish', finishReason: { unified: 'tool-calls', raw: undefined }, usage: USAGE }]
        : [{ type: 'text-start', id: 't' }, { type: 'text-delta', id: 't', delta: 'retrying' }, { type: 'text-end', id: 't' },
          { type: 'finish', finishReason: { unified: 'stop', raw: undefined }, usage: USAGE }];
      return { stream: simulateReadableStream({ chunks }) };
    },
  });
  const { tools, stopWhen } = await retryingTools(caller, { stopWhen: stepCountIs(5) });
  const result = streamText({ model, tools, stopWhen, prompt: 'refund A1', onError: () => undefined });
  const error = await result.text.then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof Escalated, `the stream ended with ${String(error)}`);
  assert.equal(error.reason, 'permission-denied');
  assert.equal(calls, 1, 'the model was called again after the escalation');
  assert.deepEqual(sent, ['issue_refund']);
});
