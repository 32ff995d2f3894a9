// The shared state on Redis (src/redis-shared-state.ts), against a real
// redis-server of each test's own (a free port, not 6379 or CI's 6391):
// `RedisSharedState`'s compare and set by version, absent as version 0, a
// wrong-typed key read as absent and replaced, the expiry on the server, the
// server's clock; `FallbackSharedState` with Redis killed (its own state,
// logged once) and back; the component's breakers through Redis: worker
// processes (test/breaker-worker.ts, and its Rust twin
// target/release/breaker-worker, built by `make judge-setup`) seeing one
// breaker, and a half-open breaker letting exactly one probe through among 32
// instances.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { AccountsError } from '../src/redis-accounts.js';
import { FallbackSharedState, RedisSharedState, STATE_PREFIX, type SharedStateEvent } from '../src/redis-shared-state.js';
import { freePort, killRedisServers, RedisServer } from './redis-server.js';

const here = dirname(fileURLToPath(import.meta.url));
const NODE_WORKER = join(here, 'breaker-worker.js');
// The Rust twin (tests/harness), built by `make judge-setup`.
const RUST_WORKER = join(here, '../../../../target/release/breaker-worker');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const run = promisify(execFile);

const backends: Array<{ close(): void }> = [];
after(async () => {
  for (const backend of backends) backend.close();
  await killRedisServers();
});

async function connect(url: string): Promise<RedisSharedState> {
  const state = await RedisSharedState.connect(url);
  backends.push(state);
  return state;
}

async function fallback(url: string, options: { retryIntervalMs?: number; log?: (e: SharedStateEvent) => void } = {}): Promise<FallbackSharedState> {
  const state = await FallbackSharedState.open(url, { log: () => undefined, ...options });
  backends.push(state);
  return state;
}

test('Redis shared state: compare and set by version, absent is version 0, on the Rust host\'s keys', async () => {
  const server = await RedisServer.start();
  const state = await connect(server.url);
  const raw = await server.client();
  try {
    const absent = state.tryLoad('k');
    assert.equal(absent.value, undefined);
    assert.equal(absent.version, 0n);
    assert.equal(state.tryStoreIf('k', 1n, 'a', 60_000n), false, 'a version that is not the current one (0) is refused');
    assert.equal(state.tryLoad('k').version, 0n, 'a refused store changes nothing');
    assert.equal(state.tryStoreIf('k', 0n, 'a', 60_000n), true);
    assert.deepEqual([state.tryLoad('k').value, state.tryLoad('k').version], ['a', 1n]);
    assert.equal(state.tryStoreIf('k', 0n, 'b', 60_000n), false, 'the version read before the store is stale');
    assert.equal(state.tryStoreIf('k', 1n, 'b é ✓', 60_000n), true);
    assert.equal(state.tryStoreIf('k', 1n, 'c', 60_000n), false, 'a second writer of version 1 loses');
    assert.deepEqual([state.tryLoad('k').value, state.tryLoad('k').version], ['b é ✓', 2n], 'UTF-8 text comes back as stored');
    assert.equal(state.tryLoad('other').version, 0n, 'keys are apart');
    // Another connection sees the same state: the store is Redis's.
    const second = await connect(server.url);
    assert.equal(second.tryStoreIf('k', 1n, 'late', 60_000n), false);
    assert.equal(second.tryStoreIf('k', 2n, 'd', 60_000n), true);
    assert.equal(state.tryLoad('k').value, 'd');
    assert.equal(await raw.type(`${STATE_PREFIX}k`), 'hash', "the Rust host's key: a hash under agent-retry:state:");
    assert.deepEqual({ ...(await raw.hGetAll(`${STATE_PREFIX}k`)) }, { value: 'd', version: '3' });
  } finally {
    raw.destroy();
  }
});

test('Redis shared state: a wrong-typed key reads as absent and the next store replaces it', async () => {
  const server = await RedisServer.start();
  const state = await connect(server.url);
  const raw = await server.client();
  try {
    await raw.set(`${STATE_PREFIX}string`, 'another program\'s value');
    assert.deepEqual([state.tryLoad('string').value, state.tryLoad('string').version], [undefined, 0n]);
    assert.equal(state.tryStoreIf('string', 1n, 'v', 60_000n), false, 'its version is 0');
    assert.equal(await raw.type(`${STATE_PREFIX}string`), 'string', 'a refused store leaves it');
    assert.equal(state.tryStoreIf('string', 0n, 'v', 60_000n), true);
    assert.equal(await raw.type(`${STATE_PREFIX}string`), 'hash');
    assert.deepEqual([state.tryLoad('string').value, state.tryLoad('string').version], ['v', 1n]);
    await raw.rPush(`${STATE_PREFIX}list`, ['x']);
    assert.equal(state.tryLoad('list').version, 0n);
    assert.equal(state.tryStoreIf('list', 0n, 'v', 60_000n), true);
    await raw.hSet(`${STATE_PREFIX}hash`, { value: 'x', version: 'not a number' });
    assert.deepEqual([state.tryLoad('hash').value, state.tryLoad('hash').version], [undefined, 0n], 'a hash without a number for its version');
    assert.equal(state.tryStoreIf('hash', 0n, 'v', 60_000n), true);
    assert.deepEqual([state.tryLoad('hash').value, state.tryLoad('hash').version], ['v', 1n]);
  } finally {
    raw.destroy();
  }
});

test('Redis shared state: an entry expires ttl-ms after its store, on the server; now-ms is the server\'s clock', async () => {
  const server = await RedisServer.start();
  const state = await connect(server.url);
  const raw = await server.client();
  try {
    assert.equal(state.tryStoreIf('k', 0n, 'a', 150n), true);
    const pttl = await raw.pTTL(`${STATE_PREFIX}k`);
    assert.ok(pttl > 0 && pttl <= 150, `PTTL ${pttl}`);
    assert.equal(state.tryLoad('k').version, 1n);
    await sleep(250);
    assert.deepEqual([state.tryLoad('k').value, state.tryLoad('k').version], [undefined, 0n], 'expired: absent');
    assert.equal(state.tryStoreIf('k', 1n, 'b', 60_000n), false, "the expired entry's version is gone");
    assert.equal(state.tryStoreIf('k', 0n, 'b', 60_000n), true);
    assert.equal(state.tryStoreIf('zero', 0n, 'z', 0n), true, 'a ttl of 0 is stored for 1 ms');
    await sleep(20);
    assert.equal(state.tryLoad('zero').version, 0n);
    // now-ms: Redis's TIME, not this process's clock (compared with TIME read just before and after).
    const time = async () => {
      const [s, us] = (await raw.sendCommand(['TIME'])) as string[];
      return BigInt(s) * 1000n + BigInt(us) / 1000n;
    };
    const before = await time();
    const loaded = state.tryLoad('k');
    const afterwards = await time();
    assert.ok(loaded.nowMs >= before && loaded.nowMs <= afterwards, `now-ms ${loaded.nowMs} between TIME ${before} and ${afterwards}`);
  } finally {
    raw.destroy();
  }
});

test('Redis shared state: a bad URL and a closed port are clear errors', async () => {
  await assert.rejects(RedisSharedState.connect('http://127.0.0.1:6379'),
    (e) => e instanceof AccountsError && e.kind === 'bad-url' && e.message.startsWith('shared state:'));
  const closed = await freePort();
  await assert.rejects(FallbackSharedState.open(`redis://127.0.0.1:${closed}/`),
    (e) => e instanceof AccountsError && e.kind === 'unreachable' && /shared state: Redis at .* is unusable/.test(e.message));
});

test('fallback shared state: a value over 1,024 bytes is refused before Redis', async () => {
  const server = await RedisServer.start();
  const state = await fallback(server.url);
  const raw = await server.client();
  try {
    assert.equal(state.storeIf('big', 0n, 'é'.repeat(513), 60_000n), false, '1,026 UTF-8 bytes');
    assert.equal(await raw.exists(`${STATE_PREFIX}big`), 0, 'Redis was not asked');
    assert.equal(state.storeIf('big', 0n, 'é'.repeat(512), 60_000n), true, '1,024 bytes');
    assert.equal(state.load('big', 1n).version, 1n);
    assert.equal(state.fallbacks, 0);
  } finally {
    raw.destroy();
  }
});

test('fallback shared state: with Redis killed it answers from its own state, logged once; back on Redis when it returns', async () => {
  const server = await RedisServer.start();
  const events: SharedStateEvent[] = [];
  const state = await fallback(server.url, { retryIntervalMs: 300, log: (e) => events.push(e) });
  assert.equal(state.storeIf('k', 0n, 'on redis', 60_000n), true);
  assert.equal(state.load('k', 5n).value, 'on redis');
  assert.ok(state.load('k', 5n).nowMs > 1_600_000_000_000n, "on Redis, now-ms is the server's clock");

  await server.kill();
  const started = performance.now();
  const local = state.load('k', 7n);
  assert.deepEqual(local, { value: undefined, version: 0n, nowMs: 7n }, "its own state: empty, and the now-ms it was passed");
  assert.ok(performance.now() - started < 1_000, 'the failure is answered within the timeout');
  assert.equal(state.fallbacks, 1);
  assert.equal(state.storeIf('k', 0n, 'local', 60_000n), true, 'stores go to its own state');
  assert.equal(state.storeIf('k', 0n, 'stale', 60_000n), false, 'compare and set there too');
  assert.deepEqual([state.load('k', 8n).value, state.load('k', 8n).version], ['local', 1n]);
  await sleep(350); // the retry is due: Redis fails again, neither counted nor logged again
  assert.equal(state.load('k', 9n).value, 'local');
  assert.equal(state.fallbacks, 1);
  const warnings = events.filter((e) => e.level === 'warning');
  assert.equal(warnings.length, 1, `logged once: ${JSON.stringify(events)}`);
  assert.equal(warnings[0].event, 'agent_retry.shared_state');
  assert.equal(warnings[0].redis, server.url);
  assert.ok(warnings[0].reason && warnings[0].message.includes("this process's own"), JSON.stringify(warnings[0]));

  await server.restart(); // empty, and without the scripts loaded
  const raw = await server.client();
  try {
    await raw.hSet(`${STATE_PREFIX}k`, { value: 'the fleet', version: '4' });
    assert.equal(state.load('k', 10n).value, 'local', 'not before the retry interval');
    await sleep(350);
    assert.deepEqual([state.load('k', 11n).value, state.load('k', 11n).version], ['the fleet', 4n], "Redis's state again");
    assert.equal(state.storeIf('k', 4n, 'next', 60_000n), true);
    assert.deepEqual({ ...(await raw.hGetAll(`${STATE_PREFIX}k`)) }, { value: 'next', version: '5' });
    assert.equal(state.fallbacks, 1);
    assert.equal(events.filter((e) => e.level === 'info').length, 1, `the return is logged once: ${JSON.stringify(events)}`);
  } finally {
    raw.destroy();
  }
});

test('fallback shared state: with Redis paused, each exchange ends within the timeout and the state is its own', async () => {
  const server = await RedisServer.start();
  const state = await fallback(server.url, { retryIntervalMs: 60_000 });
  assert.equal(state.storeIf('k', 0n, 'on redis', 60_000n), true);
  server.signal('SIGSTOP');
  try {
    const started = performance.now();
    assert.deepEqual(state.load('k', 3n), { value: undefined, version: 0n, nowMs: 3n });
    const took = performance.now() - started;
    assert.ok(took >= 400 && took < 1_500, `the load waited for the 500 ms timeout, then answered locally (${Math.round(took)} ms)`);
    assert.equal(state.fallbacks, 1);
    const next = performance.now();
    assert.equal(state.storeIf('k', 0n, 'local', 60_000n), true);
    assert.ok(performance.now() - next < 100, 'while Redis is down, it is not asked');
  } finally {
    server.signal('SIGCONT');
  }
});

test('breakers through Redis: a breaker opened in one worker process refuses the call in another', async () => {
  const server = await RedisServer.start();
  const name = `orders-${randomUUID()}`;
  const worker = async (serverName: string, mode: string) => {
    const { stdout } = await run(process.execPath, [NODE_WORKER, server.url, serverName, mode], { timeout: 30_000 });
    return JSON.parse(stdout.trim()) as Record<string, unknown>;
  };
  const opened = await worker(name, 'open');
  assert.equal(opened.action, 'replan');
  assert.deepEqual(opened.changes, [{ old: 'closed', new: 'open', tool: null }, { old: 'closed', new: 'open', tool: 'lookup_order' }]);
  const refused = await worker(name, 'call');
  assert.equal(refused.admitted, false);
  assert.equal(refused.replan, true);
  assert.match(String(refused.message), /circuit breaker open/);
  const other = await worker(`${name}-other`, 'call');
  assert.deepEqual([other.admitted, other.replan, other.message], [true, false, null], 'another server has a breaker of its own');
});

test('breakers through Redis: Node and Rust worker processes see one breaker, each way', async () => {
  assert.ok(existsSync(RUST_WORKER), `${RUST_WORKER} is missing: build it (make judge-setup builds the Rust worker)`);
  const server = await RedisServer.start();
  const worker = async (host: 'node' | 'rust', serverName: string, mode: string) => {
    const [command, ...script] = host === 'node' ? [process.execPath, NODE_WORKER] : [RUST_WORKER];
    const { stdout } = await run(command, [...script, server.url, serverName, mode], { timeout: 30_000 });
    const line = JSON.parse(stdout.trim()) as Record<string, unknown>;
    assert.equal(line.host, host);
    return line;
  };
  for (const [opener, caller] of [['rust', 'node'], ['node', 'rust']] as const) {
    const name = `orders-${randomUUID()}`;
    const opened = await worker(opener, name, 'open');
    assert.equal(opened.action, 'replan', `${opener} open: ${JSON.stringify(opened)}`);
    const refused = await worker(caller, name, 'call');
    assert.deepEqual([refused.admitted, refused.replan], [false, true], `${caller} after ${opener}: ${JSON.stringify(refused)}`);
    assert.match(String(refused.message), /circuit breaker open/);
  }
});

test('breakers through Redis: a half-open breaker lets exactly one probe through among 32 instances', async () => {
  const server = await RedisServer.start();
  const config = { tools: { lookup_order: { effect: 'read' } }, 'circuit-breaker': { 'failures-to-open': 1, 'cooldown-ms': 200 } };
  const name = `orders-${randomUUID()}`;
  // 8 backends, each its own connection (opened one after another: eight
  // threads booting at once on a loaded machine can miss the connect check).
  const states: FallbackSharedState[] = [];
  for (let i = 0; i < 8; i++) states.push(await fallback(server.url));
  const component = await PolicyComponent.load();
  // Each instance its own account budget: no embedded store beside a shared one could stand in for Redis.
  const runs = await Promise.all(Array.from({ length: 32 }, async (_, i) =>
    (await component.instantiate({ accounts: new EmbeddedAccounts(), sharedState: states[i % states.length] })).loadPolicy(config).startRun(`probe-${i}`)));
  const failure: Wit.Observation = { kind: { tag: 'http-status', val: 503 }, headers: '', body: 'upstream unavailable', sessionIdSent: false, delivery: 'sent' };
  const first = runs[0].beginCall(name, 'lookup_order', undefined, undefined, Date.now());
  assert.equal(first.admitted, true);
  const verdict = runs[0].recordFailure(first.callId, 1, failure, undefined, Date.now());
  assert.equal(verdict.breakerChanged, true, `one failure opens it (${verdict.action})`);
  assert.equal(runs[1].beginCall(name, 'lookup_order', undefined, undefined, Date.now()).replan, true, 'open: refused');
  await sleep(250);
  const starts = runs.slice(2).concat(runs.slice(0, 2)).map((r) => r.beginCall(name, 'lookup_order', undefined, undefined, Date.now()));
  const admitted = starts.filter((s) => s.admitted);
  const replans = starts.filter((s) => !s.admitted && s.replan);
  assert.equal(admitted.length, 1, `exactly one probe: ${admitted.length} admitted`);
  assert.equal(replans.length, 31);
  assert.ok(states.every((s) => s.fallbacks === 0), 'every answer came from Redis');
  const raw = await server.client();
  try {
    const keys = await raw.keys(`${STATE_PREFIX}*${name}*`);
    assert.ok(keys.length > 0, 'the breaker is kept in Redis');
  } finally {
    raw.destroy();
  }
});
