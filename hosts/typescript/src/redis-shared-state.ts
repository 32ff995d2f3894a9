// The shared state on Redis, for workers in several processes or on several
// machines: the Rust host's `RedisSharedState` and `FallbackSharedState`
// (hosts/rust/src/shared_state/redis.rs), with the same scripts, keys and
// timeout, so that Rust, Python and Node workers see one set of circuit
// breakers per server.
//
// - `RedisSharedState`: every text is a hash `{value, version}` under
//   STATE_PREFIX and the policy's key, read and compare-and-set by two Lua
//   scripts (src/redis-scripts.ts, generated from the Rust source), on the
//   server's clock. A key of another type, or a hash without a number for its
//   version, reads as absent and the next store replaces it. Every exchange,
//   connecting included, ends within ACCOUNTS_REDIS_TIMEOUT_MS (500 ms).
// - `FallbackSharedState`: the backend to instantiate with. Redis while it
//   answers; while it does not, an `EmbeddedSharedState` of its own (this
//   worker's breakers alone: it neither sees the fleet's nor shows it its own),
//   logged once, Redis tried again every `retryIntervalMs`. A change made
//   locally is not carried to Redis when it answers again: the fleet's state
//   there is newer.
//
// The component calls the shared state synchronously: as for the account
// budget, node-redis runs on a worker thread (`RedisThread`,
// src/redis-accounts.ts and src/redis-accounts-worker.ts) and each exchange
// blocks this thread until it is answered, at most ACCOUNTS_REDIS_TIMEOUT_MS.
import { utf8Length } from './limits.js';
import { AccountsError, RedisThread } from './redis-accounts.js';
import { ACCOUNTS_RETRY_INTERVAL_MS, STATE_LOAD_LUA, STATE_PREFIX, STATE_STORE_LUA } from './redis-scripts.js';
import { EmbeddedSharedState, MAX_SHARED_VALUE_BYTES, type Loaded, type SharedStateBackend } from './shared-state.js';

export { STATE_PREFIX };

/** What `FallbackSharedState` logs: the fallback to this process's own state
 *  (`warning`, with the `reason`) and the return to Redis (`info`). */
export interface SharedStateEvent {
  event: 'agent_retry.shared_state';
  level: 'warning' | 'info';
  message: string;
  redis: string;
  reason?: string;
}

export interface FallbackSharedStateOptions {
  /** How often to try Redis again while it is down (default ACCOUNTS_RETRY_INTERVAL_MS, 1 s, the Rust host's). */
  retryIntervalMs?: number;
  /** Receives the events (default: one JSON line through `console.warn`). */
  log?: (event: SharedStateEvent) => void;
}

const defaultLog = (event: SharedStateEvent): void => console.warn(JSON.stringify(event));

/** A whole number the script answered (Lua numbers come back as integers). */
function whole(value: unknown, what: string): bigint {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return BigInt(value);
  if (typeof value === 'bigint') return value;
  throw new TypeError(`the script answered ${JSON.stringify(String(value))} for ${what}, not a whole number`);
}

/** A connection to Redis holding the texts, on a worker thread of its own. */
export class RedisSharedState {
  readonly url: string;
  readonly #thread: RedisThread;

  private constructor(thread: RedisThread) {
    this.url = thread.url;
    this.#thread = thread;
  }

  /** Connects and checks that the server speaks Redis (PING) and runs the
   *  scripts: a bad URL, a closed port or a server answering garbage rejects
   *  with an `AccountsError` (`bad-url` or `unreachable`), as the Rust host
   *  does, within ACCOUNTS_REDIS_TIMEOUT_MS of the connection. */
  static async connect(url: string): Promise<RedisSharedState> {
    return new RedisSharedState(await RedisThread.start(url, [STATE_LOAD_LUA, STATE_STORE_LUA], 'shared state'));
  }

  /** Ends the worker thread; later exchanges fail at once. */
  close(): void {
    this.#thread.close();
  }

  /** Reads the text under `key`: absent (or unreadable) is version 0; `nowMs`
   *  is the server's clock. Throws `AccountsError` when Redis failed. */
  tryLoad(key: string): Loaded {
    // A text past MAX_SHARED_VALUE_BYTES is not returned, only its version: the next store replaces it.
    const reply = this.#thread.evaluate(STATE_LOAD_LUA, `${STATE_PREFIX}${key}`, [String(MAX_SHARED_VALUE_BYTES)]);
    try {
      if (!Array.isArray(reply) || reply.length !== 4) throw new TypeError(`the script answered ${JSON.stringify(reply)}`);
      const [present, value, version, now] = reply as unknown[];
      const nowMs = whole(now, 'now');
      const v = whole(version, 'version');
      const at = v > 0n ? v : 0n;
      if (whole(present, 'present') !== 1n) return { value: undefined, version: at, nowMs: nowMs > 0n ? nowMs : 0n };
      if (typeof value !== 'string') throw new TypeError(`the script answered ${JSON.stringify(String(value))} for the value, not a text`);
      return { value, version: at, nowMs: nowMs > 0n ? nowMs : 0n };
    } catch (e) {
      throw new AccountsError('unreachable', this.url, (e as Error).message, 'shared state');
    }
  }

  /** Compare and set: stores `value` at version + 1 if the version is still
   *  `expectedVersion`, to expire `ttlMs` (at least 1) later on the server;
   *  true if stored. Throws `AccountsError` when Redis failed. */
  tryStoreIf(key: string, expectedVersion: bigint, value: string, ttlMs: bigint): boolean {
    const ttl = ttlMs > 1n ? ttlMs : 1n;
    const reply = this.#thread.evaluate(STATE_STORE_LUA, `${STATE_PREFIX}${key}`, [String(expectedVersion), value, String(ttl)]);
    try {
      return whole(reply, 'stored') === 1n;
    } catch (e) {
      throw new AccountsError('unreachable', this.url, (e as Error).message, 'shared state');
    }
  }
}

/** The shared state for workers on many machines (a `SharedStateBackend` for
 *  `component.instantiate({ sharedState })`): Redis while it answers; this
 *  process's own `EmbeddedSharedState` while it does not (the breakers of this
 *  worker alone), trying Redis again every `retryIntervalMs`. */
export class FallbackSharedState implements SharedStateBackend {
  readonly redis: RedisSharedState;
  readonly retryIntervalMs: number;
  readonly #local = new EmbeddedSharedState();
  readonly #log: (event: SharedStateEvent) => void;
  /** `performance.now()` of the latest failure while Redis is not used; undefined: on Redis. */
  #downSince: number | undefined;
  #fallbacks = 0;

  constructor(redis: RedisSharedState, options: FallbackSharedStateOptions = {}) {
    this.redis = redis;
    this.retryIntervalMs = options.retryIntervalMs ?? ACCOUNTS_RETRY_INTERVAL_MS;
    this.#log = options.log ?? defaultLog;
  }

  /** `new FallbackSharedState(await RedisSharedState.connect(url), options)`. */
  static async open(url: string, options: FallbackSharedStateOptions = {}): Promise<FallbackSharedState> {
    return new FallbackSharedState(await RedisSharedState.connect(url), options);
  }

  /** Switches to the local state so far. */
  get fallbacks(): number {
    return this.#fallbacks;
  }

  /** Ends the Redis worker thread (it does not keep the process alive anyway). */
  close(): void {
    this.redis.close();
  }

  /** Whether to use Redis now: not while it is down, until the retry is due. */
  #useRedis(): boolean {
    return this.#downSince === undefined || performance.now() - this.#downSince >= this.retryIntervalMs;
  }

  #emit(fields: Omit<SharedStateEvent, 'event' | 'redis'>): void {
    try {
      this.#log({ event: 'agent_retry.shared_state', redis: this.redis.url, ...fields });
    } catch {
      // a failing logger must not fail the breaker
    }
  }

  #answered(): void {
    if (this.#downSince === undefined) return;
    this.#downSince = undefined;
    this.#emit({ level: 'info', message: "shared state: Redis answers again; the breakers are the fleet's again" });
  }

  #failed(e: unknown): void {
    if (!(e instanceof AccountsError)) throw e;
    if (this.#downSince === undefined) {
      this.#fallbacks += 1;
      this.#emit({ level: 'warning', reason: e.reason, message: "shared state: Redis failed; the breakers are this process's own until it answers" });
    }
    this.#downSince = performance.now();
  }

  load(key: string, nowMs: bigint): Loaded {
    if (this.#useRedis()) {
      try {
        const loaded = this.redis.tryLoad(key);
        this.#answered();
        return loaded;
      } catch (e) {
        this.#failed(e);
      }
    }
    return this.#local.load(key, nowMs);
  }

  storeIf(key: string, expectedVersion: bigint, value: string, ttlMs: bigint): boolean {
    if (utf8Length(value) > MAX_SHARED_VALUE_BYTES) return false;
    if (this.#useRedis()) {
      try {
        const stored = this.redis.tryStoreIf(key, expectedVersion, value, ttlMs);
        this.#answered();
        return stored;
      } catch (e) {
        this.#failed(e);
      }
    }
    return this.#local.storeIf(key, expectedVersion, value, ttlMs);
  }
}
