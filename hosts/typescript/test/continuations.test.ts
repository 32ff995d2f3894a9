// Continuations (MRTR, contract 0.7.0): a request answered `input_required`.
// With the application's own handler registered on the SDK's client
// (`McpConnection`'s `onClient`), the SDK answers it and sends the call again:
// one attempt, no attempt spent. Without one, the wrapper reports failure
// kind `input-required` with the server's questions, and the run escalates
// `input-required`. Against the demo server's `confirm_order`, whose ledger
// records every round.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import type { Client as ClientV2 } from '@modelcontextprotocol/client';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type McpHttpOptions, type VerdictEvent } from '../src/mcp.js';
import { DemoServer } from './demo-server.js';

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

async function setUp(options: McpHttpOptions) {
  const server = await DemoServer.start({ ledger: true, args: ['--era', 'modern'] });
  servers.push(server);
  const connection = McpConnection.http(server.url, { sdk: 'v2', ...options });
  connections.push(connection);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(CONFIG).startRun('confirm');
  const verdicts: VerdictEvent[] = [];
  const caller = new RetryingToolCaller(connection, run, { log: null, onVerdict: (event) => verdicts.push(event) });
  return { server, caller, run, verdicts };
}

test('input_required answered by the application\'s handler: the SDK sends the call again, one attempt, the order confirmed once', async () => {
  const asked: string[] = [];
  const { server, caller, run, verdicts } = await setUp({
    clientOptions: { capabilities: { elicitation: { form: {} } } },
    onClient: (client) => (client as ClientV2).setRequestHandler('elicitation/create', async (request) => {
      asked.push(String((request.params as { message?: unknown }).message));
      return { action: 'accept', content: { confirm: true } };
    }),
  });
  const result = await caller.callTool('confirm_order', { order_id: 'A1001' });
  assert.notEqual(result.isError, true, JSON.stringify(result));
  assert.deepEqual(result.structuredContent, { order_id: 'A1001', confirmed: true });
  assert.deepEqual(asked, ['Confirm order A1001?']);
  assert.deepEqual(server.ledger().confirmations.map((r) => r.outcome), ['asked', 'confirmed'], 'the continuation is the same attempt');
  assert.deepEqual(verdicts.filter((v) => v.tool === 'confirm_order').map((v) => [v.attempt, v.reported.tag, v.verdict.action]), [[1, 'success', 'succeed']]);
  assert.equal(run.report().retries, 0);
});

test('input_required with no handler: failure input-required with the server\'s questions, escalated input-required, nothing applied', async () => {
  const { server, caller, verdicts } = await setUp({});
  await assert.rejects(caller.callTool('confirm_order', { order_id: 'A1002' }), (e: unknown) => {
    assert.ok(e instanceof Escalated, String(e));
    assert.equal(e.escalation.reason, 'input-required');
    assert.match(e.escalation.note, /Confirm order A1002\?/);
    return true;
  });
  const reports = verdicts.filter((v) => v.tool === 'confirm_order');
  assert.equal(reports.length, 1);
  const reported = reports[0].reported;
  assert.ok(reported.tag === 'failure' && reported.val.kind.tag === 'input-required', JSON.stringify(reported));
  assert.equal(reported.val.body, 'Confirm order A1002?');
  assert.equal(reports[0].verdict.class, 'needs-input');
  assert.deepEqual(server.ledger().confirmations.map((r) => r.outcome), ['asked'], 'asked once, never confirmed');
});
