// Circuit breakers (contract 0.8.0): the embedded shared state the component
// imports (`EmbeddedSharedState`: compare and set by version, expiry on the
// host's clock, its bounds), and the wrappers with breakers on, against the
// real component: after a breaker opens, the next call is not sent, the model
// is told why (a replan whose message says "circuit breaker open"), and the
// `agent_retry.breaker` events, hook and metrics say what changed.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { ObservedFailure, ReplanNeeded } from '../src/errors.js';
import type { BreakerEvent } from '../src/events.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { RetryMetrics } from '../src/metrics.js';
import { EmbeddedSharedState, MAX_SHARED_KEYS, sharedStateFor } from '../src/shared-state.js';
import { FakeClock, startDemoServer } from '../src/testing.js';
import { CLI } from './demo-server.js';

// The embedded shared state.

/** A store on a clock the test moves. */
function storeAt(start = 1_000_000): { store: EmbeddedSharedState; clock: { now: number } } {
  const clock = { now: start };
  return { store: new EmbeddedSharedState({ clock: () => clock.now }), clock };
}

test('shared state: a store is compare and set by version, from 0 when absent', () => {
  const { store } = storeAt();
  assert.deepEqual(store.load('k', 42n), { value: undefined, version: 0n, nowMs: 42n }, 'absent: none, version 0, the now-ms passed');
  assert.equal(store.storeIf('k', 1n, 'a', 1000n), false, 'a version that is not the current one (0) is refused');
  assert.deepEqual(store.load('k', 43n), { value: undefined, version: 0n, nowMs: 43n }, 'a refused store changes nothing');
  assert.equal(store.storeIf('k', 0n, 'a', 1000n), true);
  assert.deepEqual(store.load('k', 44n), { value: 'a', version: 1n, nowMs: 44n });
  assert.equal(store.storeIf('k', 0n, 'b', 1000n), false, 'the version read before the store is stale');
  assert.equal(store.storeIf('k', 1n, 'b', 1000n), true);
  assert.equal(store.storeIf('k', 1n, 'c', 1000n), false, 'a second writer of version 1 loses');
  assert.deepEqual(store.load('k', 45n), { value: 'b', version: 2n, nowMs: 45n });
  assert.deepEqual(store.load('other', 46n), { value: undefined, version: 0n, nowMs: 46n }, 'keys are apart');
});

test('shared state: an entry expires ttl-ms after its store, on the host clock (not the now-ms passed)', () => {
  const { store, clock } = storeAt(1_000_000);
  assert.equal(store.storeIf('k', 0n, 'a', 500n), true);
  clock.now = 1_000_499;
  // The now-ms the guest passes does not move the expiry: only the host's clock does.
  assert.deepEqual(store.load('k', 9_999_999_999n), { value: 'a', version: 1n, nowMs: 9_999_999_999n });
  clock.now = 1_000_500; // expires_at <= now: absent
  assert.deepEqual(store.load('k', 0n), { value: undefined, version: 0n, nowMs: 0n });
  assert.equal(store.size, 0, 'an expired entry is deleted when read');
  assert.equal(store.storeIf('k', 1n, 'b', 500n), false, 'the expired entry\'s version is gone');
  assert.equal(store.storeIf('k', 0n, 'b', 500n), true, 'stored anew from version 0');
  assert.deepEqual(store.load('k', 1n), { value: 'b', version: 1n, nowMs: 1n });
  // A store on an expired entry it has not read yet sees it absent too.
  clock.now += 500;
  assert.equal(store.storeIf('k', 1n, 'c', 500n), false);
  assert.equal(store.storeIf('k', 0n, 'c', 500n), true);
});

test('shared state: a value over 1,024 bytes is refused', () => {
  const { store } = storeAt();
  assert.equal(store.storeIf('k', 0n, 'x'.repeat(1025), 1000n), false);
  assert.equal(store.storeIf('k', 0n, 'é'.repeat(513), 1000n), false, '1,026 UTF-8 bytes in 513 characters');
  assert.deepEqual(store.load('k', 1n).version, 0n);
  assert.equal(store.storeIf('k', 0n, 'x'.repeat(1024), 1000n), true, '1,024 bytes is within');
  assert.equal(store.storeIf('k', 1n, 'é'.repeat(512), 1000n), true);
  assert.equal(store.storeIf('k', 2n, 'y'.repeat(1025), 1000n), false, 'an existing key is bounded the same');
  assert.deepEqual(store.load('k', 1n), { value: 'é'.repeat(512), version: 2n, nowMs: 1n });
});

test('shared state: a new key is refused when 10,000 are held, after the expired ones are dropped', () => {
  const { store, clock } = storeAt(1_000_000);
  assert.equal(MAX_SHARED_KEYS, 10_000);
  for (let i = 0; i < 9_990; i++) assert.equal(store.storeIf(`long-${i}`, 0n, 'v', 1_000_000n), true);
  for (let i = 0; i < 10; i++) assert.equal(store.storeIf(`short-${i}`, 0n, 'v', 100n), true);
  assert.equal(store.size, 10_000);
  assert.equal(store.storeIf('one-more', 0n, 'v', 1000n), false, 'full: a new key is refused');
  assert.equal(store.storeIf('long-7', 1n, 'w', 1000n), true, 'an existing key is still stored when full');
  clock.now += 100; // the 10 short ones expire
  assert.equal(store.storeIf('one-more', 0n, 'v', 1000n), true, 'the expired ones are dropped to make room');
  assert.equal(store.size, 9_991);
  for (let i = 0; i < 9; i++) assert.equal(store.storeIf(`again-${i}`, 0n, 'v', 1000n), true);
  assert.equal(store.storeIf('too-many', 0n, 'v', 1000n), false, 'full again, nothing expired');
});

test('shared state: one store lives beside each account budget backend', () => {
  const accounts = new EmbeddedAccounts();
  assert.equal(sharedStateFor(accounts), sharedStateFor(accounts));
  assert.notEqual(sharedStateFor(accounts), sharedStateFor(new EmbeddedAccounts()));
});

// The wrappers with breakers on.

const BREAKER = { 'failures-to-open': 2, 'cooldown-ms': 60000 };

async function newRun(config: object, accounts = new EmbeddedAccounts(), runId = 'RUN-BREAKER'): Promise<Run> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts, entropy: new SplitMix64(11n) });
  return instance.loadPolicy(config).startRun(runId);
}

const unavailable: Wit.Observation = {
  kind: { tag: 'http-status', val: 503 }, headers: '', body: 'upstream unavailable', structuredContent: undefined, sessionIdSent: false, delivery: 'unknown',
};

type Line = Record<string, unknown>;
const breakerLines = (lines: Line[]) => lines.filter((l) => l.event === 'agent_retry.breaker');

test('withPolicy with a server: once its breaker opens, the next call is not made, and the model is told', async () => {
  const accounts = new EmbeddedAccounts();
  const config = { 'circuit-breaker': BREAKER, 'base-delay-ms': 10, 'max-delay-ms': 50, tools: { get_quote: { effect: 'read' } } };
  const server = 'https://quotes.example/api';
  const lines: Line[] = [];
  const hooked: BreakerEvent[] = [];
  const metrics = new RetryMetrics();
  const clock = new FakeClock(1_700_000_000_000);
  let calls = 0;
  const failing = () => {
    calls += 1;
    throw new ObservedFailure(unavailable);
  };
  const options = { server, clock, metrics, hooks: { onBreaker: (e: BreakerEvent) => hooked.push(e) }, log: (l: string) => lines.push(JSON.parse(l) as Line) };
  const run = await newRun(config, accounts);

  // The first call: its two 503s open the breaker.
  const first = await withPolicy(run, 'get_quote', failing, options).then(() => undefined, (e: unknown) => e);
  assert.ok(first instanceof Error, String(first));
  const sentFirst = calls;
  assert.ok(sentFirst >= 2, `the first call made ${sentFirst} attempts`);
  const opened = breakerLines(lines).filter((l) => l.from === 'closed' && l.to === 'open');
  assert.ok(opened.length >= 1, `no breaker opened: ${JSON.stringify(breakerLines(lines))}`);
  for (const line of opened) {
    assert.equal(line.server, server);
    assert.ok(line.scope === 'server' || line.scope === 'tool');
    assert.equal(line.tool, 'get_quote');
    assert.equal(line.run, 'RUN-BREAKER');
    assert.equal(typeof line.until_ms, 'number');
    assert.ok(typeof line.why === 'string' && line.why.length > 0);
  }
  assert.deepEqual(Object.keys(opened[0]), ['event', 'ts', 'run', 'policy', 'step', 'call', 'tool', 'server', 'scope', 'from', 'to', 'until_ms', 'why']);
  assert.equal(hooked.length, breakerLines(lines).length, 'the hook sees every breaker event');
  assert.equal(metrics.total('agent_retry.breaker.changes', { to: 'open' }), opened.length);
  assert.match(metrics.toPrometheus(), /^agent_retry_breaker_changes_total\{scope="(server|tool)",to="open"\} 1$/m);

  // The next call (another run sharing the account budget: the same store) is not made.
  const other = await newRun(config, accounts, 'RUN-BREAKER-2');
  lines.length = 0;
  const second = await withPolicy(other, 'get_quote', failing, options).then(() => undefined, (e: unknown) => e);
  assert.ok(second instanceof ReplanNeeded, String(second));
  assert.equal(calls, sentFirst, 'nothing was sent');
  assert.match(second.message, /circuit breaker open/);
  assert.equal(second.rule, 'circuit-open');
  const ends = lines.filter((l) => l.event === 'agent_retry.attempt' || l.event === 'agent_retry.replan');
  assert.deepEqual(ends.map((l) => [l.event, l.attempt, l.outcome ?? null, l.class ?? null, l.action ?? null, l.rule]), [
    ['agent_retry.attempt', 0, 'not sent', null, 'replan', 'circuit-open'],
    ['agent_retry.replan', 0, null, null, null, 'circuit-open'],
  ]);
  assert.equal(ends[1].message, second.message);
  assert.equal(typeof ends[0].call, 'number', 'the call the policy refused has its id');
  assert.equal(other.report().attempts, 0, 'no attempt was spent');

  // After the cooldown, one probe goes (the breaker half-opens as the call begins), and its success closes it.
  clock.advance(60_000);
  lines.length = 0;
  const probe = await newRun(config, accounts, 'RUN-BREAKER-3');
  assert.equal(await withPolicy(probe, 'get_quote', () => { calls += 1; return 'quote'; }, options), 'quote');
  assert.equal(calls, sentFirst + 1, 'the probe was sent');
  const changes = breakerLines(lines).map((l) => [l.scope, l.from, l.to]);
  assert.ok(changes.some(([, from, to]) => from === 'open' && to === 'half-open'), JSON.stringify(changes));
  assert.ok(changes.some(([, from, to]) => from === 'half-open' && to === 'closed'), JSON.stringify(changes));
  const halfOpen = breakerLines(lines).find((l) => l.to === 'half-open');
  assert.equal(typeof halfOpen?.call, 'number', 'a change as the call begins carries its id');
  assert.equal(metrics.total('agent_retry.breaker.changes', { to: 'closed' }), changes.filter(([, , to]) => to === 'closed').length);
});

test('withPolicy without a server: no breaker applies, every call is made', async () => {
  const config = { 'circuit-breaker': BREAKER, 'base-delay-ms': 10, 'max-delay-ms': 50, tools: { get_quote: { effect: 'read' } } };
  const accounts = new EmbeddedAccounts(); // one store for every run, as in the test above
  const lines: Line[] = [];
  let calls = 0;
  for (let n = 1; n <= 3; n++) {
    const run = await newRun(config, accounts, `RUN-NO-SERVER-${n}`);
    const before = calls;
    const error = await withPolicy(run, 'get_quote', () => {
      calls += 1;
      throw new ObservedFailure(unavailable);
    }, { clock: new FakeClock(1_700_000_000_000), log: (l) => lines.push(JSON.parse(l) as Line) }).then(() => undefined, (e: unknown) => e);
    assert.ok(error instanceof Error, String(error));
    assert.ok(calls - before >= 2, `call ${n} made ${calls - before} attempts`);
    assert.ok(!(error instanceof ReplanNeeded && /circuit breaker open/.test(error.message)), error.message);
  }
  assert.deepEqual(breakerLines(lines), []);
  assert.ok(!lines.some((l) => l.rule === 'circuit-open'));
});

test('RetryingToolCaller: a server answering 503 opens its breaker; the next call is not sent and the model is told', async () => {
  await using server = await startDemoServer({ binary: CLI, faults: [{ tool: 'lookup_order', fault: { kind: 'http', status: 503 } }] });
  let sent = 0;
  const counting: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string' && init.body.includes('"tools/call"')) sent += 1;
    return fetch(url, init);
  };
  // The server is told as its URL; the policy keeps it without its query and fragment.
  const connection = McpConnection.http(`${server.url}?tenant=a#frag`, { fetch: counting });
  const url = new URL(server.url);
  const kept = `${url.protocol}//${url.host}${url.pathname}`;
  assert.equal(connection.serverName, `${server.url}?tenant=a#frag`);
  const lines: Line[] = [];
  const metrics = new RetryMetrics();
  const hooked: BreakerEvent[] = [];
  try {
    const config = { 'circuit-breaker': BREAKER, 'base-delay-ms': 10, 'max-delay-ms': 50 };
    const run = await newRun(config);
    const caller = new RetryingToolCaller(connection, run, {
      log: (l) => lines.push(JSON.parse(l) as Line), metrics, hooks: { onBreaker: (e) => hooked.push(e) }, sleep: async () => undefined,
    });
    assert.equal(caller.serverName, connection.serverName);
    const first = await caller.callTool('lookup_order', { order_id: 'A1' }).then((r) => r, (e: unknown) => e);
    const sentFirst = sent;
    assert.ok(sentFirst >= 2, `the first call sent ${sentFirst} requests`);
    const opened = breakerLines(lines).filter((l) => l.from === 'closed' && l.to === 'open');
    assert.ok(opened.length >= 1, `no breaker opened (${JSON.stringify(first)}): ${JSON.stringify(breakerLines(lines))}`);
    for (const line of opened) assert.equal(line.server, kept);
    assert.equal(hooked.length, breakerLines(lines).length);
    assert.equal(metrics.total('agent_retry.breaker.changes', { to: 'open' }), opened.length);

    lines.length = 0;
    const second = await caller.callTool('lookup_order', { order_id: 'A2' });
    assert.equal(sent, sentFirst, 'the call after the breaker opened was not sent');
    assert.equal(second.isError, true);
    const text = second.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join(' ');
    assert.match(text, /circuit breaker open/);
    const replan = lines.find((l) => l.event === 'agent_retry.replan');
    assert.equal(replan?.message, text);
    assert.equal(replan?.rule, 'circuit-open');
    assert.equal(replan?.attempt, 0);
    const attempt = lines.find((l) => l.event === 'agent_retry.attempt' && l.tool === 'lookup_order');
    assert.deepEqual([attempt?.attempt, attempt?.outcome, attempt?.action, attempt?.rule], [0, 'not sent', 'replan', 'circuit-open']);
  } finally {
    await connection.close();
  }
});

test('RetryingToolCaller: the serverName option names the server; the pseudo-calls pass it too', async () => {
  await using server = await startDemoServer({ binary: CLI });
  const connection = McpConnection.http(server.url);
  try {
    const run = await newRun({ 'circuit-breaker': BREAKER });
    const servers: Array<[string, string | undefined]> = [];
    const begin = run.beginCall.bind(run);
    run.beginCall = (name, tool, key, hints, now) => {
      servers.push([tool, name]);
      return begin(name, tool, key, hints, now);
    };
    const caller = new RetryingToolCaller(connection, run, { serverName: 'orders', log: null });
    assert.equal((await caller.callTool('lookup_order', { order_id: 'A1' })).isError, false);
    assert.deepEqual(servers, [['initialize', 'orders'], ['tools/list', 'orders'], ['lookup_order', 'orders']]);
    assert.throws(() => new RetryingToolCaller(connection, run, { serverName: 'x'.repeat(4097) }), TypeError);
  } finally {
    await connection.close();
  }
});

test('McpConnection.serverName: the URL, or stdio: and the command line; the policy keeps at most 256 bytes', async () => {
  assert.equal(McpConnection.stdio({ command: 'node', args: ['server.js', '--port', '0'] }).serverName, 'stdio:node server.js --port 0');
  assert.equal(McpConnection.stdio({ command: 'npx' }).serverName, 'stdio:npx');
  const long = McpConnection.stdio({ command: 'node', args: ['x'.repeat(300)] }).serverName;
  assert.equal(Buffer.byteLength(long), 311, 'passed whole: the policy cuts it');
  const run = await newRun({ 'circuit-breaker': { 'failures-to-open': 1 } });
  const start = run.beginCall(long, 'lookup_order', undefined, { readOnly: true }, 1_764_460_800_000n);
  assert.equal(start.admitted, true);
  run.recordFailure(start.callId, 1, { kind: { tag: 'http-status', val: 503 }, headers: '', body: '', sessionIdSent: false, delivery: 'sent' }, undefined, 1_764_460_800_000n, 0n);
  const [change] = run.takeBreakerChanges();
  assert.equal(Buffer.byteLength(change.server), 256);
  assert.ok(long.startsWith(change.server));
});
