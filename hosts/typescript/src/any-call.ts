// `withPolicy`: any async function run under the policy, as the MCP wrapper runs
// a tool call. The function is one attempt; what it returns is a success (or an
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
import type { Run } from './component.js';
import { boundedDecision, boundedEscalation, policyFailureNote } from './decisions.js';
import { OsEntropy, type EntropySource } from './entropy.js';
import {
  AttemptEvent, EscalationEvent, ReplanEvent, StatusCheckEvent, WaitEvent, type AttemptFields,
} from './events.js';
import {
  CallCancelled, CallTimedOut, Escalated, InstanceUnusable, PolicyBoundaryViolation, PolicyTrap, ReplanNeeded, type StopCause,
} from './errors.js';
import { RunGuard, type CallGuard, type Violation } from './guard.js';
import type { RetryHooks } from './hooks.js';
import type { RetryMetrics } from './metrics.js';
import { observeError, observeResponse, type ObserveError } from './observe-errors.js';
import { loadOtel } from './otel.js';
import { Telemetry, type CallTrace } from './telemetry.js';
import { longTimeout } from './timers.js';

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
  /** Names the call's place in the run for its idempotency key (default `step-N`, N counting this run's `withPolicy` calls). */
  actionId?: string;
  /** Translates what the function threw into an observation; tried before the
   *  built-in mappings (undefined: not mine). */
  observe?: ObserveError;
  /** What is wrong with a returned value, if it is an empty result (a string,
   *  or `true` for "empty"); undefined or false: a success. */
  isEmpty?: (value: T) => string | boolean | undefined;
  /** Reads whether a write that may have been applied was (default: none, `unknown`: the policy escalates). */
  statusCheck?: (request: AnyStatusCheckRequest) => Promise<Wit.StatusCheckResult>;
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
const guards = new WeakMap<Run, { guard: RunGuard; steps: number; tripped?: Escalated }>();

function stateOf(run: Run): { guard: RunGuard; steps: number; tripped?: Escalated } {
  let state = guards.get(run);
  if (state === undefined) guards.set(run, (state = { guard: new RunGuard(run.configText), steps: 0 }));
  return state;
}

const wallClock: PolicyClock = {
  nowMs: () => Date.now(),
  sleep: (ms) => new Promise((resolve) => { longTimeout(ms, resolve); }),
};

/** Thrown inside a call when it must stop. */
class StopNow extends Error {
  constructor(readonly stopCause: StopCause) {
    super(stopCause);
  }
}

/** The words of an observation's outcome, the same in every host (docs/events.md). */
export function outcomeWords(observation: Wit.Observation): string {
  const kind = observation.kind;
  switch (kind.tag) {
    case 'http-status': return `http ${kind.val}`;
    case 'transport': return `transport ${kind.val}`;
    case 'protocol-error': return `json-rpc ${kind.val}`;
    case 'tool-error': return 'tool error';
    case 'input-required': return 'input required';
  }
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

/** Runs `fn` under the policy of `run` as the call `tool`. Resolves to what
 *  `fn` returned (undefined when the call succeeded on a status check's word
 *  alone); rejects with `ReplanNeeded`, `Escalated`, `CallTimedOut` /
 *  `CallCancelled`, or the function's own error unchanged when no mapping
 *  knows it (a bug in the caller's code: the call is abandoned). */
export async function withPolicy<T>(run: Run, tool: string, fn: (attempt: Attempt) => Promise<T>, options: WithPolicyOptions<T> = {}): Promise<T> {
  const limit = options.callTimeoutMs;
  if (limit !== undefined && !(typeof limit === 'number' && limit >= 0 && Number.isFinite(limit))) {
    throw new TypeError(`callTimeoutMs must be a finite number of ms, not ${String(limit)}`);
  }
  if (typeof fn !== 'function') throw new TypeError('withPolicy: fn must be a function of the attempt');
  const telemetry = new Telemetry({ log: options.log ?? null, hooks: options.hooks, metrics: options.metrics, otel: await loadOtel() });
  const identity = options.policyIdentity ?? run.instance.policyIdentity;
  const state = stateOf(run);
  state.steps += 1;
  const call = new AnyCall(run, tool, fn, options, telemetry, identity, state, state.steps);
  try {
    return await call.execute();
  } finally {
    call.dispose();
  }
}

/** One `withPolicy` call. */
class AnyCall<T> {
  private readonly clock: PolicyClock;
  private readonly entropy: EntropySource;
  private readonly trace: CallTrace;
  private readonly controller = new AbortController();
  private readonly deadline?: number;
  private cancelTimer?: () => void;
  private unlisten?: () => void;
  private stopCause?: StopCause;
  private key?: string;
  private callId?: number;
  /** The attempt planned (sent, or to be sent after the wait). */
  private attempt = 0;
  /** The highest attempt whose own outcome was reported. */
  private reported = 0;
  private inFlight = false;
  private attemptsSent = 0;
  private effect?: Wit.Effect;

  constructor(private readonly run: Run, private readonly tool: string, private readonly fn: (attempt: Attempt) => Promise<T>,
    private readonly options: WithPolicyOptions<T>, private readonly telemetry: Telemetry, private readonly identity: string,
    private readonly state: { guard: RunGuard; steps: number; tripped?: Escalated }, private readonly step: number) {
    this.clock = options.clock ?? wallClock;
    this.entropy = options.entropy ?? new OsEntropy();
    this.trace = telemetry.call(tool, { run: run.runId, policy: identity, step }, 'any');
    const limit = options.callTimeoutMs;
    if (limit !== undefined) {
      this.deadline = this.now() + limit;
      // Real time only: a fake clock's deadline is checked at its waits.
      if (options.clock === undefined) this.cancelTimer = longTimeout(limit, () => this.stop('call-timeout'));
    }
    const signal = options.signal;
    if (signal?.aborted) this.stop('cancelled');
    else if (signal) {
      const onAbort = () => this.stop('cancelled');
      signal.addEventListener('abort', onAbort, { once: true });
      this.unlisten = () => signal.removeEventListener('abort', onAbort);
    }
  }

  private now(): number {
    return Number(this.clock.nowMs());
  }

  private stop(cause: StopCause): void {
    if (this.stopCause) return;
    this.stopCause = cause;
    this.controller.abort(new StopNow(cause));
  }

  private check(): void {
    if (this.stopCause) throw new StopNow(this.stopCause);
  }

  dispose(): void {
    this.cancelTimer?.();
    this.unlisten?.();
  }

  /** Resolves as `promise` does, or rejects with `StopNow` the moment the call stops. */
  private race<V>(promise: Promise<V>): Promise<V> {
    promise.catch(() => undefined); // what loses the race is not an unhandled rejection
    if (this.stopCause) return Promise.reject(new StopNow(this.stopCause));
    const signal = this.controller.signal;
    return new Promise<V>((resolve, reject) => {
      const onAbort = () => reject(new StopNow(this.stopCause ?? 'cancelled'));
      signal.addEventListener('abort', onAbort, { once: true });
      promise.then(
        (value) => { signal.removeEventListener('abort', onAbort); resolve(value); },
        (error) => { signal.removeEventListener('abort', onAbort); reject(error); },
      );
    });
  }

  /** The time left to the deadline (ms), or undefined without one. */
  private timeLeftMs(): bigint | undefined {
    if (this.deadline === undefined) return undefined;
    const left = Math.floor(this.deadline - this.now());
    return left > 0 ? BigInt(left) : 0n;
  }

  /** Waits `ms` through the clock, unless it would end past the deadline (then the call stops now). */
  private async pause(ms: number): Promise<void> {
    this.check();
    if (ms <= 0) return;
    if (this.deadline !== undefined && this.now() + ms > this.deadline) this.stop('call-timeout');
    this.check();
    await this.race(this.clock.sleep(ms));
  }

  private fields(): Pick<AttemptFields, 'ts' | 'run' | 'policy' | 'step' | 'call' | 'tool'> {
    return { ts: this.now() / 1000, run: this.run.runId, policy: this.identity, step: this.step, call: this.callId ?? null, tool: this.tool };
  }

  async execute(): Promise<T> {
    try {
      return await this.call();
    } catch (e) {
      if (e instanceof StopNow || (this.stopCause && !(e instanceof Escalated || e instanceof ReplanNeeded))) throw this.stopped();
      throw e;
    } finally {
      this.trace.end();
    }
  }

  private async call(): Promise<T> {
    this.check();
    const { run, tool, state } = this;
    if (state.tripped) throw this.afterViolation();
    const hints = this.options.hints;
    if (keyed(run.configText, tool, hints)) {
      this.key = this.policy('not sent', () => run.instance.deriveIdempotencyKey(run.runId, this.options.actionId ?? `step-${this.step}`));
    }
    const key = this.key;
    const start = this.policy('not sent', () => run.beginCall(tool, key, hints, this.clock.nowMs()));
    if (!start.admitted) throw this.notAdmitted();
    this.callId = start.callId;
    this.effect = start.effect;
    this.attempt = 1;
    const begun = state.guard.begin(tool, key, hints, start.delayMs);
    const guard = begun.call;
    if (begun.violation) throw this.violated(0, 'not sent', begun.violation);
    await this.wait('admission', 1, Number(start.delayMs), null);

    for (;;) {
      const attempt = this.attempt;
      const { outcome, value } = await this.attemptOnce(attempt);
      guard.attempted(outcome.tag === 'failure' ? outcome.val : undefined);
      let answer = this.record(attempt, outcome, guard, true);
      let last = answer.words;
      while (answer.verdict.action === 'check-status') {
        const found = await this.checkStatus(attempt);
        const check = this.options.statusCheck;
        this.trace.emit(new StatusCheckEvent({ ...this.fields(), attempt, checkTool: typeof check === 'function' ? check.name || 'statusCheck' : null, result: found }));
        guard.statusChecked(found);
        answer = this.record(attempt, { tag: 'status-check', val: found }, guard, false);
        last = answer.words;
      }
      const verdict = answer.verdict;
      switch (verdict.action) {
        case 'retry': {
          this.attempt = verdict.attempt + 1;
          await this.wait('retry', this.attempt, Number(verdict.delayMs), verdict.hintMs === undefined ? null : Number(verdict.hintMs), answer.decision);
          continue;
        }
        case 'replan': {
          const decision = this.words(answer, last);
          const message = decision.action.tag === 'replan' ? decision.action.val : '';
          this.trace.emit(new ReplanEvent({ ...this.fields(), attempt, rule: decision.rule, message, decision }));
          throw new ReplanNeeded(message, decision.rule, tool);
        }
        case 'succeed':
          return value as T;
        case 'escalate': {
          const decision = this.words(answer, last);
          const escalation = decision.action.tag === 'escalate' ? decision.action.val : this.policy(last, () => {
            throw run.instance.violation('last-decision', `the verdict said escalate, the decision ${decision.action.tag}`);
          });
          this.escalated(attempt, decision.rule, escalation, decision);
          throw new Escalated(escalation, tool);
        }
        case 'poll':
          // No task can answer a function's call: the policy broke its contract.
          return this.policy(last, () => {
            throw run.instance.violation('record', `a poll verdict for call ${this.callId}, which has no task`);
          });
      }
    }
  }

  /** One attempt: the function's value, or its failure as observed. An error no mapping knows abandons the call and is thrown as it is. */
  private async attemptOnce(attempt: number): Promise<{ outcome: Outcome; value?: T }> {
    this.check();
    this.trace.startAttempt(attempt);
    this.attemptsSent += 1;
    this.inFlight = true;
    let value: T;
    try {
      value = await this.race(this.fn({ number: attempt, idempotencyKey: this.key, signal: this.controller.signal }));
    } catch (e) {
      if (e instanceof StopNow || this.stopCause) throw e instanceof StopNow ? e : new StopNow(this.stopCause as StopCause);
      const observation = await this.observe(e);
      this.inFlight = false;
      if (observation === undefined) {
        this.unmapped(attempt, e);
        throw e;
      }
      return { outcome: { tag: 'failure', val: observation } };
    }
    this.inFlight = false;
    if (typeof Response !== 'undefined' && value instanceof Response && !value.ok) {
      return { outcome: { tag: 'failure', val: await this.race(observeResponse(value)) } };
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
    const callId = this.callId as number;
    try {
      this.run.abandonCall(callId, attempt, true, 'cancelled');
    } catch {
      // the run cannot be told more
    }
    const name = error instanceof Error ? error.name : typeof error;
    this.line(attempt, 'unmapped error', 'stop', `${name} that no mapping translates: thrown to the caller unchanged; the call is abandoned`,
      this.reported < attempt);
    this.reported = attempt;
  }

  private async checkStatus(attempt: number): Promise<Wit.StatusCheckResult> {
    const check = this.options.statusCheck;
    if (!check) return 'unknown'; // nobody can tell: the policy escalates rather than risk a second write
    try {
      const found = await this.race(check({ tool: this.tool, idempotencyKey: this.key, callId: this.callId as number, attempt, signal: this.controller.signal }));
      return found === 'found' || found === 'absent' || found === 'unknown' ? found : 'unknown';
    } catch (e) {
      if (e instanceof StopNow) throw e;
      this.telemetry.line({ event: 'agent_retry.status_check_failed', run: this.run.runId, policy: this.identity, tool: this.tool, error: String(e) });
      return 'unknown';
    }
  }

  /** A wait event and the wait (none when `ms` is 0). */
  private async wait(why: 'retry' | 'admission', attempt: number, ms: number, hintMs: number | null, decision?: Wit.Decision): Promise<void> {
    if (ms <= 0) return;
    this.trace.emit(new WaitEvent({ ...this.fields(), attempt, why, waitMs: ms, hintMs, decision }));
    await this.pause(ms);
  }

  /** Reports one outcome, checks the verdict with the guard, and emits its attempt event. */
  private record(attempt: number, outcome: Outcome, guard: CallGuard, ownOutcome: boolean): Answer {
    const { run } = this;
    const callId = this.callId as number;
    const words = outcome.tag === 'success' ? 'success' : outcome.tag === 'empty-result' ? 'empty result'
      : outcome.tag === 'status-check' ? `status check ${outcome.val}` : outcomeWords(outcome.val);
    const verdict = this.policy(words, () => {
      switch (outcome.tag) {
        case 'success': return run.recordSuccess(callId, attempt, this.clock.nowMs());
        case 'empty-result': return run.recordEmptyResult(callId, attempt, outcome.val, this.clock.nowMs());
        case 'failure': return run.recordFailure(callId, attempt, outcome.val, this.timeLeftMs(), this.clock.nowMs(), this.entropy.nextU64());
        case 'status-check': return run.recordStatusCheck(callId, attempt, outcome.val, this.timeLeftMs(), this.clock.nowMs(), this.entropy.nextU64());
      }
    });
    if (ownOutcome) this.reported = attempt;
    // Checked before anything acts on it (a hook included).
    const violation = guard.verdict(verdict);
    if (violation) throw this.violated(attempt, words, violation, ownOutcome);
    const answer: Answer = { verdict, guard, words };
    const rule = run.instance.ruleNames()[verdict.ruleIndex] ?? null;
    const decision = this.telemetry.wantsWords ? this.words(answer, words) : undefined;
    const action = decision?.action;
    this.trace.emit(new AttemptEvent({
      ...this.fields(), attempt, key: this.key ?? null, outcome: words, class: verdict.class, rule: decision?.rule ?? rule, action: verdict.action,
      delayMs: verdict.action === 'retry' || verdict.action === 'poll' ? Number(verdict.delayMs) : null,
      hintMs: verdict.hintMs === undefined ? null : Number(verdict.hintMs),
      escalation: action?.tag === 'escalate' ? action.val.reason : null, reason: decision?.reason ?? '', decision, countsAsAttempt: ownOutcome,
    }));
    return answer;
  }

  /** The answer's decision in words, asked once and checked against the verdict (the guard). */
  private words(answer: Answer, lastOutcome: string): Wit.Decision {
    if (answer.decision) return answer.decision;
    const callId = this.callId as number;
    const decision = this.policy(lastOutcome, () => {
      const said = this.run.lastDecision(callId);
      if (said === undefined) throw this.run.instance.violation('last-decision', `no decision about call ${callId} right after its verdict`);
      return said;
    });
    const violation = answer.guard.decision(decision);
    if (violation) throw this.violated(answer.verdict.attempt, lastOutcome, violation);
    answer.decision = boundedDecision(decision);
    return answer.decision;
  }

  /** An attempt line the wrapper writes itself (no verdict: a stop, a refusal, a broken invariant). */
  private line(attempt: number, outcome: string, action: string, reason: string, countsAsAttempt: boolean,
    extra: { escalation?: Wit.EscalationReason; invariant?: Violation['invariant'] } = {}): void {
    this.trace.emit(new AttemptEvent({
      ...this.fields(), attempt, key: this.key ?? null, outcome, class: null, rule: null, action, delayMs: null, hintMs: null,
      escalation: extra.escalation ?? null, reason, countsAsAttempt, ...(extra.invariant === undefined ? {} : { invariant: extra.invariant }),
    }));
  }

  private escalated(attempt: number, rule: string | null, escalation: Wit.Escalation, decision?: Wit.Decision): void {
    this.trace.emit(new EscalationEvent({
      ...this.fields(), attempt, rule, reason: escalation.reason, note: escalation.note, escalationValue: escalation, decision,
    }));
  }

  /** Asks the policy; if the policy itself fails, the safe fallback: no retry, an escalation saying so. */
  private policy<V>(lastOutcome: string, ask: () => V): V {
    try {
      return ask();
    } catch (e) {
      if (!(e instanceof PolicyTrap || e instanceof InstanceUnusable)) throw e;
      const note = policyFailureNote(e, this.tool, lastOutcome);
      const escalation: Wit.Escalation = { reason: 'unclassified-failure', lastError: lastOutcome, resetsInMs: undefined, effects: [], effectsTotal: 0, note };
      this.line(this.attempt, lastOutcome, 'escalate', note, this.reported < this.attempt && this.attempt > 0, { escalation: 'unclassified-failure' });
      this.reported = this.attempt;
      this.escalated(this.attempt, null, escalation);
      throw new Escalated(escalation, this.tool, e);
    }
  }

  /** A broken invariant: the call escalates as when the policy fails, and so does every later call of the run. */
  private violated(attempt: number, lastOutcome: string, violation: Violation, countsAsAttempt = false): Escalated {
    const error = new PolicyBoundaryViolation(`invariant ${violation.invariant}: ${violation.detail}`, { call: 'guard' });
    const note = policyFailureNote(error, this.tool, lastOutcome);
    const escalation: Wit.Escalation = { reason: 'unclassified-failure', lastError: lastOutcome, resetsInMs: undefined, effects: [], effectsTotal: 0, note };
    // Its line stands for the verdict it replaces: an attempt's own outcome counts as the attempt.
    this.line(attempt, lastOutcome, 'escalate', note, countsAsAttempt, { escalation: 'unclassified-failure', invariant: violation.invariant });
    this.escalated(attempt, null, escalation);
    const escalated = new Escalated(escalation, this.tool, error);
    this.state.tripped ??= escalated;
    return escalated;
  }

  private afterViolation(): Escalated {
    const first = this.state.tripped as Escalated;
    const invariant = (this.state.guard.violation as Violation).invariant;
    this.line(0, 'not sent', 'escalate', first.note, false, { escalation: 'unclassified-failure', invariant });
    this.escalated(0, null, first.escalation);
    return new Escalated(first.escalation, this.tool, first.policyFailure);
  }

  /** A call the policy did not admit: the run escalated (attempt 0, `not sent`). */
  private notAdmitted(): Escalated {
    const escalation = this.policy('not sent', () => {
      const handOff = this.run.escalation();
      if (handOff === undefined) throw this.run.instance.violation('escalation', 'a call was not admitted, and the run has no escalation');
      return boundedEscalation(handOff);
    });
    this.line(0, 'not sent', 'escalate', escalation.note, false, { escalation: escalation.reason });
    this.escalated(0, null, escalation);
    return new Escalated(escalation, this.tool);
  }

  /** The call stopped (its deadline, or the caller's signal): the run is told, one `stop` line, and the error. */
  private stopped(): CallTimedOut | CallCancelled {
    const cause = this.stopCause ?? 'cancelled';
    const callId = this.callId;
    let unknown = false;
    if (callId !== undefined) {
      try {
        this.run.abandonCall(callId, this.attempt, this.inFlight, cause === 'cancelled' ? 'cancelled' : 'deadline');
      } catch {
        // a call a verdict already ended: the stop goes on
      }
      try {
        unknown = this.run.allEffects().some((effect) => effect.callId === callId && effect.status === 'unknown');
      } catch {
        unknown = true;
      }
    }
    const writes = this.effect === 'write' || this.effect === 'delete';
    const mayHaveApplied = writes && (this.inFlight || unknown);
    const stoppedBy = cause === 'cancelled' ? 'the call was cancelled' : `the call's limit of ${this.options.callTimeoutMs} ms passed`;
    const where = this.inFlight ? `while attempt ${this.attempt} was in flight` : callId === undefined ? 'before the call was sent' : 'between attempts';
    const applied = !writes ? 'it is not a write' : mayHaveApplied ? 'the write may have been applied: check before sending it again' : 'the write was not applied';
    const reason = `${stoppedBy} ${where} (${this.attemptsSent} sent); ${applied}`;
    this.line(this.attempt, cause, 'stop', reason, callId !== undefined && this.reported < this.attempt);
    this.trace.end('stop');
    const stopped = { cause, tool: this.tool, callId, attemptsSent: this.attemptsSent, mayHaveApplied };
    return cause === 'cancelled' ? new CallCancelled(`${this.tool}: ${reason}`, stopped) : new CallTimedOut(`${this.tool}: ${reason}`, stopped);
  }
}

type Outcome =
  | { tag: 'success' }
  | { tag: 'empty-result'; val: string }
  | { tag: 'failure'; val: Wit.Observation }
  | { tag: 'status-check'; val: Wit.StatusCheckResult };

interface Answer {
  verdict: Wit.Verdict;
  guard: CallGuard;
  /** The outcome's words. */
  words: string;
  decision?: Wit.Decision;
}
