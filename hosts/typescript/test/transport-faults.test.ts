// The MCP wrapper against what real transports do: the scenarios T1–T12 of
// tests/fault-proxy/README.md, run through the project's own fault programs
// (`proxy.mjs` for streamable HTTP, `stdio.mjs` for stdio) against the demo
// server (`agent-retry serve`, its ledger in a file) and against
// `@modelcontextprotocol/server-everything`. Each test reads what the server
// applied (the ledger, the proxy's or the shim's log) and what the model was
// shown. `make test-ts` builds what they need (`judge-setup`, `fault-proxy-setup`).
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { AgentRetryError, CallCancelled, CallTimedOut, Escalated, SessionLost } from '../src/errors.js';
import {
  CAPTURE_MISSING_SUFFIX, McpConnection, RetryingToolCaller, type McpHttpOptions, type RetryingToolCallerOptions, type StatusCheckRequest,
} from '../src/mcp.js';
import { isAddedEventLine } from './event-lines.js';

/** The repository's root: this file runs from hosts/typescript/dist/test. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
const CLI = join(ROOT, 'target/release/agent-retry');
const PROXY = join(ROOT, 'tests/fault-proxy/proxy.mjs');
const SHIM = join(ROOT, 'tests/fault-proxy/stdio.mjs');
const EVERYTHING = join(ROOT, 'tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js');

// The SDK major the wrapper's connections use: v1, as these scenarios were
// written for; AGENT_RETRY_TEST_SDK=v2 runs them through the v2 client in its
// 2025 mode (the same requests on the wire). test/mcp-versions.test.ts covers
// v2's negotiation.
const SDK: McpHttpOptions = process.env.AGENT_RETRY_TEST_SDK === 'v2'
  ? { sdk: 'v2', clientOptions: { versionNegotiation: { mode: 'legacy' } } } : { sdk: 'v1' };

// Small delays so the tests are quick; an attempt timeout far above what any
// test waits, so "at once" is told from "at the attempt timeout".
const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };
const ATTEMPT_TIMEOUT_MS = 10_000;

before(() => {
  for (const [path, how] of [[CLI, 'cargo build --release -p agent-retry-cli --bin agent-retry (make judge-setup)'],
    [PROXY, 'the fault proxy (tests/fault-proxy)'], [SHIM, 'the stdio fault shim (tests/fault-proxy)'],
    [EVERYTHING, 'make fault-proxy-setup']] as const) {
    assert.ok(existsSync(path), `missing ${path}: ${how}`);
  }
  const help = spawnSync(CLI, ['serve', '--help'], { encoding: 'utf8' }).stdout;
  assert.match(help, /--ledger/, 'agent-retry serve has no --ledger: rebuild it');
  assert.match(help, /--sessions/, 'agent-retry serve has no --sessions: rebuild it');
});

/** What each test started, closed when the file is done (connections first, then servers). */
const connections: Array<{ close(): Promise<void> }> = [];
const proxies: FaultProxy[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(proxies.map((p) => p.stop()));
});

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'agent-retry-faults-'));
}

/** `proxy.mjs` in front of a server command; `url` is the proxy's, `mcp` its MCP endpoint. */
class FaultProxy {
  private constructor(private readonly child: ChildProcess, readonly url: string, readonly stderr: string[]) {}

  static async start(command: string[]): Promise<FaultProxy> {
    const child = spawn(process.execPath, [PROXY, '--', ...command], { stdio: ['pipe', 'pipe', 'pipe'] });
    const stderr: string[] = [];
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => stderr.push(chunk));
    const line = await new Promise<string>((resolveLine, reject) => {
      createInterface({ input: child.stdout! }).once('line', resolveLine);
      child.once('exit', (code) => reject(new Error(`proxy.mjs exited (${code}): ${stderr.join('')}`)));
    });
    const proxy = new FaultProxy(child, (JSON.parse(line) as { url: string }).url, stderr);
    proxies.push(proxy);
    return proxy;
  }

  get mcp(): string {
    return `${this.url}/mcp`;
  }

  private async control(path: string, body?: unknown): Promise<unknown> {
    const response = await fetch(`${this.url}/__proxy/${path}`, body === undefined && path === 'log'
      ? {} : { method: 'POST', body: JSON.stringify(body ?? null), headers: { 'content-type': 'application/json' } });
    assert.ok(response.ok, `proxy ${path}: HTTP ${response.status}`);
    return response.json();
  }

  faults(...faults: Array<{ on: string; tool?: string; fault: string; delay_ms?: number }>) {
    return this.control('faults', faults);
  }

  restart() {
    return this.control('restart');
  }

  async log(): Promise<Array<{ http: string; rpc: string | null; tool: string | null; session: boolean; status: number | null; fault: string | null }>> {
    return (await this.control('log')) as never;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const gone = new Promise((r) => this.child.once('exit', r));
    // SIGTERM: the proxy stops its server and exits. (Its "stdin closed" rule
    // needs a FIFO; Node's child_process pipes are sockets.)
    this.child.kill('SIGTERM');
    await gone;
  }
}

/** The demo server over HTTP behind the proxy, its ledger in `ledger`. */
async function demoOverHttp(options: { sessions?: boolean; faults?: unknown[] } = {}): Promise<{ proxy: FaultProxy; ledger: string }> {
  const dir = tempDir();
  const ledger = join(dir, 'ledger.json');
  const command = [CLI, 'serve', '--http', '127.0.0.1:{port}', '--ledger', ledger];
  if (options.sessions) command.push('--sessions');
  if (options.faults) {
    writeFileSync(join(dir, 'faults.json'), JSON.stringify(options.faults));
    command.push('--faults', join(dir, 'faults.json'));
  }
  return { proxy: await FaultProxy.start(command), ledger };
}

interface Ledger {
  refunds: Array<{ refund_id: string; order_id: string; amount_paise: number; idempotency_key?: string }>;
  notes: Array<{ order_id: string; text: string }>;
}
const readLedger = (path: string): Ledger => JSON.parse(readFileSync(path, 'utf8')) as Ledger;

/** The demo server over stdio through `stdio.mjs`: its script, its log and its ledger. */
function demoOverStdio(faults: unknown[]): { connection: McpConnection; script: string; shimLog: string; ledger: string } {
  const dir = tempDir();
  const script = join(dir, 'faults.json');
  const shimLog = join(dir, 'shim.jsonl');
  const ledger = join(dir, 'ledger.json');
  writeFileSync(script, JSON.stringify(faults));
  const connection = McpConnection.stdio({
    command: process.execPath, args: [SHIM, '--script', script, '--log', shimLog, '--', CLI, 'serve', '--stdio', '--ledger', ledger], stderr: 'ignore', ...SDK,
  });
  connections.push(connection);
  return { connection, script, shimLog, ledger };
}

const readShimLog = (path: string): Array<{ rpc: string | null; tool: string | null; pid: number; fault: string | null }> =>
  existsSync(path) ? readFileSync(path, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];

type Line = Record<string, unknown>;

async function newCaller(source: McpConnection | Client, options: RetryingToolCallerOptions = {}, config: object = CONFIG, runId = 'CASE-T'):
  Promise<{ caller: RetryingToolCaller; lines: Line[] }> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(config).startRun(runId);
  const lines: Line[] = [];
  const caller = new RetryingToolCaller(source, run, {
    entropy: new SplitMix64(3n), attemptTimeoutMs: ATTEMPT_TIMEOUT_MS, log: (line) => { if (!isAddedEventLine(line)) lines.push(JSON.parse(line)); }, ...options,
  });
  return { caller, lines };
}

const textOf = (result: CallToolResult) => result.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');
/** The model's calls' attempt lines, as [tool, attempt, outcome, action]. */
const steps = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => [l.tool, l.attempt, l.outcome, l.action]);

/** What the model may be shown: a result, never a transport's or a session's error. */
function assertActionable(result: CallToolResult): void {
  assert.ok(!result.isError, `the model was shown an error: ${textOf(result)}`);
  assert.doesNotMatch(textOf(result), /session|HTTP 4\d\d|Not connected|Connection closed/i);
}

/** A status check that reads the demo's notes of the order (`list_notes`). */
const noteListed = async (request: StatusCheckRequest) => {
  const listed = (await request.client.callTool({ name: 'list_notes', arguments: { order_id: request.arguments.order_id } })) as CallToolResult;
  const notes = (listed.structuredContent as { notes: Array<{ text: string }> }).notes;
  return notes.some((n) => n.text === request.arguments.text) ? 'found' as const : 'absent' as const;
};

test('T1: a restarted HTTP server (the session gone) is re-initialised and the keyed refund is applied once', async () => {
  const { proxy, ledger } = await demoOverHttp({ sessions: true });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A1' }));
  await proxy.restart();
  const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 });
  assertActionable(result);
  const key = caller.run.instance.deriveIdempotencyKey('CASE-T', 'step-2');
  assert.deepEqual(steps(lines).slice(3), [
    ['issue_refund', 1, 'http 404', 'retry'], // the 404 "Session not found", reported as it came: the policy says lost-session, reconnect
    ['initialize', 1, 'success', 'succeed'],
    ['issue_refund', 2, 'success', 'succeed'],
  ]);
  const lost = lines.find((l) => l.outcome === 'http 404') as Line;
  assert.deepEqual([lost.class, lost.rule, lost.key], ['transient', 'lost-session', key]);
  const log = await proxy.log();
  assert.equal(log.filter((e) => e.rpc === 'initialize').length, 2, JSON.stringify(log));
  assert.deepEqual(log.filter((e) => e.tool === 'issue_refund').map((e) => [e.session, e.status]), [[true, 404], [true, 200]]);
  assert.deepEqual(readLedger(ledger).refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, key]]);
  assert.equal(connection.connections, 2);
});

test('T2: an HTTP answer cut mid-way is stream-closed at once; the retry carries the same key; one refund', async () => {
  const { proxy, ledger } = await demoOverHttp();
  await proxy.faults({ on: 'tools/call', tool: 'issue_refund', fault: 'cut-during' });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  const began = performance.now();
  const result = await caller.callTool('issue_refund', { order_id: 'A2', amount_paise: 700 });
  const took = performance.now() - began;
  assertActionable(result);
  assert.ok(took < 3000, `the call took ${Math.round(took)} ms: the cut was not seen at once (attempt timeout ${ATTEMPT_TIMEOUT_MS} ms)`);
  const calls = lines.filter((l) => l.tool === 'issue_refund');
  assert.deepEqual(calls.map((l) => [l.attempt, l.outcome, l.action]), [[1, 'transport stream-closed', 'retry'], [2, 'success', 'succeed']]);
  const key = caller.run.instance.deriveIdempotencyKey('CASE-T', 'step-1');
  assert.deepEqual(calls.map((l) => l.key), [key, key]);
  assert.equal((await proxy.log()).filter((e) => e.tool === 'issue_refund').length, 2);
  assert.deepEqual(readLedger(ledger).refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A2', 700, key]]);
});

test('T3: an unkeyed write whose answer was cut is checked, not resent: one note, the model gets success', async () => {
  const { proxy, ledger } = await demoOverHttp();
  await proxy.faults({ on: 'tools/call', tool: 'record_note', fault: 'cut-during' });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection, { statusCheck: { record_note: noteListed } });
  const result = await caller.callTool('record_note', { order_id: 'A3', text: 'customer called' });
  assertActionable(result);
  assert.deepEqual(lines.filter((l) => l.tool === 'record_note').map((l) => [l.attempt, l.outcome, l.action]),
    [[1, 'transport stream-closed', 'check-status'], [1, 'status check found', 'succeed']]);
  assert.equal((await proxy.log()).filter((e) => e.tool === 'record_note').length, 1);
  assert.deepEqual(readLedger(ledger).notes, [{ order_id: 'A3', text: 'customer called' }]);
});

test('T4: cut initialize, tools/list and GET stream: retried under the policy, no raw SDK error, the session lives on', async () => {
  const { proxy, ledger } = await demoOverHttp({ sessions: true });
  await proxy.faults(
    { on: 'initialize', fault: 'cut-before' }, { on: 'tools/list', fault: 'cut-before' }, { on: 'GET', fault: 'cut-before' });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A4' }));
  const pseudo = lines.filter((l) => l.step === null);
  assert.deepEqual(pseudo.map((l) => [l.tool, l.attempt, l.class, l.action]), [
    ['initialize', 1, 'transient', 'retry'], ['initialize', 2, 'success', 'succeed'],
    // The reset left the session suspect: tools/list is retried on a new one (issue 24 row 10).
    ['tools/list', 1, 'transient', 'retry'], ['initialize', 1, 'success', 'succeed'], ['tools/list', 2, 'success', 'succeed'],
  ]);
  assert.ok(pseudo.every((l) => l.call !== null && l.key === null), JSON.stringify(pseudo));
  // That session lives on: a later write goes out on it, with no new initialize.
  await new Promise((r) => setTimeout(r, 100));
  assertActionable(await caller.callTool('issue_refund', { order_id: 'A4', amount_paise: 100 }));
  const log = await proxy.log();
  assert.deepEqual(log.filter((e) => e.rpc === 'initialize').map((e) => e.fault), ['cut-before', null, null]);
  assert.deepEqual(log.filter((e) => e.http === 'GET').map((e) => e.fault)[0], 'cut-before');
  assert.ok(log.filter((e) => e.rpc === 'tools/call').every((e) => e.session && e.status === 200), JSON.stringify(log));
  assert.equal(connection.connections, 2);
  assert.equal(readLedger(ledger).refunds.length, 1);
  assert.equal(caller.run.report().escalation, undefined);
});

test('T5: a stdio server killed after a keyed write is respawned and the write resent with the same key: one refund', async () => {
  const { connection, shimLog, ledger } = demoOverStdio([{ on: 'tools/call', tool: 'issue_refund', fault: 'kill-after' }]);
  const { caller, lines } = await newCaller(connection);
  const began = performance.now();
  const result = await caller.callTool('issue_refund', { order_id: 'A5', amount_paise: 900 });
  assertActionable(result);
  assert.ok(performance.now() - began < 5000);
  const key = caller.run.instance.deriveIdempotencyKey('CASE-T', 'step-1');
  assert.deepEqual(steps(lines), [
    ['initialize', 1, 'success', 'succeed'], ['tools/list', 1, 'success', 'succeed'],
    ['issue_refund', 1, 'transport stream-closed', 'retry'], // the pipe closed while the request was out
    ['initialize', 1, 'success', 'succeed'], // the server started again
    ['issue_refund', 2, 'success', 'succeed'],
  ]);
  const shim = readShimLog(shimLog);
  const refundCalls = shim.filter((e) => e.tool === 'issue_refund');
  assert.equal(new Set(shim.map((e) => e.pid)).size, 2);
  assert.deepEqual(refundCalls.map((e) => e.fault), ['kill-after', null]);
  assert.notEqual(refundCalls[0].pid, refundCalls[1].pid);
  assert.deepEqual(readLedger(ledger).refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A5', 900, key]]);
});

test('T6: a stdio server killed after an unkeyed write is respawned and checked, not resent: one note', async () => {
  const { connection, shimLog, ledger } = demoOverStdio([{ on: 'tools/call', tool: 'record_note', fault: 'kill-after' }]);
  const { caller, lines } = await newCaller(connection, { statusCheck: noteListed });
  assertActionable(await caller.callTool('record_note', { order_id: 'A6', text: 'parcel lost' }));
  assert.deepEqual(steps(lines).slice(2), [
    ['record_note', 1, 'transport stream-closed', 'check-status'],
    ['initialize', 1, 'success', 'succeed'], // respawned before the status check
    ['record_note', 1, 'status check found', 'succeed'],
  ]);
  const shim = readShimLog(shimLog);
  assert.equal(new Set(shim.map((e) => e.pid)).size, 2);
  assert.deepEqual(shim.filter((e) => e.tool !== null).map((e) => e.tool), ['record_note', 'list_notes']);
  assert.deepEqual(readLedger(ledger).notes, [{ order_id: 'A6', text: 'parcel lost' }]);
});

test('T7: a stdio server that cannot be started again: an escalation saying so, after a bounded number of starts', async () => {
  const { connection, script, shimLog, ledger } = demoOverStdio([{ on: 'tools/call', tool: 'issue_refund', fault: 'kill-before' }]);
  const { caller, lines } = await newCaller(connection);
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A7' }));
  // From now on every start of the server fails.
  writeFileSync(script, JSON.stringify([...JSON.parse(readFileSync(script, 'utf8')), { fault: 'exit-at-start', count: 50 }]));
  let escalated: Escalated | undefined;
  await caller.callTool('issue_refund', { order_id: 'A7', amount_paise: 300 }).catch((e: unknown) => {
    assert.ok(e instanceof Escalated, `not an escalation: ${String(e)}`);
    escalated = e;
  });
  assert.ok(escalated);
  assert.equal(escalated.tool, 'initialize');
  assert.equal(escalated.reason, 'call-attempts-spent');
  assert.match(escalated.note, /could not reach the server again/);
  const starts = readShimLog(shimLog).filter((e) => e.fault === 'exit-at-start').length;
  const initializes = lines.filter((l) => l.tool === 'initialize' && l.step === null && l.attempt !== 0);
  assert.equal(starts, initializes.length - 1, 'one start per initialize attempt after the first connection');
  assert.ok(starts >= 2 && starts <= 4, `${starts} starts`); // max-attempts-per-call: 4 by default
  assert.equal(initializes.at(-1)?.action, 'escalate');
  assert.deepEqual(readLedger(ledger).refunds, []); // killed before it ran
});

test('T8: a bare Client without the capturing fetch: a warning once, and the limitation in every logged reason', async () => {
  const rule = (n: number) => ({ tool: 'lookup_order', call: n, fault: { kind: 'http', status: 429, headers: [['retry-after', '1']], body: 'slow down' } });
  const { proxy } = await demoOverHttp({ faults: [rule(1), rule(3)] });
  const client = new Client({ name: 'bare', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(proxy.mcp))); // plain fetch
  connections.push(client);
  const { caller, lines } = await newCaller(client);
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A8' }));
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A8' }));
  const warnings = lines.filter((l) => l.event === 'agent_retry.capture_missing');
  assert.equal(warnings.length, 1);
  const throttled = lines.filter((l) => l.outcome === 'http 429');
  assert.equal(throttled.length, 2);
  for (const line of throttled) {
    assert.ok((line.reason as string).endsWith(CAPTURE_MISSING_SUFFIX), line.reason as string);
    assert.equal(line.hint_ms, null); // Retry-After was not seen: the limitation the reason names
  }
  assert.ok(lines.filter((l) => l.outcome === 'success').every((l) => !(l.reason as string).includes('no HTTP status or headers')));

  // The same server through McpConnection.http: the header is seen, no warning.
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const captured = await newCaller(connection, {}, CONFIG, 'CASE-T8b');
  await proxy.faults({ on: 'tools/call', tool: 'lookup_order', fault: 'cut-before' });
  assertActionable(await captured.caller.callTool('lookup_order', { order_id: 'A8' }));
  assert.equal(captured.lines.filter((l) => l.event === 'agent_retry.capture_missing').length, 0);
  assert.ok(captured.lines.every((l) => !String(l.reason).includes('no HTTP status or headers')));
});

test('T8: with McpConnection.http the same 429 carries its Retry-After hint', async () => {
  const { proxy } = await demoOverHttp({ faults: [{ tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 429, headers: [['retry-after', '1']], body: 'slow down' } }] });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection, { sleep: async () => undefined });
  assertActionable(await caller.callTool('lookup_order', { order_id: 'A8' }));
  const throttled = lines.find((l) => l.outcome === 'http 429') as Line;
  assert.equal(throttled.hint_ms, 1000);
  assert.ok((throttled.delay_ms as number) >= 1000);
  assert.ok(!(throttled.reason as string).endsWith(CAPTURE_MISSING_SUFFIX));
});

test('T9: a call limit stops a slow write at once and says it may have been applied; a cancel during a backoff stops at once', async () => {
  const throttle = { kind: 'http', status: 429, headers: [['retry-after', '5']], body: 'slow down' };
  const { proxy, ledger } = await demoOverHttp({ faults: [{ tool: 'issue_refund', when: { order_id: 'B2' }, call: 1, fault: throttle }] });
  await proxy.faults({ on: 'tools/call', tool: 'issue_refund', fault: 'delay', delay_ms: 3000 });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  // 1 s: connecting and listing on a loaded machine fit in it, and the write's 3 s do not.
  const { caller, lines } = await newCaller(connection, { callTimeoutMs: 1000 });
  assertActionable(await caller.callTool('lookup_order', { order_id: 'B1' })); // connected and listed: the limit is for the write

  let began = performance.now();
  let stopped: unknown;
  await caller.callTool('issue_refund', { order_id: 'B1', amount_paise: 400 }).catch((e: unknown) => { stopped = e; });
  let took = performance.now() - began;
  assert.ok(stopped instanceof CallTimedOut, String(stopped));
  assert.ok(took >= 980 && took < 2000, `stopped after ${Math.round(took)} ms, the limit is 1000 ms`);
  assert.deepEqual([stopped.cause, stopped.tool, stopped.attemptsSent, stopped.mayHaveApplied], ['call-timeout', 'issue_refund', 1, true]);
  assert.equal(typeof stopped.callId, 'number');
  const stop = lines.at(-1) as Line;
  assert.deepEqual([stop.tool, stop.call, stop.attempt, stop.outcome, stop.action], ['issue_refund', stopped.callId, 1, 'call-timeout', 'stop']);
  const reason = 'the call\'s limit of 1000 ms passed while attempt 1 was in flight (1 sent); '
    + 'the write may have been applied: check before sending it again';
  assert.equal(stop.reason, reason);
  assert.equal(stopped.message, `issue_refund: ${reason}`);
  // The run was told (contract 0.7.0's abandon-call): the call is closed, its write possibly applied.
  const report = caller.run.report();
  assert.equal(report.abandonedCalls, 1);
  assert.deepEqual(report.effects.map((e) => [e.callId, e.status]), [[stopped.callId, 'unknown']]);
  // The request in flight was abandoned at once: the SDK told the server so.
  let cancelled = false;
  for (let waited = 0; waited < 1000 && !cancelled; waited += 50) {
    cancelled = (await proxy.log()).some((e) => e.rpc === 'notifications/cancelled');
    if (!cancelled) await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(cancelled, 'no notifications/cancelled: the request was left waiting');
  // The server did run it (its answer was only held back).
  await new Promise((r) => setTimeout(r, Math.max(0, 3000 - (performance.now() - began)) + 300));
  assert.deepEqual(readLedger(ledger).refunds.map((r) => r.order_id), ['B1']);

  // A keyed write refused with a 429 (Retry-After: 5 s): cancelled during the backoff.
  const patient = await newCaller(connection, {}, CONFIG, 'CASE-T9b');
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 300);
  began = performance.now();
  stopped = undefined;
  await patient.caller.callTool('issue_refund', { order_id: 'B2', amount_paise: 400 }, { signal: controller.signal }).catch((e: unknown) => { stopped = e; });
  took = performance.now() - began;
  assert.ok(stopped instanceof CallCancelled, String(stopped));
  assert.ok(took < 1000, `stopped after ${Math.round(took)} ms`);
  assert.deepEqual([stopped.cause, stopped.attemptsSent, stopped.mayHaveApplied], ['cancelled', 1, false]); // a 429 was not run
  assert.equal(stopped.message, 'issue_refund: the call was cancelled between attempts (1 sent); the write was not applied');
  // Abandoned during the wait before attempt 2: closed, and nothing on the wire.
  const patientReport = patient.caller.run.report();
  assert.deepEqual([patientReport.abandonedCalls, patientReport.effects.length], [1, 0]);
  assert.deepEqual(steps(patient.lines).slice(-2).map((s) => s.slice(2)), [['http 429', 'retry'], ['cancelled', 'stop']]);
  assert.ok(!(stopped instanceof AgentRetryError && !(stopped instanceof CallCancelled)));
  assert.deepEqual(readLedger(ledger).refunds.map((r) => r.order_id), ['B1']);
});

test('T9: a server wait past the call\'s limit fails the call now (deadline-too-near, the time left reported); a run limit stops the call as run-timeout', async () => {
  const throttle = { kind: 'http', status: 429, headers: [['retry-after', '5']], body: 'slow down' };
  const { proxy } = await demoOverHttp({ faults: [{ tool: 'lookup_order', first: 1, fault: throttle }] });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection, { callTimeoutMs: 3000 });
  const began = performance.now();
  const error = await caller.callTool('lookup_order', { order_id: 'B3' }).catch((e: unknown) => e);
  const took = performance.now() - began;
  // The wrapper reported the time left to the call's limit; the server asks for 5 s: the policy fails it now.
  assert.ok(error instanceof Escalated, String(error));
  assert.ok(took < 1500, `stopped after ${Math.round(took)} ms: the 5 s backoff was slept into`);
  assert.equal(error.reason, 'deadline-too-near');
  assert.match(error.note, /the server asks to wait 5000 ms; \d+ ms remain/);
  assert.deepEqual(steps(lines).slice(-1).map((s) => s.slice(2)), [['http 429', 'escalate']]);
  assert.equal(lines.at(-1)?.escalation, 'deadline-too-near');

  const short = await newCaller(connection, { runTimeoutMs: 0 }, CONFIG, 'CASE-T9d');
  const late = await short.caller.callTool('lookup_order', { order_id: 'B4' }, 'my-action').catch((e: unknown) => e);
  assert.ok(late instanceof CallTimedOut, String(late));
  assert.deepEqual([late.cause, late.callId, late.attemptsSent, late.mayHaveApplied], ['run-timeout', undefined, 0, false]);
  assert.deepEqual(steps(short.lines), [['lookup_order', 0, 'run-timeout', 'stop']]);
});

/** server-everything over streamable HTTP behind the proxy. */
const everythingOverHttp = () => FaultProxy.start([process.execPath, EVERYTHING, 'streamableHttp']);

test('T10: server-everything restarted between two echoes: re-initialised, the second echo succeeds', async () => {
  const proxy = await everythingOverHttp();
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  assert.equal(textOf(await caller.callTool('echo', { message: 'one' })), 'Echo: one');
  await proxy.restart();
  const result = await caller.callTool('echo', { message: 'two' });
  assertActionable(result);
  assert.equal(textOf(result), 'Echo: two');
  assert.deepEqual(steps(lines).slice(3), [
    ['echo', 1, 'http 400', 'retry'], // 400 "Bad Request: No valid session ID provided": the policy's lost-session, reconnect
    ['initialize', 1, 'success', 'succeed'],
    ['echo', 2, 'success', 'succeed'],
  ]);
  assert.equal(lines.find((l) => l.outcome === 'http 400')?.rule, 'lost-session');
  const log = await proxy.log();
  assert.equal(log.filter((e) => e.rpc === 'initialize').length, 2);
  assert.deepEqual(log.filter((e) => e.tool === 'echo').map((e) => e.status), [200, 400, 200]);
});

test('T11: server-everything over stdio killed after an echo: respawned, the echo succeeds', async () => {
  const dir = tempDir();
  const script = join(dir, 'faults.json');
  const shimLog = join(dir, 'shim.jsonl');
  writeFileSync(script, JSON.stringify([{ on: 'tools/call', tool: 'echo', fault: 'kill-after' }]));
  const connection = McpConnection.stdio({
    command: process.execPath, args: [SHIM, '--script', script, '--log', shimLog, '--', process.execPath, EVERYTHING, 'stdio'], stderr: 'ignore', ...SDK,
  });
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  const result = await caller.callTool('echo', { message: 'three' });
  assert.equal(textOf(result), 'Echo: three');
  assert.deepEqual(steps(lines).slice(2), [
    ['echo', 1, 'transport stream-closed', 'retry'], ['initialize', 1, 'success', 'succeed'], ['echo', 2, 'success', 'succeed'],
  ]);
  assert.equal(new Set(readShimLog(shimLog).map((e) => e.pid)).size, 2);
});

test('T12: server-everything\'s SSE answer cut mid-way: stream-closed at once, the echo succeeds on the retry', async () => {
  const proxy = await everythingOverHttp();
  await proxy.faults({ on: 'tools/call', tool: 'echo', fault: 'cut-during' });
  const connection = McpConnection.http(proxy.mcp, SDK);
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  const began = performance.now();
  const result = await caller.callTool('echo', { message: 'four' });
  const took = performance.now() - began;
  assert.equal(textOf(result), 'Echo: four');
  assert.ok(took < 3000, `the call took ${Math.round(took)} ms (attempt timeout ${ATTEMPT_TIMEOUT_MS} ms)`);
  assert.deepEqual(lines.filter((l) => l.tool === 'echo').map((l) => [l.attempt, l.outcome, l.action]),
    [[1, 'transport stream-closed', 'retry'], [2, 'success', 'succeed']]);
  assert.match(String(lines.find((l) => l.outcome === 'transport stream-closed')?.reason), /transport|stream/);
});

test('a bare Client over stdio whose server died: stream-closed, then SessionLost (not an escalation as a probable bug)', async () => {
  const dir = tempDir();
  const script = join(dir, 'faults.json');
  writeFileSync(script, JSON.stringify([{ on: 'tools/call', tool: 'echo', fault: 'kill-after' }]));
  const client = new Client({ name: 'bare', version: '1.0.0' });
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [SHIM, '--script', script, '--', process.execPath, EVERYTHING, 'stdio'], stderr: 'ignore' }));
  connections.push(client);
  const { caller, lines } = await newCaller(client);
  const error = await caller.callTool('echo', { message: 'five' }).catch((e: unknown) => e);
  assert.ok(error instanceof SessionLost, String(error));
  assert.match(error.message, /McpConnection/);
  assert.deepEqual(steps(lines).slice(1), [['echo', 1, 'transport stream-closed', 'retry']]);
  // The process is gone: a request that cannot be written is connection-refused, not `other`.
  const again = await newCaller(client, {}, CONFIG, 'CASE-T-bare2');
  const refused = await again.caller.callTool('echo', { message: 'six' }).catch((e: unknown) => e);
  assert.ok(refused instanceof SessionLost, String(refused));
  assert.deepEqual(steps(again.lines), [['tools/list', 1, 'transport stream-closed', 'retry']]);
  assert.equal(again.lines[0].class, 'transient');
});

test('McpConnection connects, connects again, and close() ends the server process', async () => {
  const dir = tempDir();
  const shimLog = join(dir, 'shim.jsonl');
  writeFileSync(join(dir, 'faults.json'), '[]');
  const connection = McpConnection.stdio({
    command: process.execPath, args: [SHIM, '--script', join(dir, 'faults.json'), '--log', shimLog, '--', CLI, 'serve', '--stdio'], stderr: 'ignore', ...SDK,
  });
  const first = await connection.connect();
  assert.ok((await first.listTools()).tools.some((t) => t.name === 'issue_refund'));
  const second = await connection.connect();
  assert.notEqual(first, second);
  assert.equal(connection.connections, 2);
  assert.equal(connection.lost, undefined);
  const pids = [...new Set(readShimLog(shimLog).map((e) => e.pid))];
  assert.equal(pids.length, 2);
  await connection.close();
  await new Promise((r) => setTimeout(r, 200));
  for (const pid of pids) assert.throws(() => process.kill(pid, 0), /ESRCH/, `process ${pid} still runs`);
  await assert.rejects(connection.connect(), /closed/);
});

/** A scripted streamable-HTTP server inside a `fetch`: its `tools/call` answers are SSE streams as `answer` says. */
function scriptedServer(answer: (call: number, id: unknown) => 'priming-then-end' | 'priming-then-cut' | 'whole') {
  const seen: string[] = [];
  let calls = 0;
  let pending: unknown;
  let resumption: 'replay' | 'fail' = 'replay';
  const sse = (events: string[], cut = false) => new Response(new ReadableStream<Uint8Array>({
    start(controller) {
      for (const event of events) controller.enqueue(new TextEncoder().encode(event));
      if (cut) setTimeout(() => controller.error(new TypeError('terminated')), 10);
      else controller.close();
    },
  }), { status: 200, headers: { 'content-type': 'text/event-stream', 'mcp-session-id': 's1' } });
  const json = (value: unknown, status = 200) => new Response(JSON.stringify(value), { status, headers: { 'content-type': 'application/json', 'mcp-session-id': 's1' } });
  const result = (id: unknown, text: string) => `id: r${String(id)}\ndata: ${JSON.stringify({ jsonrpc: '2.0', id, result: { content: [{ type: 'text', text }] } })}\n\n`;
  const fetchImpl = async (_url: string | URL, init?: RequestInit): Promise<Response> => {
    const headers = new Headers(init?.headers);
    if ((init?.method ?? 'GET') === 'GET') {
      const last = headers.get('last-event-id');
      seen.push(last ? `GET resume ${last}` : 'GET');
      if (!last) return new Response(null, { status: 405 });
      if (resumption === 'fail') throw new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } });
      return sse([result(pending, 'resumed')]);
    }
    const message = JSON.parse(String(init?.body)) as { id?: unknown; method: string };
    seen.push(message.method);
    if (message.id === undefined) return new Response(null, { status: 202 });
    if (message.method === 'initialize') {
      return json({ jsonrpc: '2.0', id: message.id, result: { protocolVersion: '2025-11-25', capabilities: { tools: {} }, serverInfo: { name: 'scripted', version: '1' } } });
    }
    if (message.method === 'tools/list') {
      return json({ jsonrpc: '2.0', id: message.id, result: { tools: [{ name: 'lookup', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } }] } });
    }
    calls += 1;
    pending = message.id;
    const how = answer(calls, message.id);
    const priming = 'id: e1\nretry: 50\ndata: \n\n';
    if (how === 'whole') return sse([priming, result(message.id, `answer ${calls}`)]);
    return sse([priming], how === 'priming-then-cut');
  };
  return { fetchImpl, seen, failResumption: () => { resumption = 'fail'; } };
}

test('an SSE answer that ends cleanly after an event id is resumed by the SDK; a resumption that fails is stream-closed at once', async () => {
  const server = scriptedServer((call) => (call <= 2 ? 'priming-then-end' : 'whole'));
  const connection = McpConnection.http('http://scripted.invalid/mcp', { ...SDK, fetch: server.fetchImpl });
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  // The stream ends after its priming event: the SDK resumes it (GET, Last-Event-ID) and the answer comes that way.
  assert.equal(textOf(await caller.callTool('lookup', {})), 'resumed');
  assert.deepEqual(steps(lines).slice(2), [['lookup', 1, 'success', 'succeed']]);
  assert.ok(server.seen.includes('GET resume e1'), server.seen.join());
  // Now the resumption fails: stream-closed when it fails, not at the attempt timeout; the retry is answered.
  server.failResumption();
  const began = performance.now();
  assert.equal(textOf(await caller.callTool('lookup', {})), 'answer 3');
  assert.ok(performance.now() - began < 2000);
  // The cut left the session suspect: the retry goes on a new one (issue 24 row 10).
  assert.deepEqual(steps(lines).slice(3), [
    ['lookup', 1, 'transport stream-closed', 'retry'], ['initialize', 1, 'success', 'succeed'], ['lookup', 2, 'success', 'succeed'],
  ]);
  assert.match(String(lines.find((l) => l.outcome === 'transport stream-closed')?.reason), /./);
});

test('an SSE answer cut after its event id is stream-closed at once, not left to the SDK\'s resumption', async () => {
  const server = scriptedServer((call) => (call === 1 ? 'priming-then-cut' : 'whole'));
  const connection = McpConnection.http('http://scripted.invalid/mcp', { ...SDK, fetch: server.fetchImpl });
  connections.push(connection);
  const { caller, lines } = await newCaller(connection);
  const began = performance.now();
  assert.equal(textOf(await caller.callTool('lookup', {})), 'answer 2');
  assert.ok(performance.now() - began < 2000);
  // The cut left the session suspect: the retry goes on a new one (issue 24 row 10).
  assert.deepEqual(steps(lines).slice(2), [
    ['lookup', 1, 'transport stream-closed', 'retry'], ['initialize', 1, 'success', 'succeed'], ['lookup', 2, 'success', 'succeed'],
  ]);
});
