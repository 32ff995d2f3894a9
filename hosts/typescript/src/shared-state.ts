// The shared state the component imports (contract 0.8.0, wit/shared-state.wit):
// short texts kept by the host for the policy, the circuit breakers' states,
// read with their version and replaced only if the version is still the one
// read (compare and set). The policy alone decides what a text means.
//
// `EmbeddedSharedState` keeps them in this process, with the same semantics in
// every host: a map key -> (value, version, expires at); an entry whose expiry
// is at or before the host's clock is absent (version 0); a store raises the
// version by one and expires `ttl-ms` after the host's clock; a value over
// 1,024 bytes, or a new key when 10,000 are held (after the expired ones are
// dropped), is refused. One lives beside each account budget backend
// (`sharedStateFor`): every instance that shares the process's embedded
// account budget shares the process's store. For workers on many machines,
// `FallbackSharedState` (src/redis-shared-state.ts) keeps it in Redis.
import type { AccountBudgetBackend } from './accounts.js';
import { utf8Length } from './limits.js';

/** What `load` found under a key (the contract's `loaded`). */
export interface Loaded {
  /** The stored text; undefined when nothing is stored (or it expired). */
  value?: string;
  /** The version to pass to `storeIf`: 0 when nothing is stored. */
  version: bigint;
  /** The store's clock (ms since the Unix epoch); an embedded store gives the `nowMs` it was passed. */
  nowMs: bigint;
}

/** A shared state. `storeIf` must be atomic (compare and set) across every caller. */
export interface SharedStateBackend {
  load(key: string, nowMs: bigint): Loaded;
  storeIf(key: string, expectedVersion: bigint, value: string, ttlMs: bigint): boolean;
}

/** The longest value a store keeps, in UTF-8 bytes. */
export const MAX_SHARED_VALUE_BYTES = 1_024;
/** The most keys an embedded store holds. */
export const MAX_SHARED_KEYS = 10_000;

interface Entry {
  value: string;
  version: bigint;
  /** ms since the Unix epoch on the store's clock. */
  expiresAtMs: bigint;
}

export interface EmbeddedSharedStateOptions {
  /** The store's clock, in ms since the Unix epoch (default `Date.now`): expiries are kept on it. */
  clock?: () => number | bigint;
  /** The longest value (default `MAX_SHARED_VALUE_BYTES`). */
  maxValueBytes?: number;
  /** The most keys held (default `MAX_SHARED_KEYS`). */
  maxKeys?: number;
}

/** The shared state in this process's memory. Node runs JavaScript on one
 *  thread, so a synchronous `storeIf` is atomic for every instance in the process. */
export class EmbeddedSharedState implements SharedStateBackend {
  private readonly entries = new Map<string, Entry>();
  private readonly clock: () => number | bigint;
  private readonly maxValueBytes: number;
  private readonly maxKeys: number;

  constructor(options: EmbeddedSharedStateOptions = {}) {
    this.clock = options.clock ?? Date.now;
    this.maxValueBytes = options.maxValueBytes ?? MAX_SHARED_VALUE_BYTES;
    this.maxKeys = options.maxKeys ?? MAX_SHARED_KEYS;
  }

  /** The store's clock now, in whole ms. */
  private now(): bigint {
    const now = this.clock();
    return typeof now === 'bigint' ? now : BigInt(Math.floor(now));
  }

  /** The live entry under `key` (an expired one is deleted). */
  private live(key: string, now: bigint): Entry | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAtMs <= now) {
      this.entries.delete(key);
      return undefined;
    }
    return entry;
  }

  /** The keys held (expired ones included until they are dropped). */
  get size(): number {
    return this.entries.size;
  }

  load(key: string, nowMs: bigint): Loaded {
    const entry = this.live(key, this.now());
    return entry === undefined ? { value: undefined, version: 0n, nowMs } : { value: entry.value, version: entry.version, nowMs };
  }

  storeIf(key: string, expectedVersion: bigint, value: string, ttlMs: bigint): boolean {
    if (utf8Length(value) > this.maxValueBytes) return false;
    const now = this.now();
    const entry = this.live(key, now);
    if ((entry?.version ?? 0n) !== expectedVersion) return false;
    if (entry === undefined && this.entries.size >= this.maxKeys) {
      this.dropExpired(now);
      if (this.entries.size >= this.maxKeys) return false;
    }
    this.entries.set(key, { value, version: expectedVersion + 1n, expiresAtMs: now + ttlMs });
    return true;
  }

  private dropExpired(now: bigint): void {
    for (const [key, entry] of this.entries) if (entry.expiresAtMs <= now) this.entries.delete(key);
  }
}

/** The store beside each account budget backend: the same owner and lifetime. */
const beside = new WeakMap<AccountBudgetBackend, EmbeddedSharedState>();

/** The embedded shared state that lives beside `accounts`: every instance made
 *  with the same account budget backend (the process's, by default) shares it. */
export function sharedStateFor(accounts: AccountBudgetBackend): EmbeddedSharedState {
  let state = beside.get(accounts);
  if (state === undefined) beside.set(accounts, (state = new EmbeddedSharedState()));
  return state;
}
