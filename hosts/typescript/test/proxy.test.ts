// `agent-retry proxy` (host-example/src/proxy) driven by the official MCP
// TypeScript SDK clients, which know nothing of the policy: v1
// (`@modelcontextprotocol/sdk`) and v2 (`@modelcontextprotocol/client`), each
// over stdio (the client starts `agent-retry proxy --upstream URL`) and over
// streamable HTTP (`agent-retry proxy --listen 127.0.0.1:0`, its URL read from
// the line it prints on stderr). Upstream is the demo server (demo-server.ts,
// failing on each test's fault script; what it applied read from its ledger),
// and once server-everything (over stdio, started by the proxy). What the
// client sees is asserted, and what the server saw: the ledger, and the fault
// script's call counts (a rule on the Nth call the server receives). The
// proxy's own lines (stderr, one JSON line per attempt) are read too.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import { afterEach, test } from 'node:test';

import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport as StdioV1 } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport as HttpV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Client as ClientV2, StreamableHTTPClientTransport as HttpV2 } from '@modelcontextprotocol/client';
import { StdioClientTransport as StdioV2 } from '@modelcontextprotocol/client/stdio';

import { CLI, DemoServer, ROOT, requireDemo, type Fault, type FaultRule } from './demo-server.js';

const EVERYTHING = join(ROOT, 'tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js');
/** The policy's configuration: small delays, so that the retries are quick. */
const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };
/** The most a request may take before the test fails (the SDKs' own default is 60 s). */
const REQUEST_TIMEOUT_MS = 15_000;
/** The most the proxy may take to print its URL or a line a test waits for. */
const LINE_TIMEOUT_MS = 10_000;

type Sdk = 'v1' | 'v2';
type Form = 'stdio' | 'http';
type Line = Record<string, unknown>;
interface ToolResult { content: Array<{ type: string; text?: string }>; isError?: boolean; structuredContent?: unknown }

/** What a test started, ended after it. */
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await gone;
  clearTimeout(timer);
}

/** The proxy's stderr, line by line: its JSON lines kept, and a bounded wait for one. */
class ProxyLog {
  readonly said: string[] = [];
  readonly lines: Line[] = [];
  private waiters: Array<() => void> = [];

  constructor(stream: Readable) {
    createInterface({ input: stream }).on('line', (text) => {
      this.said.push(text);
      try {
        const parsed = JSON.parse(text) as unknown;
        if (parsed && typeof parsed === 'object') this.lines.push(parsed as Line);
      } catch {
        // the URL line, or the upstream server's own stderr
      }
      for (const wake of this.waiters.splice(0)) wake();
    });
  }

  /** The first line `matches`, waiting for it at most LINE_TIMEOUT_MS (a missing line fails, it does not hang). */
  async waitFor<T>(what: string, matches: (said: string[]) => T | undefined): Promise<T> {
    const deadline = Date.now() + LINE_TIMEOUT_MS;
    for (;;) {
      const found = matches(this.said);
      if (found !== undefined) return found;
      const left = deadline - Date.now();
      if (left <= 0) assert.fail(`the proxy wrote no ${what} in ${LINE_TIMEOUT_MS} ms; it wrote:\n${this.said.join('\n')}`);
      await new Promise<void>((wake) => {
        const timer = setTimeout(wake, left);
        this.waiters.push(() => { clearTimeout(timer); wake(); });
      });
    }
  }

  /** The attempt lines of the model's calls (not the `tools/list` pseudo-calls): [tool, attempt, outcome, action]. */
  attempts(tool: string): Array<[unknown, unknown, unknown, unknown]> {
    return this.lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === tool).map((l) => [l.tool, l.attempt, l.outcome, l.action]);
  }

  /** The attempt lines once `count` of them were read: the proxy writes them to
   *  its stderr, which may arrive after the answer the client already has. */
  async attemptsLogged(tool: string, count: number): Promise<Array<[unknown, unknown, unknown, unknown]>> {
    await this.waitFor(`${count} attempt line(s) of ${tool}`, () => (this.attempts(tool).length >= count ? true : undefined));
    return this.attempts(tool);
  }
}

/** An SDK client connected to the proxy, whatever the SDK and the form. */
interface Proxied {
  listTools(): Promise<Array<{ name: string }>>;
  callTool(name: string, args: Record<string, unknown>): Promise<ToolResult>;
  log: ProxyLog;
}

/** Starts `agent-retry proxy ARGS` (`--config` the policy's, `--settings` if given) in the form and connects an SDK client to it. */
async function proxied(sdk: Sdk, form: Form, args: string[], settings?: Record<string, unknown>): Promise<Proxied> {
  requireDemo();
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-proxy-test-'));
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'policy.json'), JSON.stringify(CONFIG));
  const flags = ['proxy', '--config', join(dir, 'policy.json'), '--watch-ms', '0'];
  if (settings) {
    writeFileSync(join(dir, 'settings.json'), JSON.stringify(settings));
    flags.push('--settings', join(dir, 'settings.json'));
  }
  // The upstream server's command (after `--`) goes last.
  const split = args.indexOf('--');
  const proxyArgs = split < 0 ? [...flags, ...args] : [...flags, ...args.slice(0, split), ...(form === 'http' ? ['--listen', '127.0.0.1:0'] : []), ...args.slice(split)];
  if (split < 0 && form === 'http') proxyArgs.push('--listen', '127.0.0.1:0');

  let log: ProxyLog;
  let transport;
  if (form === 'stdio') {
    const parameters = { command: CLI, args: proxyArgs, stderr: 'pipe' as const };
    const stdio = sdk === 'v1' ? new StdioV1(parameters) : new StdioV2(parameters);
    log = new ProxyLog(stdio.stderr as Readable);
    transport = stdio;
  } else {
    const child = spawn(CLI, proxyArgs, { stdio: ['ignore', 'ignore', 'pipe'] });
    cleanups.push(() => stopChild(child));
    log = new ProxyLog(child.stderr!);
    const exited = new Promise<never>((_, reject) => child.once('exit', (code) => reject(new Error(`the proxy exited (${code}): ${log.said.join('\n')}`))));
    exited.catch(() => undefined);
    const url = await Promise.race([log.waitFor('URL', (said) => said.map((s) => /agent-retry proxy at (\S+)/.exec(s)?.[1]).find(Boolean)), exited]);
    transport = sdk === 'v1' ? new HttpV1(new URL(url)) : new HttpV2(new URL(url));
  }
  const options = { timeout: REQUEST_TIMEOUT_MS };
  if (sdk === 'v1') {
    const client = new ClientV1({ name: 'agent-retry-proxy-test', version: '1.0.0' });
    await client.connect(transport as StdioV1 | HttpV1, options);
    cleanups.push(() => client.close());
    return {
      log,
      listTools: async () => (await client.listTools(undefined, options)).tools,
      callTool: async (name, args) => (await client.callTool({ name, arguments: args }, undefined, options)) as ToolResult,
    };
  }
  const client = new ClientV2({ name: 'agent-retry-proxy-test', version: '1.0.0' });
  await client.connect(transport as StdioV2 | HttpV2, options);
  cleanups.push(() => client.close());
  return {
    log,
    listTools: async () => (await client.listTools(undefined, options)).tools,
    callTool: async (name, args) => (await client.callTool({ name, arguments: args }, options)) as ToolResult,
  };
}

/** The demo server failing on `faults` (its ledger in a file), stopped after the test. */
async function demo(...faults: FaultRule[]): Promise<DemoServer> {
  const server = await DemoServer.start({ faults, ledger: true });
  cleanups.push(() => server.stop());
  return server;
}

const http = (status: number, body = ''): Fault => ({ kind: 'http', status, body });
const textOf = (result: ToolResult) => result.content.flatMap((b) => (b.type === 'text' && b.text !== undefined ? [b.text] : [])).join(' ');
/** A result the server gives its Nth call of a tool, to learn how many calls it saw before. */
const marker = (n: number) => `the server's call ${n} of this tool`;
const markerAt = (tool: string, n: number): FaultRule => ({ tool, call: n, fault: { kind: 'tool-text', text: marker(n) } });
/** The marker's result as the client sees it: an `isError` result (the policy replans), the tool's text in the message. */
function assertMarker(result: ToolResult, tool: string, n: number): void {
  assert.equal(result.isError, true);
  assert.equal(textOf(result), `${tool} failed: tool error: ${marker(n)}`);
}

const COMBINATIONS: Array<[Sdk, Form]> = [['v1', 'stdio'], ['v2', 'http'], ['v1', 'http'], ['v2', 'stdio']];

for (const [sdk, form] of COMBINATIONS) {
  const name = `${sdk} over ${form}`;

  test(`${name}: a 503 once on lookup_order is invisible to the client; the server saw 2 calls`, { timeout: 30_000 }, async () => {
    const server = await demo({ tool: 'lookup_order', call: 1, fault: http(503, 'upstream unavailable') }, markerAt('lookup_order', 3));
    const proxy = await proxied(sdk, form, ['--upstream', server.url]);
    const result = await proxy.callTool('lookup_order', { order_id: 'A1' });
    assert.ok(!result.isError, `the client was shown an error: ${textOf(result)}`);
    assert.match(textOf(result), /"order_id":"A1"/);
    assert.deepEqual(result.structuredContent, { amount_paise: 245000, customer: 'Hansini', order_id: 'A1', status: 'delivered' });
    assert.deepEqual(await proxy.log.attemptsLogged('lookup_order', 2), [['lookup_order', 1, 'http 503', 'retry'], ['lookup_order', 2, 'success', 'succeed']]);
    // The server's next call of lookup_order is its third: the first call took exactly two.
    assertMarker(await proxy.callTool('lookup_order', { order_id: 'A1' }), 'lookup_order', 3);
  });

  test(`${name}: a 400 is a replan: an isError result with the policy's message, not retried`, { timeout: 30_000 }, async () => {
    const server = await demo({ tool: 'issue_refund', call: 1, fault: http(400, 'amount must be an integer number of paise') }, markerAt('issue_refund', 2));
    const proxy = await proxied(sdk, form, ['--upstream', server.url]);
    const result = await proxy.callTool('issue_refund', { order_id: 'A1', amount_paise: 12 });
    assert.equal(result.isError, true);
    assert.equal(textOf(result), 'issue_refund failed: HTTP 400: amount must be an integer number of paise');
    assert.deepEqual(await proxy.log.attemptsLogged('issue_refund', 1), [['issue_refund', 1, 'http 400', 'replan']]);
    assert.deepEqual(server.ledger().refunds, []);
    // Not retried: the server's next call of issue_refund is its second.
    assertMarker(await proxy.callTool('issue_refund', { order_id: 'A1', amount_paise: 12 }), 'issue_refund', 2);
  });

  test(`${name}: a 403 on issue_refund escalates: an isError result carrying the note, and a proxy_escalation line`, { timeout: 30_000 }, async () => {
    const server = await demo({ tool: 'issue_refund', call: 1, fault: http(403, 'refunds above 5000 rupees need a person') }, markerAt('issue_refund', 2));
    const proxy = await proxied(sdk, form, ['--upstream', server.url]);
    const result = await proxy.callTool('issue_refund', { order_id: 'A1', amount_paise: 600000 });
    assert.equal(result.isError, true);
    const note = textOf(result);
    assert.match(note, /stopped: permission denied; a person must grant access or approve the action\./);
    assert.match(note, /Last error: HTTP 403: refunds above 5000 rupees need a person\./);
    assert.deepEqual(await proxy.log.attemptsLogged('issue_refund', 1), [['issue_refund', 1, 'http 403', 'escalate']]);
    const logged = await proxy.log.waitFor('proxy_escalation line', () =>
      proxy.log.lines.find((l) => l.event === 'agent_retry.proxy_escalation'));
    assert.equal(logged.tool, 'issue_refund');
    assert.equal(logged.reason, 'permission-denied');
    // The log names the upstream by scheme, host and port: a query or path may hold a credential.
    assert.equal(logged.server, new URL(server.url).origin);
    assert.equal(logged.message, note);
    assert.deepEqual(server.ledger().refunds, []);
    assertMarker(await proxy.callTool('issue_refund', { order_id: 'A1', amount_paise: 600000 }), 'issue_refund', 2);
  });

  // Half the combinations let the proxy derive the key, half send their own (kept, and sent unchanged).
  const givenKey = sdk === 'v1' ? (form === 'http' ? 'client-key-1' : undefined) : form === 'stdio' ? 'client-key-2' : undefined;
  test(`${name}: a keyed write whose first attempt timed out after it was applied leaves one refund (${givenKey ? 'the client\'s key' : 'a derived key'})`, { timeout: 30_000 }, async () => {
    const server = await demo({ tool: 'issue_refund', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1000 } });
    const proxy = await proxied(sdk, form, ['--upstream', server.url], { 'attempt-timeout-ms': 300 });
    const args = { order_id: 'A1', amount_paise: 500, ...(givenKey ? { idempotency_key: givenKey } : {}) };
    const result = await proxy.callTool('issue_refund', args);
    assert.ok(!result.isError, `the client was shown an error: ${textOf(result)}`);
    const attempts = proxy.log.lines.filter((l) => l.event === 'agent_retry.attempt' && l.tool === 'issue_refund');
    // The retry may become a task of the server's (the proxy drives it to its end): its polls are attempt 2's.
    const seen = attempts.map((l) => [l.attempt, l.outcome, l.action]);
    assert.deepEqual(seen[0], [1, 'transport timeout', 'retry']);
    assert.deepEqual(seen.at(-1), [2, 'success', 'succeed']);
    assert.deepEqual(seen.slice(1, -1).filter(([a, o, act]) => !(a === 2 && o === 'task working' && act === 'poll')), []);
    const key = attempts[0].key;
    assert.equal(typeof key, 'string');
    assert.equal(attempts[1].key, key); // one key for every attempt
    if (givenKey) assert.equal(key, givenKey);
    const refunds = server.ledger().refunds;
    assert.deepEqual(refunds.map((r) => [r.order_id, r.amount_paise, r.idempotency_key]), [['A1', 500, key]]);
  });
}

for (const [sdk, form] of [['v1', 'stdio'], ['v2', 'http']] as Array<[Sdk, Form]>) {
  test(`${sdk} over ${form}: server-everything behind the proxy: its tools listed, echo called`, { timeout: 30_000 }, async () => {
    assert.ok(existsSync(EVERYTHING), `missing ${EVERYTHING}: make fault-proxy-setup`);
    const proxy = await proxied(sdk, form, ['--', process.execPath, EVERYTHING, 'stdio']);
    const tools = (await proxy.listTools()).map((t) => t.name);
    assert.ok(tools.includes('echo'), `no echo in ${tools.join(', ')}`);
    const result = await proxy.callTool('echo', { message: 'through the proxy' });
    assert.ok(!result.isError);
    assert.equal(textOf(result), 'Echo: through the proxy');
    assert.deepEqual(await proxy.log.attemptsLogged('echo', 1), [['echo', 1, 'success', 'succeed']]);
  });
}
