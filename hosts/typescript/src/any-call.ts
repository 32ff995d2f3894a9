// `withPolicy`: any function (async or not) run under the policy, through the
// MCP wrapper's call core (src/call-core.ts): the same events, in the same
// words. The function is one attempt; what it returns is a success (or an
// empty result), what it throws is translated into the contract's observation
// (src/observe-errors.ts, or the caller's own `observe`) and reported. The
// verdict is obeyed: a retry after its wait, a status check, a replan
// (`ReplanNeeded`), an escalation (`Escalated`). The run guard (src/guard.ts)
// checks every verdict as it does for the MCP wrapper, so no policy can repeat
// a 4xx as it is, resend an unknown write, change a key or wait past the caps.
//
//   const quote = await withPolicy(run, 'get_quote', async ({ signal }) => {
//     const response = await fetch(url, { signal });
//     return response.ok ? response.json() : response;   // a Response that is not ok is a failure
//   });
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { CallCore, CallScope, StopNow, errorName, type Outcome, type RunState, type StatusCheckAnswer } from './call-core.js';
import type { Run } from './component.js';
import { OsEntropy, type EntropySource } from './entropy.js';
import { Escalated, ReplanNeeded, type StopCause } from './errors.js';
import { RunGuard } from './guard.js';
import type { RetryHooks } from './hooks.js';
import type { RetryMetrics } from './metrics.js';
import { observeError, observeResponse, type ObserveError } from './observe-errors.js';
import { loadOtel } from './otel.js';
import { Telemetry } from './telemetry.js';

export { outcomeWords, type StatusCheckAnswer } from './call-core.js';

/** What one attempt of the function is given. */
export interface Attempt {
  /** 1 for the first attempt, then each retry's. */
  number: number;
  /** The call's idempotency key, the same in every attempt (a keyed tool only). */
  idempotencyKey?: string;
  /** Aborted when the call stops (its deadline, or the caller's signal). */
  signal: AbortSignal;
}

/** What a status check is asked about: the call whose effect may have been applied. */
export interface AnyStatusCheckRequest {
  tool: string;
  idempotencyKey?: string;
  callId: number;
  attempt: number;
  signal: AbortSignal;
}

/** The time and the waits of `withPolicy` (default: the wall clock and real timers; `FakeClock` in tests). */
export interface PolicyClock {
  nowMs(): number | bigint;
  sleep(ms: number): Promise<void>;
}

export interface WithPolicyOptions<T> {
  /** The tool's hints (`readOnly`, `destructive`, `idempotent`), as MCP annotations give them. */
  hints?: Wit.ToolHints;
  /** The server the function calls, named for the circuit breakers (contract
   *  0.8.0: the same name in every worker, e.g. a URL without its query); with
   *  a `circuit-breaker` configuration, an open breaker of it ends the call
   *  before the function runs (`ReplanNeeded`, or `Escalated` as configured).
   *  Default: none, no breaker applies. */
  server?: string;
  /** Names the call's place in the run for its idempotency key (default `step-N`, N counting this run's `withPolicy` calls). */
  actionId?: string;
  /** Translates what the function threw into an observation; tried before the
   *  built-in mappings (undefined: not mine). */
  observe?: ObserveError;
  /** What is wrong with a returned value, if it is an empty result (a string,
   *  or `true` for "empty"); undefined or false: a success. */
  isEmpty?: (value: T) => string | boolean | undefined;
  /** Reads whether a write that may have been applied was (default: none, `unknown`: the policy escalates);
   *  async or plain, bounded by the call's deadline; what throws is `unknown`. */
  statusCheck?: (request: AnyStatusCheckRequest) => StatusCheckAnswer | Promise<StatusCheckAnswer>;
  hooks?: RetryHooks;
  metrics?: RetryMetrics;
  clock?: PolicyClock;
  /** Jitter entropy (default: the OS; `fixedEntropy(seed)` replays). */
  entropy?: EntropySource;
  /** Logged as `policy` (default: the run's instance's `policyIdentity`). */
  policyIdentity?: string;
  /** The most the call may take, retries and waits included (default: none). */
  callTimeoutMs?: number;
  /** Stops the call at once when aborted (`CallCancelled`). */
  signal?: AbortSignal;
  /** One JSON line per event; default none (quiet), `(line) => process.stderr.write(line + '\n')` to see them. */
  log?: ((line: string) => void) | null;
}

/** The guard of each run `withPolicy` serves: its steps and retries are the run's, and a broken invariant ends the run. */
const runs = new WeakMap<Run, RunState & { steps: number }>();

function stateOf(run: Run): RunState & { steps: number } {
  let state = runs.get(run);
  if (state === undefined) runs.set(run, (state = { guard: new RunGuard(run.configText), steps: 0 }));
  return state;
}

/** Whether the tool takes an idempotency key: not read-only, and idempotent by its hints or its configuration entry. */
function keyed(configText: string, tool: string, hints: Wit.ToolHints | undefined): boolean {
  let entry: unknown;
  try {
    const tools = (JSON.parse(configText) as { tools?: Record<string, unknown> }).tools;
    entry = tools && Object.prototype.hasOwnProperty.call(tools, tool) ? tools[tool] : undefined;
  } catch {
    entry = undefined;
  }
  const e = (entry ?? {}) as Record<string, unknown>;
  if (e.effect === 'read' || e.readOnlyHint === true || (e.effect === undefined && hints?.readOnly === true)) return false;
  return e.idempotent === true || e.idempotentHint === true || hints?.idempotent === true;
}

/** Runs `fn` under the policy of `run` as the call `tool`. `fn` may be
 *  synchronous or async. Resolves to what `fn` returned (undefined when the
 *  call succeeded on a status check's word alone); rejects with
 *  `ReplanNeeded`, `Escalated`, `CallTimedOut` / `CallCancelled`, or the
 *  function's own error unchanged when no mapping knows it (a bug in the
 *  caller's code: the call is abandoned). */
export async function withPolicy<T>(run: Run, tool: string, fn: (attempt: Attempt) => T | Promise<T>, options: WithPolicyOptions<T> = {}): Promise<T> {
  const limit = options.callTimeoutMs;
  if (limit !== undefined && !(typeof limit === 'number' && limit >= 0 && Number.isFinite(limit))) {
    throw new TypeError(`callTimeoutMs must be a finite number of ms, not ${String(limit)}`);
  }
  if (typeof fn !== 'function') throw new TypeError(`withPolicy: fn must be a function of the attempt, not ${fn === null ? 'null' : typeof fn}`);
  const telemetry = new Telemetry({ log: options.log ?? null, hooks: options.hooks, metrics: options.metrics, otel: await loadOtel() });
  const policy = options.policyIdentity ?? run.instance.policyIdentity;
  const state = stateOf(run);
  state.steps += 1;
  const clock = options.clock;
  const now = clock ? () => Number(clock.nowMs()) : () => Date.now();
  const scope = new CallScope({
    now, deadline: limit === undefined ? undefined : { at: now() + limit, cause: 'call-timeout', limitMs: limit },
    // Real time only: a fake clock's deadline is checked at its waits.
    timer: clock === undefined, signal: options.signal, sleep: clock ? (ms) => clock.sleep(ms) : undefined,
  });
  const server: unknown = options.server;
  if (server !== undefined && typeof server !== 'string') throw new TypeError(`server must be a string (the server's name), not ${typeof server}`);
  const core = new CallCore({
    run, tool, server, step: state.steps, policy, trace: telemetry.call(tool, { run: run.runId, policy, step: state.steps }, 'any'), runState: state, scope,
    entropy: options.entropy ?? new OsEntropy(), policyNow: clock ? () => clock.nowMs() : () => Date.now(),
  });
  try {
    return await new AnyCall(core, fn, options).call(options.actionId ?? `step-${state.steps}`);
  } catch (e) {
    if (e instanceof StopNow || (scope.cause && !(e instanceof Escalated || e instanceof ReplanNeeded))) throw core.stopped();
    throw e;
  } finally {
    scope.dispose();
    core.trace.end();
  }
}

/** One `withPolicy` call: its attempts are the function's calls. */
class AnyCall<T> {
  constructor(private readonly core: CallCore, private readonly fn: (attempt: Attempt) => T | Promise<T>,
    private readonly options: WithPolicyOptions<T>) {}

  async call(actionId: string): Promise<T> {
    const { core, options } = this;
    core.scope.check();
    core.checkTripped();
    if (keyed(core.run.configText, core.tool, options.hints)) core.deriveKey(actionId);
    const begun = await core.begin(options.hints);
    // A circuit breaker of the server is open: over before the function ran, as a replan.
    if (begun.replan) throw new ReplanNeeded(begun.replan.message, begun.replan.rule, core.tool);
    const { guard } = begun;
    for (;;) {
      const attempt = core.attempt;
      const { outcome, value } = await this.attemptOnce(attempt);
      guard.attempted(outcome.tag === 'failure' ? outcome.val : undefined);
      let answer = core.record(attempt, outcome, guard, true);
      while (answer.verdict.action === 'check-status') {
        const check = options.statusCheck;
        const found = await core.checkStatus(check && (() => check({
          tool: core.tool, idempotencyKey: core.key, callId: core.callId as number, attempt, signal: core.scope.signal,
        })));
        answer = core.statusChecked(attempt, guard, typeof check === 'function' ? check.name || null : null, found);
      }
      const verdict = answer.verdict;
      switch (verdict.action) {
        case 'retry':
          core.attempt = verdict.attempt + 1;
          await core.wait('retry', core.attempt, verdict.delayMs, verdict.hintMs, answer.decision);
          continue;
        case 'replan': {
          const message = core.replan(answer);
          throw new ReplanNeeded(message, answer.decision?.rule ?? '', core.tool);
        }
        case 'succeed':
          return value as T;
        case 'escalate':
          throw core.escalate(answer);
        case 'poll':
          // No task can answer a function's call: the policy broke its contract.
          return core.noTask(answer);
      }
    }
  }

  /** One attempt: the function's value, or its failure as observed. An error no mapping knows abandons the call and is thrown as it is. */
  private async attemptOnce(attempt: number): Promise<{ outcome: Outcome; value?: T }> {
    const { core } = this;
    core.scope.checkDeadline();
    core.sending(attempt);
    let value: T;
    try {
      value = await core.scope.race(this.invoke(attempt));
    } catch (e) {
      if (e instanceof StopNow || core.scope.cause) throw e instanceof StopNow ? e : new StopNow(core.scope.cause as StopCause);
      const observation = await this.observe(e);
      core.inFlight = false;
      if (observation === undefined) {
        this.unmapped(attempt, e);
        throw e;
      }
      return { outcome: { tag: 'failure', val: observation } };
    }
    core.inFlight = false;
    if (typeof Response !== 'undefined' && value instanceof Response && !value.ok) {
      return { outcome: { tag: 'failure', val: await core.scope.race(observeResponse(value)) } };
    }
    let empty: string | boolean | undefined;
    try {
      empty = this.options.isEmpty?.(value);
    } catch (e) {
      // The caller's check failed: its bug, as an error no mapping knows.
      this.unmapped(attempt, e);
      throw e;
    }
    if (empty !== undefined && empty !== false) {
      return { outcome: { tag: 'empty-result', val: typeof empty === 'string' ? empty : 'the call returned an empty result' }, value };
    }
    return { outcome: { tag: 'success' }, value };
  }

  /** The function's answer as a promise, whether it is async or not (what it throws at once is its failure). */
  private invoke(attempt: number): Promise<T> {
    const core = this.core;
    try {
      return Promise.resolve(this.fn({ number: attempt, idempotencyKey: core.key, signal: core.scope.signal }));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** The caller's mapping, then the built-in ones; a mapping that throws knows nothing. */
  private async observe(error: unknown): Promise<Wit.Observation | undefined> {
    for (const mapping of [this.options.observe, observeError]) {
      if (mapping === undefined) continue;
      try {
        const observation = await mapping(error);
        if (observation !== undefined) return observation;
      } catch {
        // not this mapping's
      }
    }
    return undefined;
  }

  /** An error no mapping knows: the call is abandoned (as cancelled: the caller's code failed) and its line says so. */
  private unmapped(attempt: number, error: unknown): void {
    this.core.abandonUnknown(attempt, error, `${errorName(error)} that no mapping translates`);
  }
}
