// One outcome-words function for every wrapper (docs/events.md): the same
// failure gives the same `outcome` in an MCP call's attempt event (from the
// demo server) and in a `withPolicy` attempt event (from a local HTTP server,
// or an observation the function throws).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { EmbeddedAccounts } from '../src/accounts.js';
import { outcomeWords, withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { ObservedFailure } from '../src/errors.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import { FakeClock, startDemoServer, type RunningDemoServer } from '../src/testing.js';
import { FaultyServer } from './faulty-http.js';

let demo: RunningDemoServer;
let http: FaultyServer;
before(async () => {
  demo = await startDemoServer({
    faults: [
      { tool: 'lookup_order', when: { order_id: 'W-503' }, call: 1, fault: { kind: 'http', status: 503, body: 'upstream unavailable' } },
      { tool: 'lookup_order', when: { order_id: 'W-TOOL' }, fault: { kind: 'tool-error', message: 'the upstream said no' } },
    ],
  });
  http = await FaultyServer.start();
});
after(async () => {
  await demo.close();
  await http.stop();
});

let runs = 0;
async function newRun(): Promise<Run> {
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy({ tools: { lookup_order: { effect: 'read' } } }).startRun(`RUN-WORDS-${runs}`);
}

type Line = Record<string, unknown>;
const attempts = (lines: Line[], tool: string) => lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === tool);

/** The attempt lines of one MCP call of lookup_order against the demo server. */
async function mcpCall(orderId: string): Promise<Line[]> {
  const lines: Line[] = [];
  const connection = McpConnection.http(demo.url);
  try {
    const caller = new RetryingToolCaller(connection, await newRun(), { log: (l) => lines.push(JSON.parse(l) as Line), sleep: async () => undefined });
    await caller.callTool('lookup_order', { order_id: orderId }).catch(() => undefined);
  } finally {
    await connection.close();
  }
  return attempts(lines, 'lookup_order');
}

/** The attempt lines of one `withPolicy` call of `fn` as lookup_order. */
async function anyCall(fn: () => unknown): Promise<Line[]> {
  const lines: Line[] = [];
  await withPolicy(await newRun(), 'lookup_order', fn, { clock: new FakeClock(), log: (l) => lines.push(JSON.parse(l) as Line) })
    .catch(() => undefined);
  return attempts(lines, 'lookup_order');
}

test('a 503: the same outcome in an MCP call\'s attempt event and in withPolicy\'s', async () => {
  const overMcp = await mcpCall('W-503');
  http.script('/order', { status: 503, body: 'upstream unavailable' }, { status: 200, body: '{"order_id":"W-503"}' });
  const throughAny = await anyCall(async () => {
    const response = await fetch(`${http.url}/order`);
    return response.ok ? (await response.json() as unknown) : response;
  });
  assert.deepEqual(overMcp.map((l) => [l.attempt, l.outcome, l.action]), [[1, 'http 503', 'retry'], [2, 'success', 'succeed']]);
  assert.deepEqual(throughAny.map((l) => [l.attempt, l.outcome, l.action]), overMcp.map((l) => [l.attempt, l.outcome, l.action]));
});

test('a tool error: the same outcome in an MCP call\'s attempt event and in withPolicy\'s', async () => {
  const overMcp = await mcpCall('W-TOOL');
  const observation: Wit.Observation = {
    kind: { tag: 'tool-error', val: undefined }, headers: '', body: 'the upstream said no', structuredContent: undefined,
    sessionIdSent: false, delivery: 'answer-started',
  };
  const throughAny = await anyCall(() => { throw new ObservedFailure(observation); });
  assert.equal(overMcp[0]?.outcome, 'tool error');
  assert.deepEqual(throughAny.map((l) => [l.outcome, l.class, l.action]), overMcp.map((l) => [l.outcome, l.class, l.action]));
});

test('outcomeWords: each outcome in the words of docs/events.md', () => {
  const failed = (kind: Wit.FailureKind): Wit.Observation =>
    ({ kind, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'answer-started' });
  assert.equal(outcomeWords({ tag: 'success' }), 'success');
  assert.equal(outcomeWords({ tag: 'empty-result', val: 'nothing' }), 'empty result');
  assert.equal(outcomeWords(failed({ tag: 'http-status', val: 503 })), 'http 503');
  assert.equal(outcomeWords({ tag: 'failure', val: failed({ tag: 'http-status', val: 503 }) }), 'http 503');
  assert.equal(outcomeWords({ tag: 'failure', val: failed({ tag: 'transport', val: 'timeout' }) }), 'transport timeout');
  assert.equal(outcomeWords({ tag: 'failure', val: failed({ tag: 'protocol-error', val: -32603 }) }), 'json-rpc -32603');
  assert.equal(outcomeWords({ tag: 'failure', val: failed({ tag: 'tool-error', val: undefined }) }), 'tool error');
  assert.equal(outcomeWords({ tag: 'failure', val: failed({ tag: 'input-required' }) }), 'input required');
  assert.equal(outcomeWords({ tag: 'status-check', val: 'found' }), 'status check found');
  assert.equal(outcomeWords({ tag: 'poll-failure', val: failed({ tag: 'http-status', val: 503 }) }), 'poll failed: http 503');
});
