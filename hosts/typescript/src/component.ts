// Loading the policy component (transpiled by jco) and calling it.
//
//   const component = await PolicyComponent.load();     // compile once per process
//   const instance = await component.instantiate();     // one per run or worker
//   const policy = instance.loadPolicy({ 'max-attempts-per-call': 3 });
//   const run = policy.startRun('CASE-5016');
//   const start = run.beginCall(undefined, 'lookup_order', key, hints, nowMs());
//   const verdict = run.recordFailure(start.callId, 1, observation, undefined, nowMs());
//
// Which transpilation runs: the one the package carries (generated/, no
// dependency) when the .wasm in force is the component it was made from, or no
// .wasm is asked for; `generatedDir` when given (made by
// `agent-retry-policy-transpile`); otherwise the .wasm is transpiled at run time
// by jco's API (an optional peer dependency, @bytecodealliance/jco 1.12.x) into
// a cache directory keyed by its SHA-256 (`cacheDir`), and a cached
// transpilation is reused. The contract version and the imports are checked on
// the .wasm's bytes before anything is transpiled.
//
// The component gets only the account budget, the shared state (contract 0.8.0:
// the circuit breakers', src/shared-state.ts) and `wasi:random/random` from this
// host (no WASI shim at all), so it can reach no file, socket, clock or environment;
// a component that imports anything else is refused at load (`ComponentImportRefused`).
//
// The sandbox (src/sandbox.ts): each core module is rewritten at load so that every
// call runs on a fuel budget (`fuelPerCall`, default 20 M, as in the Rust and
// Python hosts; `policy.from-json` gets `fuelPerConfigByte`, default 2,000, more per
// byte of its text) and the instance's memory is capped (`maxMemoryBytes`, default
// 64 MiB). Values are checked in both directions: arguments against their WIT
// types before the call (`ValueConversionError`, nothing reaches the guest),
// results by jco's lifting with a fatal UTF-8 decoder. A trap, an exhausted
// limit or a value the contract does not allow is a `PolicyTrap` (kinds:
// `PolicyOutOfFuel`, `PolicyMemoryExceeded`, `PolicyBoundaryViolation`) and the
// instance is refused afterwards (`InstanceUnusable`): instantiate a new one.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import type { Root } from '../generated/agent_retry_policy.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { PROCESS_ACCOUNTS, type AccountBudgetBackend } from './accounts.js';
import { MAX_SHARED_VALUE_BYTES, sharedStateFor, type Loaded, type SharedStateBackend } from './shared-state.js';
import { checkContractVersion, checkImports, componentExportNames, componentImportNames } from './contract.js';
import { OsEntropy, randomBytes, type EntropySource } from './entropy.js';
import { withJson, type JsonSafe } from './json.js';
import {
  AgentRetryError, ComponentImportRefused, ComponentLoadError, ComponentNotFound, ConfigError, InstanceUnusable, PolicyBoundaryViolation,
  PolicyInputTooLarge, PolicyMemoryExceeded, PolicyOutOfFuel, PolicyTrap, RunMisuse, SnapshotError,
} from './errors.js';
import {
  MAX_CONFIG_BYTES, MAX_ID_BYTES, MAX_SERVER_BYTES, boundedDetail, boundedObservation, boundedTaskReport, cutUtf8, overLimit, utf8Length,
} from './limits.js';
import { MAX_ARGUMENTS_BYTES, MAX_SNAPSHOT_BYTES } from './limits-generated.js';
import { FUEL_EXPORT, FUEL_PER_CALL, FUEL_PER_CONFIG_BYTE, GROW_FAILED_EXPORT, MAX_MEMORY_BYTES, instrumentCoreModule } from './sandbox.js';
import { FUNCTIONS, TYPES, ValueConversionError, checkJco, jcoProblem } from './wit.js';

export type PolicyExports = Root['policy'];
type JcoPolicy = ReturnType<PolicyExports['Policy']['fromJson']>;
type JcoRun = ReturnType<JcoPolicy['startRun']>;

export const WASM_ENV_VAR = 'AGENT_RETRY_WASM';

/** Milliseconds since the Unix epoch, from the wall clock (what `now-ms` means). */
export function nowMs(): bigint {
  return BigInt(Date.now());
}

const here = dirname(fileURLToPath(import.meta.url));
/** dist/src -> dist/generated (the build copies generated/ there). */
const defaultGeneratedDir = resolve(here, '../generated');
/** Installed from npm (under node_modules) rather than built in the repository:
 *  the error messages then give a package user's fixes, not the repository's. */
export const INSTALLED = here.split(sep).includes('node_modules');
/** dist/src -> the repository root (only when built in the repository). */
const repoWasm = INSTALLED ? undefined : resolve(here, '../../../../target/component/agent_retry_policy.wasm');
/** How a user transpiles a .wasm of their own for `generatedDir`. */
const TRANSPILE_ADVICE = 'transpile it with `npx agent-retry-policy-transpile <file.wasm> <dir>` (needs `npm install -D ' +
  '@bytecodealliance/jco@1.12.0`) and pass `{ generatedDir: <dir> }`';

/** The .wasm that should be in force: `path`, else $AGENT_RETRY_WASM, else (in
 *  the repository) its build output; `undefined` when none is asked for, so that
 *  the transpiled component the package carries is used as it is. */
export function locateComponent(path?: string): string | undefined {
  const explicit = path ?? process.env[WASM_ENV_VAR];
  if (explicit) {
    const how = path ? 'the wasmPath option' : `$${WASM_ENV_VAR}`;
    if (!existsSync(explicit)) {
      throw new ComponentNotFound(`the agent-retry policy component was not found at ${explicit} (${how}). ` +
        (INSTALLED
          ? `Point ${how} at an existing .wasm, or ${path ? 'leave it out' : 'unset it'} to use the component this package carries.`
          : 'Build it with `make wasm` in the repository root.'));
    }
    return resolve(explicit);
  }
  return repoWasm !== undefined && existsSync(repoWasm) ? repoWasm : undefined;
}

/** What a transpiled component was made from (`PolicyComponent.source`): the
 *  .wasm's path and SHA-256, the jco version, and the component's exports and imports. */
export interface SourceInfo { wasm: string; sha256: string; jco: string; glueEdits?: number; exports?: string[]; imports?: string[] }

/** scripts/jco-transpile.mjs: jco's options and the sandbox's edits of its glue,
 *  shared with `npm run transpile` (loaded from the package's scripts/, next to dist/). */
interface JcoTranspile {
  JCO_INSTALL: string;
  STRICT_DECODER: string;
  GLUE_EDITS_VERSION: number;
  GLUE_FILE: string;
  findJco(from: string): { entry: string; root: string; version: string };
  sameLine(version: unknown): boolean;
  transpileInWorker(from: string, bytes: Uint8Array, wasmName: string): Promise<{ files: Record<string, Uint8Array>; source: SourceInfo }>;
}
let shared: Promise<JcoTranspile> | undefined;
const jcoTranspile = (): Promise<JcoTranspile> =>
  (shared ??= import(new URL('../../scripts/jco-transpile.mjs', import.meta.url).href) as Promise<JcoTranspile>);

export const CACHE_ENV_VAR = 'AGENT_RETRY_CACHE_DIR';

/** Where `.wasm` files other than the bundled component are transpiled at run
 *  time: $AGENT_RETRY_CACHE_DIR, else $XDG_CACHE_HOME/agent-retry-policy, else
 *  <os.tmpdir()>/agent-retry-policy-<uid>. One subdirectory per component SHA-256. */
export function defaultCacheDir(): string {
  const explicit = process.env[CACHE_ENV_VAR];
  if (explicit) return resolve(explicit);
  const xdg = process.env.XDG_CACHE_HOME;
  if (xdg && isAbsolute(xdg)) return join(xdg, 'agent-retry-policy');
  const uid = typeof process.getuid === 'function' ? `-${process.getuid()}` : '';
  return join(tmpdir(), `agent-retry-policy${uid}`);
}

/** Where a component's transpilation came from. */
export type ComponentOrigin = 'bundled' | 'generated' | 'cache' | 'transpiled';

export interface LoadOptions {
  /** The .wasm the transpiled code must come from (checked by hash). */
  wasmPath?: string;
  /** Where `npm run transpile` put jco's output (default: the package's). */
  generatedDir?: string;
  /** The most linear memory an instance may grow to (default `MAX_MEMORY_BYTES`,
   *  64 MiB, as in the Rust and Python hosts). Applied to the compiled modules. */
  maxMemoryBytes?: number;
  /** Where a .wasm other than the bundled component is transpiled at run time
   *  (default `defaultCacheDir()`). Not used with `generatedDir`. */
  cacheDir?: string;
}

/** `PolicyComponent.fromBytes`'s options. */
export interface FromBytesOptions {
  /** Names the component in messages (its path). */
  source?: string;
  maxMemoryBytes?: number;
  cacheDir?: string;
}

export interface InstantiateOptions {
  /** Default: the buckets shared by the whole process. */
  accounts?: AccountBudgetBackend;
  /** The shared state (the circuit breakers', contract 0.8.0). Default: the
   *  embedded store beside `accounts` (`sharedStateFor(accounts)`): every
   *  instance sharing an account budget backend shares its store. Workers on
   *  many machines: `await FallbackSharedState.open(url)` (Redis, src/redis-shared-state.ts). */
  sharedState?: SharedStateBackend;
  /** For `wasi:random`, used only when a call passes no entropy. Default: the OS. */
  entropy?: EntropySource;
  /** Fuel each call may burn, about one unit per wasm instruction (default
   *  `FUEL_PER_CALL`, 20 M, as in the Rust and Python hosts); `null`: no limit. */
  fuelPerCall?: number | null;
  /** Fuel `policy.from-json` (`loadPolicy`) gets on top of `fuelPerCall`, per
   *  UTF-8 byte of the configuration (default `FUEL_PER_CONFIG_BYTE`, 2,000, as in
   *  the Rust and Python hosts): its cost is linear in the text and it runs off
   *  the decision path, so a large valid configuration is not cut off by a
   *  call's tank. Ignored when `fuelPerCall` is `null`. */
  fuelPerConfigByte?: number;
}

/** Raised by a host import, to tell it apart from the guest's own failures. */
class ImportFailure extends Error {}

/** The most an i64 fuel global holds: an unmetered instance's tank. */
const UNMETERED = (1n << 63n) - 1n;

/** The sandbox's handles on one instance: the fuel and failed-grow globals and
 *  the memories of its core instances. */
class Meter {
  readonly fuel: WebAssembly.Global[] = [];
  readonly growFailed: WebAssembly.Global[] = [];
  readonly memories: WebAssembly.Memory[] = [];
  /** A call's tank, computed once (refuelling is on every decision's path). */
  private readonly callTank: bigint;
  /** The tank of the call running (or last run): a call's, or a configuration load's. */
  private tank: bigint;
  /** The configuration bytes that tank was sized for (undefined: a call's tank). */
  private configBytes: number | undefined;
  constructor(readonly fuelPerCall: number | null, readonly fuelPerConfigByte: number, readonly maxMemoryBytes: number) {
    this.callTank = fuelPerCall === null ? UNMETERED : BigInt(fuelPerCall);
    this.tank = this.callTank;
  }
  /** The tank for a call: `fuelPerCall`, or for a configuration of `configBytes`
   *  UTF-8 bytes `fuelPerCall + fuelPerConfigByte * configBytes` (its load is
   *  linear in the text; every other call gets a call's tank). */
  private fill(configBytes?: number): bigint {
    if (this.fuelPerCall === null || configBytes === undefined) return this.callTank;
    const wanted = this.callTank + BigInt(this.fuelPerConfigByte) * BigInt(configBytes);
    return wanted < UNMETERED ? wanted : UNMETERED; // the fuel globals are i64
  }
  /** The tank the last call was given, as `PolicyOutOfFuel` names it (built
   *  only when a call ran out). */
  get tankDescription(): string {
    if (this.fuelPerCall === null) return 'unmetered';
    if (this.configBytes === undefined) return `${this.fuelPerCall} units a call`;
    return `${this.tank} units: ${this.fuelPerCall} a call + ${this.fuelPerConfigByte} a configuration byte x ${this.configBytes} bytes`;
  }
  record(instance: WebAssembly.Instance): void {
    for (const [name, value] of Object.entries(instance.exports)) {
      if (name === FUEL_EXPORT) this.fuel.push(value as WebAssembly.Global);
      else if (name === GROW_FAILED_EXPORT) this.growFailed.push(value as WebAssembly.Global);
      else if (value instanceof WebAssembly.Memory) this.memories.push(value);
    }
  }
  /** Fills the tank for one call (a configuration's load: `configBytes`, its UTF-8 size). */
  refuel(configBytes?: number): void {
    this.tank = this.fill(configBytes);
    this.configBytes = this.fuelPerCall === null ? undefined : configBytes;
    for (const global of this.fuel) global.value = this.tank;
  }
  outOfFuel(): boolean {
    return this.fuel.some((global) => (global.value as bigint) < 0n);
  }
  /** The fuel the last call burned, over all core instances. */
  used(): number {
    return this.fuel.reduce((sum, global) => sum + Number(this.tank - (global.value as bigint)), 0);
  }
  memoryBytes(): number {
    return this.memories.reduce((most, memory) => Math.max(most, memory.buffer.byteLength), 0);
  }
  /** Whether a `memory.grow` was refused (sticky for the instance) or a memory is past the cap. */
  overMemory(): boolean {
    return this.growFailed.some((global) => global.value !== 0) || this.memoryBytes() > this.maxMemoryBytes;
  }
}

/** The checks on a component's bytes before anything is transpiled or compiled:
 *  a readable component, of this host's contract version, importing nothing
 *  outside the contract. */
function checkComponentBytes(bytes: Uint8Array, where: string): void {
  let exportNames: string[];
  try {
    exportNames = componentExportNames(bytes);
  } catch (e) {
    throw new ComponentLoadError(`${where} is not a readable WebAssembly component: ${(e as Error).message}`, { cause: e });
  }
  checkContractVersion(exportNames, where);
  let importNames: string[];
  try {
    importNames = componentImportNames(bytes);
  } catch (e) {
    throw new ComponentLoadError(`${where} is not a readable WebAssembly component: ${(e as Error).message}`, { cause: e });
  }
  checkImports(importNames, where);
}

function readSourceInfo(dir: string): SourceInfo | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, 'source.json'), 'utf8')) as SourceInfo;
  } catch {
    return undefined;
  }
}

/** The cache's root must be this user's alone: the glue in it is code this
 *  process runs. Refuses a root another user owns or others may write to. */
function checkPrivate(root: string): void {
  if (typeof process.getuid !== 'function') return;
  const stat = statSync(root);
  if (!stat.isDirectory() || stat.uid !== process.getuid() || (stat.mode & 0o022) !== 0) {
    throw new ComponentLoadError(`the transpilation cache ${root} is not a directory of this user's that only it may write ` +
      `(owner ${stat.uid}, mode ${(stat.mode & 0o777).toString(8)}): refused, since the code in it would run here; ` +
      `set the cacheDir option or $${CACHE_ENV_VAR} to a private directory`);
  }
}

/** A cached transpilation usable for these bytes: made from them, by jco 1.12.x
 *  with the current glue edits. */
function usable(dir: string, sha256: string, t: JcoTranspile): boolean {
  const source = readSourceInfo(dir);
  return source !== undefined && source.sha256 === sha256 && source.glueEdits === t.GLUE_EDITS_VERSION && t.sameLine(source.jco) &&
    Array.isArray(source.exports) && existsSync(join(dir, t.GLUE_FILE));
}

/** The directory of this component's transpilation in the cache, and whether it
 *  was there already (`cache`) or made now (`transpiled`). */
async function transpiled(bytes: Uint8Array, sha256: string, where: string, root: string): Promise<[string, ComponentOrigin]> {
  const t = await jcoTranspile();
  const dir = join(root, sha256);
  try {
    mkdirSync(root, { recursive: true, mode: 0o700 });
    checkPrivate(root);
  } catch (e) {
    if (e instanceof ComponentLoadError) throw e;
    throw new ComponentLoadError(`the transpilation cache ${root} cannot be used: ${(e as Error).message}`, { cause: e });
  }
  if (usable(dir, sha256, t)) return [dir, 'cache'];
  try {
    t.findJco(import.meta.url);
  } catch (e) {
    throw new ComponentLoadError(`${where} is not the component this package carries, so it must be transpiled at run time, ` +
      `which needs jco: ${(e as Error).message} (or transpile it ahead with \`npx agent-retry-policy-transpile <file.wasm> <dir>\` ` +
      'and pass { generatedDir: <dir> })', { cause: e });
  }
  let output: Awaited<ReturnType<JcoTranspile['transpileInWorker']>>;
  try {
    output = await t.transpileInWorker(import.meta.url, bytes, where);
  } catch (e) {
    throw new ComponentLoadError(`jco cannot transpile ${where}: ${(e as Error).message}`, { cause: e });
  }
  // Written beside the final directory and renamed into place: a reader sees
  // all of a transpilation or none of it, and of two processes racing one wins.
  const temp = mkdtempSync(join(root, `.${sha256.slice(0, 16)}-`));
  try {
    for (const [name, data] of Object.entries(output.files)) {
      const path = join(temp, name);
      if (!path.startsWith(temp + sep)) throw new ComponentLoadError(`jco named an output file outside its directory: ${name}`);
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, data);
    }
    writeFileSync(join(temp, 'source.json'), JSON.stringify(output.source, null, 2) + '\n');
    // The glue is an ES module wherever the cache is (Node 20 would read a bare .js as CommonJS).
    writeFileSync(join(temp, 'package.json'), '{ "type": "module" }\n');
    try {
      renameSync(temp, dir);
    } catch {
      // Another process put one there first (or a stale one is in the way).
      if (usable(dir, sha256, t)) {
        rmSync(temp, { recursive: true, force: true });
        return [dir, 'cache'];
      }
      rmSync(dir, { recursive: true, force: true });
      renameSync(temp, dir);
    }
  } catch (e) {
    rmSync(temp, { recursive: true, force: true });
    if (usable(dir, sha256, t)) return [dir, 'cache'];
    if (e instanceof ComponentLoadError) throw e;
    throw new ComponentLoadError(`cannot write the transpilation of ${where} into ${root}: ${(e as Error).message}`, { cause: e });
  }
  return [dir, 'transpiled'];
}

/** `agent-retry:policy@<version> wasm <first 12 hex digits of the SHA-256>`. */
export function policyIdentityOf(contractVersion: string, wasmSha256: string): string {
  return `agent-retry:policy@${contractVersion} wasm ${wasmSha256.slice(0, 12)}`;
}

/** The identity of an instance made without its component (not by `instantiate`). */
export const UNKNOWN_POLICY_IDENTITY = 'agent-retry:policy (unknown component)';

type Instantiate = (getCoreModule: (path: string) => WebAssembly.Module, imports: unknown,
  instantiateCore: (module: WebAssembly.Module, imports?: WebAssembly.Imports) => Promise<WebAssembly.Instance>) => Promise<Root>;

/** The transpiled component with its core modules compiled, ready to instantiate many times. */
export class PolicyComponent {
  private static readonly cache = new Map<string, Promise<PolicyComponent>>();

  private constructor(
    readonly source: SourceInfo,
    private readonly modules: Map<string, WebAssembly.Module>,
    private readonly instantiateRoot: Instantiate,
    /** The memory cap the modules were compiled with. */
    readonly maxMemoryBytes: number,
    /** Which transpilation runs: the package's own (`bundled`), a `generatedDir`
     *  (`generated`), one found in the cache (`cache`) or made by this load (`transpiled`). */
    readonly origin: ComponentOrigin,
    /** The contract version the component speaks (from its export names), e.g. `0.9.0`. */
    readonly contractVersion: string,
  ) {}

  /** SHA-256 (hex) of the .wasm this component's transpilation was made from
   *  (for the bundled one, the .wasm `npm run transpile` was given: `generated/source.json`). */
  get wasmSha256(): string {
    return this.source.sha256;
  }

  /** Which policy this is, for logs: `agent-retry:policy@<contract version> wasm
   *  <first 12 hex digits of the .wasm's SHA-256>`, e.g. `agent-retry:policy@0.9.0
   *  wasm 0c1b894cf1b1`. Every instance says it too (`policyIdentity`), and the MCP
   *  wrapper logs it on every attempt line. */
  get identity(): string {
    return policyIdentityOf(this.contractVersion, this.source.sha256);
  }

  /** Loads the component once per process (per content and memory cap).
   *  Throws `ComponentNotFound` if it is missing; `ContractVersionMismatch` (a
   *  `ComponentLoadError`) if it speaks another major version of the contract
   *  than this host (`CONTRACT_VERSION`); `ComponentImportRefused` if it imports
   *  anything outside the contract; `ComponentLoadError` if `generatedDir` was
   *  transpiled from another .wasm than the one in force, or if a .wasm other
   *  than the bundled one must be transpiled and jco is not installed. */
  static load(options: LoadOptions = {}): Promise<PolicyComponent> {
    // `load("/path.wasm")` from plain JavaScript once loaded the bundled component, silently.
    if (typeof options !== 'object' || options === null) {
      return Promise.reject(new TypeError(`PolicyComponent.load takes options ({ wasmPath: ${JSON.stringify(options)} }), not a ${options === null ? 'null' : typeof options}`));
    }
    const maxMemoryBytes = options.maxMemoryBytes ?? MAX_MEMORY_BYTES;
    if (!Number.isSafeInteger(maxMemoryBytes) || maxMemoryBytes < 65536) {
      return Promise.reject(new RangeError(`maxMemoryBytes must be an integer of at least 65536 (one page), not ${maxMemoryBytes}`));
    }
    let wasm: string | undefined;
    let bytes: Uint8Array | undefined;
    try {
      wasm = locateComponent(options.wasmPath);
      if (wasm !== undefined && options.generatedDir === undefined) bytes = readFileSync(wasm);
    } catch (e) {
      return Promise.reject(e);
    }
    const cacheDir = resolve(options.cacheDir ?? defaultCacheDir());
    const key = bytes !== undefined
      ? `wasm\0${createHash('sha256').update(bytes).digest('hex')}\0${maxMemoryBytes}\0${cacheDir}`
      : `dir\0${resolve(options.generatedDir ?? defaultGeneratedDir)}\0${wasm ?? ''}\0${maxMemoryBytes}`;
    let loading = PolicyComponent.cache.get(key);
    if (!loading) {
      loading = bytes !== undefined
        ? PolicyComponent.fromBytes(bytes, { source: wasm, maxMemoryBytes, cacheDir })
        : PolicyComponent.loadFrom(resolve(options.generatedDir ?? defaultGeneratedDir), wasm, maxMemoryBytes);
      PolicyComponent.cache.set(key, loading);
      loading.catch(() => PolicyComponent.cache.delete(key));
    }
    return loading;
  }

  /** Loads a component from its bytes, as `load({ wasmPath })` does but without
   *  the per-process memo (each call compiles; the transpilation is cached on
   *  disk). The checks come first, on the bytes: the contract version and the
   *  imports. Then the bundled transpilation if these are the bytes it was made
   *  from, else a cached one (`cacheDir`, by SHA-256), else jco transpiles them
   *  on a worker thread into the cache (written to a temporary directory and
   *  renamed, so processes racing on one cache are safe). */
  static async fromBytes(bytes: Uint8Array, options: FromBytesOptions = {}): Promise<PolicyComponent> {
    const maxMemoryBytes = options.maxMemoryBytes ?? MAX_MEMORY_BYTES;
    if (!Number.isSafeInteger(maxMemoryBytes) || maxMemoryBytes < 65536) {
      throw new RangeError(`maxMemoryBytes must be an integer of at least 65536 (one page), not ${maxMemoryBytes}`);
    }
    const where = options.source ?? 'the component';
    checkComponentBytes(bytes, where);
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    const bundled = readSourceInfo(defaultGeneratedDir);
    if (bundled?.sha256 === sha256) {
      return PolicyComponent.loadGenerated(defaultGeneratedDir, bundled, maxMemoryBytes, 'bundled');
    }
    const [dir, origin] = await transpiled(bytes, sha256, where, resolve(options.cacheDir ?? defaultCacheDir()));
    const source = readSourceInfo(dir);
    if (source === undefined) throw new ComponentLoadError(`the transpilation of ${where} in ${dir} has no source.json`);
    return PolicyComponent.loadGenerated(dir, source, maxMemoryBytes, origin);
  }

  private static async loadFrom(dir: string, wasm: string | undefined, maxMemoryBytes: number): Promise<PolicyComponent> {
    const sourceFile = join(dir, 'source.json');
    if (!existsSync(sourceFile)) {
      throw new ComponentNotFound(`no transpiled component in ${dir}: ` + (dir !== resolve(defaultGeneratedDir)
        ? `point generatedDir at the output directory of \`agent-retry-policy-transpile\`, or leave it out to use the component this package carries`
        : INSTALLED
          ? 'this installation of agent-retry-policy is incomplete; reinstall it (`npm install agent-retry-policy`)'
          : 'run `make wasm` in the repository root, then `npm run transpile && npm run build` in hosts/typescript'));
    }
    const source = JSON.parse(readFileSync(sourceFile, 'utf8')) as SourceInfo;
    if (wasm !== undefined) {
      const bytes = readFileSync(wasm);
      // The contract first: a component of another major version is refused with
      // both versions named, whatever was transpiled; then its imports.
      checkComponentBytes(bytes, `the component ${wasm}`);
      const sha256 = createHash('sha256').update(bytes).digest('hex');
      if (sha256 !== source.sha256) {
        throw new ComponentLoadError(`${dir} was transpiled from another build than ${wasm}: ` + (INSTALLED
          ? `leave out generatedDir to transpile ${wasm} at run time (needs jco), or ${TRANSPILE_ADVICE}`
          : 'run `npm run transpile && npm run build` in hosts/typescript, or leave out generatedDir'));
      }
    }
    return PolicyComponent.loadGenerated(dir, source, maxMemoryBytes, dir === resolve(defaultGeneratedDir) ? 'bundled' : 'generated');
  }

  /** Compiles a transpilation (its core modules rewritten by the sandbox) and imports its glue. */
  private static async loadGenerated(dir: string, source: SourceInfo, maxMemoryBytes: number, origin: ComponentOrigin): Promise<PolicyComponent> {
    const sourceFile = join(dir, 'source.json');
    if (!Array.isArray(source.exports)) {
      throw new ComponentLoadError(`${sourceFile} does not say what the transpiled component exports (an older transpilation): ` +
        (INSTALLED ? `reinstall agent-retry-policy, or ${TRANSPILE_ADVICE}` : 'run `npm run transpile && npm run build` in hosts/typescript'));
    }
    const contractVersion = checkContractVersion(source.exports, `the component transpiled in ${dir} (from ${source.wasm})`);
    if (typeof source.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(source.sha256)) {
      throw new ComponentLoadError(`${sourceFile} does not give the SHA-256 of the .wasm it was transpiled from: ` +
        (INSTALLED ? `reinstall agent-retry-policy, or ${TRANSPILE_ADVICE}` : 'run `npm run transpile && npm run build` in hosts/typescript'));
    }
    if (Array.isArray(source.imports)) checkImports(source.imports, `the component transpiled in ${dir} (from ${source.wasm})`);
    const glue = join(dir, 'agent_retry_policy.js');
    if (!readFileSync(glue, 'utf8').includes((await jcoTranspile()).STRICT_DECODER)) {
      throw new ComponentLoadError(`${glue} decodes the guest's strings leniently (transpiled by another script than this package's): ` +
        (INSTALLED ? `reinstall agent-retry-policy, or ${TRANSPILE_ADVICE}` : 'run `npm run transpile && npm run build` in hosts/typescript'));
    }
    const modules = new Map<string, WebAssembly.Module>();
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.wasm'))) {
      // The sandbox: fuel metering and the memory cap, written into each core module.
      const instrumented = instrumentCoreModule(readFileSync(join(dir, file)), maxMemoryBytes);
      try {
        modules.set(file, await WebAssembly.compile(instrumented));
      } catch (e) {
        throw new ComponentLoadError(`${join(dir, file)} does not compile once sandboxed: ${(e as Error).message}`, { cause: e });
      }
    }
    const generated = (await import(pathToFileURL(glue).href)) as { instantiate: Instantiate };
    return new PolicyComponent(source, modules, generated.instantiate, maxMemoryBytes, origin, contractVersion);
  }

  /** A fresh instance with its own memory. */
  async instantiate(options: InstantiateOptions = {}): Promise<PolicyInstance> {
    const accounts = options.accounts ?? PROCESS_ACCOUNTS;
    const sharedState = options.sharedState ?? sharedStateFor(accounts);
    const entropy = options.entropy ?? new OsEntropy();
    const fuelPerCall = options.fuelPerCall === undefined ? FUEL_PER_CALL : options.fuelPerCall;
    if (fuelPerCall !== null && (!Number.isSafeInteger(fuelPerCall) || fuelPerCall < 1)) {
      throw new RangeError(`fuelPerCall must be a positive integer or null (no limit), not ${fuelPerCall}`);
    }
    const fuelPerConfigByte = options.fuelPerConfigByte === undefined ? FUEL_PER_CONFIG_BYTE : options.fuelPerConfigByte;
    if (!Number.isSafeInteger(fuelPerConfigByte) || fuelPerConfigByte < 0) {
      throw new RangeError(`fuelPerConfigByte must be a whole number of units (0: none more than a call's), not ${fuelPerConfigByte}`);
    }
    const meter = new Meter(fuelPerCall, fuelPerConfigByte, this.maxMemoryBytes);
    const imported = <A extends unknown[], R>(f: (...args: A) => R) => (...args: A): R => {
      try {
        return f(...args);
      } catch (e) {
        throw new ImportFailure((e as Error)?.message ?? String(e), { cause: e });
      }
    };
    // jco's instantiation imports are keyed without versions.
    const provided = {
      'agent-retry:policy/account-budget': {
        reserve: imported((accountId: string, tokens: number, bucket: { capacity: number; refillIntervalMs: bigint }, maxWaitMs: bigint, now: bigint) => {
          const reservation = accounts.reserve(accountId, tokens, bucket, maxWaitMs, now);
          return { tag: reservation.granted ? 'granted' : 'refused', val: reservation.waitMs };
        }),
        refund: imported((accountId: string, tokens: number, bucket: { capacity: number; refillIntervalMs: bigint }, now: bigint) => {
          accounts.refund(accountId, tokens, bucket, now);
        }),
      },
      'agent-retry:policy/shared-state': {
        load: imported((key: string, now: bigint): Loaded => checkedLoaded(sharedState.load(key, now))),
        storeIf: imported((key: string, expectedVersion: bigint, value: string, ttlMs: bigint): boolean => {
          const stored: unknown = sharedState.storeIf(key, expectedVersion, value, ttlMs);
          if (typeof stored !== 'boolean') throw new TypeError(`the shared state's storeIf answered ${typeof stored}, not a boolean`);
          return stored;
        }),
      },
      'agent-retry:policy/types': {},
      'wasi:random/random': {
        getRandomU64: imported(() => entropy.nextU64()),
        getRandomBytes: imported((length: bigint) => randomBytes(entropy, Number(length > 4096n ? 4096n : length))),
      },
    };
    // A transpilation that asks for anything else (its source.json said nothing of
    // its imports) is refused here, naming the import, before any guest code runs.
    const imports = new Proxy(provided, {
      get(target, name) {
        if (typeof name === 'string' && !(name in target)) {
          throw new ComponentImportRefused(`the component imports ${name}, which is outside the agent-retry contract: refused, nothing was run`, name);
        }
        return (target as Record<string | symbol, unknown>)[name];
      },
    });
    const instantiateCore = async (module: WebAssembly.Module, moduleImports?: WebAssembly.Imports) => {
      const instance = await WebAssembly.instantiate(module, moduleImports ?? {});
      meter.record(instance);
      return instance;
    };
    const getCoreModule = (path: string): WebAssembly.Module => {
      const module = this.modules.get(path);
      if (!module) throw new ComponentLoadError(`jco asked for a core module ${path} that was not transpiled`);
      return module;
    };
    try {
      meter.refuel(); // start functions run on the first call's tank
      const root = await this.instantiateRoot(getCoreModule, imports, instantiateCore);
      return new PolicyInstance(root.policy, meter, this.identity, entropy);
    } catch (e) {
      if (e instanceof ComponentLoadError) throw e;
      throw new ComponentLoadError(`the component cannot be instantiated by this host: ${(e as Error).message}`, { cause: e });
    }
  }
}

/** What a shared state's `load` answered, checked before jco lowers it (it would wrap a bad integer silently). */
function checkedLoaded(loaded: Loaded): Loaded {
  const ok = typeof loaded === 'object' && loaded !== null && (loaded.value === undefined || typeof loaded.value === 'string')
    && isU64(loaded.version) && isU64(loaded.nowMs);
  if (!ok) throw new TypeError("the shared state's load answered something other than { value?: string, version: u64, nowMs: u64 }");
  // A text past the longest any store keeps is not copied into the guest, whatever backend read it.
  const value = loaded.value !== undefined && utf8Length(loaded.value) > MAX_SHARED_VALUE_BYTES ? undefined : loaded.value;
  return { value, version: loaded.version, nowMs: loaded.nowMs };
}

/** jco throws a `ComponentError` carrying `payload` for a result's err case. */
function resultError(e: unknown): { payload: unknown } | undefined {
  if (e instanceof Error && e.constructor.name === 'ComponentError' && 'payload' in e) return e as Error & { payload: unknown };
  return undefined;
}

/** Checks a call's arguments against the contract's parameter types (jco would
 *  wrap an out-of-range integer silently). Throws `ValueConversionError`. */
function checkArgs(fn: keyof typeof FUNCTIONS, args: unknown[]): void {
  const params = FUNCTIONS[fn].params;
  for (let i = 0; i < params.length; i++) {
    if (jcoProblem(args[i], params[i]) !== undefined) checkJco(args[i], params[i], `${fn.replace(/^\[[a-z]+\]/, '')} argument ${i + 1}`);
  }
}

const U32_MAX = 0xffffffff;
const U64_MAX = (1n << 64n) - 1n;
/** A u32 as jco takes it (the fast check; `checkArgs` says what is wrong). */
const isU32 = (n: unknown): boolean => typeof n === 'number' && n >= 0 && n <= U32_MAX && Number.isInteger(n);
const isU64 = (n: unknown): boolean => typeof n === 'bigint' && n >= 0n && n <= U64_MAX;

/** One instance of the component. Calls are synchronous; use it from one place at a time. */
export class PolicyInstance {
  private broken?: string;
  private rules?: readonly string[];

  /** @internal Made by `PolicyComponent.instantiate`. */
  constructor(
    /** @internal The component's exports as jco transpiled them, unguarded. */
    readonly exports: PolicyExports,
    private readonly meter?: Meter,
    /** The identity of the component this is an instance of (`PolicyComponent.identity`):
     *  `agent-retry:policy@<version> wasm <12 hex digits>`. */
    readonly policyIdentity: string = UNKNOWN_POLICY_IDENTITY,
    /** Where `Run.recordFailure` and `Run.recordStatusCheck` draw entropy when
     *  given none (the instance's `wasi:random` source). */
    private entropySource?: EntropySource,
  ) {}

  /** The next u64 of the instance's entropy source (the OS when it was made without one). */
  nextEntropy(): bigint {
    return (this.entropySource ??= new OsEntropy()).nextU64();
  }

  /** Why this instance refuses calls (a trap, a limit, a bad value), if it does. */
  get brokenBy(): string | undefined {
    return this.broken;
  }

  /** The fuel the last call burned (about one unit per wasm instruction, over
   *  all of the component's core instances), out of the tank it was given (a
   *  configuration's load gets a larger one). */
  fuelUsedByLastCall(): number {
    return this.meter?.used() ?? 0;
  }

  /** The largest linear memory of the instance, in bytes. */
  memoryBytes(): number {
    return this.meter?.memoryBytes() ?? 0;
  }

  /** Runs `call` on a full tank of fuel, turning a trap, an exhausted limit or a
   *  value the contract does not allow into a `PolicyTrap` (and the instance
   *  unusable), and leaving results' err cases (jco's ComponentError) to the caller.
   *  `configBytes`: the call is `policy.from-json` of a text of that many UTF-8
   *  bytes, or `policy.effective-config` of a configuration loaded from one, and
   *  runs on `fuelPerCall + fuelPerConfigByte * configBytes` (its cost is linear
   *  in the configuration); any other call runs on `fuelPerCall`. */
  guard<T>(name: string, call: () => T, configBytes?: number): T {
    if (this.broken !== undefined) {
      throw new InstanceUnusable(`this policy instance failed earlier (${this.broken}); instantiate a new one`);
    }
    const meter = this.meter;
    meter?.refuel(configBytes);
    let result: T;
    try {
      result = call();
    } catch (e) {
      if (resultError(e)) throw e; // an answer
      if (e instanceof AgentRetryError && !(e instanceof PolicyTrap)) throw e; // our own check (a closed handle)
      throw this.fail(name, e);
    }
    // The memories' maximum is the cap, so a call that returned stayed within it.
    return result;
  }

  /** A value the guest returned that jco accepted but the contract does not
   *  allow (a rule index outside `rule-names`): the instance is marked broken. */
  violation(name: string, message: string): PolicyBoundaryViolation {
    const error = new PolicyBoundaryViolation(`${name} returned a value the contract does not allow: ${message}`, { call: name });
    this.broken = `${name}: ${error.message}`;
    return error;
  }

  /** Marks the instance broken and says why, as the most specific `PolicyTrap`. */
  private fail(name: string, e: unknown): PolicyTrap {
    const message = e === undefined ? '' : String((e as Error)?.message ?? e);
    const meter = this.meter;
    let error: PolicyTrap;
    if (meter?.outOfFuel()) {
      error = new PolicyOutOfFuel(`${name} ran out of fuel (${meter.tankDescription}) and was stopped`, { cause: e, call: name });
    } else if (meter?.overMemory()) {
      error = new PolicyMemoryExceeded(`${name} asked for more memory than the cap of ${meter.maxMemoryBytes} bytes` +
        `${message ? ` (${message})` : ''}`, { cause: e, call: name });
    } else if (e instanceof ImportFailure) {
      // A host import that threw mid-call: the guest's state can no longer be trusted.
      error = new PolicyTrap(`${name} trapped: ${message}`, { cause: (e as Error).cause, call: name });
    } else if ((e instanceof TypeError || e instanceof RangeError) && !/call stack/i.test(message)) {
      // Raised while jco lifted the guest's answer: an enum or variant case that
      // does not exist, a string that is not UTF-8, a pointer outside its memory.
      error = new PolicyBoundaryViolation(`${name} returned a value the contract does not allow: ${message}`, { cause: e, call: name });
    } else {
      error = new PolicyTrap(`${name} trapped: ${message}`, { cause: e, call: name });
    }
    this.broken = `${name}: ${error.message}`;
    return error;
  }

  /** `ar1-` + 32 hex digits of FNV-1a-128 over run-id, 0x00, action-id. An id
   *  over 256 bytes is refused before the call (`PolicyInputTooLarge`; the
   *  instance stays usable). */
  deriveIdempotencyKey(runId: string, actionId: string): string {
    checkArgs('derive-idempotency-key', [runId, actionId]);
    const over = overLimit('run-id', runId) ?? overLimit('action-id', actionId);
    if (over) throw new PolicyInputTooLarge(...over);
    return this.guard('derive-idempotency-key', () => this.exports.deriveIdempotencyKey(runId, actionId));
  }

  /** `read-probe-answer` (contract 0.5.0 on): what an answer to the v2 SDK's
   *  `server/discover` probe that is not a discovery result means: `failure`
   *  (the connect attempt failed) or `older-server` (fall back to the
   *  handshake). The component decides; no host keeps a rule of its own. */
  readProbeAnswer(httpStatus: number | undefined, jsonRpcCode: number | undefined): Wit.ProbeAnswer {
    checkArgs('read-probe-answer', [httpStatus, jsonRpcCode]);
    return this.guard('read-probe-answer', () => this.exports.readProbeAnswer(httpStatus, jsonRpcCode));
  }

  /** `rule-names`: the names of the rules a decision can name,
   *  in the order `Verdict.ruleIndex` indexes; `ruleNames()[v.ruleIndex]` is the
   *  `rule` of the same decision. Asked of the component once per instance (the
   *  list is fixed per component), then kept. */
  ruleNames(): readonly string[] {
    if (this.rules !== undefined) return this.rules;
    const names = this.guard('rule-names', () => this.exports.ruleNames());
    this.rules = Object.freeze(names.slice());
    return this.rules;
  }

  /** `policy.from-json`: JSON text or an object. Throws `ConfigError` (kind
   *  `too-large` for a text over 1 MiB, answered without crossing the boundary,
   *  as the component would answer it). Runs on `fuelPerCall + fuelPerConfigByte
   *  * <the text's UTF-8 bytes>` of fuel. */
  loadPolicy(config: string | object = '{}'): Policy {
    const text = typeof config === 'string' ? config : JSON.stringify(config);
    checkArgs('[static]policy.from-json', [text]);
    const size = utf8Length(text); // sets the load's fuel as well as the limit
    if (size > MAX_CONFIG_BYTES) {
      throw new ConfigError({ kind: 'too-large', field: '', message: `the configuration is ${size} bytes, more than the ${MAX_CONFIG_BYTES}-byte limit` });
    }
    try {
      // Off the decision path and linear in the text: a tank sized by the text.
      return new Policy(this, this.guard('from-json', () => this.exports.Policy.fromJson(text), size), size, text);
    } catch (e) {
      const error = resultError(e);
      if (error) throw new ConfigError(error.payload as Wit.ConfigError);
      throw e;
    }
  }
}

abstract class Handle<T extends object> {
  private handle?: T;
  constructor(readonly instance: PolicyInstance, handle: T) {
    this.handle = handle;
  }
  /** The jco resource; throws once closed. */
  get resource(): T {
    if (this.handle === undefined) throw new InstanceUnusable(`this ${this.constructor.name.toLowerCase()} was closed`);
    return this.handle;
  }
  /** Frees the resource in the instance (on the sandbox's terms; an instance
   *  that failed is not entered again, its resources go with it). */
  close(): void {
    const handle = this.handle as { [Symbol.dispose]?: () => void } | undefined;
    this.handle = undefined;
    if (handle === undefined || this.instance.brokenBy !== undefined) return;
    this.instance.guard('drop', () => handle[Symbol.dispose]?.());
  }
  [Symbol.dispose](): void {
    this.close();
  }
}

const big = (n: bigint | number): bigint => {
  if (typeof n === 'bigint') return n;
  if (!Number.isInteger(n)) throw new ValueConversionError(`${n} is not an integer (a u64 is expected)`);
  return BigInt(n);
};

/** A validated configuration; start many runs from it. */
export class Policy extends Handle<JcoPolicy> {
  /** `configBytes`: the UTF-8 size of the text this configuration was loaded from;
   *  `configText`: that text, which the wrapper's run-time guard reads its caps
   *  from (never the component's own `effective-config`). Made by `PolicyInstance.loadPolicy`.
   *  @internal */
  constructor(instance: PolicyInstance, handle: JcoPolicy, readonly configBytes: number, readonly configText: string) {
    super(instance, handle);
  }
  /** The configuration in force, every default filled in, as JSON text. Its cost
   *  is linear in the configuration, as its load's: it runs on the load's tank,
   *  `fuelPerCall + fuelPerConfigByte * configBytes` (the live gate calls it). */
  effectiveConfig(): string {
    return this.instance.guard('effective-config', () => this.resource.effectiveConfig(), this.configBytes);
  }
  /** Classifies an observation (cut to the host's limits first, src/limits.ts). */
  classify(observation: Wit.Observation, now: bigint | number): Wit.Classification {
    const at = big(now);
    checkArgs('[method]policy.classify', [observation, at]);
    const bounded = boundedObservation(observation);
    return this.instance.guard('classify', () => this.resource.classify(bounded, at));
  }
  /** The delay before retry number `retry` (1 for the first); no entropy: wasi:random. */
  nextDelay(retry: number, hintMs?: bigint | number, entropy?: bigint): bigint {
    const hint = hintMs === undefined ? undefined : big(hintMs);
    checkArgs('[method]policy.next-delay', [retry, hint, entropy]);
    return this.instance.guard('next-delay', () => this.resource.nextDelay(retry, hint, entropy));
  }
  /** Starts a run. Throws `RunMisuse` with the component's run-error (`too-large`
   *  for a run id over 256 bytes, answered without crossing the boundary). */
  startRun(runId: string): Run {
    checkArgs('[method]policy.start-run', [runId]);
    const over = overLimit('run-id', runId);
    if (over) throw tooLarge(over);
    return new Run(this.instance, misuse(() => this.instance.guard('start-run', () => this.resource.startRun(runId))), runId, this.configText, this);
  }

  /** Resumes an escalated run from its snapshot (`Run.snapshot`, taken in any
   *  host) with a person's answer, under this configuration (contract 0.9.0).
   *  The run keeps its id, calls, keys, effects and every budget spent;
   *  `resumedCall()` then says what to do with the call that stopped it.
   *  Throws `SnapshotError`: `malformed`, `tampered` (changed after it was
   *  taken), `other-contract` (naming both versions), `too-large` (a text past
   *  2 MiB, or a `done` result past 1 MiB, answered without crossing the
   *  boundary). Linear in the document, it runs on a configuration load's tank. */
  resumeRun(snapshot: string, answer: ResumeAnswer, now: bigint | number): Run {
    const at = big(now);
    const lowered = jcoAnswer(answer);
    checkArgs('[method]policy.resume-run', [snapshot, lowered, at]);
    const size = utf8Length(snapshot);
    if (size > MAX_SNAPSHOT_BYTES) throw snapshotTooLarge(`the snapshot is ${size} bytes, more than the ${MAX_SNAPSHOT_BYTES}-byte limit`);
    if (lowered.tag === 'done' && lowered.val !== undefined && utf8Length(lowered.val) > MAX_ARGUMENTS_BYTES) {
      throw snapshotTooLarge(`the done answer's result is ${utf8Length(lowered.val)} bytes, more than the ${MAX_ARGUMENTS_BYTES}-byte limit`);
    }
    const handle = refused(() => this.instance.guard('resume-run', () => this.resource.resumeRun(snapshot, lowered, at), size));
    let runId: string;
    try {
      runId = this.instance.guard('report', () => handle.report()).runId;
    } catch (e) {
      (handle as { [Symbol.dispose]?: () => void })[Symbol.dispose]?.();
      throw e;
    }
    return new Run(this.instance, handle, runId, this.configText, this);
  }
}

/** A person's answer to an escalation (contract 0.9.0, `policy.resume-run`;
 *  the escalation's note and the snapshot's `answers` say which are safe):
 *  `retry` sends the call that stopped the run again, the same key, as its
 *  next attempt; `done` treats it as succeeded (`result`: its result for the
 *  model); `skip` tells the model it was skipped (a replan); `abort` ends the
 *  run (`aborted`). */
export type ResumeAnswer = { kind: 'retry' } | { kind: 'done'; result?: string } | { kind: 'skip' } | { kind: 'abort' };

/** The answers, made: `ResumeAnswer.retry()`, `ResumeAnswer.done('refunded')`, ... */
export const ResumeAnswer = {
  retry: (): ResumeAnswer => ({ kind: 'retry' }),
  done: (result?: string): ResumeAnswer => (result === undefined ? { kind: 'done' } : { kind: 'done', result }),
  skip: (): ResumeAnswer => ({ kind: 'skip' }),
  abort: (): ResumeAnswer => ({ kind: 'abort' }),
} as const;

/** An answer in jco's form (the contract's `resume-answer` variant); a TypeError for anything else. */
function jcoAnswer(answer: ResumeAnswer): Wit.ResumeAnswer {
  const kind = (answer as { kind?: unknown } | null | undefined)?.kind;
  switch (kind) {
    case 'retry': case 'skip': case 'abort':
      return { tag: kind };
    case 'done': {
      const result = (answer as { result?: unknown }).result;
      if (result !== undefined && result !== null && typeof result !== 'string') {
        throw new TypeError(`a done answer's result must be a string or undefined, not ${typeof result}`);
      }
      return { tag: 'done', val: result ?? undefined };
    }
    default:
      throw new TypeError(`a resume answer is {kind: 'retry' | 'done' | 'skip' | 'abort'}, not ${JSON.stringify(answer) ?? String(answer)}`);
  }
}

/** A refusal the host answers itself, as the component would, for a text over its limit. */
function snapshotTooLarge(message: string): SnapshotError {
  return new SnapshotError({ kind: 'too-large', message });
}

/** The component's snapshot-error as `SnapshotError`. */
function refused<T>(call: () => T): T {
  try {
    return call();
  } catch (e) {
    const error = resultError(e);
    if (error) throw new SnapshotError(error.payload as Wit.SnapshotError);
    throw e;
  }
}

/** One agent run: its calls, budgets and effects. */
export class Run extends Handle<JcoRun> {
  /** `configText`: the configuration text of the policy the run started from
   *  (the wrapper's guard reads its caps there; default: all defaults);
   *  `policy`: that policy (`resume` resumes a snapshot of the run under it).
   *  Made by `Policy.startRun` and `Policy.resumeRun`.
   *  @internal */
  constructor(instance: PolicyInstance, handle: JcoRun, readonly runId: string, readonly configText = '{}', readonly policy?: Policy) {
    super(instance, handle);
  }
  /** Asks to begin a call of `tool` on `server` (contract 0.8.0: the MCP
   *  server's name for the circuit breakers; undefined: no breaker applies)
   *  with its idempotency key and MCP hints. A call not admitted (`admitted`
   *  false) escalated the run (`escalation()` gives the hand-off), or, when
   *  `replan` is set, is over before it was sent: a breaker of its server is
   *  open, and `lastDecision(callId)` has the message for the model. When
   *  `breakerChanged` is set, `takeBreakerChanges()` says how. Throws
   *  `RunMisuse` for the component's run-error (`too-large` for a server
   *  name, tool name or key over 256 bytes, answered without crossing the boundary). */
  beginCall(server: string | undefined, tool: string, idempotencyKey: string | undefined, hints: Wit.ToolHints | undefined,
    now: bigint | number): Wit.CallStart {
    const at = typeof now === 'bigint' ? now : big(now);
    if (!(server === undefined || typeof server === 'string') || typeof tool !== 'string' ||
      !(idempotencyKey === undefined || typeof idempotencyKey === 'string') || !isU64(at) ||
      (hints !== undefined && jcoProblem(hints, TYPES.toolHints) !== undefined)) {
      checkArgs('[method]run.begin-call', [server, tool, idempotencyKey, hints, at]);
    }
    const over = (server === undefined ? undefined : overLimit('server', server, MAX_SERVER_BYTES)) ?? overLimit('tool', tool) ??
      (idempotencyKey === undefined ? undefined : overLimit('idempotency-key', idempotencyKey));
    if (over) throw tooLarge(over);
    const resource = this.resource;
    return misuse(() => this.instance.guard('begin-call', () => resource.beginCall(server, tool, idempotencyKey, hints, at)));
  }

  /** The circuit breakers' changes the run's last `beginCall` or report made,
   *  oldest first, and forgets them (contract 0.8.0). Ask only when
   *  `CallStart.breakerChanged` or `Verdict.breakerChanged` is set. */
  takeBreakerChanges(): Wit.BreakerChange[] {
    const resource = this.resource;
    return this.instance.guard('take-breaker-changes', () => resource.takeBreakerChanges());
  }

  /** Reports that attempt `attempt` of call `callId` returned a usable result
   *  (1 for the first attempt, then `verdict.attempt + 1` after each retry).
   *  A second report of one attempt throws `RunMisuse` (`attempt-mismatch`)
   *  and changes nothing. The verdict: the action's case, the class, the
   *  attempt, a retry's delay, the hint, the rule's index into `ruleNames()`,
   *  whether `lastDecision` has words for the model or a person, and whether a
   *  retry needs a new session first (`reconnect`). */
  recordSuccess(callId: number, attempt: number, now: bigint | number): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    if (!isU32(callId) || !isU32(attempt) || !isU64(at)) checkArgs('[method]run.record-success', [callId, attempt, at]);
    const rules = this.instance.ruleNames().length; // asked once, before the call (the fuel of the last call stays its own)
    const resource = this.resource;
    return this.checked('record-success', rules,
      misuse(() => this.instance.guard('record-success', () => resource.recordSuccess(callId, attempt, at))));
  }

  /** Reports an attempt whose result is empty, partial or wrong; `detail` says
   *  what was wrong (cut to `MAX_BODY_BYTES`). */
  recordEmptyResult(callId: number, attempt: number, detail: string, now: bigint | number): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    if (!isU32(callId) || !isU32(attempt) || typeof detail !== 'string' || !isU64(at)) {
      checkArgs('[method]run.record-empty-result', [callId, attempt, detail, at]);
    }
    const bounded = boundedDetail(detail);
    const rules = this.instance.ruleNames().length;
    const resource = this.resource;
    return this.checked('record-empty-result', rules,
      misuse(() => this.instance.guard('record-empty-result', () => resource.recordEmptyResult(callId, attempt, bounded, at))));
  }

  /** Reports a failed attempt as it was observed (raw: the status, headers and
   *  body as received, whether an `Mcp-Session-Id` was sent, how far the
   *  request got); the policy decides what it means. The observation is cut to
   *  the host's limits first (src/limits.ts). `timeLeftMs`: the time to the
   *  call's or run's deadline, if there is one (undefined: none). `entropy`:
   *  the jitter's; none draws it from the instance's entropy source (as
   *  `wasi:random` would). Arguments outside their WIT types (a u16 status of
   *  66039) throw `ValueConversionError` before anything reaches the component. */
  recordFailure(callId: number, attempt: number, observation: Wit.Observation, timeLeftMs: bigint | number | undefined,
    now: bigint | number, entropy?: bigint): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    const left = timeLeftMs === undefined ? undefined : typeof timeLeftMs === 'bigint' ? timeLeftMs : big(timeLeftMs);
    const jitter = entropy ?? this.instance.nextEntropy();
    if (jcoProblem(observation, TYPES.observation) !== undefined) checkJco(observation, TYPES.observation, 'record-failure observation');
    if (!isU32(callId) || !isU32(attempt) || !isU64(at) || !isU64(jitter) || !(left === undefined || isU64(left))) {
      checkArgs('[method]run.record-failure', [callId, attempt, observation, left, at, jitter]);
    }
    const bounded = boundedObservation(observation);
    const rules = this.instance.ruleNames().length;
    const resource = this.resource;
    return this.checked('record-failure', rules, misuse(() => this.instance.guard('record-failure', () =>
      resource.recordFailure(callId, attempt, bounded, left, at, jitter))));
  }

  /** Reports what the status check a `check-status` verdict asked for found,
   *  for the attempt whose effect was checked. `timeLeftMs` and `entropy` as
   *  for `recordFailure`. */
  recordStatusCheck(callId: number, attempt: number, result: Wit.StatusCheckResult, timeLeftMs: bigint | number | undefined,
    now: bigint | number, entropy?: bigint): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    const left = timeLeftMs === undefined ? undefined : typeof timeLeftMs === 'bigint' ? timeLeftMs : big(timeLeftMs);
    const jitter = entropy ?? this.instance.nextEntropy();
    checkArgs('[method]run.record-status-check', [callId, attempt, result, left, at, jitter]);
    const rules = this.instance.ruleNames().length;
    const resource = this.resource;
    return this.checked('record-status-check', rules, misuse(() => this.instance.guard('record-status-check', () =>
      resource.recordStatusCheck(callId, attempt, result, left, at, jitter))));
  }

  /** Reports what the server said of the call's task (contract 0.7.0 on): the
   *  tool call was answered by a task, or a poll (`tasks/get`) answered
   *  `working`, `input_required` (`input-answered` when a handler of the
   *  application answered it) or `cancelled`. `attempt` is the attempt the task
   *  answered. A task that completed or failed is reported as an attempt is
   *  (`recordSuccess`, `recordEmptyResult`, `recordFailure`). The verdict is
   *  `poll`, or it stops waiting (then `cancelTask` may be set). The message is
   *  cut to `MAX_BODY_BYTES`; a task id over 256 bytes is the component's
   *  `too-large`. `timeLeftMs` and `entropy` as for `recordFailure`. */
  recordTaskStatus(callId: number, attempt: number, task: Wit.TaskReport, timeLeftMs: bigint | number | undefined,
    now: bigint | number, entropy?: bigint): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    const left = timeLeftMs === undefined ? undefined : typeof timeLeftMs === 'bigint' ? timeLeftMs : big(timeLeftMs);
    const jitter = entropy ?? this.instance.nextEntropy();
    checkArgs('[method]run.record-task-status', [callId, attempt, task, left, at, jitter]);
    const bounded = boundedTaskReport(task);
    const rules = this.instance.ruleNames().length;
    const resource = this.resource;
    return this.checked('record-task-status', rules, misuse(() => this.instance.guard('record-task-status', () =>
      resource.recordTaskStatus(callId, attempt, bounded, left, at, jitter))));
  }

  /** Reports a poll (`tasks/get`) of the call's task that failed, as observed
   *  (as `recordFailure` takes it, cut to the same limits). A call without a
   *  task is the component's `no-task`. */
  recordPollFailure(callId: number, attempt: number, observation: Wit.Observation, timeLeftMs: bigint | number | undefined,
    now: bigint | number, entropy?: bigint): Wit.Verdict {
    const at = typeof now === 'bigint' ? now : big(now);
    const left = timeLeftMs === undefined ? undefined : typeof timeLeftMs === 'bigint' ? timeLeftMs : big(timeLeftMs);
    const jitter = entropy ?? this.instance.nextEntropy();
    checkArgs('[method]run.record-poll-failure', [callId, attempt, observation, left, at, jitter]);
    const bounded = boundedObservation(observation);
    const rules = this.instance.ruleNames().length;
    const resource = this.resource;
    return this.checked('record-poll-failure', rules, misuse(() => this.instance.guard('record-poll-failure', () =>
      resource.recordPollFailure(callId, attempt, bounded, left, at, jitter))));
  }

  /** A verdict whose rule is one of `rule-names` and that reconnects only to retry or poll (jco checked the rest as it lifted it). */
  private checked(name: string, rules: number, verdict: Wit.Verdict): Wit.Verdict {
    if (verdict.ruleIndex >= rules) {
      throw this.instance.violation(name, `rule-index ${verdict.ruleIndex} is outside rule-names (${rules} names)`);
    }
    if (verdict.reconnect && verdict.action !== 'retry' && verdict.action !== 'poll') {
      throw this.instance.violation(name, `reconnect is set on a ${verdict.action} verdict (only a retry or a poll reconnects)`);
    }
    return verdict;
  }

  /** Ends a call the host stopped before a verdict ended it (`why`: `cancelled` by the caller, or its `deadline`
   *  passed), so that it no longer counts as open. `sent`: whether `attempt` had left without an answer (then a
   *  write is listed as an `unknown` effect). A call that is over, or another attempt, is the component's
   *  run-error (`RunMisuse`). */
  abandonCall(callId: number, attempt: number, sent: boolean, why: Wit.AbandonReason): void {
    checkArgs('[method]run.abandon-call', [callId, attempt, sent, why]);
    const resource = this.resource;
    misuse(() => this.instance.guard('abandon-call', () => resource.abandonCall(callId, attempt, sent, why)));
  }

  /** The run's last decision in full (of any report) if it was about call `callId`: the reason, a replan's
   *  message, a note, an escalation; `undefined` if the last decision was about
   *  another call, or there was none. The guest builds its prose only now. */
  lastDecision(callId: number): Wit.Decision | undefined {
    if (!isU32(callId)) checkArgs('[method]run.last-decision', [callId]);
    const resource = this.resource;
    return this.instance.guard('last-decision', () => resource.lastDecision(callId));
  }

  /** The hand-off, if the run has escalated (by any call); `undefined` if not. */
  escalation(): Wit.Escalation | undefined {
    const resource = this.resource;
    return this.instance.guard('escalation', () => resource.escalation());
  }

  /** A snapshot of the escalated run (contract 0.9.0): a versioned JSON
   *  document with a digest (the run's id, calls, keys, effects, budgets spent,
   *  the escalation and the answers that are safe) for a person to answer and
   *  any host to resume (`Policy.resumeRun`). `argumentsJson`: the stopped
   *  call's arguments as JSON text (at most 1 MiB), kept as given so that a
   *  retry sends the same call. Throws `SnapshotError`: `not-escalated`,
   *  `calls-open` (a call other than the stopped one is open: `abandonCall` it
   *  first), `too-large`. */
  snapshot(argumentsJson: string | undefined, now: bigint | number): string {
    const at = big(now);
    checkArgs('[method]run.snapshot', [argumentsJson, at]);
    if (argumentsJson !== undefined && utf8Length(argumentsJson) > MAX_ARGUMENTS_BYTES) {
      throw snapshotTooLarge(`arguments-json is ${utf8Length(argumentsJson)} bytes, more than the ${MAX_ARGUMENTS_BYTES}-byte limit`);
    }
    const resource = this.resource;
    const text = refused(() => this.instance.guard('snapshot', () => resource.snapshot(argumentsJson, at)));
    const size = utf8Length(text);
    if (size > MAX_SNAPSHOT_BYTES) throw snapshotTooLarge(`the component's snapshot is ${size} bytes, more than the ${MAX_SNAPSHOT_BYTES}-byte limit`);
    return text;
  }

  /** After `Policy.resumeRun`: the call that stopped the run and what to do
   *  with it (`action`: `send` its attempt `attempt` with `ticket` and the same
   *  key, `succeed` with `resultText`, `replan` with `lastDecision(callId)`'s
   *  message, or `escalate`: `escalation()`). Undefined for a run that was not
   *  resumed, or whose escalation stopped no call. Its texts are bounded as
   *  every text lifted from the guest (arguments past 1 MiB are dropped: cut
   *  JSON is not JSON). */
  resumedCall(): Wit.ResumedCall | undefined {
    const resource = this.resource;
    const call = this.instance.guard('resumed-call', () => resource.resumedCall());
    if (call === undefined) return undefined;
    return {
      ...call,
      tool: cutUtf8(call.tool, MAX_ID_BYTES),
      idempotencyKey: call.idempotencyKey === undefined ? undefined : cutUtf8(call.idempotencyKey, MAX_ID_BYTES),
      server: call.server === undefined ? undefined : cutUtf8(call.server, MAX_SERVER_BYTES),
      argumentsJson: call.argumentsJson !== undefined && utf8Length(call.argumentsJson) <= MAX_ARGUMENTS_BYTES ? call.argumentsJson : undefined,
      resultText: call.resultText === undefined ? undefined : cutUtf8(call.resultText, MAX_ARGUMENTS_BYTES),
    };
  }

  /** The run's tally. Its u64 fields (`waitedMs`) are `bigint`s; `JSON.stringify`
   *  works on it all the same (a non-enumerable `toJSON()`: a u64 becomes a number
   *  when it is at most `Number.MAX_SAFE_INTEGER`, else a string of its digits). */
  report(): Wit.RunReport & { toJSON(): JsonSafe<Wit.RunReport> } {
    return withJson(this.instance.guard('report', () => this.resource.report()));
  }
  /** The run's effects in order from the `start`-th (0 for the first), at most
   *  `maxCount` of them and never more than `MAX_EFFECTS_PAGE` (1,000) a call. */
  effects(start: number, maxCount: number = MAX_EFFECTS_PAGE): Wit.EffectRecord[] {
    checkArgs('[method]run.effects', [start, maxCount]);
    return this.instance.guard('effects', () => this.resource.effects(start, maxCount));
  }
  /** Every effect of the run, page by page (`report().effects` holds at most 20). */
  allEffects(): Wit.EffectRecord[] {
    const all: Wit.EffectRecord[] = [];
    for (;;) {
      const page = this.effects(Math.min(all.length, 0xffffffff), MAX_EFFECTS_PAGE);
      if (page.length === 0) return all;
      for (const effect of page) all.push(effect);
    }
  }
}

/** The most effects `run.effects` returns a call. */
export const MAX_EFFECTS_PAGE = 1_000;

/** The component's run-error as `RunMisuse`. */
function misuse<T>(call: () => T): T {
  try {
    return call();
  } catch (e) {
    const error = resultError(e);
    if (error) throw new RunMisuse(error.payload as Wit.RunError);
    throw e;
  }
}

/** `too-large`, as the component answers it, for an id over its limit. */
function tooLarge([input, sizeBytes, limitBytes]: [string, number, number]): RunMisuse {
  return new RunMisuse({ tag: 'too-large', val: { input, sizeBytes, limitBytes } });
}
