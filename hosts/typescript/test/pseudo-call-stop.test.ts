// A stop (the call's limit, a cancellation) while the wrapper connects or lists
// the tools for a call: the pseudo-call in progress (`tools/list`) is abandoned
// in the run and writes its own stop line, then the call's; the metrics agree
// with the run report.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { CallCancelled, CallTimedOut } from '../src/errors.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { RetryMetrics } from '../src/metrics.js';
import { DemoServer } from './demo-server.js';

type Line = Record<string, unknown>;

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

/** A fetch that holds every `tools/list` request for 20 s (until its signal aborts), `onListing` told. */
const slowListing = (onListing: () => void): FetchLike => async (url, init) => {
  if (typeof init?.body === 'string' && init.body.includes('"tools/list"')) {
    onListing();
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(resolve, 20_000);
      init.signal?.addEventListener('abort', () => { clearTimeout(timer); reject(init.signal?.reason); }, { once: true });
    });
  }
  return fetch(url, init);
};

let runs = 0;
async function setUp(options: { callTimeoutMs?: number }, onListing: () => void = () => undefined) {
  const server = await DemoServer.start();
  servers.push(server);
  const connection = McpConnection.http(server.url, { fetch: slowListing(onListing) });
  connections.push(connection);
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run: Run = instance.loadPolicy({ 'base-delay-ms': 20 }).startRun(`RUN-PSEUDO-STOP-${runs}`);
  const lines: Line[] = [];
  const metrics = new RetryMetrics();
  const caller = new RetryingToolCaller(connection, run, {
    entropy: new SplitMix64(3n), metrics, log: (l) => lines.push(JSON.parse(l) as Line), ...options,
  });
  return { caller, run, lines, metrics };
}

const attempts = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => [l.tool, l.attempt, l.outcome, l.action]);

test('the call\'s limit passing while the tools are listed: tools/list and the call each stop', async () => {
  const { caller, run, lines, metrics } = await setUp({ callTimeoutMs: 3_000 });
  const reason = 'the call\'s limit of 3000 ms passed while its tools/list ran, before the call was sent (0 sent); nothing of it was sent';
  await assert.rejects(caller.callTool('record_note', { order_id: 'A1', text: 'hi' }), (e: unknown) => e instanceof CallTimedOut
    && e.message === `record_note: ${reason}`);
  assert.deepEqual(lines.filter((l) => l.action === 'stop').map((l) => l.reason), [
    'the call\'s limit of 3000 ms passed while attempt 1 was in flight (1 sent); it is not a write', reason,
  ]);
  assert.deepEqual(attempts(lines), [
    ['initialize', 1, 'success', 'succeed'], ['tools/list', 1, 'call-timeout', 'stop'], ['record_note', 0, 'call-timeout', 'stop'],
  ]);
  const report = run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
});

test('listTools cancelled while the tools are listed: one stop line, the pseudo-call\'s', async () => {
  const controller = new AbortController();
  const { caller, run, lines, metrics } = await setUp({}, () => setTimeout(() => controller.abort(), 50));
  await assert.rejects(caller.listTools({ signal: controller.signal }), (e: unknown) => e instanceof CallCancelled && e.tool === 'tools/list'
    && e.message === 'tools/list: the call was cancelled while attempt 1 was in flight (1 sent); it is not a write');
  assert.deepEqual(attempts(lines), [['initialize', 1, 'success', 'succeed'], ['tools/list', 1, 'cancelled', 'stop']]);
  const report = run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
});
