// Loading the policy component (transpiled by jco) and calling it.
//
//   const component = await PolicyComponent.load();     // compile once per process
//   const instance = await component.instantiate();     // one per run or worker
//   const policy = instance.loadPolicy({ 'max-attempts-per-call': 3 });
//   const run = policy.startRun('CASE-5016');
//   const admission = run.beginCall({ tool: 'lookup_order' }, nowMs());
//
// The component gets only the account budget and `wasi:random/random` from this
// host (no WASI shim at all), so it can reach no file, socket, clock or environment.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import type { Root } from '../generated/agent_retry_policy.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { PROCESS_ACCOUNTS, type AccountBudgetBackend } from './accounts.js';
import { checkContractVersion, componentExportNames } from './contract.js';
import { OsEntropy, randomBytes, type EntropySource } from './entropy.js';
import { withJson, type JsonSafe } from './json.js';
import { AgentRetryError, ComponentLoadError, ComponentNotFound, ConfigError, InstanceUnusable, PolicyTrap, RunMisuse } from './errors.js';

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

interface SourceInfo { wasm: string; sha256: string; jco: string; exports?: string[] }

export interface LoadOptions {
  /** The .wasm the transpiled code must come from (checked by hash). */
  wasmPath?: string;
  /** Where `npm run transpile` put jco's output (default: the package's). */
  generatedDir?: string;
}

export interface InstantiateOptions {
  /** Default: the buckets shared by the whole process. */
  accounts?: AccountBudgetBackend;
  /** For `wasi:random`, used only when a call passes no entropy. Default: the OS. */
  entropy?: EntropySource;
}

type Instantiate = (getCoreModule: (path: string) => WebAssembly.Module, imports: unknown) => Promise<Root>;

/** The transpiled component with its core modules compiled, ready to instantiate many times. */
export class PolicyComponent {
  private static readonly cache = new Map<string, Promise<PolicyComponent>>();

  private constructor(
    readonly source: SourceInfo,
    private readonly modules: Map<string, WebAssembly.Module>,
    private readonly instantiateRoot: Instantiate,
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
    const key = `${dir}\0${wasm ?? ''}`;
    let loading = PolicyComponent.cache.get(key);
    if (!loading) {
      loading = PolicyComponent.loadFrom(dir, wasm);
      PolicyComponent.cache.set(key, loading);
      loading.catch(() => PolicyComponent.cache.delete(key));
    }
    return loading;
  }

  private static async loadFrom(dir: string, wasm: string | undefined): Promise<PolicyComponent> {
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
    const modules = new Map<string, WebAssembly.Module>();
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.wasm'))) {
      modules.set(file, await WebAssembly.compile(readFileSync(join(dir, file))));
    }
    const generated = (await import(pathToFileURL(join(dir, 'agent_retry_policy.js')).href)) as { instantiate: Instantiate };
    return new PolicyComponent(source, modules, generated.instantiate);
  }

  /** A fresh instance with its own memory. */
  async instantiate(options: InstantiateOptions = {}): Promise<PolicyInstance> {
    const accounts = options.accounts ?? PROCESS_ACCOUNTS;
    const entropy = options.entropy ?? new OsEntropy();
    // jco's instantiation imports are keyed without versions.
    const imports = {
      'agent-retry:policy/account-budget': {
        reserve(accountId: string, tokens: number, bucket: { capacity: number; refillIntervalMs: bigint }, maxWaitMs: bigint, now: bigint) {
          const reservation = accounts.reserve(accountId, tokens, bucket, maxWaitMs, now);
          return { tag: reservation.granted ? 'granted' : 'refused', val: reservation.waitMs };
        },
        refund(accountId: string, tokens: number, bucket: { capacity: number; refillIntervalMs: bigint }, now: bigint) {
          accounts.refund(accountId, tokens, bucket, now);
        },
      },
      'agent-retry:policy/types': {},
      'wasi:random/random': {
        getRandomU64: () => entropy.nextU64(),
        getRandomBytes: (length: bigint) => randomBytes(entropy, Number(length > 4096n ? 4096n : length)),
      },
    };
    const getCoreModule = (path: string): WebAssembly.Module => {
      const module = this.modules.get(path);
      if (!module) throw new ComponentLoadError(`jco asked for a core module ${path} that was not transpiled`);
      return module;
    };
    try {
      const root = await this.instantiateRoot(getCoreModule, imports);
      return new PolicyInstance(root.policy);
    } catch (e) {
      throw new ComponentLoadError(`the component cannot be instantiated by this host: ${(e as Error).message}`, { cause: e });
    }
  }
}

/** jco throws a `ComponentError` carrying `payload` for a result's err case. */
function resultError(e: unknown): { payload: unknown } | undefined {
  if (e instanceof Error && e.constructor.name === 'ComponentError' && 'payload' in e) return e as Error & { payload: unknown };
  return undefined;
}

/** One instance of the component. Calls are synchronous; use it from one place at a time. */
export class PolicyInstance {
  private broken?: string;

  constructor(readonly exports: PolicyExports) {}

  /** Runs `call`, turning a trap into `PolicyTrap` and leaving results' err cases
   *  (jco's ComponentError) to the caller. */
  guard<T>(name: string, call: () => T): T {
    if (this.broken !== undefined) {
      throw new InstanceUnusable(`this policy instance trapped earlier (${this.broken}); instantiate a new one`);
    }
    try {
      return call();
    } catch (e) {
      if (resultError(e) || e instanceof AgentRetryError) throw e; // an answer, or our own check
      // jco's lowering rejected an argument before entering the component.
      if (e instanceof TypeError || e instanceof RangeError) throw e;
      // A trap (WebAssembly.RuntimeError) or a host import that threw mid-call:
      // the instance's state can no longer be trusted.
      this.broken = `${name}: ${(e as Error).message}`;
      throw new PolicyTrap(`${name} trapped: ${(e as Error).message}`, { cause: e });
    }
  }

  /** `ar1-` + 32 hex digits of FNV-1a-128 over run-id, 0x00, action-id. */
  deriveIdempotencyKey(runId: string, actionId: string): string {
    return this.guard('derive-idempotency-key', () => this.exports.deriveIdempotencyKey(runId, actionId));
  }

  /** `policy.from-json`: JSON text or an object. Throws `ConfigError`. */
  loadPolicy(config: string | object = '{}'): Policy {
    const text = typeof config === 'string' ? config : JSON.stringify(config);
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
  /** Frees the resource in the instance. */
  close(): void {
    const handle = this.handle;
    this.handle = undefined;
    (handle as { [Symbol.dispose]?: () => void } | undefined)?.[Symbol.dispose]?.();
  }
  [Symbol.dispose](): void {
    this.close();
  }
}

const big = (n: bigint | number): bigint => (typeof n === 'bigint' ? n : BigInt(n));

/** A validated configuration; start many runs from it. */
export class Policy extends Handle<JcoPolicy> {
  /** The configuration in force, every default filled in, as JSON text. */
  effectiveConfig(): string {
    return this.instance.guard('effective-config', () => this.resource.effectiveConfig());
  }
  classify(failure: Wit.Failure, now: bigint | number): Wit.Classification {
    return this.instance.guard('classify', () => this.resource.classify(failure, big(now)));
  }
  /** The delay before retry number `retry` (1 for the first); no entropy: wasi:random. */
  nextDelay(retry: number, hintMs?: bigint | number, entropy?: bigint): bigint {
    return this.instance.guard('next-delay', () =>
      this.resource.nextDelay(retry, hintMs === undefined ? undefined : big(hintMs), entropy));
  }
  startRun(runId: string): Run {
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
    return this.misuse(() => this.instance.guard('begin-call', () => this.resource.beginCall(call, big(now))));
  }
  /** Records one attempt's outcome (or a status check's) and returns what to do. */
  recordOutcome(callId: number, outcome: Wit.Outcome, now: bigint | number, entropy?: bigint): Wit.Decision {
    return this.misuse(() => this.instance.guard('record-outcome', () => this.resource.recordOutcome(callId, outcome, big(now), entropy)));
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
