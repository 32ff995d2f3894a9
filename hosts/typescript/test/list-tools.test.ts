// `RetryingToolCaller.listTools()`: the server's tools listed through the
// policy, as the `tools/list` pseudo-call (a failure retried as the policy
// says), connecting first; the calls after it use that listing.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { startDemoServer } from '../src/testing.js';
import { CLI } from './demo-server.js';

test('a tools/list answered 503 is retried; the first call does not list again', async () => {
  await using server = await startDemoServer({ binary: CLI, faults: [{ tool: 'tools/list', call: 1, fault: { kind: 'http', status: 503 } }] });
  let listings = 0;
  const counting: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string' && init.body.includes('"tools/list"')) listings += 1;
    return fetch(url, init);
  };
  const connection = McpConnection.http(server.url, { fetch: counting });
  const lines: Array<Record<string, unknown>> = [];
  try {
    const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(9n) });
    const run = instance.loadPolicy({}).startRun('RUN-LIST');
    const caller = new RetryingToolCaller(connection, run, { log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>), sleep: async () => undefined });
    const tools = await caller.listTools();
    assert.ok(tools.some((t) => t.name === 'lookup_order'), JSON.stringify(tools.map((t) => t.name)));
    assert.deepEqual(lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => [l.tool, l.attempt, l.outcome, l.action]), [
      ['initialize', 1, 'success', 'succeed'], ['tools/list', 1, 'http 503', 'retry'], ['tools/list', 2, 'success', 'succeed'],
    ]);
    assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
    assert.equal(listings, 2, 'the call used the listing');
  } finally {
    await connection.close();
  }
});
