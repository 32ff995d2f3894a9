// The OpenAI Agents SDK (JS) adapter end to end: the SDK's own `run()` with its
// scripted test model (`ScriptedModel`, which records every request), the
// adapter's function tools, the real policy component, and the demo MCP server
// failing on each test's fault script. What the model saw is read from the
// requests the scripted model recorded; what was sent, from the fetch under the
// capturing one; what was applied, from the server's ledger.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import { Agent, Runner, ToolCallError, setTracingDisabled } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall, modelResponder, type RecordedModelCall } from '@openai/agents/testing';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type RetryingToolCallerOptions } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { ToolReplan, findEscalation, retryingTools } from '../src/adapters/openai-agents.js';
import { DemoServer, type FaultRule } from './demo-server.js';

setTracingDisabled(true); // no exporter: nothing leaves the machine

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
afterEach(async () => {
  for (const c of connections.splice(0)) await c.close();
  for (const s of servers.splice(0)) await s.stop();
});

let component: PolicyComponent | undefined;

/** The demo server on `faults`, a caller over the wrapper's connection (a
 *  recording fetch under the capturing one), and the adapter's tools. */
async function setUp(faults: FaultRule[], options: RetryingToolCallerOptions & { config?: object } = {}) {
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
  const { config, ...callerOptions } = options;
  const run = instance.loadPolicy({ ...CONFIG, ...config }).startRun('ADAPTER-OAI');
  const lines: Array<Record<string, unknown>> = [];
  const sleeps: number[] = [];
  const caller = new RetryingToolCaller(connection, run, {
    entropy: new SplitMix64(3n), log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>),
    sleep: async (ms) => { sleeps.push(ms); }, ...callerOptions,
  });
  return { server, caller, run, sent, lines, sleeps };
}

/** Everything the model was given in one request, as text (its input items, tool outputs included). */
const inputText = (call: RecordedModelCall | undefined): string => JSON.stringify(call?.request.input ?? null);

/** A model that calls `tool` with `args` once, then answers with the last tool output it was given. */
function callsOnce(tool: string, args: Record<string, unknown>): ScriptedModel {
  return new ScriptedModel([
    [functionCall(tool, args, { callId: 'call-1' })],
    modelResponder((call) => [assistantMessage(`saw: ${inputText(call)}`)]),
  ]);
}

function agentWith(model: ScriptedModel, tools: Awaited<ReturnType<typeof retryingTools>>): Agent {
  return new Agent({ name: 'refund desk', instructions: 'help with orders', model, tools });
}

test('the tools are the server\'s, without the key argument the wrapper fills', async () => {
  const { caller } = await setUp([]);
  const tools = await retryingTools(caller);
  // The one MCP client: the wrapper's, on the v2 package the SDK itself installs.
  assert.equal(caller.connection?.sdk, 'v2');
  assert.equal(caller.connection?.connections, 1);
  const refund = tools.find((t) => t.name === 'issue_refund');
  assert.ok(refund, tools.map((t) => t.name).join(', '));
  const properties = (refund.parameters as { properties: Record<string, unknown> }).properties;
  assert.deepEqual(Object.keys(properties).sort(), ['amount_paise', 'order_id']);
  assert.equal(refund.strict, false);
  const only = await retryingTools(caller, { include: ['lookup_order'] });
  assert.deepEqual(only.map((t) => t.name), ['lookup_order']);
  await assert.rejects(retryingTools(caller, { include: ['no_such_tool'] }), /no_such_tool/);
  // Names the SDK rewrites to the same function name are refused, not silently shadowed.
  const described = (name: string) => ({ name, inputSchema: { type: 'object' as const, properties: {} } });
  await assert.rejects(retryingTools(caller, { tools: [described('orders.get'), described('orders_get')] }), /"orders\.get" and "orders_get"/);
  const given = await retryingTools(caller, { tools: [described('orders.get')] });
  assert.deepEqual(given.map((t) => t.name), ['orders_get']);
});

test('a transient failure is invisible: the model sees the order, not the 503', async () => {
  const { caller, sent } = await setUp([{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503, body: 'upstream busy' } }]);
  const model = callsOnce('lookup_order', { order_id: 'A1' });
  const result = await new Runner().run(agentWith(model, await retryingTools(caller)), 'where is order A1?');
  assert.deepEqual(sent, ['lookup_order', 'lookup_order'], 'the 503 was retried once');
  assert.equal(model.calls.length, 2);
  const seen = inputText(model.calls[1]);
  assert.match(seen, /Hansini/, 'the model got the order');
  assert.doesNotMatch(seen, /503|upstream busy|error/i, 'the failure reached the model');
  assert.match(String(result.finalOutput), /^saw: /);
});

test('a replan reaches the model as the tool\'s error output, and the run goes on', async () => {
  const { caller, sent } = await setUp([
    { tool: 'lookup_order', call: 1, fault: { kind: 'json-rpc-error', code: -32602, message: 'order_id must look like A1, not a1' } },
  ]);
  let replan: string | undefined;
  const model = new ScriptedModel([
    [functionCall('lookup_order', { order_id: 'a1' }, { callId: 'call-1' })],
    modelResponder((call) => {
      replan = inputText(call);
      return [functionCall('lookup_order', { order_id: 'A1' }, { callId: 'call-2' })];
    }),
    modelResponder((call) => [assistantMessage(`saw: ${inputText(call)}`)]),
  ]);
  const result = await new Runner().run(agentWith(model, await retryingTools(caller)), 'look up a1');
  assert.deepEqual(sent, ['lookup_order', 'lookup_order'], 'the replan was not retried by the wrapper; the model called again');
  assert.match(replan ?? '', /order_id must look like A1, not a1/, 'the policy\'s message reached the model');
  assert.doesNotMatch(replan ?? '', /Please try again/, 'the SDK\'s generic error text reached the model');
  assert.match(String(result.finalOutput), /Hansini/);
  model.assertComplete();
});

test('an escalation stops the run and reaches the application with its note, not the model', async () => {
  const { caller, sent } = await setUp([{ tool: 'issue_refund', fault: { kind: 'http', status: 403, body: 'refunds above 5000 rupees need a person' } }]);
  const model = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 900_000 });
  const error = await new Runner().run(agentWith(model, await retryingTools(caller)), 'refund A1').then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof ToolCallError, `run() ended with ${String(error)}`);
  const escalated = findEscalation(error);
  assert.ok(escalated instanceof Escalated, String(error));
  assert.equal(escalated.reason, 'permission-denied');
  assert.match(escalated.note, /refunds above 5000 rupees need a person/);
  assert.equal(model.calls.length, 1, 'the model was called again after the escalation');
  assert.deepEqual(sent, ['issue_refund'], 'a 403 was sent again');
  assert.ok(!(error as ToolCallError).error || !((error as ToolCallError).error instanceof ToolReplan));
});

test('a keyed write leaves one effect: the retry after a lost answer resends the same key', async () => {
  const { caller, server, sent, lines } = await setUp([{ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1500 } }],
    { attemptTimeoutMs: 400 });
  const model = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
  await new Runner().run(agentWith(model, await retryingTools(caller)), 'refund A1');
  assert.equal(sent.filter((t) => t === 'issue_refund').length, 2, 'the timed-out write was retried');
  const refunds = server.ledger().refunds;
  assert.equal(refunds.length, 1, JSON.stringify(refunds));
  const keys = lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'issue_refund').map((l) => l.key);
  assert.ok(keys.length >= 2 && keys.every((k) => k === refunds[0].idempotency_key), JSON.stringify(keys));
  assert.doesNotMatch(inputText(model.calls[1]), /timeout|timed out/i);
});

test('the capture is wired: a 429\'s Retry-After is waited', async () => {
  const { caller, sent, sleeps, lines } = await setUp([
    { tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 429, headers: [['retry-after', '2']], body: 'slow down' } },
  ]);
  const model = callsOnce('lookup_order', { order_id: 'A1' });
  await new Runner().run(agentWith(model, await retryingTools(caller)), 'where is A1?');
  assert.deepEqual(sent, ['lookup_order', 'lookup_order']);
  assert.ok(sleeps.some((ms) => ms >= 2000), `no wait of Retry-After's 2 s: ${JSON.stringify(sleeps)}`);
  assert.equal(lines.find((l) => l.event === 'agent_retry.attempt' && l.outcome === 'http 429')?.hint_ms, 2000);
});

test('the capture is wired: a 503 with x-should-retry: false is not retried, and the run stops', async () => {
  const { caller, sent } = await setUp([
    { tool: 'lookup_order', fault: { kind: 'http', status: 503, headers: [['x-should-retry', 'false']], body: 'down for maintenance' } },
  ]);
  const model = callsOnce('lookup_order', { order_id: 'A1' });
  const error = await new Runner().run(agentWith(model, await retryingTools(caller)), 'where is A1?').then(() => undefined, (e: unknown) => e);
  const escalated = findEscalation(error);
  assert.ok(escalated, `run() ended with ${String(error)}`);
  assert.equal(escalated.reason, 'retry-forbidden');
  assert.deepEqual(sent, ['lookup_order']);
  assert.equal(model.calls.length, 1);
});

test('an approval is the SDK\'s interruption: nothing is sent until a person approves, then one refund', async () => {
  const { caller, server, sent } = await setUp([]);
  const tools = await retryingTools(caller, { needsApproval: ['issue_refund'] });
  const model = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
  const agent = agentWith(model, tools);
  const runner = new Runner();
  const first = await runner.run(agent, 'refund A1');
  assert.equal(first.interruptions.length, 1);
  assert.equal(first.interruptions[0].name, 'issue_refund');
  assert.deepEqual(sent, [], 'the call was sent before it was approved');
  assert.equal(server.ledger().refunds.length, 0);
  first.state.approve(first.interruptions[0]);
  const second = await runner.run(agent, first.state);
  assert.deepEqual(sent, ['issue_refund']);
  assert.equal(server.ledger().refunds.length, 1);
  assert.match(String(second.finalOutput), /refund/);
});

test('a rejected approval is never sent and costs the policy no step', async () => {
  const { caller, run, sent } = await setUp([]);
  const tools = await retryingTools(caller, { needsApproval: (tool) => tool.name === 'issue_refund' });
  // The listing is the policy's (the initialize and tools/list pseudo-calls); the rejected call adds nothing.
  const listed = run.report().calls;
  const model = callsOnce('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
  const agent = agentWith(model, tools);
  const runner = new Runner();
  const first = await runner.run(agent, 'refund A1');
  first.state.reject(first.interruptions[0]);
  await runner.run(agent, first.state);
  assert.deepEqual(sent, []);
  assert.equal(run.report().calls, listed);
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

test('tool calls the SDK runs together go through the caller one at a time, each its own step', async () => {
  const { caller, lines } = await setUp([{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503, body: 'busy' } }]);
  const overlap = watchOverlap(caller);
  const model = new ScriptedModel([
    [functionCall('lookup_order', { order_id: 'A1' }, { callId: 'call-1' }), functionCall('list_refunds', { order_id: 'A1' }, { callId: 'call-2' })],
    modelResponder((call) => [assistantMessage(`saw: ${inputText(call)}`)]),
  ]);
  await new Runner().run(agentWith(model, await retryingTools(caller)), 'A1?');
  assert.equal(overlap.most(), 1, 'two calls of one caller ran at once');
  const seen = inputText(model.calls[1]);
  assert.match(seen, /Hansini/);
  assert.match(seen, /refunds/);
  const steps = lines.filter((l) => l.event === 'agent_retry.attempt' && l.step !== null).map((l) => `${String(l.tool)}@${String(l.step)}`);
  assert.deepEqual([...new Set(steps)], ['lookup_order@1', 'list_refunds@2']);
});
