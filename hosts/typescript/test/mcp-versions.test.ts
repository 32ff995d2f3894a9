// The MCP wrapper across protocol revisions and SDK majors: the v2 client
// (`@modelcontextprotocol/client`, negotiating: `server/discover`, else
// `initialize`) and v1 (`@modelcontextprotocol/sdk`, the 2025 handshake) against
// the demo server as a modern-only (2026-07-28) and a dual-era server, over
// http and https, and against `@modelcontextprotocol/server-everything` (a
// 2025-11-25 server) over stdio and HTTP. The demo server is
// `target/release/agent-retry serve` (`make judge-setup`); server-everything is
// installed by `make fault-proxy-setup`. A test whose server is missing fails.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, test } from 'node:test';

import type { Client as ClientV2 } from '@modelcontextprotocol/client';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { Agent, fetch as undiciFetch } from 'undici';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { AgentRetryError, ConnectionConfigError, Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type McpSdkName, type RetryingToolCallerOptions } from '../src/mcp.js';
import { CLI, DemoServer, ROOT, requireDemo as requireDemoWith } from './demo-server.js';
import { isAddedEventLine } from './event-lines.js';

const PROXY = join(ROOT, 'tests/fault-proxy/proxy.mjs');
const SHIM = join(ROOT, 'tests/fault-proxy/stdio.mjs');
const EVERYTHING = join(ROOT, 'tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js');

const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };
const ATTEMPT_TIMEOUT_MS = 10_000;
const MODERN = '2026-07-28';
const LEGACY = '2025-11-25';

/** The flags these tests use, required of the demo server binary. */
const DEMO_FLAGS = ['--era', '--tls-ca-out', '--sessions'];
const requireDemo = () => requireDemoWith(...DEMO_FLAGS);

function requireEverything(): void {
  assert.ok(existsSync(EVERYTHING), `missing ${EVERYTHING}: make fault-proxy-setup`);
}

const children: ChildProcess[] = [];
const demos: DemoServer[] = [];
const closers: Array<() => Promise<void>> = [];
after(async () => {
  await Promise.all(closers.map((close) => close().catch(() => undefined)));
  await Promise.all([...children.map(stopChild), ...demos.map((demo) => demo.stop())]);
});

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await gone;
  clearTimeout(timer);
}

const tempDir = () => mkdtempSync(join(tmpdir(), 'agent-retry-versions-'));

/** `agent-retry serve --http 127.0.0.1:0 ARGS` (demo-server.ts), stopped when the file is done. */
async function startDemo(args: string[]): Promise<{ url: string }> {
  const server = await DemoServer.start({ args, require: DEMO_FLAGS });
  demos.push(server);
  return { url: server.url };
}

/** `proxy.mjs` in front of a server command (tests/fault-proxy/README.md). */
async function startProxy(command: string[]) {
  assert.ok(existsSync(PROXY), `missing ${PROXY}`);
  const child = spawn(process.execPath, [PROXY, '--', ...command], { stdio: ['pipe', 'pipe', 'pipe'] });
  children.push(child);
  const line = await new Promise<string>((resolveLine, reject) => {
    createInterface({ input: child.stdout! }).once('line', resolveLine);
    child.once('exit', (code) => reject(new Error(`proxy.mjs exited (${code})`)));
  });
  const base = (JSON.parse(line) as { url: string }).url;
  const control = async (path: string, body?: unknown): Promise<unknown> => {
    const response = await fetch(`${base}/__proxy/${path}`, body === undefined
      ? {} : { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' } });
    assert.ok(response.ok, `proxy ${path}: HTTP ${response.status}`);
    return response.json();
  };
  return {
    mcp: `${base}/mcp`,
    faults: (...faults: Array<{ on: string; tool?: string; fault: string }>) => control('faults', faults),
    restart: () => control('restart', null),
    log: async () => (await control('log')) as Array<{ http: string; rpc: string | null; tool: string | null; session: boolean; status: number | null }>,
  };
}

function track(connection: McpConnection): McpConnection {
  closers.push(() => connection.close());
  return connection;
}

type Line = Record<string, unknown>;

async function newCaller(connection: McpConnection, options: RetryingToolCallerOptions = {}, runId = 'CASE-V') {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(CONFIG).startRun(runId);
  const lines: Line[] = [];
  const caller = new RetryingToolCaller(connection, run, {
    entropy: new SplitMix64(3n), attemptTimeoutMs: ATTEMPT_TIMEOUT_MS, log: (line) => { if (!isAddedEventLine(line)) lines.push(JSON.parse(line)); }, ...options,
  });
  return { caller, lines };
}

const textOf = (result: CallToolResult) => result.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');
/** The attempt lines, as [tool, attempt, outcome, action]. */
const steps = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.attempt').map((l) => [l.tool, l.attempt, l.outcome, l.action]);
const CLEAN = [['initialize', 1, 'success', 'succeed'], ['tools/list', 1, 'success', 'succeed']];

/** A call that must succeed: the result, and nothing escalated. */
async function lookup(caller: RetryingToolCaller): Promise<string> {
  const result = await caller.callTool('lookup_order', { order_id: 'A1' });
  assert.ok(!result.isError, `the model was shown an error: ${textOf(result)}`);
  assert.match(textOf(result), /A1/);
  assert.equal(caller.run.report().escalation, undefined);
  return textOf(result);
}

const eraOf = (connection: McpConnection) => (connection.client as ClientV2).getProtocolEra();
const sessionOf = (connection: McpConnection) => (connection.client?.transport as { sessionId?: string } | undefined)?.sessionId;

// 1. A modern-only server over HTTP, with the v2 client.

test('1. a modern-only server over HTTP: the v2 client speaks 2026-07-28 (server/discover, no initialize) and the call succeeds', async () => {
  const { url } = await startDemo(['--era', 'modern']);
  const connection = track(McpConnection.http(url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection);
  await lookup(caller);
  assert.equal(connection.sdk, 'v2');
  assert.equal(connection.protocolVersion, MODERN);
  assert.equal(eraOf(connection), 'modern');
  assert.equal(sessionOf(connection), undefined); // 2026-07-28 has no sessions
  assert.deepEqual(steps(lines), [...CLEAN, ['lookup_order', 1, 'success', 'succeed']]);
});

test('1. a modern-only server, v2: a 429\'s Retry-After reaches the policy (the capturing fetch on the modern era)', async () => {
  const dir = tempDir();
  const throttle = { kind: 'http', status: 429, headers: [['retry-after', '1']], body: 'slow down' };
  writeFileSync(join(dir, 'faults.json'), JSON.stringify([{ tool: 'lookup_order', call: 1, fault: throttle }]));
  const { url } = await startDemo(['--era', 'modern', '--faults', join(dir, 'faults.json')]);
  const connection = track(McpConnection.http(url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection, { sleep: async () => undefined });
  await lookup(caller);
  assert.deepEqual(steps(lines).slice(2), [['lookup_order', 1, 'http 429', 'retry'], ['lookup_order', 2, 'success', 'succeed']]);
  const throttled = lines.find((l) => l.outcome === 'http 429') as Line;
  assert.deepEqual([throttled.class, throttled.hint_ms], ['throttled', 1000]);
  assert.ok((throttled.delay_ms as number) >= 1000);
});

test('1. a modern-only server behind the proxy, v2: an answer cut mid-way is stream-closed at once, the retry succeeds', async () => {
  requireDemo();
  const proxy = await startProxy([CLI, 'serve', '--http', '127.0.0.1:{port}', '--era', 'modern']);
  await proxy.faults({ on: 'tools/call', tool: 'lookup_order', fault: 'cut-during' });
  const connection = track(McpConnection.http(proxy.mcp, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection);
  const began = performance.now();
  await lookup(caller);
  assert.ok(performance.now() - began < 3000, 'the cut was not seen at once');
  // The cut left the session suspect: the retry goes on a new one (issue 24 row 10).
  assert.deepEqual(steps(lines).slice(2), [
    ['lookup_order', 1, 'transport stream-closed', 'retry'], ['initialize', 1, 'success', 'succeed'], ['lookup_order', 2, 'success', 'succeed'],
  ]);
  const log = await proxy.log();
  assert.equal(log.filter((e) => e.rpc === 'initialize').length, 0, JSON.stringify(log));
  assert.equal(log.filter((e) => e.rpc === 'server/discover').length, 2, JSON.stringify(log));
});

// 2. A dual-era server over HTTP, stateless and with sessions, with each SDK.

for (const sessions of [false, true]) {
  for (const sdk of ['v2', 'v1'] as McpSdkName[]) {
    const speaks = sdk === 'v2' ? MODERN : LEGACY;
    test(`2. a dual-era server (${sessions ? 'with sessions' : 'stateless'}), sdk ${sdk}: the call succeeds over ${speaks}`, async () => {
      const { url } = await startDemo(['--era', 'dual', ...(sessions ? ['--sessions'] : [])]);
      const connection = track(McpConnection.http(url, { sdk }));
      const { caller, lines } = await newCaller(connection);
      await lookup(caller);
      assert.equal(connection.sdk, sdk);
      assert.equal(connection.protocolVersion, speaks);
      if (sdk === 'v2') assert.equal(eraOf(connection), 'modern');
      // Sessions are for clients of revisions before 2026-07-28 only.
      assert.equal(sessionOf(connection) !== undefined, sessions && sdk === 'v1');
      assert.deepEqual(steps(lines), [...CLEAN, ['lookup_order', 1, 'success', 'succeed']]);
    });
  }
}

// 3. A 2025-11-25 server (server-everything) over stdio: v2 falls back to initialize; v1 as before.

for (const sdk of ['v2', 'v1'] as McpSdkName[]) {
  test(`3. server-everything over stdio, sdk ${sdk}: the echo succeeds${sdk === 'v2' ? ' (server/discover refused, then initialize: 2025-11-25)' : ''}`, async () => {
    requireEverything();
    const connection = track(McpConnection.stdio({ command: process.execPath, args: [EVERYTHING, 'stdio'], stderr: 'ignore', sdk }));
    const { caller, lines } = await newCaller(connection);
    const result = await caller.callTool('echo', { message: 'hi' });
    assert.equal(textOf(result), 'Echo: hi');
    assert.ok(!result.isError);
    assert.deepEqual(steps(lines), [...CLEAN, ['echo', 1, 'success', 'succeed']]);
    if (sdk === 'v2') {
      assert.equal(eraOf(connection), 'legacy');
      assert.equal(connection.protocolVersion, LEGACY);
    }
    assert.equal(connection.connections, 1);
  });
}

test('3. server-everything over stdio, v2: killed after an echo, started again (probe, then initialize), the echo succeeds', async () => {
  requireEverything();
  const dir = tempDir();
  const script = join(dir, 'faults.json');
  const shimLog = join(dir, 'shim.jsonl');
  writeFileSync(script, JSON.stringify([{ on: 'tools/call', tool: 'echo', fault: 'kill-after' }]));
  const connection = track(McpConnection.stdio({
    command: process.execPath, args: [SHIM, '--script', script, '--log', shimLog, '--', process.execPath, EVERYTHING, 'stdio'], stderr: 'ignore', sdk: 'v2',
  }));
  const { caller, lines } = await newCaller(connection);
  assert.equal(textOf(await caller.callTool('echo', { message: 'three' })), 'Echo: three');
  assert.deepEqual(steps(lines).slice(2), [
    ['echo', 1, 'transport stream-closed', 'retry'], ['initialize', 1, 'success', 'succeed'], ['echo', 2, 'success', 'succeed'],
  ]);
  assert.equal(connection.connections, 2);
  assert.equal(connection.protocolVersion, LEGACY);
  const echoes = readFileSync(shimLog, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { tool: string | null; pid: number })
    .filter((e) => e.tool === 'echo');
  assert.equal(echoes.length, 2);
  assert.notEqual(echoes[0].pid, echoes[1].pid);
});

test('3. server-everything over HTTP, v2: the probe\'s 400 is not a failure; a restart loses the session, which is established again', async () => {
  requireEverything();
  const proxy = await startProxy([process.execPath, EVERYTHING, 'streamableHttp']);
  const connection = track(McpConnection.http(proxy.mcp, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection);
  assert.equal(textOf(await caller.callTool('echo', { message: 'one' })), 'Echo: one');
  assert.equal(connection.protocolVersion, LEGACY);
  assert.ok(sessionOf(connection) !== undefined);
  await proxy.restart();
  assert.equal(textOf(await caller.callTool('echo', { message: 'two' })), 'Echo: two');
  assert.deepEqual(steps(lines), [
    ...CLEAN, ['echo', 1, 'success', 'succeed'],
    ['echo', 1, 'http 400', 'retry'], // 400 "Bad Request: No valid session ID provided": the policy's lost-session, reconnect
    ['initialize', 1, 'success', 'succeed'],
    ['echo', 2, 'success', 'succeed'],
  ]);
  const log = await proxy.log();
  assert.deepEqual(log.filter((e) => e.rpc === 'server/discover').map((e) => e.status), [400, 400], JSON.stringify(log));
  assert.equal(log.filter((e) => e.rpc === 'initialize').length, 2);
});

// 4. https with a CA made at test time.

test('4. an https modern-only server: trusted through an undici Agent with the CA, the call succeeds; without it, a certificate failure escalates', async () => {
  const ca = join(tempDir(), 'ca.pem');
  const { url } = await startDemo(['--era', 'modern', '--tls-ca-out', ca]);
  assert.match(url, /^https:\/\//);
  assert.match(readFileSync(ca, 'utf8'), /BEGIN CERTIFICATE/);

  // The README's route: undici's Agent trusting the CA, through a fetch wrapper.
  const agent = new Agent({ connect: { ca: readFileSync(ca) } });
  closers.push(() => agent.close());
  const trusting = (input: string | URL, init?: RequestInit) => undiciFetch(input, { ...init, dispatcher: agent } as never) as unknown as Promise<Response>;
  const trusted = track(McpConnection.http(url, { sdk: 'v2', fetch: trusting }));
  const ok = await newCaller(trusted);
  await lookup(ok.caller);
  assert.equal(trusted.protocolVersion, MODERN);

  const plain = track(McpConnection.http(url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(plain, {}, 'CASE-V-TLS');
  const error = await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => e);
  assert.ok(error instanceof Escalated, `not an escalation: ${String(error)}`);
  assert.equal(error.tool, 'initialize');
  assert.equal(error.reason, 'connection-misconfigured'); // transport `tls`: a person must fix the certificate, not retried
  assert.match(error.note, /certificate/i);
  assert.deepEqual(steps(lines), [['initialize', 1, 'transport tls', 'escalate']]);
  assert.equal(lines[0].class, 'misconfigured');
  assert.equal(plain.connections, 0);
});

// 5. A URL scheme the wrapper cannot serve, and other configuration errors: typed, at construction.

test('5. McpConnection.http(\'ftp://...\') throws a ConnectionConfigError naming the scheme, at construction', () => {
  const refused = (e: unknown, option: string, pattern: RegExp) => {
    assert.ok(e instanceof ConnectionConfigError, String(e));
    assert.ok(e instanceof AgentRetryError);
    assert.equal(e.option, option);
    assert.match(e.message, pattern);
    return true;
  };
  assert.throws(() => McpConnection.http('ftp://files.example.com/mcp'), (e) => refused(e, 'url', /'ftp'/));
  assert.throws(() => McpConnection.http('ws://127.0.0.1:1/mcp', { sdk: 'v1' }), (e) => refused(e, 'url', /'ws'/));
  assert.throws(() => McpConnection.http('not a url'), (e) => refused(e, 'url', /not a url/));
  assert.throws(() => McpConnection.http('http://127.0.0.1:1/mcp', { sdk: 'v3' as McpSdkName }), (e) => refused(e, 'sdk', /'v1'.*'v2'/));
  // Both are installed here: the default is v2 (it reaches 2026-07-28 servers).
  assert.equal(McpConnection.http('https://127.0.0.1:1/mcp').sdk, 'v2');
  assert.equal(McpConnection.stdio({ command: 'true', sdk: 'v1' }).sdk, 'v1');
});

// 6. v1 against the modern-only server.

test('6. v1 against a modern-only server: initialize is refused (HTTP 400, -32022) twice, and the policy escalates protocol-version-unsupported naming the supported revision', async () => {
  // The same outcome as the Rust and Python wrappers' handshake-only clients:
  // the host reports the HTTP status and body; what -32022 means is the
  // policy's to decide (contract 0.5: a retry on a new session, then, refused
  // again, protocol-version-unsupported), not a host's reading of the body.
  const { url } = await startDemo(['--era', 'modern']);
  const connection = track(McpConnection.http(url, { sdk: 'v1' }));
  const { caller, lines } = await newCaller(connection);
  const error = await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => e);
  assert.ok(error instanceof Escalated, `not an escalation: ${String(error)}`);
  assert.equal(error.reason, 'protocol-version-unsupported');
  assert.match(error.note, /-32022/);
  assert.match(error.note, /"supported":\["2026-07-28"\]/);
  assert.deepEqual(steps(lines), [['initialize', 1, 'http 400', 'retry'], ['initialize', 2, 'http 400', 'escalate']]);
  assert.equal(lines[0].rule, 'version-mismatch');
  assert.equal(connection.connections, 0);
});

// 7. The answer to v2's server/discover probe (the rule of all three hosts):
// HTTP 401, 403, 408, 429 or any 5xx is the connect attempt's failure, with its
// status, headers and body; any other 4xx is a 2025 server's refusal (the
// handshake follows). A front in the test answers the probe as told and
// forwards everything else to the demo server.

/** What the front answers for one request instead of forwarding it (status 0: nothing, ever). */
interface FrontAnswer { status: number; headers?: Record<string, string>; body?: string }

/** A front of `upstream`: `answer(rpc)` may answer a POST itself; `rewrite(rpc,
 *  message)` may change each JSON-RPC message of a forwarded answer. */
async function startFront(upstream: string, hooks: {
  answer?: (rpc: string | null) => FrontAnswer | undefined;
  rewrite?: (rpc: string | null, message: Record<string, unknown>) => void;
}) {
  const { createServer } = await import('node:http');
  const seen: Array<{ rpc: string | null; status: number }> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      void (async () => {
        const body = Buffer.concat(chunks).toString('utf8');
        let rpc: string | null = null;
        try {
          const message = JSON.parse(body) as { method?: string };
          rpc = typeof message.method === 'string' ? message.method : null;
        } catch { /* not JSON */ }
        const own = req.method === 'POST' ? hooks.answer?.(rpc) : undefined;
        if (own?.status === 0) return; // never answered (closed with the front)
        if (own) {
          seen.push({ rpc, status: own.status });
          res.writeHead(own.status, { 'content-type': 'text/plain', ...own.headers });
          res.end(own.body ?? '');
          return;
        }
        const headers: Record<string, string> = {};
        for (const [name, value] of Object.entries(req.headers)) {
          if (typeof value === 'string' && !['host', 'content-length', 'connection'].includes(name)) headers[name] = value;
        }
        const answer = await fetch(upstream, { method: req.method, headers, body: req.method === 'POST' ? body : undefined });
        seen.push({ rpc, status: answer.status });
        const type = answer.headers.get('content-type') ?? '';
        let text = await answer.text();
        const edit = (json: string) => {
          const value = JSON.parse(json) as Record<string, unknown> | Array<Record<string, unknown>>;
          for (const m of Array.isArray(value) ? value : [value]) hooks.rewrite?.(rpc, m);
          return JSON.stringify(value);
        };
        if (hooks.rewrite && text) {
          if (type.includes('application/json')) text = edit(text);
          else if (type.includes('text/event-stream')) text = text.replace(/^data: ?(.*)$/gm, (_all, data: string) => `data: ${edit(data)}`);
        }
        const out: Record<string, string> = {};
        answer.headers.forEach((value, name) => {
          if (!['content-length', 'content-encoding', 'transfer-encoding', 'connection'].includes(name)) out[name] = value;
        });
        res.writeHead(answer.status, out);
        res.end(text);
      })().catch((e: unknown) => {
        res.writeHead(502);
        res.end(String(e));
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  closers.push(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}/mcp`, seen };
}

/** A front of a dual-era demo server whose probe answers are `answers` (one per probe, then forwarded). */
async function probeFront(answers: Array<FrontAnswer | undefined> | (() => FrontAnswer)) {
  const { url } = await startDemo(['--era', 'dual']);
  let probes = 0;
  return startFront(url, {
    answer: (rpc) => {
      if (rpc !== 'server/discover') return undefined;
      probes += 1;
      return typeof answers === 'function' ? answers() : answers[probes - 1];
    },
  });
}

const probes = (front: { seen: Array<{ rpc: string | null; status: number }> }) =>
  front.seen.filter((e) => e.rpc === 'server/discover').map((e) => e.status);
const handshakes = (front: { seen: Array<{ rpc: string | null; status: number }> }) => front.seen.filter((e) => e.rpc === 'initialize').length;

test('7. v2, a dual-era server: the probe answered 429 with Retry-After: 1 once is the connect attempt\'s failure; the retry honours the hint and speaks 2026-07-28', async () => {
  const front = await probeFront([{ status: 429, headers: { 'retry-after': '1' }, body: 'slow down' }]);
  const connection = track(McpConnection.http(front.url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection, { sleep: async () => undefined });
  await lookup(caller);
  assert.deepEqual(steps(lines), [
    ['initialize', 1, 'http 429', 'retry'], ['initialize', 2, 'success', 'succeed'],
    ['tools/list', 1, 'success', 'succeed'], ['lookup_order', 1, 'success', 'succeed'],
  ]);
  const throttled = lines[0];
  assert.deepEqual([throttled.class, throttled.hint_ms], ['throttled', 1000]);
  assert.ok((throttled.delay_ms as number) >= 1000, JSON.stringify(throttled));
  assert.equal(connection.protocolVersion, MODERN);
  assert.equal(eraOf(connection), 'modern');
  assert.deepEqual(probes(front), [429, 200]);
  assert.equal(handshakes(front), 0); // never downgraded
});

test('7. v2: the probe answered 403 escalates permission-denied at the connect', async () => {
  const front = await probeFront(() => ({ status: 403, body: 'forbidden' }));
  const connection = track(McpConnection.http(front.url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection, { sleep: async () => undefined });
  const error = await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => e);
  assert.ok(error instanceof Escalated, `not an escalation: ${String(error)}`);
  assert.equal(error.tool, 'initialize');
  assert.equal(error.reason, 'permission-denied');
  assert.deepEqual(steps(lines), [['initialize', 1, 'http 403', 'escalate']]);
  assert.equal(handshakes(front), 0);
  assert.equal(connection.connections, 0);
});

test('7. v2: the probe answered 503 every time escalates after the policy\'s attempts, never falling back', async () => {
  const front = await probeFront(() => ({ status: 503, body: 'unavailable' }));
  const connection = track(McpConnection.http(front.url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection, { sleep: async () => undefined });
  const error = await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => e);
  assert.ok(error instanceof Escalated, `not an escalation: ${String(error)}`);
  assert.equal(error.tool, 'initialize');
  const seen = steps(lines);
  assert.ok(seen.length > 1, JSON.stringify(seen));
  assert.ok(seen.every(([tool, , outcome]) => tool === 'initialize' && outcome === 'http 503'), JSON.stringify(seen));
  assert.deepEqual(seen.slice(0, -1).map((s) => s[3]), seen.slice(0, -1).map(() => 'retry'));
  assert.equal(seen[seen.length - 1][3], 'escalate');
  assert.equal(probes(front).length, seen.length);
  assert.equal(handshakes(front), 0);
});

test('7. v2: the probe answered 404 is a 2025 server\'s refusal: the handshake follows (2025-11-25), no failure', async () => {
  const front = await probeFront(() => ({ status: 404, body: 'not found' }));
  const connection = track(McpConnection.http(front.url, { sdk: 'v2' }));
  const { caller, lines } = await newCaller(connection);
  await lookup(caller);
  assert.deepEqual(steps(lines), [...CLEAN, ['lookup_order', 1, 'success', 'succeed']]);
  assert.equal(connection.protocolVersion, LEGACY);
  assert.equal(eraOf(connection), 'legacy');
  assert.deepEqual(probes(front), [404]);
  assert.equal(handshakes(front), 1);
});

// 8. A server that does not advertise capabilities.tools: the wrapper still lists (and sends the key).

/** Deletes `capabilities.tools` wherever it is in a JSON-RPC answer. */
function stripToolsCapability(value: unknown): void {
  if (typeof value !== 'object' || value === null) return;
  for (const [key, inner] of Object.entries(value)) {
    if (key === 'capabilities' && typeof inner === 'object' && inner !== null) delete (inner as Record<string, unknown>).tools;
    stripToolsCapability(inner);
  }
}

for (const negotiation of ['auto', 'legacy'] as const) {
  test(`8. v2 (${negotiation === 'auto' ? 'server/discover' : 'initialize'}), a server whose answer omits capabilities.tools: tools/list is sent, issue_refund carries its idempotency key`, async () => {
    const demo = await DemoServer.start({ args: ['--era', 'dual'], ledger: true, require: DEMO_FLAGS });
    demos.push(demo);
    const front = await startFront(demo.url, {
      rewrite: (rpc, message) => {
        if (rpc === 'server/discover' || rpc === 'initialize') stripToolsCapability(message.result);
      },
    });
    const connection = track(McpConnection.http(front.url, { sdk: 'v2', clientOptions: { versionNegotiation: { mode: negotiation } } }));
    const { caller, lines } = await newCaller(connection);
    const result = await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 50_000 });
    assert.ok(!result.isError, textOf(result));
    assert.equal(connection.protocolVersion, negotiation === 'auto' ? MODERN : LEGACY);
    assert.ok(front.seen.some((e) => e.rpc === 'tools/list'), 'tools/list was never sent');
    const refund = lines.find((l) => l.tool === 'issue_refund') as Line;
    assert.equal(typeof refund.key, 'string');
    const refunds = demo.ledger().refunds;
    assert.equal(refunds.length, 1);
    assert.equal(refunds[0].idempotency_key, refund.key);
  });
}

// 9. close() does not wait long for a connect that was given up.

test('9. v2: a probe that is never answered, its call stopped by its limit: close() returns at once, not after the probe\'s timeout', async () => {
  const front = await probeFront(() => ({ status: 0 }));
  const connection = track(McpConnection.http(front.url, { sdk: 'v2' }));
  const { caller } = await newCaller(connection, { callTimeoutMs: 300 });
  const error = await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => e);
  assert.equal((error as Error).name, 'CallTimedOut', String(error));
  const began = performance.now();
  await connection.close();
  const took = performance.now() - began;
  assert.ok(took < 2000, `close() took ${Math.round(took)} ms`);
  assert.equal(connection.client, undefined);
});
