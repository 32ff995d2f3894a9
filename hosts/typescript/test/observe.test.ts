// What the wrapper reports (contract 0.7.0), without a server: network errors
// named as their socket code says (TLS, DNS), how far a request got, the
// time left to the run deadline on every failure, and timers past 2^31 - 1 ms.
import assert from 'node:assert/strict';
import * as diagnostics from 'node:diagnostics_channel';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { fetch as undiciFetch } from 'undici';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import type { Observation } from '../src/index.js';
import {
  DEFAULT_RUN_TIMEOUT_MS, MAX_TIMER_MS, McpConnection, RetryingToolCaller, classifyNetworkError, deliveryOfNetworkError, jsonRpcErrorCode, type VerdictEvent,
} from '../src/mcp.js';
import { describeError } from '../src/mcp/capture.js';
import { CLI, DemoServer, type Fault, type FaultRule } from './demo-server.js';

/** A fetch error as undici gives it: "fetch failed" with the socket's code on its cause. */
const fetchFailed = (code: string) => Object.assign(new TypeError('fetch failed'), { cause: Object.assign(new Error(code), { code }) });

test('a network error is the transport error its code names, and says how far the request got', () => {
  const cases: Array<[string, string, string]> = [
    ['ENOTFOUND', 'name-resolution', 'not-sent'],
    ['EAI_AGAIN', 'name-resolution', 'not-sent'],
    ['CERT_HAS_EXPIRED', 'tls', 'not-sent'],
    ['UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'tls', 'not-sent'],
    ['ERR_TLS_CERT_ALTNAME_INVALID', 'tls', 'not-sent'],
    ['ECONNREFUSED', 'connection-refused', 'not-sent'],
    ['ECONNRESET', 'connection-reset', 'sent'],
    ['UND_ERR_HEADERS_TIMEOUT', 'timeout', 'sent'],
    ['EWHATEVER', 'other', 'unknown'],
  ];
  for (const [code, error, delivery] of cases) {
    assert.equal(classifyNetworkError(fetchFailed(code)), error, code);
    assert.equal(deliveryOfNetworkError(fetchFailed(code)), delivery, code);
  }
  assert.equal(classifyNetworkError(new Error('no code')), 'other');
});

/** A fetch error whose socket error names its syscall, as node's net errors do (`read EHOSTUNREACH`). */
const socketFailed = (code: string, syscall?: string) => Object.assign(new TypeError('fetch failed'), {
  cause: Object.assign(new Error(syscall ? `${syscall} ${code}` : code), { code, ...(syscall ? { syscall } : {}) }),
});

/** A fetch error whose socket error undici reported as its connect's (TCP connect, TLS handshake): published as undici does. */
function connectFailed(code: string): TypeError {
  const error = socketFailed(code);
  diagnostics.channel('undici:client:connectError').publish({ connectParams: {}, connector: () => undefined, error: error.cause });
  return error;
}

const named = (error: unknown) => [classifyNetworkError(error), deliveryOfNetworkError(error)];

test('an unreachable host or network is connection-refused, not-sent only while connecting; on an established connection it is connection-reset, sent', () => {
  for (const code of ['EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'ENETDOWN']) {
    assert.deepEqual(named(socketFailed(code, 'connect')), ['connection-refused', 'not-sent'], `connect ${code}`);
    assert.deepEqual(named(connectFailed(code)), ['connection-refused', 'not-sent'], `${code} in undici's connect`);
    // Linux: an established connection whose retransmissions meet an ICMP unreachable. The request was written.
    assert.deepEqual(named(socketFailed(code, 'read')), ['connection-reset', 'sent'], `read ${code}`);
    assert.deepEqual(named(socketFailed(code, 'write')), ['connection-reset', 'sent'], `write ${code}`);
    assert.deepEqual(named(socketFailed(code)), ['connection-reset', 'sent'], `${code}, no syscall, not undici's connect`);
  }
  // A connect that timed out is UND_ERR_CONNECT_TIMEOUT's fact; a read that did is a timeout.
  assert.deepEqual(named(socketFailed('ETIMEDOUT', 'connect')), ['connection-refused', 'not-sent']);
  assert.deepEqual(named(socketFailed('ETIMEDOUT', 'read')), ['timeout', 'sent']);
  assert.deepEqual(named(socketFailed('ECONNREFUSED', 'connect')), ['connection-refused', 'not-sent']);
});

test('a TLS error is tls, not-sent only in the handshake; a bad record after it is connection-reset, sent', () => {
  for (const code of ['ERR_SSL_DECRYPTION_FAILED_OR_BAD_RECORD_MAC', 'ERR_SSL_SSLV3_ALERT_BAD_RECORD_MAC', 'ERR_SSL_WRONG_VERSION_NUMBER']) {
    assert.deepEqual(named(socketFailed(code)), ['connection-reset', 'sent'], `${code} on an established connection`);
    assert.deepEqual(named(connectFailed(code)), ['tls', 'not-sent'], `${code} in the handshake (undici's connect)`);
  }
  assert.deepEqual(named(socketFailed('EPROTO', 'read')), ['connection-reset', 'sent']);
  assert.deepEqual(named(connectFailed('EPROTO')), ['tls', 'not-sent']);
  // A certificate check is the handshake's, however it is reported.
  for (const code of ['CERT_HAS_EXPIRED', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'ERR_TLS_CERT_ALTNAME_INVALID']) {
    assert.deepEqual(named(socketFailed(code)), ['tls', 'not-sent'], code);
  }
});

test('real sockets: a refused connect and a failed TLS handshake (node\'s fetch and undici\'s) are not-sent', async () => {
  // A server that answers a TLS ClientHello with plain text: the handshake fails (ERR_SSL_WRONG_VERSION_NUMBER).
  const server = createServer((socket) => socket.once('data', () => socket.end('HTTP/1.1 400 Bad Request\r\n\r\nnot TLS\r\n')));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  try {
    for (const [name, fetching] of [['fetch', fetch], ['undici', undiciFetch]] as const) {
      const handshake = await (fetching as typeof fetch)(`https://127.0.0.1:${port}/mcp`, { method: 'POST', body: '{}' }).catch((e: unknown) => e);
      assert.deepEqual(named(handshake), ['tls', 'not-sent'], `${name}: ${String(handshake)} ${describeError(handshake)}`);
    }
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
  const refused = await fetch(`http://127.0.0.1:${port}/mcp`, { method: 'POST', body: '{}' }).catch((e: unknown) => e);
  assert.deepEqual(named(refused), ['connection-refused', 'not-sent'], describeError(refused));
});

/** One `lookup_order` call through the wrapper whose first attempt meets `fault`: that attempt's verdict event, and the connections made. */
async function firstAttempt(connection: McpConnection, options: { attemptTimeoutMs?: number } = {}): Promise<{ event: VerdictEvent; connections: number }> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(9n) });
  const run = instance.loadPolicy({ tools: { lookup_order: { effect: 'read' } } }).startRun('answers');
  const seen: VerdictEvent[] = [];
  const caller = new RetryingToolCaller(connection, run, { log: null, sleep: async () => undefined, onVerdict: (e) => seen.push(e), ...options });
  try {
    await caller.callTool('lookup_order', { order_id: 'A1' }).catch((e: unknown) => {
      if (!(e instanceof Escalated)) throw e;
    });
  } finally {
    await connection.close();
  }
  const event = seen.find((e) => e.tool === 'lookup_order' && e.attempt === 1);
  assert.ok(event, 'no verdict on attempt 1 of lookup_order');
  return { event, connections: connection.connections };
}

test('a server\'s own -32000 / -32001 (an answer came) is protocol-error with its message and data, with either SDK, over HTTP and stdio; the connection lives on', async () => {
  const faults: Fault[] = [
    { kind: 'json-rpc-error', code: -32001, message: 'upstream request timed out', data: { upstream: 'orders' } },
    { kind: 'json-rpc-error', code: -32000, message: 'upstream busy, try again in 20s' },
  ];
  for (const sdk of ['v1', 'v2'] as const) {
    for (const fault of faults) {
      const rule: FaultRule = { tool: 'lookup_order', call: 1, fault };
      const demo = await DemoServer.start({ faults: [rule] });
      const dir = mkdtempSync(join(tmpdir(), 'agent-retry-answers-'));
      writeFileSync(join(dir, 'faults.json'), JSON.stringify([rule]));
      const connections = [
        ['http', () => McpConnection.http(demo.url, { sdk })],
        ['stdio', () => McpConnection.stdio({ command: CLI, args: ['serve', '--stdio', '--faults', join(dir, 'faults.json')], stderr: 'ignore', sdk })],
      ] as const;
      try {
        for (const [transport, connect] of connections) {
          const what = `${sdk} ${transport} ${fault.kind === 'json-rpc-error' ? fault.code : ''}`;
          const { event, connections: made } = await firstAttempt(connect());
          assert.equal(event.reported.tag, 'failure', what);
          const observation = event.reported.tag === 'failure' ? event.reported.val : undefined;
          assert.deepEqual(observation?.kind, { tag: 'protocol-error', val: fault.kind === 'json-rpc-error' ? fault.code : 0 }, what);
          assert.equal(observation?.body, fault.kind === 'json-rpc-error' ? fault.message : '', what);
          assert.equal(observation?.structuredContent, fault.kind === 'json-rpc-error' && fault.data ? JSON.stringify(fault.data) : undefined, what);
          assert.equal(observation?.delivery, 'answer-started', what);
          assert.equal(event.verdict.reconnect, false, what);
          assert.equal(made, 1, `${what}: the server answered, the connection is not lost`);
        }
      } finally {
        await demo.stop();
      }
    }
  }
});

test('the SDK\'s own timeout (no answer came) is transport timeout, sent, with either SDK', async () => {
  for (const sdk of ['v1', 'v2'] as const) {
    const demo = await DemoServer.start({ faults: [{ tool: 'lookup_order', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 1500 } }] });
    try {
      const { event } = await firstAttempt(McpConnection.http(demo.url, { sdk }), { attemptTimeoutMs: 300 });
      const observation = event.reported.tag === 'failure' ? event.reported.val : undefined;
      assert.deepEqual(observation?.kind, { tag: 'transport', val: 'timeout' }, sdk);
      assert.equal(observation?.delivery, 'sent', sdk);
    } finally {
      await demo.stop();
    }
  }
});

test('the code of a JSON-RPC error in an answer body (JSON or SSE) is read for read-probe-answer', () => {
  assert.equal(jsonRpcErrorCode('{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}'), -32601);
  assert.equal(jsonRpcErrorCode('event: message\ndata: {"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"x"}}\n\n'), -32022);
  assert.equal(jsonRpcErrorCode('Session expired'), undefined);
  assert.equal(jsonRpcErrorCode(''), undefined);
});

test('a name that does not resolve is reported name-resolution, not-sent, and escalates at once (connection-misconfigured)', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(3n) });
  const seen: VerdictEvent[] = [];
  const connection = McpConnection.http('http://agent-retry-no-such-host.invalid/mcp', { sdk: 'v2' });
  const caller = new RetryingToolCaller(connection, instance.loadPolicy({}).startRun('dns'),
    { log: null, sleep: async () => undefined, onVerdict: (e) => seen.push(e) });
  try {
    await assert.rejects(caller.callTool('lookup_order', {}), (e: unknown) => e instanceof Escalated && e.reason === 'connection-misconfigured' && e.tool === 'initialize');
  } finally {
    await connection.close();
  }
  assert.equal(seen.length, 1);
  const reported = seen[0].reported;
  assert.ok(reported.tag === 'failure');
  assert.deepEqual([reported.val.kind, reported.val.delivery, reported.val.sessionIdSent], [{ tag: 'transport', val: 'name-resolution' }, 'not-sent', false]);
  assert.equal(seen[0].verdict.class, 'misconfigured');
});

/** A fake client whose `lookup` fails with an `isError` result `failures` times, then succeeds. */
function flaky(failures: number): Client {
  let sent = 0;
  return {
    listTools: async () => ({ tools: [{ name: 'lookup', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true } }] }),
    callTool: async () => {
      sent += 1;
      if (sent <= failures) return { isError: true, content: [{ type: 'text', text: 'upstream returned HTTP 503, try again' }] };
      return { content: [{ type: 'text', text: 'ok' }] };
    },
  } as unknown as Client;
}

/** The `time-left-ms` each `recordFailure` of the caller's run was given. */
function timeLefts(caller: RetryingToolCaller): Array<bigint | number | undefined> {
  const seen: Array<bigint | number | undefined> = [];
  const run = caller.run;
  const record = run.recordFailure.bind(run);
  run.recordFailure = (callId: number, attempt: number, observation: Observation, left: bigint | number | undefined, now: bigint | number, entropy?: bigint) => {
    seen.push(left);
    return record(callId, attempt, observation, left, now, entropy);
  };
  return seen;
}

test('with a run deadline (runTimeoutMs, 30 minutes by default) every failure reports the time left; with null, none', async () => {
  const component = await PolicyComponent.load();
  const policyOf = async () => (await component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(1n) })).loadPolicy({});
  const bounded = new RetryingToolCaller(flaky(1), (await policyOf()).startRun('deadline'), { log: null, sleep: async () => undefined, runTimeoutMs: 60_000 });
  const left = timeLefts(bounded);
  assert.ok(!(await bounded.callTool('lookup')).isError);
  assert.equal(left.length, 1);
  assert.ok(typeof left[0] === 'bigint' && left[0] > 50_000n && left[0] <= 60_000n, String(left[0]));

  // The default deadline: 30 minutes from the caller's construction.
  assert.equal(DEFAULT_RUN_TIMEOUT_MS, 1_800_000);
  const byDefault = new RetryingToolCaller(flaky(1), (await policyOf()).startRun('default-deadline'), { log: null, sleep: async () => undefined });
  const defaultLeft = timeLefts(byDefault);
  assert.ok(!(await byDefault.callTool('lookup')).isError);
  assert.ok(typeof defaultLeft[0] === 'bigint' && defaultLeft[0] > 1_700_000n && defaultLeft[0] <= 1_800_000n, String(defaultLeft[0]));

  const free = new RetryingToolCaller(flaky(1), (await policyOf()).startRun('no-deadline'), { log: null, sleep: async () => undefined, runTimeoutMs: null });
  const none = timeLefts(free);
  assert.ok(!(await free.callTool('lookup')).isError);
  assert.deepEqual(none, [undefined]);

  // A deadline already passed: 0 is reported (never a negative number), and the call is stopped.
  const late = new RetryingToolCaller(flaky(5), (await policyOf()).startRun('late'), { log: null, sleep: async () => undefined, runTimeoutMs: 0 });
  await assert.rejects(late.callTool('lookup'), /run's limit of 0 ms passed/);
});

test('a deadline or a wait longer than 2^31 - 1 ms does not fire at once (setTimeout would)', async () => {
  assert.equal(MAX_TIMER_MS, 2 ** 31 - 1);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(1n) });
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.name);
  process.on('warning', onWarning);
  try {
    const caller = new RetryingToolCaller(flaky(1), instance.loadPolicy({}).startRun('long'), {
      log: null, sleep: async () => undefined, callTimeoutMs: 2 ** 40, runTimeoutMs: 2 ** 41, attemptTimeoutMs: 2 ** 35,
    });
    const result = await caller.callTool('lookup');
    assert.ok(!result.isError, 'a 2^40 ms limit is not a limit of 1 ms');
    await new Promise((resolve) => setImmediate(resolve));
  } finally {
    process.off('warning', onWarning);
  }
  assert.ok(!warnings.includes('TimeoutOverflowWarning'), warnings.join());
});

test('McpConnection.connect with a timeout past 2^31 - 1 ms connects (the SDK\'s timer would fire at once)', async () => {
  const demo = await DemoServer.start();
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.name);
  process.on('warning', onWarning);
  try {
    for (const sdk of ['v1', 'v2'] as const) {
      const connection = McpConnection.http(demo.url, { sdk });
      try {
        await connection.connect({ timeoutMs: 2 ** 40 });
        assert.equal(connection.connections, 1, sdk);
      } finally {
        await connection.close();
      }
    }
    await new Promise((resolve) => setImmediate(resolve));
  } finally {
    process.off('warning', onWarning);
    await demo.stop();
  }
  assert.ok(!warnings.includes('TimeoutOverflowWarning'), warnings.join());
});
