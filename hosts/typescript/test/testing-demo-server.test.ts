// `startDemoServer` (src/testing.ts): the demo MCP server with a fault script,
// as a node:test fixture: given as rules or as a file, closed by `close()` or
// by `await using`, and a clear error when there is no binary.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import { demoServerBinary, startDemoServer } from '../src/testing.js';
import { CLI, ROOT } from './demo-server.js';

/** The attempt lines of one lookup_order call against `url`, as [attempt, outcome, action]. */
async function lookup(url: string): Promise<Array<[unknown, unknown, unknown]>> {
  const lines: Array<Record<string, unknown>> = [];
  const connection = McpConnection.http(url);
  try {
    const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(5n) });
    const caller = new RetryingToolCaller(connection, instance.loadPolicy({}).startRun('RUN-FIXTURE'), {
      log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>), sleep: async () => undefined,
    });
    assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
  } finally {
    await connection.close();
  }
  return lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'lookup_order').map((l) => [l.attempt, l.outcome, l.action]);
}

test('a 503 fault then success: the call succeeds with 2 attempts', async () => {
  const server = await startDemoServer({ binary: CLI, faults: [{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 503 } }] });
  try {
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
    assert.deepEqual(await lookup(server.url), [[1, 'http 503', 'retry'], [2, 'success', 'succeed']]);
  } finally {
    await server.close();
  }
  await assert.rejects(fetch(server.url), 'closed: nothing listens any more');
});

test('a fault script file, closed by await using', async () => {
  let url: string;
  {
    await using server = await startDemoServer({ binary: CLI, faults: join(ROOT, 'tests/dist/examples/faults.json') });
    url = server.url;
    assert.deepEqual(await lookup(url), [[1, 'http 503', 'retry'], [2, 'success', 'succeed']]);
  }
  await assert.rejects(fetch(url), 'disposed at the end of the block');
});

test('the binary: the option, else $AGENT_RETRY_BIN; a missing one is a clear error', async () => {
  const saved = process.env.AGENT_RETRY_BIN;
  try {
    process.env.AGENT_RETRY_BIN = '/from/the/environment/agent-retry';
    assert.equal(demoServerBinary('/given/agent-retry'), '/given/agent-retry');
    assert.equal(demoServerBinary(), '/from/the/environment/agent-retry');
  } finally {
    if (saved === undefined) delete process.env.AGENT_RETRY_BIN;
    else process.env.AGENT_RETRY_BIN = saved;
  }
  await assert.rejects(startDemoServer({ binary: '/nowhere/agent-retry' }),
    (e: unknown) => e instanceof Error && e.message.includes('no agent-retry binary at /nowhere/agent-retry'));
});
