// Loading the policy component (transpiled by jco) and calling it.
//
//   const component = await PolicyComponent.load();     // compile once per process
//   const instance = await component.instantiate();     // one per run or worker
//   const policy = instance.loadPolicy({ 'max-attempts-per-call': 3 });
//   const run = policy.startRun('CASE-5016');
//   const admission = run.beginCall({ tool: 'lookup_order' }, nowMs());
//
// The component gets only the account budget and `wasi:random/random` from this
// host (no WASI shim at all), so it can reach no file, socket, clock or environment;
// a component that imports anything else is refused at load (`ComponentImportRefused`).
//
// The sandbox (src/sandbox.ts): each core module is rewritten at load so that every
// call runs on a fuel budget (`fuelPerCall`, default 20 M, as in the Rust and
// Python hosts) and the instance's memory is capped (`maxMemoryBytes`, default
// 64 MiB). Values are checked in both directions: arguments against their WIT
// types before the call (`ValueConversionError`, nothing reaches the guest),
// results by jco's lifting with a fatal UTF-8 decoder. A trap, an exhausted
// limit or a value the contract does not allow is a `PolicyTrap` (kinds:
// `PolicyOutOfFuel`, `PolicyMemoryExceeded`, `PolicyBoundaryViolation`) and the
// instance is refused afterwards (`InstanceUnusable`): instantiate a new one.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import type { Root } from '../generated/agent_retry_policy.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { PROCESS_ACCOUNTS, type AccountBudgetBackend } from './accounts.js';
import { checkContractVersion, checkImports, componentExportNames, componentImportNames } from './contract.js';
import { OsEntropy, randomBytes, type EntropySource } from './entropy.js';
import { withJson, type JsonSafe } from './json.js';
import {
  AgentRetryError, ComponentImportRefused, ComponentLoadError, ComponentNotFound, ConfigError, InstanceUnusable, PolicyBoundaryViolation,
  PolicyMemoryExceeded, PolicyOutOfFuel, PolicyTrap, RunMisuse,
} from './errors.js';
import { FUEL_EXPORT, FUEL_PER_CALL, GROW_FAILED_EXPORT, MAX_MEMORY_BYTES, instrumentCoreModule } from './sandbox.js';
import { FUNCTIONS, ValueConversionError, checkJco, jcoProblem } from './wit.js';

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

interface SourceInfo { wasm: string; sha256: string; jco: string; exports?: string[]; imports?: string[] }

/** What `scripts/transpile.mjs` makes of jco's glue: strings the guest returns
 *  are decoded strictly (jco's own decoder replaces invalid UTF-8 silently). */
const STRICT_DECODER = "new TextDecoder('utf-8', { fatal: true })";

export interface LoadOptions {
  /** The .wasm the transpiled code must come from (checked by hash). */
  wasmPath?: string;
  /** Where `npm run transpile` put jco's output (default: the package's). */
  generatedDir?: string;
  /** The most linear memory an instance may grow to (default `MAX_MEMORY_BYTES`,
   *  64 MiB, as in the Rust and Python hosts). Applied to the compiled modules. */
  maxMemoryBytes?: number;
}

export interface InstantiateOptions {
  /** Default: the buckets shared by the whole process. */
  accounts?: AccountBudgetBackend;
  /** For `wasi:random`, used only when a call passes no entropy. Default: the OS. */
  entropy?: EntropySource;
  /** Fuel each call may burn, about one unit per wasm instruction (default
   *  `FUEL_PER_CALL`, 20 M, as in the Rust and Python hosts); `null`: no limit. */
  fuelPerCall?: number | null;
}

/** Raised by a host import, to tell it apart from the guest's own failures. */
class ImportFailure extends Error {}

/** The sandbox's handles on one instance: the fuel and failed-grow globals and
 *  the memories of its core instances. */
class Meter {
  readonly fuel: WebAssembly.Global[] = [];
  readonly growFailed: WebAssembly.Global[] = [];
  readonly memories: WebAssembly.Memory[] = [];
  private readonly tank: bigint;
  constructor(readonly fuelPerCall: number | null, readonly maxMemoryBytes: number) {
    this.tank = fuelPerCall === null ? (1n << 63n) - 1n : BigInt(fuelPerCall);
  }
  record(instance: WebAssembly.Instance): void {
    for (const [name, value] of Object.entries(instance.exports)) {
      if (name === FUEL_EXPORT) this.fuel.push(value as WebAssembly.Global);
      else if (name === GROW_FAILED_EXPORT) this.growFailed.push(value as WebAssembly.Global);
      else if (value instanceof WebAssembly.Memory) this.memories.push(value);
    }
  }
  refuel(): void {
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
  ) {}

  /** Loads jco's output once per process. Throws `ComponentNotFound` if it is
   *  missing; `ContractVersionMismatch` (a `ComponentLoadError`) if the .wasm in
   *  force, or the one transpiled, speaks another major version of the contract
   *  than this host (`CONTRACT_VERSION`); `ComponentLoadError` if it was
   *  transpiled from another .wasm than the one in force (rerun
   *  `npm run transpile && npm run build`). */
  static load(options: LoadOptions = {}): Promise<PolicyComponent> {
    const dir = resolve(options.generatedDir ?? defaultGeneratedDir);
    const wasm = locateComponent(options.wasmPath);
    const maxMemoryBytes = options.maxMemoryBytes ?? MAX_MEMORY_BYTES;
    if (!Number.isSafeInteger(maxMemoryBytes) || maxMemoryBytes < 65536) {
      return Promise.reject(new RangeError(`maxMemoryBytes must be an integer of at least 65536 (one page), not ${maxMemoryBytes}`));
    }
    const key = `${dir}\0${wasm ?? ''}\0${maxMemoryBytes}`;
    let loading = PolicyComponent.cache.get(key);
    if (!loading) {
      loading = PolicyComponent.loadFrom(dir, wasm, maxMemoryBytes);
      PolicyComponent.cache.set(key, loading);
      loading.catch(() => PolicyComponent.cache.delete(key));
    }
    return loading;
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
      // both versions named, whatever was transpiled.
      let exportNames: string[];
      try {
        exportNames = componentExportNames(bytes);
      } catch (e) {
        throw new ComponentLoadError(`${wasm} is not a readable WebAssembly component: ${(e as Error).message}`, { cause: e });
      }
      checkContractVersion(exportNames, `the component ${wasm}`);
      // Then its imports: nothing outside the contract (no WASI filesystem, sockets, ...).
      checkImports(componentImportNames(bytes), `the component ${wasm}`);
      const sha256 = createHash('sha256').update(bytes).digest('hex');
      if (sha256 !== source.sha256) {
        throw new ComponentLoadError(`${dir} was transpiled from another build than ${wasm}: ` + (INSTALLED
          ? `unset ${WASM_ENV_VAR} (or leave out wasmPath) to use the component this package carries, or ${TRANSPILE_ADVICE}`
          : 'run `npm run transpile && npm run build` in hosts/typescript'));
      }
    }
    if (!Array.isArray(source.exports)) {
      throw new ComponentLoadError(`${sourceFile} does not say what the transpiled component exports (an older transpilation): ` +
        (INSTALLED ? `reinstall agent-retry-policy, or ${TRANSPILE_ADVICE}` : 'run `npm run transpile && npm run build` in hosts/typescript'));
    }
    checkContractVersion(source.exports, `the component transpiled in ${dir} (from ${source.wasm})`);
    if (Array.isArray(source.imports)) checkImports(source.imports, `the component transpiled in ${dir} (from ${source.wasm})`);
    const glue = join(dir, 'agent_retry_policy.js');
    if (!readFileSync(glue, 'utf8').includes(STRICT_DECODER)) {
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
    return new PolicyComponent(source, modules, generated.instantiate, maxMemoryBytes);
  }

  /** A fresh instance with its own memory. */
  async instantiate(options: InstantiateOptions = {}): Promise<PolicyInstance> {
    const accounts = options.accounts ?? PROCESS_ACCOUNTS;
    const entropy = options.entropy ?? new OsEntropy();
    const fuelPerCall = options.fuelPerCall === undefined ? FUEL_PER_CALL : options.fuelPerCall;
    if (fuelPerCall !== null && (!Number.isSafeInteger(fuelPerCall) || fuelPerCall < 1)) {
      throw new RangeError(`fuelPerCall must be a positive integer or null (no limit), not ${fuelPerCall}`);
    }
    const meter = new Meter(fuelPerCall, this.maxMemoryBytes);
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
      return new PolicyInstance(root.policy, meter);
    } catch (e) {
      if (e instanceof ComponentLoadError) throw e;
      throw new ComponentLoadError(`the component cannot be instantiated by this host: ${(e as Error).message}`, { cause: e });
    }
  }
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

/** One instance of the component. Calls are synchronous; use it from one place at a time. */
export class PolicyInstance {
  private broken?: string;

  constructor(readonly exports: PolicyExports, private readonly meter?: Meter) {}

  /** Why this instance refuses calls (a trap, a limit, a bad value), if it does. */
  get brokenBy(): string | undefined {
    return this.broken;
  }

  /** The fuel the last call burned (about one unit per wasm instruction, over
   *  all of the component's core instances). */
  fuelUsedByLastCall(): number {
    return this.meter?.used() ?? 0;
  }

  /** The largest linear memory of the instance, in bytes. */
  memoryBytes(): number {
    return this.meter?.memoryBytes() ?? 0;
  }

  /** Runs `call` on a full tank of fuel, turning a trap, an exhausted limit or a
   *  value the contract does not allow into a `PolicyTrap` (and the instance
   *  unusable), and leaving results' err cases (jco's ComponentError) to the caller. */
  guard<T>(name: string, call: () => T): T {
    if (this.broken !== undefined) {
      throw new InstanceUnusable(`this policy instance failed earlier (${this.broken}); instantiate a new one`);
    }
    const meter = this.meter;
    meter?.refuel();
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

  /** Marks the instance broken and says why, as the most specific `PolicyTrap`. */
  private fail(name: string, e: unknown): PolicyTrap {
    const message = e === undefined ? '' : String((e as Error)?.message ?? e);
    const meter = this.meter;
    let error: PolicyTrap;
    if (meter?.outOfFuel()) {
      error = new PolicyOutOfFuel(`${name} ran out of fuel (${meter.fuelPerCall} units a call) and was stopped`, { cause: e, call: name });
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

  /** `ar1-` + 32 hex digits of FNV-1a-128 over run-id, 0x00, action-id. */
  deriveIdempotencyKey(runId: string, actionId: string): string {
    checkArgs('derive-idempotency-key', [runId, actionId]);
    return this.guard('derive-idempotency-key', () => this.exports.deriveIdempotencyKey(runId, actionId));
  }

  /** `policy.from-json`: JSON text or an object. Throws `ConfigError`. */
  loadPolicy(config: string | object = '{}'): Policy {
    const text = typeof config === 'string' ? config : JSON.stringify(config);
    checkArgs('[static]policy.from-json', [text]);
    try {
      return new Policy(this, this.guard('from-json', () => this.exports.Policy.fromJson(text)));
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
  /** The configuration in force, every default filled in, as JSON text. */
  effectiveConfig(): string {
    return this.instance.guard('effective-config', () => this.resource.effectiveConfig());
  }
  classify(failure: Wit.Failure, now: bigint | number): Wit.Classification {
    const at = big(now);
    checkArgs('[method]policy.classify', [failure, at]);
    return this.instance.guard('classify', () => this.resource.classify(failure, at));
  }
  /** The delay before retry number `retry` (1 for the first); no entropy: wasi:random. */
  nextDelay(retry: number, hintMs?: bigint | number, entropy?: bigint): bigint {
    const hint = hintMs === undefined ? undefined : big(hintMs);
    checkArgs('[method]policy.next-delay', [retry, hint, entropy]);
    return this.instance.guard('next-delay', () => this.resource.nextDelay(retry, hint, entropy));
  }
  startRun(runId: string): Run {
    checkArgs('[method]policy.start-run', [runId]);
    return new Run(this.instance, this.instance.guard('start-run', () => this.resource.startRun(runId)), runId);
  }
}

/** One agent run: its calls, budgets and effects. */
export class Run extends Handle<JcoRun> {
  constructor(instance: PolicyInstance, handle: JcoRun, readonly runId: string) {
    super(instance, handle);
  }
  /** Asks to begin a call. Throws `RunMisuse` for the component's run-error. */
  beginCall(call: Wit.CallRequest, now: bigint | number): Wit.Admission {
    const at = big(now);
    checkArgs('[method]run.begin-call', [call, at]);
    return this.misuse(() => this.instance.guard('begin-call', () => this.resource.beginCall(call, at)));
  }
  /** Records one attempt's outcome (or a status check's) and returns what to do.
   *  Arguments outside their WIT types (a u16 status of 66039) throw
   *  `ValueConversionError` before anything reaches the component. */
  recordOutcome(callId: number, outcome: Wit.Outcome, now: bigint | number, entropy?: bigint): Wit.Decision {
    const at = big(now);
    checkArgs('[method]run.record-outcome', [callId, outcome, at, entropy]);
    return this.misuse(() => this.instance.guard('record-outcome', () => this.resource.recordOutcome(callId, outcome, at, entropy)));
  }
  /** The run's tally. Its u64 fields (`waitedMs`) are `bigint`s; `JSON.stringify`
   *  works on it all the same (a non-enumerable `toJSON()`: a u64 becomes a number
   *  when it is at most `Number.MAX_SAFE_INTEGER`, else a string of its digits). */
  report(): Wit.RunReport & { toJSON(): JsonSafe<Wit.RunReport> } {
    return withJson(this.instance.guard('report', () => this.resource.report()));
  }
  private misuse<T>(call: () => T): T {
    try {
      return call();
    } catch (e) {
      const error = resultError(e);
      if (error) throw new RunMisuse(error.payload as Wit.RunError);
      throw e;
    }
  }
}
