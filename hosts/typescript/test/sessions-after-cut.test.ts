// Sessions after a cut stream or a refused connection (issue 24 row 10), against
// the `mcp` 2.x Python SDK's own streamable-HTTP server (tests/mcp-sdk-server/server.py,
// run with the repository's .venv): the server SIGKILLed mid-read and listening
// again 1.5 s later, and a refused connection, both completed on a new session; a
// server that cuts every stream gets exactly `maxReconnectsPerRun` new sessions,
// then the escalation saying so; the tool list is read again after a reconnection.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import {
  DEFAULT_MAX_RECONNECTS_PER_RUN, McpConnection, RetryingToolCaller, type McpHttpOptions, type RetryingToolCallerOptions,
} from '../src/mcp.js';

/** The repository's root: this file runs from hosts/typescript/dist/test. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
const PYTHON = join(ROOT, '.venv/bin/python');
const SERVER = join(ROOT, 'tests/mcp-sdk-server/server.py');
// The row's sessions: the 2025-11-25 handshake (v1 by default; AGENT_RETRY_TEST_SDK=v2 for v2 in its legacy mode).
const SDK: McpHttpOptions = process.env.AGENT_RETRY_TEST_SDK === 'v2'
  ? { sdk: 'v2', clientOptions: { versionNegotiation: { mode: 'legacy' } } } : { sdk: 'v1' };
/** How long nothing listens between the kill and the restarted server. */
const DOWN_MS = 1500;
/** The SDK server takes about 2 s to import: its replacement starts this long before it listens. */
const IMPORT_MS = 4000;

before(() => {
  assert.ok(existsSync(PYTHON), `missing ${PYTHON}: the repository's Python environment (make test-python sets it up)`);
});

const started: ChildProcess[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close()));
  for (const child of started) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

async function freePort(): Promise<number> {
  return new Promise((done) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => done(port));
    });
  });
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

/** The SDK server on a fixed port, killed and started again by the test; its request log. */
class SdkServer {
  readonly log: string;
  readonly processes: ChildProcess[] = [];
  private constructor(readonly port: number, dir: string) {
    this.log = join(dir, 'requests.log');
  }

  static async create(): Promise<SdkServer> {
    return new SdkServer(await freePort(), mkdtempSync(join(tmpdir(), 'row10-')));
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  spawn(flags: string[], listenAt = 0): { child: ChildProcess; listening: Promise<void> } {
    const child = spawn(PYTHON, [SERVER, '--port', String(this.port), '--log', this.log, '--listen-at', String(listenAt), ...flags],
      { stdio: ['ignore', 'pipe', 'inherit'] });
    started.push(child);
    this.processes.push(child);
    const listening = new Promise<void>((done, fail) => {
      const lines = createInterface({ input: child.stdout as NonNullable<typeof child.stdout> });
      lines.once('line', (line) => (line.startsWith('listening') ? done() : fail(new Error(`the SDK server did not start: ${line}`))));
      child.once('exit', (code) => fail(new Error(`the SDK server exited (${code}) before it listened`)));
    });
    return { child, listening };
  }

  async start(...flags: string[]): Promise<void> {
    await this.spawn(flags).listening;
  }

  /** SIGKILLs the server; its replacement listens DOWN_MS later on the same port. `killed` resolves at the kill. */
  killAndRestart(...flags: string[]): { killed: Promise<void>; back: Promise<void> } {
    const killAt = Date.now() + IMPORT_MS;
    const old = this.processes[this.processes.length - 1];
    const { listening } = this.spawn(flags, (killAt + DOWN_MS) / 1000);
    const killed = (async () => {
      await sleep(killAt - Date.now());
      const exited = new Promise((done) => old.once('exit', done));
      old.kill('SIGKILL');
      await exited;
    })();
    return { killed, back: killed.then(() => listening) };
  }

  requests(): string[] {
    return existsSync(this.log) ? readFileSync(this.log, 'utf8').split('\n').filter(Boolean).map((line) => line.split(' ')[0]) : [];
  }

  /** New sessions asked for: the first request of each negotiation. */
  connects(): number {
    return this.requests().filter((method) => method === 'initialize' || method === 'server/discover').length;
  }
}

async function newCaller(url: string, runId: string, options: RetryingToolCallerOptions = {}, config: object = {}):
  Promise<{ caller: RetryingToolCaller; connection: McpConnection }> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(config).startRun(runId);
  const connection = McpConnection.http(url, SDK);
  connections.push(connection);
  return { caller: new RetryingToolCaller(connection, run, { entropy: new SplitMix64(3n), log: null, ...options }), connection };
}

const textOf = (result: CallToolResult) => result.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');

async function waitFor(predicate: () => boolean, what: string): Promise<void> {
  const ends = Date.now() + 10_000;
  while (!predicate()) {
    if (Date.now() > ends) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

test('a server killed mid-read and listening again 1.5 s later is reached on a new session', async () => {
  const server = await SdkServer.create();
  await server.start('--slow-s', '30');
  const { caller } = await newCaller(server.url, 'row10-kill');
  const call = caller.callTool('lookup_order', { order_id: 'K1' });
  await waitFor(() => server.requests().includes('slow'), 'the slow read to start');
  const { back } = server.killAndRestart('--generation', '2'); // mid-read: the answer stream is cut
  const [result] = await Promise.all([call, back]);
  assert.ok(!result.isError && textOf(result).includes('generation 2'), textOf(result));
  const requests = server.requests();
  const restarted = requests.slice(requests.indexOf('slow') + 1);
  assert.equal(restarted[0], 'initialize', requests.join(' '));
  assert.ok(restarted.includes('tools/call'), requests.join(' '));
});

test('a refused connection is reached again on a new session', async () => {
  const server = await SdkServer.create();
  await server.start();
  const { caller } = await newCaller(server.url, 'row10-refused');
  const first = await caller.callTool('lookup_order', { order_id: 'R1' });
  const { killed, back } = server.killAndRestart('--generation', '2');
  await killed; // nothing listens: the attempt's connection is refused
  const second = await caller.callTool('lookup_order', { order_id: 'R2' });
  await back;
  assert.ok(textOf(first).includes('generation 1') && textOf(second).includes('generation 2'), `${textOf(first)} / ${textOf(second)}`);
  assert.equal(server.connects(), 2, server.requests().join(' '));
});

test('a server that cuts every stream gets maxReconnectsPerRun new sessions, then the escalation', async () => {
  const server = await SdkServer.create();
  await server.start('--cut-calls');
  // Enough attempts for the budget to end the call, not the per-call limit.
  const config = { 'base-delay-ms': 10, 'max-delay-ms': 20, 'max-attempts-per-call': 8 };
  const { caller } = await newCaller(server.url, 'row10-budget', { maxReconnectsPerRun: 2 }, config);
  const escalated = await caller.callTool('lookup_order', { order_id: 'B1' }).then(() => undefined, (e: unknown) => e);
  assert.ok(escalated instanceof Escalated, String(escalated));
  // The first session and exactly two more; three cut attempts, then none sent.
  assert.equal(server.connects(), 3, server.requests().join(' '));
  assert.equal(server.requests().filter((m) => m === 'tools/call').length, 3, server.requests().join(' '));
  assert.match(escalated.escalation.note, /reconnections spent: 2 new sessions in this run \(maxReconnectsPerRun 2\)/);
});

test('maxReconnectsPerRun defaults to 3 and must be a non-negative integer', async () => {
  assert.equal(DEFAULT_MAX_RECONNECTS_PER_RUN, 3);
  for (const bad of [-1, 1.5, Number.NaN, '3' as unknown as number]) {
    await assert.rejects(newCaller('http://127.0.0.1:9/mcp', 'row10-option', { maxReconnectsPerRun: bad }),
      (e: unknown) => e instanceof TypeError && /maxReconnectsPerRun/.test(e.message));
  }
});

test('the tool list is read again after a reconnection', async () => {
  const server = await SdkServer.create();
  await server.start();
  const { caller } = await newCaller(server.url, 'row10-relist');
  const titleOf = () => (caller as unknown as { tools?: Map<string, { title?: string }> }).tools?.get('lookup_order')?.title;
  await caller.callTool('lookup_order', { order_id: 'L1' });
  const before = titleOf();
  const { killed, back } = server.killAndRestart('--generation', '2');
  await killed;
  await caller.callTool('lookup_order', { order_id: 'L2' }); // refused, then a new session
  await back;
  await caller.callTool('lookup_order', { order_id: 'L3' });
  assert.equal(before, 'lookup order (generation 1)');
  assert.equal(titleOf(), 'lookup order (generation 2)');
  const requests = server.requests();
  const reconnected = requests.lastIndexOf('initialize');
  assert.ok(requests.slice(0, reconnected).includes('tools/list') && requests.slice(reconnected).includes('tools/list'), requests.join(' '));
});
