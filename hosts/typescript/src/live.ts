// A policy that operators update while the host runs: a new `.wasm`, or a new
// configuration, read from files the host watches (or on `reload()`), or
// published once for a whole fleet in Redis (src/fleet.ts, `openFleet`), checked
// by a gate, and swapped in atomically; `rollback()` returns to the previous good
// one. A refused update leaves the last good policy serving and says why. The
// same design and names as the Rust host's (hosts/rust/src/live.rs) and the
// Python host's (agent_retry_policy/live.py).
//
//   const live = await LivePolicy.open({ wasm, config, integrity: Integrity.ed25519(publicKey) });
//   const watcher = live.watch(2000);           // or await live.reload() / live.rollback()
//   const loaded = live.current();               // per run (or worker): keep it for the run
//   const instance = await loaded.component.instantiate();
//   const policy = instance.loadPolicy(loaded.configJson);   // log loaded.identity with its decisions
//
// The gate, before anything serves:
//
// 0. not older: an update older than the serving policy is refused
//    (`UpdateOlderError`, kind `older`): a fleet's publication whose revision
//    is lower than the serving policy's (a stale replica, a Redis restored
//    from an old dump), or files whose newest modification time is older than
//    the serving policy's files' (equal is not older: the same files may be
//    read again). A rollback is not an update and is never refused so;
// 1. integrity: the `.wasm`'s SHA-256 equals a pinned digest, or, under an
//    Ed25519 key, the signed manifest (src/manifest.ts: `<wasm>.manifest`, or
//    the fleet's `{prefix}:manifest`) covers exactly what was read (the
//    `.wasm`, the configuration, the vectors or none, the fleet's revision or
//    none) and its signature verifies (node:crypto); an unsigned publication,
//    and a signature over the `.wasm` alone (before 0.7), are refused;
// 2. the component loads: it speaks this host's contract version and imports
//    nothing outside the contract (checked on its bytes), then it is transpiled
//    at run time (jco, on a worker thread, cached by SHA-256) and compiled with
//    the sandbox (`PolicyComponent.fromBytes`); a `.wasm` byte-identical to the
//    serving one is not compiled again;
// 3. the configuration loads in it;
// 4. the gate vectors: the invariants every policy must keep for the host to
//    stay safe, as data (tests/vectors/gate.json, shipped in this package as
//    dist/gate.json), plus the operator's own files (`LiveOptions.gateVectors`),
//    run by this host's conformance runner (src/conformance.ts) against the
//    candidate, each case on a fresh sandboxed instance; a case without
//    `config` runs with the update's configuration, a case with one under its
//    own. A failing case, a trap, a sandbox limit or a value outside the
//    contract refuses the update (`UpdateSelfTestError`, naming the case);
// 5. the vectors the update ships with, if any (`PolicySource.vectors`, or the
//    fleet's `{prefix}:vectors`: a file in the same format), run the same way.
//
// The swap: JavaScript runs on one thread, so replacing the serving `Loaded` is
// atomic. A reload reads, checks, transpiles (on a worker) and compiles
// asynchronously; until the swap every decision is made by the old policy.
// Runs in flight finish on the policy they started with: a host takes
// `live.current()` when it starts a run (or a worker) and keeps that `Loaded`
// for the run; an update changes what new runs get. Every decision can be
// attributed to exactly one policy version (`PolicyIdentity`). One update at a
// time: reload, poll and rollback are queued (`#serialised`), so a read, its
// gate and its swap finish before the next read starts, and the policy that
// serves last is the one read last (two reloads at once while the files change
// end with the newest serving; tested).
import { createHash, createPublicKey, type KeyObject } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { existsSync, statSync, watch as watchFs } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';

import { fileURLToPath } from 'node:url';

import { EmbeddedAccounts } from './accounts.js';
import { HarnessError, parseVectorFile, runCase, type VectorFile } from './conformance.js';
import { PolicyComponent } from './component.js';
import { SplitMix64 } from './entropy.js';
import {
  AgentRetryError, ComponentLoadError, ConfigError, NothingToRollBackTo, UpdateConfigError, UpdateError, UpdateFleetError,
  UpdateIntegrityError, UpdateLoadError, UpdateOlderError, UpdateReadError, UpdateSelfTestError,
} from './errors.js';
import { Fleet, type FleetSource } from './fleet.js';
import { verifyPublication, type PublicationRead } from './manifest.js';
import type { PolicyUpdateEvent } from './events.js';
import type { RetryHooks } from './hooks.js';
import type { RetryMetrics } from './metrics.js';
import { loadOtel, type Otel } from './otel.js';
import { Telemetry } from './telemetry.js';
import { MAX_TIMER_MS } from './timers.js';

/** The gate's invariants as data: tests/vectors/gate.json, copied next to
 *  dist/src by the build (scripts/copy-generated.mjs) and shipped in the package. */
export const GATE_VECTORS = resolve(dirname(fileURLToPath(import.meta.url)), '../gate.json');
/** A signature over the `.wasm` alone (before 0.7): named when found, never accepted. */
export const SIGNATURE_SUFFIX = '.sig';
export const MANIFEST_SUFFIX = '.manifest';
/** DER prefix of an Ed25519 SubjectPublicKeyInfo; the raw 32-byte key follows. */
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/** Which policy made a decision: the component's digest and the configuration's. */
export class PolicyIdentity {
  constructor(
    /** SHA-256 of the .wasm, hex. */
    readonly wasmSha256: string,
    /** SHA-256 of the configuration text, hex. */
    readonly configSha256: string,
    /** 1 for the policy the host started with, then one more per accepted update. */
    readonly generation: number,
  ) {
    Object.freeze(this);
  }
  toString(): string {
    return `generation ${this.generation} (wasm ${this.wasmSha256.slice(0, 12)}, config ${this.configSha256.slice(0, 12)})`;
  }
  toJSON(): { generation: number; wasm_sha256: string; config_sha256: string } {
    return { generation: this.generation, wasm_sha256: this.wasmSha256, config_sha256: this.configSha256 };
  }
}

/** A policy that passed the gate: its compiled component, configuration and identity. */
export interface Loaded {
  readonly component: PolicyComponent;
  readonly configJson: string;
  readonly identity: PolicyIdentity;
}

/** How updates are trusted: `Integrity.unchecked()` (any `.wasm` that passes the
 *  rest of the gate; a development setting), `Integrity.pinnedSha256(hex)` (only
 *  a `.wasm` with this SHA-256) or `Integrity.ed25519(publicKey)` (only a
 *  publication whose signed manifest, `<wasm>.manifest` or the fleet's
 *  `{prefix}:manifest`, covers it all and verifies under this 32-byte key). */
export class Integrity {
  private constructor(
    readonly kind: 'unchecked' | 'pinned-sha256' | 'ed25519',
    readonly sha256?: string,
    readonly publicKey?: Uint8Array,
    private readonly key?: KeyObject,
  ) {
    Object.freeze(this);
  }

  static unchecked(): Integrity {
    return new Integrity('unchecked');
  }

  /** Throws RangeError unless `hex` is 64 hex digits (either case). */
  static pinnedSha256(hex: string): Integrity {
    const digest = hex.trim().toLowerCase();
    if (!/^[0-9a-f]{64}$/.test(digest)) throw new RangeError(`a SHA-256 digest is 64 hex digits, got ${JSON.stringify(hex)}`);
    return new Integrity('pinned-sha256', digest);
  }

  /** Throws RangeError for a key that is not 32 bytes or not an Ed25519 key. */
  static ed25519(publicKey: Uint8Array): Integrity {
    if (!(publicKey instanceof Uint8Array) || publicKey.length !== 32) {
      throw new RangeError(`an Ed25519 public key is 32 bytes, got ${publicKey instanceof Uint8Array ? publicKey.length : typeof publicKey}`);
    }
    let key: KeyObject;
    try {
      key = createPublicKey({ key: Buffer.concat([ED25519_SPKI_PREFIX, publicKey]), format: 'der', type: 'spki' });
    } catch (e) {
      throw new RangeError(`not a valid Ed25519 public key: ${(e as Error).message}`);
    }
    return new Integrity('ed25519', undefined, Uint8Array.from(publicKey), key);
  }

  /** Throws `UpdateIntegrityError` unless the publication as read is trusted:
   *  the pinned digest is `sha256`'s, or, under a key, its manifest covers it
   *  all and verifies. */
  verify(read: IntegrityRead): void {
    if (this.kind === 'pinned-sha256') {
      if (this.sha256 !== read.sha256) throw new UpdateIntegrityError(`the .wasm's SHA-256 is ${read.sha256}, the pinned digest ${this.sha256}`);
    } else if (this.kind === 'ed25519') {
      try {
        verifyPublication(this.key as KeyObject, read.manifest, read.manifestAt, read, read.legacySignatureAt);
      } catch (e) {
        throw new UpdateIntegrityError((e as Error).message);
      }
    }
  }
}

/** What `Integrity.verify` checks: the publication's parts as read. */
export interface IntegrityRead extends PublicationRead {
  /** The SHA-256 of `wasm`, hex. */
  readonly sha256: string;
  /** The signed manifest, if one came with it, and where it was looked for. */
  readonly manifest: Uint8Array | undefined;
  readonly manifestAt: string;
  /** Where a signature over the `.wasm` alone was found, if one was. */
  readonly legacySignatureAt?: string;
}

/** Where the policy comes from, and how it is trusted. */
export interface PolicySource {
  /** The component (.wasm). */
  readonly wasm: string;
  /** The configuration (JSON text, UTF-8). */
  readonly config: string;
  readonly integrity: Integrity;
  /** Optional: vectors the update ships with (a JSON file in the format of
   *  tests/vectors/*.json), read with the other files on every reload; every
   *  case must pass against the candidate. A configured path that cannot be
   *  read refuses the update (`UpdateReadError`). */
  readonly vectors?: string;
}

/** A fleet's publication in Redis (src/fleet.ts), and how it is trusted. */
export interface FleetPolicySource {
  readonly url: string;
  readonly prefix: string;
  readonly integrity: Integrity;
}

/** Where the signed manifest of `wasm` is: `<wasm>.manifest`. */
export function manifestPath(wasm: string): string {
  return `${wasm}${MANIFEST_SUFFIX}`;
}

/** Where a signature over `wasm` alone was kept before 0.7 (`<wasm>.sig`): no
 *  longer accepted, only named when found. */
export function signaturePath(wasm: string): string {
  return `${wasm}${SIGNATURE_SUFFIX}`;
}

/** One log record of an update (src/events.ts). */
export type { PolicyUpdateEvent } from './events.js';

/** Counters of what happened to updates since `open` (for a metrics endpoint). */
export interface UpdateMetrics {
  readonly accepted: number;
  readonly refused: number;
  readonly rolledBack: number;
}

export interface LiveOptions {
  /** Receives one event per accepted, refused or rolled-back update. Default:
   *  one JSON line on stderr (as the MCP wrapper's attempt log). */
  log?: (event: PolicyUpdateEvent) => void;
  /** `onPolicyUpdate` is called with every update event (an observer: one that throws is logged once, `agent_retry.hook_failed`). */
  hooks?: RetryHooks;
  /** Counts accepted, refused and rolled-back updates (`agent_retry.policy_updates`). */
  metrics?: RetryMetrics;
  /** The sandbox's memory cap for every policy loaded (default 64 MiB). */
  maxMemoryBytes?: number;
  /** Where `.wasm` updates are transpiled (default `defaultCacheDir()`). */
  cacheDir?: string;
  /** More gate vector files (the format of tests/vectors/*.json) every
   *  candidate must pass, after the package's own gate.json: the operator's
   *  invariants. Read at every gate; one that cannot be read or parsed refuses
   *  the update. */
  gateVectors?: readonly string[];
}

/** What `watch` returns: stop it with `close()` (or `stop()`). */
export interface PolicyWatcher {
  close(): void;
  stop(): void;
  /** Whether the files are watched by `fs.watch` besides the polling (false where it is unavailable). */
  readonly native: boolean;
}

/** A file's state when last read (mtime in ns, size, inode), to notice a
 *  change, and its mtime (ns; -1 when absent). */
function stamp(path: string): { stamp: string; mtimeNs: bigint } {
  try {
    const s = statSync(path, { bigint: true });
    return { stamp: `${s.mtimeNs}:${s.size}:${s.ino}`, mtimeNs: s.mtimeNs };
  } catch {
    return { stamp: 'absent', mtimeNs: -1n };
  }
}

/** The update's files' stamps (what counts as a change), and the newest
 *  modification time among them (ns: how old the candidate is). */
function filesNow(source: PolicySource): { seen: string; newest: bigint } {
  const none = { stamp: '', mtimeNs: -1n };
  const files = [
    stamp(source.wasm), stamp(source.config), source.integrity.kind === 'ed25519' ? stamp(manifestPath(source.wasm)) : none,
    source.vectors === undefined ? none : stamp(source.vectors),
  ];
  return { seen: files.map((file) => file.stamp).join('|'), newest: files.reduce((newest, file) => (file.mtimeNs > newest ? file.mtimeNs : newest), -1n) };
}

/** A modification time in ns, for messages. */
function mtimeText(ns: bigint): string {
  const ms = Number(ns / 1_000_000n);
  const date = new Date(ms);
  return Number.isNaN(date.getTime()) ? `${ns} ns` : `${date.toISOString().slice(0, -1)}${String(ns % 1_000_000n).padStart(6, '0')}Z`;
}

/** An update as read, before the gate. */
interface Read {
  readonly wasm: Uint8Array;
  readonly config: Uint8Array;
  /** The signed manifest, if one came with it (read only under a key). */
  readonly manifest: Uint8Array | undefined;
  /** Where the manifest was looked for, for messages. */
  readonly manifestAt: string;
  /** Where a signature over the `.wasm` alone (before 0.7) was found, if one was. */
  readonly legacySignatureAt: string | undefined;
  /** The fleet's revision it was read under; null for files. */
  readonly revision: number | null;
  /** Where the .wasm came from, for messages. */
  readonly wasmAt: string;
  /** The vectors shipped with the update, if any, and where they came from. */
  readonly vectors: Uint8Array | undefined;
  readonly vectorsAt: string;
  /** What was read, to notice the next change. */
  readonly seen: string;
  /** How new the update is: the fleet's revision, or the files' newest
   *  modification time (ns); a candidate whose order is lower than the serving
   *  policy's is refused as older. */
  readonly order: bigint;
}

/** Where updates come from: files, or a fleet's publication in Redis. */
interface Origin {
  readonly integrity: Integrity;
  /** What counts as a change: the files' stamps, or the fleet's revision
   *  (rejects with `UpdateFleetError` when Redis cannot be reached). */
  seenNow(): Promise<string>;
  read(): Promise<Read>;
  /** An order (`Read.order`) in words, for messages. */
  describe(order: bigint): string;
}

class FileOrigin implements Origin {
  constructor(readonly source: PolicySource) {}

  get integrity(): Integrity {
    return this.source.integrity;
  }

  async seenNow(): Promise<string> {
    return filesNow(this.source).seen;
  }

  describe(order: bigint): string {
    return `the files' newest modification time ${mtimeText(order)}`;
  }

  async read(): Promise<Read> {
    const { seen, newest } = filesNow(this.source);
    const wasm = await read(this.source.wasm);
    const config = await read(this.source.config);
    const signed = this.source.integrity.kind === 'ed25519';
    const manifestAt = manifestPath(this.source.wasm);
    const manifest = signed ? await readFile(manifestAt).catch(() => undefined) : undefined;
    const legacySignatureAt = signed && existsSync(signaturePath(this.source.wasm)) ? signaturePath(this.source.wasm) : undefined;
    const vectorsAt = this.source.vectors ?? '';
    const vectors = this.source.vectors === undefined ? undefined : await read(this.source.vectors);
    return { wasm, config, manifest, manifestAt, legacySignatureAt, revision: null, wasmAt: this.source.wasm, vectors, vectorsAt, seen, order: newest };
  }
}

const fleetError = (e: unknown): UpdateFleetError =>
  e instanceof UpdateFleetError ? e : new UpdateFleetError((e as Error)?.message ?? String(e), { cause: e });

class FleetOrigin implements Origin {
  constructor(readonly fleet: Fleet, readonly integrity: Integrity) {}

  async seenNow(): Promise<string> {
    try {
      return `revision ${await this.fleet.revision()}`;
    } catch (e) {
      throw fleetError(e);
    }
  }

  async read(): Promise<Read> {
    let publication;
    try {
      publication = await this.fleet.read();
    } catch (e) {
      throw fleetError(e);
    }
    const { wasm, config, manifest, legacySignature, vectors, revision } = publication;
    return {
      wasm, config, manifest, manifestAt: this.fleet.key('manifest'), legacySignatureAt: legacySignature ? this.fleet.key('wasm.sig') : undefined,
      // Always a revision: 0 ("none stored") is "revision 0", which no manifest covers (a files one says "none").
      revision, wasmAt: `${this.fleet.key('wasm')} (revision ${revision})`,
      vectors, vectorsAt: `${this.fleet.key('vectors')} (revision ${revision})`, seen: `revision ${revision}`, order: BigInt(revision),
    };
  }

  describe(order: bigint): string {
    return `revision ${order} (${this.fleet.key('revision')})`;
  }
}

function identityFields(identity: PolicyIdentity): Pick<PolicyUpdateEvent, 'policy' | 'generation' | 'wasm_sha256' | 'config_sha256'> {
  return { policy: identity.toString(), generation: identity.generation, wasm_sha256: identity.wasmSha256, config_sha256: identity.configSha256 };
}

const defaultLog = (event: PolicyUpdateEvent): void => {
  process.stderr.write(`${JSON.stringify(event)}\n`);
};

/** The serving policy, the previous good one, and what counts as an update.
 *  `current()` is synchronous; updates (reload, rollback, poll) run one at a time. */
export class LivePolicy {
  #current: Loaded;
  #previous: Loaded | undefined;
  #seen: string;
  #lastRefusal: string | undefined;
  #generations: number;
  /** Whether the fleet's Redis was unreachable at the last check (logged once per outage). */
  #unreachable = false;
  #queue: Promise<unknown> = Promise.resolve();
  /** How new each policy held (serving, previous) was when read (`Read.order`). */
  readonly #orders = new WeakMap<Loaded, bigint>();
  readonly #counters = { accepted: 0, refused: 0, rolledBack: 0 };
  readonly #watchers = new Set<PolicyWatcher>();
  readonly #log: (event: PolicyUpdateEvent) => void;

  /** The files, or the fleet's Redis, updates are read from. */
  readonly source: PolicySource | FleetPolicySource;
  readonly #origin: Origin;

  private constructor(origin: Origin, first: Loaded, read: Read, private readonly options: LiveOptions, otel?: Otel) {
    this.#origin = origin;
    const { seen } = read;
    this.#orders.set(first, read.order);
    this.source = origin instanceof FleetOrigin
      ? Object.freeze({ url: origin.fleet.url, prefix: origin.fleet.prefix, integrity: origin.integrity })
      : (origin as FileOrigin).source;
    this.#current = first;
    this.#seen = seen;
    this.#generations = first.identity.generation;
    const log = options.log ?? defaultLog;
    // The hook, the counter and OpenTelemetry's: the fan-out every emitter uses. The update's line is the `log`
    // option's (its records are typed); a hook's failure line goes to stderr.
    const fanOut = new Telemetry({ log: (line) => process.stderr.write(`${line}\n`), hooks: options.hooks, metrics: options.metrics, otel });
    this.#log = (event) => {
      log(event);
      fanOut.emit(event, false);
    };
  }

  /** Loads the first policy through the same gate as every update. Rejects with an `UpdateError`. */
  static async open(source: PolicySource, options: LiveOptions = {}): Promise<LivePolicy> {
    if (!(source.integrity instanceof Integrity)) {
      throw new TypeError('PolicySource.integrity: use Integrity.unchecked(), Integrity.pinnedSha256(hex) or Integrity.ed25519(publicKey)');
    }
    if (source.vectors !== undefined && typeof source.vectors !== 'string') throw new TypeError('PolicySource.vectors: a path, or undefined');
    const resolved: PolicySource = Object.freeze({
      wasm: resolve(source.wasm), config: resolve(source.config), integrity: source.integrity,
      ...(source.vectors === undefined ? {} : { vectors: resolve(source.vectors) }),
    });
    return LivePolicy.#openOrigin(new FileOrigin(resolved), options);
  }

  /** Loads the first policy from the fleet's Redis (src/fleet.ts: one MGET of
   *  `{prefix}:wasm`, `:config`, `:wasm.sig`, `:revision`, `:vectors`), through the same
   *  gate, the signature taken from `{prefix}:wasm.sig`; a worker started after
   *  a publication takes it here. Rejects with an `UpdateError`
   *  (`UpdateFleetError` when Redis cannot be read or nothing is published). */
  static async openFleet(fleet: FleetSource, integrity: Integrity, options: LiveOptions = {}): Promise<LivePolicy> {
    if (!(integrity instanceof Integrity)) {
      throw new TypeError('integrity: use Integrity.unchecked(), Integrity.pinnedSha256(hex) or Integrity.ed25519(publicKey)');
    }
    return LivePolicy.#openOrigin(new FleetOrigin(new Fleet(fleet), integrity), options);
  }

  static async #openOrigin(origin: Origin, given: LiveOptions): Promise<LivePolicy> {
    const gate = given.gateVectors;
    if (gate !== undefined && (!Array.isArray(gate) || !gate.every((path) => typeof path === 'string'))) {
      throw new TypeError('LiveOptions.gateVectors: an array of paths to vector files, or undefined');
    }
    // Resolved once: a later chdir does not move them.
    const options: LiveOptions = gate === undefined ? given : { ...given, gateVectors: Object.freeze(gate.map((path) => resolve(path))) };
    const read = await origin.read();
    const first = await candidate(read, origin.integrity, 1, undefined, options);
    return new LivePolicy(origin, first, read, options, await loadOtel());
  }

  /** The policy new runs get. Keep it for the run: an update does not change it. */
  current(): Loaded {
    return this.#current;
  }

  /** Why the last update was refused, if the last attempt was refused. */
  lastRefusal(): string | undefined {
    return this.#lastRefusal;
  }

  /** Updates accepted, refused and rolled back since `open` (a snapshot). */
  get metrics(): UpdateMetrics {
    return { ...this.#counters };
  }

  /** Reads the files (or the fleet's publication) again, gates the candidate (off the hot path: the old
   *  policy serves until the swap), and swaps it in. On refusal rejects with an
   *  `UpdateError`, logs the reason and counts it; the serving policy is unchanged. */
  reload(): Promise<PolicyIdentity> {
    return this.#serialised(() => this.#reload());
  }

  /** Returns to the previous good policy (it passed the gate when it served);
   *  a second rollback returns to the one rolled back from. Rejects with
   *  `NothingToRollBackTo` if there is none. */
  rollback(): Promise<PolicyIdentity> {
    return this.#serialised(async () => {
      const previous = this.#previous;
      if (previous === undefined) throw new NothingToRollBackTo();
      this.#previous = this.#current;
      this.#current = previous;
      this.#counters.rolledBack += 1;
      this.#log({ event: 'agent_retry.policy_update', level: 'info', message: 'policy rolled back', ...identityFields(previous.identity) });
      return previous.identity;
    });
  }

  /** Reloads if a file changed since it was last read (mtime, size or inode; the
   *  signature too when a key is configured, the vectors when configured), or the fleet's revision is one
   *  not tried yet (accepted or refused): the new identity, or `undefined` if
   *  nothing changed. Rejects with an `UpdateError` on refusal. A fleet whose
   *  Redis cannot be reached resolves `undefined` (the serving policy stays;
   *  logged once per outage, and once when it answers again). */
  poll(): Promise<PolicyIdentity | undefined> {
    return this.#serialised(async () => {
      let now: string;
      try {
        now = await this.#origin.seenNow();
      } catch (e) {
        this.#reachable(false, e);
        return undefined;
      }
      this.#reachable(true);
      return now === this.#seen ? undefined : this.#reload();
    });
  }

  /** Logs the transitions of the fleet's Redis between reachable and not. */
  #reachable(reachable: boolean, error?: unknown): void {
    if (reachable === !this.#unreachable) return;
    this.#unreachable = !reachable;
    const serving = this.#current.identity.toString();
    if (reachable) this.#log({ event: 'agent_retry.policy_update', level: 'info', message: "the fleet's Redis answers again", serving });
    else this.#log({ event: 'agent_retry.policy_update', level: 'warning', message: 'cannot check for a policy update', serving, reason: String((error as Error)?.message ?? error) });
  }

  /** Watches for updates, and always polls every `intervalMs` besides (`poll()`).
   *  Files: `fs.watch` on their directories too, so a change is picked up
   *  within about 50 ms (the polling covers filesystems where `fs.watch` says
   *  nothing, network ones among them). A fleet: a subscription to the
   *  `{prefix}:updates` channel on a connection of its own, so a publication is
   *  taken at once (the polling of `{prefix}:revision` covers a missed message,
   *  an outage, a lost subscription, which is made again after
   *  min(intervalMs, 1 s)). Refusals are logged and kept in `lastRefusal()`, a
   *  Redis outage is logged; the watcher goes on. Its timers, watchers and
   *  subscription are unref'd: they do not keep the process alive. Stop it
   *  with `close()` on it or on this object. */
  watch(intervalMs: number): PolicyWatcher {
    if (!Number.isFinite(intervalMs) || intervalMs <= 0) throw new RangeError(`intervalMs must be a positive number, not ${intervalMs}`);
    let polling = false;
    let again = false;
    let closed = false;
    const check = () => {
      if (closed) return;
      if (polling) {
        again = true; // a change seen during a poll is checked right after it
        return;
      }
      polling = true;
      again = false;
      this.poll().catch((e: unknown) => {
        if (!(e instanceof UpdateError)) {
          this.#log({ event: 'agent_retry.policy_update', level: 'warning', message: 'watcher: polling failed', serving: this.#current.identity.toString(), reason: String((e as Error)?.message ?? e) });
        }
      }).finally(() => {
        polling = false;
        if (again) check();
      });
    };
    // Past 2^31 - 1 ms node's timer would fire every ms: the longest it takes polls rarely enough.
    const timer = setInterval(check, Math.min(intervalMs, MAX_TIMER_MS));
    timer.unref();
    const stops: Array<() => void> = [];
    let native: () => boolean;
    if (this.#origin instanceof FleetOrigin) {
      native = this.#subscribe(this.#origin.fleet, Math.min(intervalMs, 1000), check, () => closed, stops);
    } else {
      const fsWatchers = this.#watchFiles((this.#origin as FileOrigin).source, intervalMs, check, () => closed, stops);
      native = () => fsWatchers > 0;
    }
    const watcher: PolicyWatcher = {
      get native() {
        return native();
      },
      close: () => {
        closed = true;
        clearInterval(timer);
        for (const stop of stops) stop();
        this.#watchers.delete(watcher);
      },
      stop: () => watcher.close(),
    };
    this.#watchers.add(watcher);
    return watcher;
  }

  /** `fs.watch` on the files' directories; returns how many are watched. */
  #watchFiles(source: PolicySource, intervalMs: number, check: () => void, closed: () => boolean, stops: Array<() => void>): number {
    let debounce: NodeJS.Timeout | undefined;
    const soon = () => {
      if (closed()) return;
      if (debounce) clearTimeout(debounce);
      debounce = setTimeout(check, Math.min(50, intervalMs));
      debounce.unref();
    };
    stops.push(() => {
      if (debounce) clearTimeout(debounce);
    });
    // The directories, not the files: an operator replacing a file by a rename
    // (the safe way to publish) would leave a watch on the old file blind.
    const names = new Map<string, Set<string>>();
    for (const path of [source.wasm, source.config, manifestPath(source.wasm), ...(source.vectors === undefined ? [] : [source.vectors])]) {
      const dir = dirname(path);
      names.set(dir, (names.get(dir) ?? new Set()).add(basename(path)));
    }
    let watched = 0;
    for (const [dir, files] of names) {
      try {
        const w = watchFs(dir, { persistent: false }, (_event, name) => {
          if (name === null || files.has(String(name))) soon();
        });
        w.on('error', () => w.close()); // the polling goes on
        w.unref();
        stops.push(() => w.close());
        watched += 1;
      } catch {
        // fs.watch is unavailable here: polling only.
      }
    }
    return watched;
  }

  /** Keeps a subscription to the fleet's channel while the watcher lives:
   *  every announcement checks the revision; a lost subscription is logged and
   *  made again after `retryMs`; once (re)subscribed the revision is checked,
   *  so a publication made while it was down is not missed. Returns whether it
   *  is subscribed now. */
  #subscribe(fleet: Fleet, retryMs: number, check: () => void, closed: () => boolean, stops: Array<() => void>): () => boolean {
    let subscription: { close(): void } | undefined;
    let retry: NodeJS.Timeout | undefined;
    const again = () => {
      if (closed()) return;
      retry = setTimeout(subscribe, retryMs);
      retry.unref();
    };
    const subscribe = () => {
      retry = undefined;
      if (closed()) return;
      fleet.subscribe(check, (e) => {
        subscription = undefined;
        if (closed()) return;
        this.#reachable(false, e);
        again();
      }).then((made) => {
        if (closed()) {
          made.close();
          return;
        }
        subscription = made;
        check();
      }, (e: unknown) => {
        this.#reachable(false, e);
        again();
      });
    };
    stops.push(() => {
      if (retry) clearTimeout(retry);
      subscription?.close();
      subscription = undefined;
    });
    subscribe();
    return () => subscription !== undefined;
  }

  /** Stops every watcher. The serving policy stays usable. */
  close(): void {
    for (const watcher of [...this.#watchers]) watcher.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** One update at a time, in the order asked. */
  #serialised<T>(update: () => Promise<T>): Promise<T> {
    const next = this.#queue.then(update, update);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  async #reload(): Promise<PolicyIdentity> {
    // Noted first, so that an update that cannot even be read is tried once, not at every poll.
    try {
      this.#seen = await this.#origin.seenNow();
    } catch {
      // Redis is away: the read below says so.
    }
    const serving = this.#current;
    let loaded: Loaded;
    let order: bigint;
    try {
      const read = await this.#origin.read();
      this.#seen = read.seen;
      // Older than what serves (a stale replica, an old dump, files put back
      // with their old times): refused before it is even checked. Equal is
      // not older (the same files or revision may be read again); a rollback
      // is not an update and changes what serves, so what comes next is
      // compared with the policy rolled back to.
      const servingOrder = this.#orders.get(serving);
      if (servingOrder !== undefined && read.order < servingOrder) {
        throw new UpdateOlderError(`${this.#origin.describe(read.order)}, while the serving policy's is ${this.#origin.describe(servingOrder)}`);
      }
      // Generations only grow (after a rollback too), so that one number names
      // one policy; a refused candidate takes none (the Rust host's numbering).
      loaded = await candidate(read, this.#origin.integrity, this.#generations + 1, serving, this.options);
      order = read.order;
    } catch (e) {
      const error = e instanceof UpdateError ? e : new UpdateSelfTestError(`${(e as Error)?.name ?? 'Error'}: ${(e as Error)?.message ?? e}`, { cause: e });
      this.#lastRefusal = error.message;
      this.#counters.refused += 1;
      this.#log({ event: 'agent_retry.policy_update', level: 'warning', message: 'policy update refused', serving: serving.identity.toString(), kind: error.kind, reason: error.message });
      throw error;
    }
    this.#generations = loaded.identity.generation;
    this.#orders.set(loaded, order);
    this.#previous = this.#current;
    this.#current = loaded;
    this.#lastRefusal = undefined;
    this.#counters.accepted += 1;
    this.#log({ event: 'agent_retry.policy_update', level: 'info', message: 'policy update accepted', ...identityFields(loaded.identity) });
    return loaded.identity;
  }
}

async function read(path: string): Promise<Uint8Array> {
  try {
    return await readFile(path);
  } catch (e) {
    const error = e as NodeJS.ErrnoException;
    throw new UpdateReadError(path, error.code ? `${error.code}: ${error.message}` : String(error.message ?? e), { cause: e });
  }
}

/** `read` by another name: `candidate`'s parameter `read` hides it there. */
const readGateFile = (path: string): Promise<Uint8Array> => read(path);

const sha256Hex = (bytes: Uint8Array): string => createHash('sha256').update(bytes).digest('hex');

/** Checks and compiles a candidate (a `.wasm` byte-identical to the serving one
 *  is not compiled again); loads its configuration, runs the gate vectors,
 *  then the vectors it ships with. */
async function candidate(read: Read, integrity: Integrity, generation: number, serving: Loaded | undefined, options: LiveOptions): Promise<Loaded> {
  const { wasm, config: configBytes } = read;
  let configJson: string;
  try {
    configJson = new TextDecoder('utf-8', { fatal: true }).decode(configBytes);
  } catch (e) {
    throw new UpdateConfigError('the configuration is not UTF-8', { cause: e });
  }
  const wasmSha256 = sha256Hex(wasm);
  integrity.verify({ ...read, config: configBytes, sha256: wasmSha256 });
  let component: PolicyComponent;
  if (serving !== undefined && serving.identity.wasmSha256 === wasmSha256) {
    component = serving.component; // the same bytes passed the load check already
  } else {
    try {
      component = await PolicyComponent.fromBytes(wasm, { source: read.wasmAt, maxMemoryBytes: options.maxMemoryBytes, cacheDir: options.cacheDir });
    } catch (e) {
      if (e instanceof ComponentLoadError) throw new UpdateLoadError(e);
      throw new UpdateLoadError(new ComponentLoadError(`${read.wasmAt} cannot be loaded: ${(e as Error)?.message ?? e}`, { cause: e }));
    }
  }
  await checkConfig(component, configJson);
  // The gate's invariants (the package's gate.json, then the operator's files).
  for (const path of [GATE_VECTORS, ...(options.gateVectors ?? [])]) {
    await runShippedVectors(component, configJson, parseShippedVectors(await readGateFile(path), path, 'gate vectors'), path, 'gate vectors');
  }
  // Then the vectors the update ships with (a malformed file refuses it too).
  if (read.vectors !== undefined) {
    await runShippedVectors(component, configJson, parseShippedVectors(read.vectors, read.vectorsAt, "update's vectors"), read.vectorsAt, "update's vectors");
  }
  return { component, configJson, identity: new PolicyIdentity(wasmSha256, sha256Hex(configBytes), generation) };
}

/** The shipped vectors' text, parsed; a malformed file refuses the update. */
function parseShippedVectors(bytes: Uint8Array, at: string, what: string): VectorFile {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (e) {
    throw new UpdateSelfTestError(`the ${what} (${at}) are not UTF-8`, { cause: e });
  }
  try {
    return parseVectorFile(text);
  } catch (e) {
    throw new UpdateSelfTestError(`the ${what} (${at}) are not in the vector format: ${(e as Error)?.message ?? e}`, { cause: e });
  }
}

/** Runs every case of a vector file (the gate's, or the update's own) against
 *  the candidate, each on a fresh instance (src/conformance.ts `runCase`); a
 *  case without `config` loads the update's configuration. The first failing
 *  case refuses the update, named. */
async function runShippedVectors(component: PolicyComponent, configJson: string, vectors: VectorFile, at: string, what: string): Promise<void> {
  for (const testCase of vectors.cases) {
    let failure: string | undefined;
    let cause: unknown;
    try {
      const result = await runCase(component, at, testCase, { defaultConfigText: configJson });
      failure = result.failure;
      cause = result.error; // a trap or fuel run out in a step: the refusal's cause
    } catch (e) {
      // The candidate is untrusted: a trap while instantiating it refuses it too.
      cause = e;
      failure = `${e instanceof HarnessError ? '' : `${(e as Error)?.name ?? 'Error'}: `}${(e as Error)?.message ?? e}`;
    }
    if (failure !== undefined) {
      throw new UpdateSelfTestError(`the ${what} (${at}) fail: ${JSON.stringify(testCase.description)} ${failure}`, cause === undefined ? undefined : { cause });
    }
  }
}

/** Gate step 3: the configuration loads in the candidate (a fresh instance of
 *  its own); a refused configuration is an `UpdateConfigError`, anything else
 *  going wrong in the untrusted candidate an `UpdateSelfTestError`. */
async function checkConfig(component: PolicyComponent, configJson: string): Promise<void> {
  try {
    const instance = await component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(1n) });
    instance.loadPolicy(configJson).close();
  } catch (e) {
    if (e instanceof ConfigError) throw new UpdateConfigError(`${e.field}: ${e.detail}`, { cause: e });
    if (e instanceof UpdateError) throw e;
    const name = e instanceof AgentRetryError ? e.name : `${(e as Error)?.name ?? 'Error'}`;
    throw new UpdateSelfTestError(`${name}: ${(e as Error)?.message ?? e}`, { cause: e });
  }
}
