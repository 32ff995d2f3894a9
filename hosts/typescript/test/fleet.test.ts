// Fleet updates through Redis (src/fleet.ts, LivePolicy.openFleet): the Rust
// host's host-example/tests/fleet.rs for this host. Each test starts its own
// redis-server on a free port (not 6379, not CI's 6391) and kills it after;
// workers are separate Node processes (test/fleet-worker.ts) printing JSON lines.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, execFile, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import { createClient, RESP_TYPES } from 'redis';

import { locateComponent } from '../src/component.js';
import { UpdateFleetError, UpdateOlderError, UpdateSelfTestError } from '../src/errors.js';
import { DEFAULT_PREFIX, Fleet, FleetError, MAX_REVISION, REDIS_TIMEOUT_MS, parseRevision, publishPolicy } from '../src/fleet.js';
import { Integrity, LivePolicy, type LiveOptions, type PolicyUpdateEvent } from '../src/live.js';
import { ManifestError, signPublication } from '../src/manifest.js';
import { killRedisServers, RedisServer } from './redis-server.js';

const here = dirname(fileURLToPath(import.meta.url));
const WORKER = join(here, 'fleet-worker.js');
const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-fleet-cache-'));
const WASM = readFileSync(locateComponent() ?? assert.fail('the component: make wasm'));
/** The Rust host's command line (`cargo build --release -p agent-retry-cli`; `make test` builds it). */
const RUST_CLI = process.env.AGENT_RETRY_CLI ?? join(here, '../../../../target/release/agent-retry');

const config = (attempts: number) => `{"default-effect": "read", "max-attempts-per-call": ${attempts}}`;
const sha256Hex = (text: string | Uint8Array) => createHash('sha256').update(text).digest('hex');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A TEST-ONLY Ed25519 seed (tests/vectors/fleet/manifests.json's), and its public key. */
const SEED = Uint8Array.from(Buffer.from('0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20', 'hex'));
const PUBLIC_KEY_HEX = (JSON.parse(readFileSync(join(here, '../../../../tests/vectors/fleet/manifests.json'), 'utf8')) as { public_key: string }).public_key;


/** `redis-cli -p <port> …` (stdin: `input`, for `-x`), its answer trimmed. */
function cli(redis: RedisServer, args: string[], input?: Buffer): string {
  const out = spawnSync('redis-cli', ['-p', String(redis.port), ...args], { input });
  if (out.error) throw out.error;
  return out.stdout.toString().trim();
}

/** A raw client of the test's own, for reading and writing keys directly. */
async function raw(url: string) {
  const client = createClient({ url, socket: { reconnectStrategy: false } });
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

/** A worker process (test/fleet-worker.ts) and its JSON lines. */
class Worker {
  private readonly lines: Array<Record<string, unknown>> = [];
  private waiting: (() => void) | undefined;
  readonly child: ChildProcess;
  stderr = '';

  constructor(url: string, options: { prefix?: string; intervalMs?: number; publicKeyHex?: string } = {}) {
    this.child = spawn(process.execPath, [WORKER], {
      env: {
        ...process.env, FLEET_WORKER: '1', FLEET_URL: url, FLEET_PREFIX: options.prefix ?? '', FLEET_INTERVAL_MS: String(options.intervalMs ?? 2000),
        FLEET_PUBLIC_KEY: options.publicKeyHex ?? '', AGENT_RETRY_CACHE_DIR: cacheDir,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    workers.add(this);
    this.child.stderr?.on('data', (d: Buffer) => (this.stderr += d.toString()));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      try {
        this.lines.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        this.lines.push({ event: 'not-json', line });
      }
      this.waiting?.();
    });
  }

  /** The next line whose event is `event` (earlier lines of other events are dropped), within `ms`. */
  async next(event: string, ms = 15_000): Promise<Record<string, unknown>> {
    const deadline = Date.now() + ms;
    for (;;) {
      while (this.lines.length > 0) {
        const line = this.lines.shift()!;
        if (line.event === event) return line;
        if (line.event === 'crashed' || line.event === 'open-failed') assert.fail(`worker: ${JSON.stringify(line)}`);
      }
      const left = deadline - Date.now();
      if (left <= 0) assert.fail(`no ${event} line within ${ms} ms; stderr: ${this.stderr}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiting = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.waiting = undefined;
    }
  }

  async ask(command: 'decide' | 'status'): Promise<Record<string, unknown>> {
    this.child.stdin!.write(`${command}\n`);
    return this.next(command === 'decide' ? 'decided' : 'status');
  }

  /** Until its subscription to the channel is up (polling `status`). */
  async subscribed(): Promise<void> {
    const deadline = Date.now() + 10_000;
    while ((await this.ask('status')).subscribed !== true) {
      if (Date.now() > deadline) assert.fail('the worker never subscribed');
      await sleep(50);
    }
  }

  kill(): void {
    workers.delete(this);
    this.child.kill('SIGKILL');
  }
}
const workers = new Set<Worker>();

after(async () => {
  for (const worker of [...workers]) worker.kill();
  await killRedisServers();
});

type Policy = { generation: number; config_sha256: string; wasm_sha256: string };
const policyOf = (line: Record<string, unknown>) => line.policy as Policy;

test('publishPolicy writes the Rust host\'s layout in one script and announces it', async () => {
  const redis = await RedisServer.start();
  const client = await raw(redis.url);
  const messages: string[] = [];
  const subscriber = client.duplicate();
  subscriber.on('error', () => undefined);
  await subscriber.connect();
  await subscriber.subscribe(`${DEFAULT_PREFIX}:updates`, (message) => messages.push(message));
  try {
    assert.equal(DEFAULT_PREFIX, 'agent-retry:policy');
    const manifest = signPublication(SEED, WASM, config(4), null, 1_000);
    await client.set('agent-retry:policy:wasm.sig', 'a signature over the .wasm alone (before 0.7)');
    const first = await publishPolicy(redis.url, WASM, config(4), { manifest });
    assert.equal(first, 1_000, "a signed publication is stored under its manifest's revision");
    const buffers = client.withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
    assert.ok((await buffers.get('agent-retry:policy:wasm'))?.equals(WASM), 'the .wasm, byte for byte');
    assert.equal(await client.get('agent-retry:policy:config'), config(4));
    assert.equal(await client.get('agent-retry:policy:manifest'), manifest);
    assert.equal(await client.exists('agent-retry:policy:wasm.sig'), 0, 'a signature over the .wasm alone is deleted');
    assert.equal(await client.get('agent-retry:policy:revision'), String(first));
    // Unsigned: the old manifest is deleted, never left beside another publication.
    const second = await publishPolicy(redis.url, WASM, config(2));
    assert.ok(second > first, `revisions grow: ${first} then ${second}`);
    assert.equal(await client.exists('agent-retry:policy:manifest'), 0);
    // Another prefix, a manifest as bytes.
    const other = signPublication(SEED, WASM, config(3), null, 7);
    assert.equal(await publishPolicy(redis.url, WASM, config(3), { prefix: 'team-a:policy', manifest: Buffer.from(other) }), 7);
    assert.equal(await client.get('team-a:policy:manifest'), other);
    assert.equal(await client.get('agent-retry:policy:revision'), String(second), 'the other prefix is another policy');
    await sleep(100);
    assert.deepEqual(messages, ['published', 'published']);
    // What a worker reads: one MGET, Buffers.
    const read = await new Fleet({ url: redis.url }).read();
    assert.ok(Buffer.isBuffer(read.wasm) && read.wasm.equals(WASM));
    assert.ok(Buffer.isBuffer(read.config) && read.config.toString() === config(2));
    assert.equal(read.manifest, undefined);
    assert.equal(read.legacySignature, false);
    assert.equal(read.revision, second);
    // Refused before anything is written: not a manifest, one that does not cover what is published, one signed for files.
    await assert.rejects(publishPolicy(redis.url, WASM, config(5), { manifest: 'not a manifest' }), (e: unknown) => e instanceof ManifestError && e.kind === 'malformed');
    await assert.rejects(publishPolicy(redis.url, WASM, config(5), { manifest: other }), /config-sha256 .* changed after signing: nothing was written/);
    await assert.rejects(publishPolicy(redis.url, WASM, config(5), { manifest: signPublication(SEED, WASM, config(5)) }), /revision none \(signed for files\)/);
    // A manifest whose revision is not greater than the stored one: the script refuses, nothing is written.
    await assert.rejects(publishPolicy(redis.url, WASM, config(5), { manifest: signPublication(SEED, WASM, config(5), null, second) }), /is not greater than the stored revision .* nothing was written/);
    assert.equal(await client.get('agent-retry:policy:config'), config(2));
  } finally {
    subscriber.destroy();
    client.destroy();
    await redis.kill();
  }
});

test('nothing published, Redis away, Redis silent: refused at open with the reason, within the 500 ms timeout', async () => {
  const redis = await RedisServer.start();
  try {
    await assert.rejects(LivePolicy.openFleet({ url: redis.url }, Integrity.unchecked()), (e: unknown) =>
      e instanceof UpdateFleetError && e.kind === 'fleet' && /nothing published at agent-retry:policy:wasm/.test(e.message));
  } finally {
    await redis.kill();
  }
  await assert.rejects(LivePolicy.openFleet({ url: redis.url }, Integrity.unchecked()), (e: unknown) =>
    e instanceof UpdateFleetError && e.kind === 'fleet' && /ECONNREFUSED/.test(e.message));
  // A server that accepts connections and never answers: every command has 500 ms.
  const sockets: Socket[] = [];
  const silent: Server = createServer((socket) => sockets.push(socket));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
  const url = `redis://127.0.0.1:${(silent.address() as { port: number }).port}`;
  try {
    const start = performance.now();
    await assert.rejects(new Fleet({ url }).revision(), (e: unknown) => e instanceof FleetError && /500 ms|timeout/i.test((e as Error).message));
    const took = performance.now() - start;
    console.log(`# a silent Redis: GET revision gave up after ${took.toFixed(0)} ms`);
    assert.ok(took >= REDIS_TIMEOUT_MS - 20 && took < 3 * REDIS_TIMEOUT_MS, `${took} ms`);
    await assert.rejects(publishPolicy(url, WASM, config(2)), FleetError);
  } finally {
    for (const socket of sockets) socket.destroy();
    silent.close();
  }
});

test('one publication reaches every worker process through the channel; a worker started after it takes it at open', async () => {
  const redis = await RedisServer.start();
  assert.ok(await publishPolicy(redis.url, WASM, config(4)) > 0);
  // A polling interval of a minute: the announcement on the channel is what wakes them.
  const fleet = [0, 1, 2].map(() => new Worker(redis.url, { intervalMs: 60_000 }));
  for (const worker of fleet) {
    const serving = policyOf(await worker.next('serving', 30_000));
    assert.equal(serving.config_sha256, sha256Hex(config(4)));
    assert.equal(serving.wasm_sha256, sha256Hex(WASM));
    assert.equal(serving.generation, 1);
    assert.equal((await worker.ask('decide')).attempts, 4);
  }
  for (const worker of fleet) await worker.subscribed();
  let published = performance.now();
  assert.ok(await publishPolicy(redis.url, WASM, config(2)) > 0);
  const latencies: number[] = [];
  for (const worker of fleet) {
    const serving = policyOf(await worker.next('serving', 10_000));
    latencies.push(performance.now() - published);
    assert.equal(serving.config_sha256, sha256Hex(config(2)));
    assert.equal(serving.generation, 2);
    assert.equal((await worker.ask('decide')).attempts, 2, "new runs get the fleet's new budget");
  }
  console.log(`# publication to 3 worker processes, through the channel: ${latencies.map((ms) => `${ms.toFixed(0)} ms`).join(', ')} (the poll is every 60 s)`);
  // A worker down during the next publication takes it when it starts.
  fleet.shift()!.kill();
  published = performance.now();
  assert.ok(await publishPolicy(redis.url, WASM, config(3)) > 0);
  const late = new Worker(redis.url, { intervalMs: 60_000 });
  const first = policyOf(await late.next('serving', 30_000));
  assert.equal(first.config_sha256, sha256Hex(config(3)));
  assert.equal(first.generation, 1);
  assert.equal((await late.ask('decide')).attempts, 3);
  for (const worker of fleet) {
    const serving = policyOf(await worker.next('serving', 10_000));
    assert.equal(serving.config_sha256, sha256Hex(config(3)));
    assert.equal(serving.generation, 3);
  }
  for (const worker of [...fleet, late]) worker.kill();
  await redis.kill();
});

// Issue 24, row 2: the signature covered the .wasm alone, so a configuration
// rewritten in Redis after signing was taken (4 attempts on a persistent 503
// became 100), and deleting `:vectors` dropped their check. The signed
// manifest now covers the whole publication.
test('under an Ed25519 key only the publication as signed is taken and the last good one serves', async () => {
  const redis = await RedisServer.start();
  const prefix = 'team-a:policy';
  const key = (name: string) => `${prefix}:${name}`;
  // Nothing announces a rewrite: the next revision (and a message) makes every worker read it.
  const rewritten = (...commands: string[][]): number => {
    for (const command of commands) cli(redis, command);
    const revision = Number(cli(redis, ['INCR', key('revision')]));
    cli(redis, ['PUBLISH', key('updates'), 'rewritten']);
    return revision;
  };
  const vectors = '{"description": "the fleet\'s promises", "cases": []}';
  assert.equal(await publishPolicy(redis.url, WASM, config(4), { prefix, vectors, manifest: signPublication(SEED, WASM, config(4), vectors, 1_000) }), 1_000);
  const worker = new Worker(redis.url, { prefix, intervalMs: 200, publicKeyHex: PUBLIC_KEY_HEX });
  const serving = policyOf(await worker.next('serving', 30_000));
  assert.equal(serving.generation, 1);
  assert.equal((await worker.ask('decide')).attempts, 4);

  // The configuration rewritten in Redis, the signed .wasm untouched: refused, the old policy keeps serving.
  rewritten(['SET', key('config'), config(100)]);
  let refused = await worker.next('refused');
  assert.equal(refused.kind, 'integrity');
  assert.match(String(refused.reason), /config-sha256 .* changed after signing/);
  assert.equal((await worker.ask('decide')).attempts, 4);
  // The vectors deleted.
  rewritten(['SET', key('config'), config(4)], ['DEL', key('vectors')]);
  assert.match(String((await worker.next('refused')).reason), /removed after signing/);
  // The publication as signed, under another revision.
  const revision = rewritten(['SET', key('vectors'), vectors]);
  assert.match(String((await worker.next('refused')).reason), new RegExp(`is revision ${revision}: not the revision it was signed for`));
  // Unsigned, then a signature over the .wasm alone (before 0.7).
  await publishPolicy(redis.url, WASM, config(2), { prefix });
  assert.match(String((await worker.next('refused')).reason), /unsigned: no signed manifest at team-a:policy:manifest/);
  rewritten(['SET', key('wasm.sig'), '00'.repeat(64)]);
  assert.match(String((await worker.next('refused')).reason), /\(before 0\.7\) is not accepted: sign the whole publication/);
  // Signed by another key.
  const stored = Number(cli(redis, ['GET', key('revision')]));
  await publishPolicy(redis.url, WASM, config(2), { prefix, manifest: signPublication(new Uint8Array(32).fill(9), WASM, config(2), null, stored + 1) });
  assert.match(String((await worker.next('refused')).reason), /does not verify under the configured key/);
  const status = await worker.ask('status');
  assert.deepEqual(policyOf(status), serving, 'the last good policy serves');
  assert.equal(status.refused, 6);
  assert.equal((await worker.ask('decide')).attempts, 4);
  // Signed properly, it is taken: generation 2, the refusals took no number.
  await publishPolicy(redis.url, WASM, config(2), { prefix, manifest: signPublication(SEED, WASM, config(2), null, stored + 2) });
  const taken = policyOf(await worker.next('serving'));
  assert.equal(taken.config_sha256, sha256Hex(config(2)));
  assert.equal(taken.generation, 2);
  assert.equal((await worker.ask('decide')).attempts, 2);
  worker.kill();
  await redis.kill();
});

test('a watcher outlives Redis: killed, restarted empty (nothing published: refused, the last good serves), the next publication taken', async () => {
  let redis = await RedisServer.start();
  await publishPolicy(redis.url, WASM, config(4));
  const worker = new Worker(redis.url, { intervalMs: 200 });
  const serving = policyOf(await worker.next('serving', 30_000));
  await worker.subscribed();
  await redis.kill();
  const away = await worker.next('log', 5_000);
  assert.equal(away.message, 'cannot check for a policy update');
  await sleep(1_000);
  assert.equal((await worker.ask('decide')).attempts, 4, 'the policy serves with Redis away');
  assert.equal((await worker.ask('status')).subscribed, false);
  // Back, but empty (a restart without persistence): nothing to take, the last good serves.
  redis = await RedisServer.start(redis.port);
  const refused = await worker.next('refused');
  assert.equal(refused.kind, 'fleet');
  assert.match(String(refused.reason), /nothing published at agent-retry:policy:wasm/);
  const status = await worker.ask('status');
  assert.deepEqual(policyOf(status), serving);
  assert.equal(status.refused, 1, 'refused once, not at every poll');
  await publishPolicy(redis.url, WASM, config(2));
  const taken = policyOf(await worker.next('serving'));
  assert.equal(taken.config_sha256, sha256Hex(config(2)));
  assert.equal(taken.generation, 2);
  await worker.subscribed(); // the subscription is made again
  worker.kill();
  await redis.kill();
});

test('in process: a watcher takes a publication, logs an outage once, and does not keep the process alive', async () => {
  const redis = await RedisServer.start();
  await publishPolicy(redis.url, WASM, config(4));
  const events: PolicyUpdateEvent[] = [];
  const options: LiveOptions = { cacheDir, log: (e) => events.push(e) };
  const live = await LivePolicy.openFleet({ url: redis.url }, Integrity.pinnedSha256(sha256Hex(WASM)), options);
  assert.deepEqual(live.source, { url: redis.url, prefix: DEFAULT_PREFIX, integrity: live.source.integrity });
  assert.equal(await live.poll(), undefined, 'nothing new');
  await publishPolicy(redis.url, WASM, config(2));
  assert.equal((await live.poll())?.generation, 2);
  // A pinned digest refuses another .wasm from the fleet.
  const other = Buffer.concat([WASM, Buffer.from([0, 5, 4, 0x74, 0x65, 0x73, 0x74])]); // a custom section "test"
  await publishPolicy(redis.url, other, config(3));
  await assert.rejects(live.poll(), (e: unknown) => e instanceof Error && /pinned digest/.test(e.message));
  assert.equal(await live.poll(), undefined, 'a refused revision is tried once');
  await redis.kill();
  for (let i = 0; i < 3; i++) assert.equal(await live.poll(), undefined);
  const warnings = events.filter((e) => e.message === 'cannot check for a policy update');
  assert.equal(warnings.length, 1, 'an outage is logged once');
  assert.match(String(warnings[0].reason), /ECONNREFUSED/);
  await assert.rejects(live.reload(), UpdateFleetError);
  assert.equal(live.current().identity.generation, 2);
  assert.deepEqual(live.metrics, { accepted: 1, refused: 2, rolledBack: 0 });
  live.close();
  // A process that only watches a fleet exits by itself once its own work is done.
  const other2 = await RedisServer.start();
  await publishPolicy(other2.url, WASM, '{}');
  const script = `import { LivePolicy, Integrity } from ${JSON.stringify(pathToFileURL(join(here, '../src/index.js')).href)};
    const live = await LivePolicy.openFleet({ url: ${JSON.stringify(other2.url)} }, Integrity.unchecked(), { log: () => {} });
    const watcher = live.watch(50);
    console.log('watching ' + live.current().identity);
    setTimeout(() => console.log(watcher.native ? 'subscribed' : 'not subscribed'), 1000);`;
  const start = performance.now();
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script],
    { timeout: 20_000, env: { ...process.env, AGENT_RETRY_CACHE_DIR: cacheDir } });
  assert.match(stdout, /^watching generation 1 .*\nsubscribed\n$/s);
  console.log(`# a fleet-watching process exited by itself ${(performance.now() - start).toFixed(0)} ms after its start (its own timer: 1000 ms)`);
  await other2.kill();
});

/** Vectors a publication ships with: a case without `config` runs with the published configuration. */
const FOUR_ATTEMPTS = 'a persistent 503 on a read gets 4 attempts, then escalates';
const http503 = { failure: { kind: { 'http-status': 503 } } };
const VECTORS = JSON.stringify({
  description: 'what the publication promises',
  cases: [{
    description: FOUR_ATTEMPTS,
    steps: [
      { op: 'begin-call', call: { tool: 'lookup_order' } },
      { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 2 } } } } },
      { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 3 } } } } },
      { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 4 } } } } },
      { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { escalate: { reason: 'call-attempts-spent' } } } } },
    ],
  }],
});

test('a publication may ship vectors ({prefix}:vectors): a worker runs them against the candidate and refuses one that fails', async () => {
  const redis = await RedisServer.start();
  const client = await raw(redis.url);
  try {
    const prefix = 'team-v:policy';
    const first = await publishPolicy(redis.url, WASM, config(4), { prefix, vectors: VECTORS });
    assert.equal(await client.get(`${prefix}:vectors`), VECTORS, 'SET in the same transaction');
    assert.equal(await client.get(`${prefix}:revision`), String(first));
    const read = await new Fleet({ url: redis.url, prefix }).read();
    assert.ok(read.vectors?.equals(Buffer.from(VECTORS)), 'read in the same MGET');
    assert.equal(read.revision, first);

    const events: PolicyUpdateEvent[] = [];
    const live = await LivePolicy.openFleet({ url: redis.url, prefix }, Integrity.unchecked(), { cacheDir, log: (e) => events.push(e) });
    assert.equal(live.current().identity.generation, 1, 'published with 4 attempts: the vectors pass');

    // The same vectors published with a configuration of 2 attempts: refused, naming the case.
    const failing = await publishPolicy(redis.url, WASM, config(2), { prefix, vectors: VECTORS });
    await assert.rejects(live.poll(), (e: unknown) => {
      assert.ok(e instanceof UpdateSelfTestError, String(e));
      assert.equal(e.kind, 'self-test');
      assert.ok(e.message.includes(`${prefix}:vectors (revision ${failing})`), e.message);
      assert.ok(e.message.includes(`"${FOUR_ATTEMPTS}" step 3 (record-outcome)`), e.message);
      return true;
    });
    assert.equal(live.current().identity.generation, 1, 'the last good policy keeps serving');
    assert.equal(live.current().identity.configSha256, sha256Hex(config(4)));
    const refused = events.filter((e) => e.message === 'policy update refused');
    assert.equal(refused.length, 1);
    assert.equal(refused[0].kind, 'self-test');

    // Malformed vectors: refused.
    await publishPolicy(redis.url, WASM, config(4), { prefix, vectors: '{"description": "x", "cases": "none"}' });
    await assert.rejects(live.poll(), (e: unknown) => e instanceof UpdateSelfTestError && /vectors/.test(e.message) && /"cases"/.test(e.message));

    // Without vectors the key is deleted (no older vectors beside a new publication), and the update is gated as before.
    await publishPolicy(redis.url, WASM, config(2), { prefix });
    assert.equal(await client.exists(`${prefix}:vectors`), 0);
    assert.equal((await new Fleet({ url: redis.url, prefix }).read()).vectors, undefined);
    assert.equal((await live.poll())?.generation, 2);
    // Vectors as bytes, passing: accepted.
    await publishPolicy(redis.url, WASM, config(4), { prefix, vectors: Buffer.from(VECTORS) });
    assert.equal((await live.poll())?.generation, 3);
    assert.deepEqual(live.metrics, { accepted: 2, refused: 2, rolledBack: 0 });
    await assert.rejects(publishPolicy(redis.url, WASM, config(4), { prefix, vectors: 42 as unknown as string }), TypeError);
    live.close();
  } finally {
    client.destroy();
    await redis.kill();
  }
});

test('the Rust host and this one share a fleet: each takes what the other publishes', { skip: !existsSync(RUST_CLI) && `no ${RUST_CLI}` }, async () => {
  const redis = await RedisServer.start();
  const publicKeyHex = PUBLIC_KEY_HEX;
  const dir = mkdtempSync(join(tmpdir(), 'fleet-rust-'));
  writeFileSync(join(dir, 'policy.json'), config(4));
  writeFileSync(join(dir, 'seed.hex'), Buffer.from(SEED).toString('hex'));
  // `agent-retry sign` and `agent-retry publish` (Rust), taken by a worker of this host at open.
  const signed = await promisify(execFile)(RUST_CLI, ['sign', '--key', join(dir, 'seed.hex'), '--wasm', locateComponent()!, '--config', join(dir, 'policy.json'),
    '--revision', '1000']);
  assert.equal(signed.stdout, signPublication(SEED, WASM, config(4), null, 1000), 'the Rust command line signs as this host does');
  writeFileSync(join(dir, 'policy.manifest'), signed.stdout);
  const { stdout } = await promisify(execFile)(RUST_CLI, ['publish', '--redis', redis.url, '--wasm', locateComponent()!, '--config', join(dir, 'policy.json'),
    '--manifest', join(dir, 'policy.manifest')]);
  assert.match(stdout, /"revision":1000/);
  const worker = new Worker(redis.url, { intervalMs: 60_000, publicKeyHex });
  assert.equal(policyOf(await worker.next('serving', 30_000)).config_sha256, sha256Hex(config(4)));
  // publishPolicy (here), taken by `agent-retry watch --fleet` (Rust) through the channel.
  const rust = spawn(RUST_CLI, ['watch', '--fleet', redis.url, '--interval-ms', '60000', '--public-key', publicKeyHex], { stdio: ['pipe', 'pipe', 'ignore'] });
  const rustLines: Array<Record<string, unknown>> = [];
  createInterface({ input: rust.stdout! }).on('line', (line) => rustLines.push(JSON.parse(line) as Record<string, unknown>));
  const rustServing = async (sha: string) => {
    const deadline = Date.now() + 15_000;
    while (!rustLines.some((l) => l.event === 'serving' && (l.policy as Record<string, unknown>)['config-sha256'] === sha)) {
      if (Date.now() > deadline) assert.fail(`the Rust worker never served ${sha}: ${JSON.stringify(rustLines)}`);
      await sleep(50);
    }
  };
  try {
    await rustServing(sha256Hex(config(4)));
    await worker.subscribed();
    await sleep(500); // the Rust worker subscribes after its first read
    assert.equal(await publishPolicy(redis.url, WASM, config(2), { manifest: signPublication(SEED, WASM, config(2), null, 1001) }), 1001);
    await rustServing(sha256Hex(config(2)));
    assert.equal(policyOf(await worker.next('serving')).config_sha256, sha256Hex(config(2)));
  } finally {
    rust.kill();
    worker.kill();
    await redis.kill();
  }
});

test('without node-redis the error says what to install', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'no-redis-'));
  for (const file of ['fleet.js', 'fleet-scripts.js', 'errors.js', 'manifest.js']) copyFileSync(join(here, '../src', file), join(dir, file));
  const script = `import { publishPolicy } from ${JSON.stringify(pathToFileURL(join(dir, 'fleet.js')).href)};
    publishPolicy('redis://127.0.0.1:1', new Uint8Array(1), '{}').then(() => console.log('published?'), (e) => console.log(e.name + ': ' + e.message));`;
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script]);
  assert.match(stdout, /^FleetError: fleet updates through Redis need the npm package `redis` \(node-redis 5\).*npm install redis@\^5\.9\.0/);
});

test('the one revision parser reads tests/vectors/fleet/revisions.json as the Rust and Python hosts do', () => {
  const file = join(here, '../../../../tests/vectors/fleet/revisions.json');
  const { cases } = JSON.parse(readFileSync(file, 'utf8')) as { cases: Array<{ description: string; text: string; revision: number | null }> };
  assert.ok(cases.length >= 19, `${cases.length} cases`);
  assert.equal(MAX_REVISION, 2 ** 53 - 1);
  for (const { description, text, revision } of cases) {
    for (const given of [text, Buffer.from(text, 'utf8')]) {
      if (revision === null) {
        assert.throws(() => parseRevision(given), (e: unknown) => {
          assert.ok(e instanceof FleetError, `${description}: ${String(e)}`);
          assert.equal(e.message, `${JSON.stringify(text)} is not a revision (decimal digits from 1 to 9007199254740991)`, description);
          return true;
        });
      } else {
        assert.equal(parseRevision(given), revision, description);
      }
    }
  }
});

test('a publication onto a garbage revision writes nothing; reading the revision refuses it by name; a good revision publishes again', async () => {
  const redis = await RedisServer.start();
  try {
    const fleet = new Fleet({ url: redis.url });
    const first = await publishPolicy(redis.url, WASM, config(4));
    for (const garbage of ['abc', '-5', '18446744073709551616', '9007199254740991']) {
      cli(redis, ['SET', 'agent-retry:policy:revision', garbage]);
      await assert.rejects(publishPolicy(redis.url, WASM, config(2), { vectors: VECTORS }), (e: unknown) => {
        assert.ok(e instanceof FleetError, `${garbage}: ${String(e)}`);
        assert.match(e.message, /nothing was written/, garbage);
        return true;
      });
      assert.equal(cli(redis, ['GET', 'agent-retry:policy:config']), config(4), `${garbage}: the configuration is the last good publication's`);
      assert.equal(cli(redis, ['EXISTS', 'agent-retry:policy:vectors']), '0', `${garbage}: nor the vectors`);
      assert.equal(cli(redis, ['GET', 'agent-retry:policy:revision']), garbage, `${garbage}: nor the revision`);
      if (garbage !== '9007199254740991') {
        const named = (e: unknown) => {
          assert.ok(e instanceof FleetError, `${garbage}: ${String(e)}`);
          assert.ok(e.message.includes(`agent-retry:policy:revision: ${JSON.stringify(garbage)} is not a revision`), e.message);
          return true;
        };
        await assert.rejects(fleet.revision(), named);
        await assert.rejects(fleet.read(), named);
      } else {
        assert.equal(await fleet.revision(), MAX_REVISION, 'the largest is a revision: only a publication after it is refused');
      }
    }
    cli(redis, ['SET', 'agent-retry:policy:revision', String(first)]);
    assert.ok(await publishPolicy(redis.url, WASM, config(2)) > first, 'a good revision publishes again');
    assert.equal(cli(redis, ['GET', 'agent-retry:policy:config']), config(2));
  } finally {
    await redis.kill();
  }
});

test('a publication older than the serving one (an old dump: its .wasm, configuration and lower revision written back) is refused as older; the serving policy stays', async () => {
  const redis = await RedisServer.start();
  const worker = new Worker(redis.url, { intervalMs: 200 });
  try {
    // The older publication: another .wasm (a custom section) with 3 attempts; then the one that serves, 2 attempts.
    const older = Buffer.concat([WASM, Buffer.from([0, 5, 4, 0x74, 0x65, 0x73, 0x74])]);
    const r1 = await publishPolicy(redis.url, older, config(3));
    const live = await LivePolicy.openFleet({ url: redis.url }, Integrity.unchecked(), { cacheDir, log: () => undefined });
    assert.equal(live.current().identity.configSha256, sha256Hex(config(3)));
    assert.equal(policyOf(await worker.next('serving', 30_000)).config_sha256, sha256Hex(config(3)));
    await worker.subscribed();
    await sleep(5);
    const r2 = await publishPolicy(redis.url, WASM, config(2));
    assert.ok(r2 > r1);
    assert.equal((await live.poll())?.generation, 2);
    const serving = live.current();
    assert.equal(serving.identity.configSha256, sha256Hex(config(2)));
    const taken = policyOf(await worker.next('serving'));
    assert.equal(taken.config_sha256, sha256Hex(config(2)), 'the worker took it');

    // A Redis restored from an old dump: the older publication's keys and revision, written directly.
    cli(redis, ['-x', 'SET', 'agent-retry:policy:wasm'], older);
    cli(redis, ['SET', 'agent-retry:policy:config', config(3)]);
    cli(redis, ['SET', 'agent-retry:policy:revision', String(r1)]);
    const read = await new Fleet({ url: redis.url }).read();
    assert.ok(read.wasm.equals(older) && read.revision === r1, 'the old dump is what Redis holds');

    const isOlder = (e: unknown) => {
      assert.ok(e instanceof UpdateOlderError, String(e));
      assert.equal(e.kind, 'older');
      assert.equal(e.message, `older than the serving policy: revision ${r1} (agent-retry:policy:revision), while the serving policy's is revision ${r2} (agent-retry:policy:revision)`);
      return true;
    };
    await assert.rejects(live.poll(), isOlder);
    assert.equal(await live.poll(), undefined, 'tried once');
    await assert.rejects(live.reload(), isOlder);
    assert.equal(live.current(), serving, 'the serving policy is unchanged');
    assert.deepEqual(live.metrics, { accepted: 1, refused: 2, rolledBack: 0 });
    // The worker process: its watcher sees the revision change and refuses it.
    const refused = await worker.next('refused');
    assert.equal(refused.kind, 'older');
    assert.match(String(refused.reason), new RegExp(`^older than the serving policy: revision ${r1} .*the serving policy's is revision ${r2}`));
    const status = await worker.ask('status');
    assert.deepEqual(policyOf(status), taken);
    assert.equal(status.refused, 1, 'refused once, not at every poll');
    assert.equal((await worker.ask('decide')).attempts, 2);

    // A rollback is not an update: it is never refused as older, and what comes next is compared with what it serves.
    assert.equal((await live.rollback()).configSha256, sha256Hex(config(3)));
    // The next publication is newer than both (the server's time in ms, past the revision restored).
    const r3 = await publishPolicy(redis.url, WASM, config(4));
    assert.ok(r3 > r2, `${r2} then ${r3}`);
    assert.equal((await live.poll())?.configSha256, sha256Hex(config(4)));
    assert.equal(policyOf(await worker.next('serving')).config_sha256, sha256Hex(config(4)));
    live.close();
  } finally {
    worker.kill();
    await redis.kill();
  }
});
