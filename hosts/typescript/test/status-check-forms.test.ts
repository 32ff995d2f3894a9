// A status check may be a plain function or an async one, in `withPolicy` and
// in the MCP wrapper alike: its answer is read; what it throws (anything) is
// `unknown` with an `agent_retry.status_check_failed` line (with `ts`); its
// `check_tool` is the function's name, or null when it has none.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated, ObservedFailure } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type StatusCheck } from '../src/mcp.js';
import { FakeClock } from '../src/testing.js';
import { DemoServer } from './demo-server.js';

type Line = Record<string, unknown>;
let runs = 0;

async function newRun(config: object): Promise<Run> {
  runs += 1;
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(BigInt(runs)) });
  return instance.loadPolicy({ 'base-delay-ms': 20, ...config }).startRun(`RUN-CHECKS-${runs}`);
}

const timedOut = () => new ObservedFailure({
  kind: { tag: 'transport', val: 'timeout' }, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'sent',
});

/** An unkeyed write that times out once, checked by `check`: its lines, and what the call ended with. */
async function checkedWrite(check: (request: never) => unknown): Promise<{ lines: Line[]; ended: unknown }> {
  const lines: Line[] = [];
  let sent = 0;
  const ended = await withPolicy(await newRun({ tools: { send_email: { effect: 'write' } } }), 'send_email', () => {
    sent += 1;
    if (sent === 1) throw timedOut();
    return 'sent';
  }, { clock: new FakeClock(0), statusCheck: check as never, log: (l) => lines.push(JSON.parse(l) as Line) }).catch((e: unknown) => e);
  return { lines, ended };
}

const checks = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.status_check').map((l) => [l.check_tool, l.result]);
const failed = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.status_check_failed');

test('withPolicy: a plain status check\'s answer is read', async () => {
  const { lines, ended } = await checkedWrite(function absentInLedger() { return 'absent'; });
  assert.equal(ended, 'sent');
  assert.deepEqual(checks(lines), [['absentInLedger', 'absent']]);
});

test('withPolicy: a check that throws anything is unknown, logged with ts; an unnamed one is null', async () => {
  const unnamed = [() => { throw undefined; }][0];
  assert.equal(unnamed.name, '');
  for (const [check, name] of [[function readLedger() { throw new Error('db down'); }, 'readLedger'], [unnamed, null]] as const) {
    const before = Date.now() / 1000;
    const { lines, ended } = await checkedWrite(check);
    const after = Date.now() / 1000;
    assert.ok(ended instanceof Escalated && ended.reason === 'status-unknown');
    assert.deepEqual(checks(lines), [[name, 'unknown']]);
    const [line] = failed(lines);
    assert.equal(typeof line.ts, 'number');
    assert.deepEqual(Object.keys(line), ['event', 'ts', 'run', 'policy', 'tool', 'error']);
    // `ts` is the wall clock's (docs/events.md), not the FakeClock(0) the call's waits and the policy are on: in every line.
    for (const each of lines) {
      const ts = each.ts as number;
      assert.ok(ts >= before - 0.001 && ts <= after + 0.001, `${String(each.event)}: ts ${ts} is not between ${before} and ${after}`);
    }
  }
});

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

/** `record_note` through the MCP wrapper, its first attempt timing out after the server applied it. */
async function checkedNote(statusCheck: StatusCheck): Promise<{ lines: Line[]; ended: unknown }> {
  const server = await DemoServer.start({ faults: [{ tool: 'record_note', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 2000 } }] });
  servers.push(server);
  const connection = McpConnection.http(server.url);
  connections.push(connection);
  const lines: Line[] = [];
  const caller = new RetryingToolCaller(connection, await newRun({}), {
    entropy: new SplitMix64(3n), attemptTimeoutMs: 300, statusCheck, log: (l) => lines.push(JSON.parse(l) as Line),
  });
  const ended = await caller.callTool('record_note', { order_id: 'A1', text: 'hi' }).catch((e: unknown) => e);
  return { lines, ended };
}

test('MCP: a plain status check\'s answer is read', async () => {
  const { lines, ended } = await checkedNote(function noteInLedger() { return 'found'; });
  assert.equal((ended as { isError?: boolean }).isError, false);
  assert.deepEqual(checks(lines), [['noteInLedger', 'found']]);
});

test('MCP: a plain status check that throws is unknown, logged with ts', async () => {
  const { lines, ended } = await checkedNote(function noteInLedger() { throw new Error('db down'); });
  assert.ok(ended instanceof Escalated && ended.reason === 'status-unknown');
  assert.deepEqual(checks(lines), [['noteInLedger', 'unknown']]);
  assert.equal(typeof failed(lines)[0].ts, 'number');
});
