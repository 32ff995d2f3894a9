// A policy published once in Redis for a whole fleet of workers: the Rust
// host's `crate::fleet` (hosts/rust/src/fleet.rs), with the same layout, so a
// publication made by any host (`agent-retry publish`, `publishPolicy` here,
// the Python host's) reaches workers of every host:
//
// - `{prefix}:wasm`: the component's bytes;
// - `{prefix}:config`: the configuration (JSON text);
// - `{prefix}:manifest`: optional signed manifest (src/manifest.ts): one
//   Ed25519 signature over the `.wasm`'s digest, the configuration's, the
//   vectors' and the revision; under a key a worker takes nothing else (a
//   `{prefix}:wasm.sig` of before 0.7, over the `.wasm` alone, is not
//   accepted, and every publication deletes it);
// - `{prefix}:vectors`: optional vectors the publication ships with (JSON text
//   in the format of tests/vectors/*.json); a worker's gate runs every case
//   against the candidate (src/live.ts);
// - `{prefix}:revision`: the publication's revision, decimal digits from 1 to
//   MAX_REVISION (2^53 - 1; `parseRevision`, the one rule of every host): one
//   more than the last, or the server's time in ms if that is larger, so that
//   it never repeats after Redis loses its state; a signed publication is
//   stored under its manifest's revision exactly, which must be greater;
// - channel `{prefix}:updates`: a message per publication (it only wakes workers).
//
// `publishPolicy` writes all of it in one script (PUBLISH_LUA, generated from
// the Rust host's), which checks the stored revision before it writes anything:
// a publication onto a revision that is not one (garbage, or the largest there
// is) fails with "nothing was written", and nothing is. A worker reading with
// one MGET never sees a `.wasm` of one publication with the configuration of
// another. A worker (`LivePolicy.openFleet`, src/live.ts)
// learns of an update from the channel at once, and from polling
// `{prefix}:revision` otherwise (a missed message, a reconnection, a worker that
// was down): either way it reads the revision it has not tried yet and puts it
// through the same gate as a file update; a revision lower than the serving
// policy's is refused as older (`UpdateOlderError`).
//
// Redis is reached with node-redis (the npm package `redis`, 5.x), an optional
// peer dependency imported only when a fleet is used. Every command, the
// connection included, has REDIS_TIMEOUT_MS (500 ms), as the Rust host's
// REDIS_TIMEOUT; a connection is opened per operation (as the Rust host does),
// except the subscriber's, which lives as long as the watcher.
import { createHash } from 'node:crypto';

import { AgentRetryError } from './errors.js';
import { MAX_REVISION, PUBLISH_LUA } from './fleet-scripts.js';
import { checkCovers, ManifestError, parseManifest } from './manifest.js';

export { MAX_REVISION, PUBLISH_LUA };

/** The default key prefix. */
export const DEFAULT_PREFIX = 'agent-retry:policy';
/** The timeout of every Redis command, the connection included (the Rust host's `REDIS_TIMEOUT`). */
export const REDIS_TIMEOUT_MS = 500;
/** What to install when node-redis is missing. */
export const REDIS_INSTALL = 'npm install redis@^5.9.0';
/** Where a fleet's policy is published: `redis://host:port/db` and the keys' prefix. */
export interface FleetSource {
  readonly url: string;
  /** `DEFAULT_PREFIX` unless several policies share one Redis. */
  readonly prefix?: string;
}

/** One publication, as read (one MGET). */
export interface Publication {
  readonly wasm: Buffer;
  readonly config: Buffer;
  /** The signed manifest (`{prefix}:manifest`), if any. */
  readonly manifest: Buffer | undefined;
  /** Whether a signature over the `.wasm` alone (`{prefix}:wasm.sig`, before 0.7) is stored. */
  readonly legacySignature: boolean;
  /** The vectors shipped with the publication (`{prefix}:vectors`), if any. */
  readonly vectors: Buffer | undefined;
  /** `parseRevision` of `{prefix}:revision`; 0 when the key is absent. */
  readonly revision: number;
}

export interface PublishOptions {
  /** The signed manifest (`signPublication`, with a revision): the
   *  publication is stored under its revision exactly, and refused before
   *  anything is written (`ManifestError`) when it is malformed, has revision
   *  none (signed for files), or does not cover this `.wasm`, configuration
   *  and vectors. Without it the manifest key is deleted, so an older manifest
   *  never stays beside a new publication. */
  manifest?: Uint8Array | string;
  /** Vectors the publication ships with (a vector file's JSON text, the format
   *  of tests/vectors/*.json): every worker's gate runs each case against the
   *  candidate and refuses the publication if one fails. Without it the vectors
   *  key is deleted, so older vectors never stay beside a new publication. */
  vectors?: Uint8Array | string;
  /** The keys' prefix (`DEFAULT_PREFIX`). */
  prefix?: string;
}

/** Redis cannot be reached, did not answer in time, or node-redis is not installed. */
export class FleetError extends AgentRetryError {}

type Redis = typeof import('redis');
type Client = ReturnType<Redis['createClient']>;

let redisModule: Promise<Redis> | undefined;

/** node-redis, imported on first use: the package works without it until a fleet is used. */
function loadRedis(): Promise<Redis> {
  redisModule ??= import('redis').catch((e: unknown) => {
    redisModule = undefined;
    throw new FleetError(
      `fleet updates through Redis need the npm package \`redis\` (node-redis 5), an optional peer dependency of agent-retry-policy: ` +
        `${REDIS_INSTALL} (${(e as Error)?.message ?? e})`,
      { cause: e },
    );
  });
  return redisModule;
}

/** Resolves `promise`, or rejects with a `FleetError` after `ms` (calling `onTimeout` first). */
function within<T>(promise: Promise<T>, ms: number, what: string, onTimeout: () => void): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      onTimeout();
      reject(new FleetError(`${what}: no answer within ${ms} ms`));
    }, ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function describe(e: unknown): string {
  if (e instanceof AggregateError && e.errors.length > 0) return e.errors.map(describe).join('; ');
  return (e as Error)?.message || String(e);
}

function destroy(client: Client): void {
  try {
    client.destroy();
  } catch {
    // already closed
  }
}

/** A fleet's keys, and the operations a worker and a publisher need. */
export class Fleet {
  readonly url: string;
  readonly prefix: string;

  constructor(source: FleetSource) {
    if (typeof source?.url !== 'string' || source.url === '') throw new TypeError('FleetSource.url: a redis:// URL');
    this.url = source.url;
    this.prefix = source.prefix ?? DEFAULT_PREFIX;
    Object.freeze(this);
  }

  key(name: 'wasm' | 'config' | 'manifest' | 'wasm.sig' | 'vectors' | 'revision' | 'updates'): string {
    return `${this.prefix}:${name}`;
  }

  /** The channel a publication is announced on. */
  get channel(): string {
    return this.key('updates');
  }

  /** A connected client (within REDIS_TIMEOUT_MS) that does not reconnect by itself. */
  async #connect(): Promise<Client> {
    const { createClient } = await loadRedis();
    const client = createClient({
      url: this.url,
      socket: { connectTimeout: REDIS_TIMEOUT_MS, reconnectStrategy: false },
      disableOfflineQueue: true,
      disableClientInfo: true,
      commandOptions: { timeout: REDIS_TIMEOUT_MS },
    });
    // Errors are reported by the commands' rejections (and, for a subscriber, by its owner's listener).
    client.on('error', () => undefined);
    try {
      await within(client.connect(), REDIS_TIMEOUT_MS, `${this.url}: connect`, () => destroy(client));
    } catch (e) {
      destroy(client);
      throw e instanceof FleetError ? e : new FleetError(`${this.url}: ${describe(e)}`, { cause: e });
    }
    return client;
  }

  /** One operation on a connection of its own, closed after it. */
  async #with<T>(what: string, use: (client: Client) => Promise<T>): Promise<T> {
    const client = await this.#connect();
    try {
      return await within(use(client), REDIS_TIMEOUT_MS, `${this.url}: ${what}`, () => destroy(client));
    } catch (e) {
      throw e instanceof FleetError ? e : new FleetError(`${this.url}: ${what}: ${describe(e)}`, { cause: e });
    } finally {
      destroy(client);
    }
  }

  /** The current revision (0: nothing published yet). Rejects with a
   *  `FleetError` naming the key and the value when it is not a revision
   *  (`parseRevision`). */
  async revision(): Promise<number> {
    const text = await this.#with('GET revision', (client) => client.get(this.key('revision')));
    return this.#revision(text);
  }

  /** `parseRevision`, absent as 0, a refusal naming the key. */
  #revision(text: string | Uint8Array | null): number {
    if (text === null) return 0;
    try {
      return parseRevision(text);
    } catch (e) {
      throw new FleetError(`${this.key('revision')}: ${(e as Error).message}`, { cause: e });
    }
  }

  /** The published policy, read in one MGET (one publication's parts, as
   *  Buffers). Rejects with a `FleetError` "nothing published at …" when the
   *  `.wasm` or the configuration is absent. */
  async read(): Promise<Publication> {
    const { RESP_TYPES } = await loadRedis();
    const parts = (await this.#with('MGET', (client) =>
      client.sendCommand(['MGET', this.key('wasm'), this.key('config'), this.key('manifest'), this.key('revision'), this.key('vectors'), this.key('wasm.sig')], {
        typeMapping: { [RESP_TYPES.BLOB_STRING]: Buffer },
        timeout: REDIS_TIMEOUT_MS,
      }))) as unknown;
    if (!Array.isArray(parts) || parts.length !== 6) throw new FleetError(`${this.url}: MGET answered ${String(parts)}`);
    const [wasm, config, manifest, revision, vectors, legacy] = parts as Array<Buffer | null>;
    const missing = (what: 'wasm' | 'config') =>
      new FleetError(`nothing published at ${this.key(what)} (\`agent-retry publish\` or publishPolicy() writes it)`);
    if (!Buffer.isBuffer(wasm)) throw missing('wasm');
    if (!Buffer.isBuffer(config)) throw missing('config');
    return {
      wasm, config, manifest: Buffer.isBuffer(manifest) ? manifest : undefined, legacySignature: legacy !== null && legacy !== undefined,
      vectors: Buffer.isBuffer(vectors) ? vectors : undefined, revision: this.#revision(revision),
    };
  }

  /** `publishPolicy` on this fleet (`manifest`: already checked, stored under
   *  `revision`): PUBLISH_LUA, by EVALSHA (EVAL when the server does not hold it yet). */
  async publish(wasm: Uint8Array, configJson: string, manifest: Buffer | undefined, vectors?: Buffer, revision?: number): Promise<number> {
    const keys = [this.key('wasm'), this.key('config'), this.key('manifest'), this.key('vectors'), this.key('revision'), this.key('wasm.sig')];
    const args = [
      Buffer.from(wasm), configJson, manifest ?? '', vectors ?? '', this.channel, manifest === undefined ? '0' : '1', vectors === undefined ? '0' : '1',
      revision === undefined ? '' : String(revision),
    ];
    const reply = await this.#with('publish', async (client) => {
      try {
        return await client.sendCommand(['EVALSHA', PUBLISH_SHA1, String(keys.length), ...keys, ...args]);
      } catch (e) {
        if (!/^NOSCRIPT/.test((e as Error)?.message ?? '')) throw e;
        return client.sendCommand(['EVAL', PUBLISH_LUA, String(keys.length), ...keys, ...args]);
      }
    });
    if (typeof reply !== 'number' || !Number.isSafeInteger(reply) || reply < 1) {
      throw new FleetError(`${this.url}: publish: the new ${this.key('revision')} answered ${String(reply)}`);
    }
    return reply;
  }

  /** Subscribes to the update channel on a connection of its own. `onMessage`
   *  is called for each announcement, `onLost` once if the connection is lost
   *  (the subscription is then over: subscribe again). */
  async subscribe(onMessage: () => void, onLost: (error: Error) => void): Promise<{ close(): void }> {
    const client = await this.#connect();
    let over = false;
    const lose = (e: unknown) => {
      if (over) return;
      over = true;
      destroy(client);
      onLost(e instanceof Error ? e : new Error(String(e)));
    };
    client.on('error', lose);
    client.on('end', () => lose(new FleetError(`${this.url}: the subscription's connection closed`)));
    try {
      await within(client.subscribe(this.channel, () => onMessage()), REDIS_TIMEOUT_MS, `${this.url}: SUBSCRIBE`, () => destroy(client));
    } catch (e) {
      over = true;
      destroy(client);
      throw e instanceof FleetError ? e : new FleetError(`${this.url}: SUBSCRIBE: ${describe(e)}`, { cause: e });
    }
    // Like the file watcher's timers: the subscription does not keep the process alive.
    client.unref();
    return {
      close: () => {
        over = true;
        destroy(client);
      },
    };
  }
}

/** The SHA-1 of PUBLISH_LUA, for EVALSHA. */
const PUBLISH_SHA1 = createHash('sha1').update(PUBLISH_LUA).digest('hex');

/** The one revision parser (the Rust host's `parse_revision`, checked against
 *  the same vectors, tests/vectors/fleet/revisions.json): decimal digits, no
 *  sign, space or leading zero, from 1 to MAX_REVISION (2^53 - 1). Anything
 *  else throws a `FleetError` saying what it is, never read as some number. */
export function parseRevision(text: string | Uint8Array): number {
  const value = typeof text === 'string' ? text : Buffer.from(text).toString('utf8');
  if (value.length <= 16 && /^[1-9][0-9]*$/.test(value)) {
    const revision = Number(value);
    if (revision <= MAX_REVISION) return revision;
  }
  throw new FleetError(`${JSON.stringify([...value].slice(0, 40).join(''))} is not a revision (decimal digits from 1 to ${MAX_REVISION})`);
}

/** Publishes a policy for every worker of the fleet in one script (PUBLISH_LUA:
 *  the stored revision checked, then SET wasm, SET config, SET or DEL manifest,
 *  SET or DEL vectors, DEL wasm.sig, SET revision, PUBLISH updates) and returns
 *  the new revision: the manifest's, when one is given (it must be greater than
 *  the stored one). Workers gate it as any update: a worker refuses what does
 *  not pass and keeps its last good policy. Throws `ManifestError` before
 *  anything is written for a manifest that is malformed, signed for files, or
 *  does not cover what is published; rejects with a `FleetError` when Redis
 *  cannot be reached or does not answer in time, and when the stored revision
 *  is not one (garbage, or MAX_REVISION), or not lower than the manifest's:
 *  then "nothing was written", and nothing is. */
export async function publishPolicy(url: string, wasm: Uint8Array, configJson: string, options: PublishOptions = {}): Promise<number> {
  const fleet = new Fleet({ url, prefix: options.prefix });
  if (!(wasm instanceof Uint8Array)) throw new TypeError('publishPolicy: wasm must be a Uint8Array (a Buffer)');
  if (typeof configJson !== 'string') throw new TypeError('publishPolicy: configJson must be a string (JSON text)');
  const { vectors } = options;
  if (vectors !== undefined && typeof vectors !== 'string' && !(vectors instanceof Uint8Array)) {
    throw new TypeError('publishPolicy: vectors must be a string (JSON text) or a Uint8Array');
  }
  let manifest: Buffer | undefined;
  let revision: number | undefined;
  if (options.manifest !== undefined) {
    const at = 'the manifest to publish';
    manifest = typeof options.manifest === 'string' ? Buffer.from(options.manifest, 'utf8') : Buffer.from(options.manifest);
    const parsed = parseManifest(manifest, at);
    try {
      checkCovers(parsed, at, wasm, configJson, vectors);
    } catch (e) {
      throw new ManifestError('mismatch', `${(e as Error).message}: nothing was written`);
    }
    if (parsed.revision === null) {
      throw new ManifestError('malformed', `${at} has revision none (signed for files): sign it with a revision to publish it to a fleet; nothing was written`);
    }
    revision = parsed.revision;
  }
  return fleet.publish(wasm, configJson, manifest, vectors === undefined ? undefined : Buffer.from(vectors), revision);
}
