// The per-call bookkeeping every wrapper shares: the MCP `RetryingToolCaller`
// (src/mcp/caller.ts, its pseudo-calls included) and `withPolicy`
// (src/any-call.ts) make each call through one `CallCore`. So both ask the
// policy and fall back when it fails, check its verdicts with the run guard,
// wait, stop, and write their events (docs/events.md) with the same code and
// the same words. Sending, observing, sessions and tasks stay with each wrapper.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import type { Run } from './component.js';
import { boundedDecision, boundedEscalation, policyFailureNote } from './decisions.js';
import type { EntropySource } from './entropy.js';
import {
  AttemptEvent, BreakerEvent, EscalationEvent, ReplanEvent, ResumeEvent, StatusCheckEvent, TaskPollEvent, WaitEvent, type CallFields, type WaitWhy,
} from './events.js';
import {
  CallCancelled, CallTimedOut, Escalated, InstanceUnusable, PolicyBoundaryViolation, PolicyTrap, type StopCause,
} from './errors.js';
import type { CallGuard, Invariant, RunGuard, Violation } from './guard.js';
import type { CallTrace } from './telemetry.js';
import { stopReason, type StopApplied, type StopWhere } from './stop-reason.js';
import { longTimeout } from './timers.js';

/** What a status check answers: `found`, `absent` or `unknown`; any other string reads as `unknown`
 *  (typed so that `async () => 'absent'` needs no `as const`). */
export type StatusCheckAnswer = Wit.StatusCheckResult | (string & Record<never, never>);

/** What one attempt (or status check, or poll) is reported as. */
export type Outcome =
  | { tag: 'success' }
  | { tag: 'empty-result'; val: string }
  | { tag: 'failure'; val: Wit.Observation }
  | { tag: 'status-check'; val: Wit.StatusCheckResult }
  | { tag: 'task'; val: Wit.TaskReport }
  | { tag: 'poll-failure'; val: Wit.Observation };

/** An outcome (or a failure's observation) in the words of docs/events.md,
 *  the same in every host and every wrapper: `success`, `empty result`,
 *  `http 503`, `transport timeout`, `json-rpc -32603`, `tool error`, `input
 *  required`, `status check found`, `task working`, `poll failed: http 503`. */
export function outcomeWords(outcome: Outcome | Wit.Observation): string {
  if ('kind' in outcome) return failureWords(outcome);
  switch (outcome.tag) {
    case 'success': return 'success';
    case 'empty-result': return 'empty result';
    case 'failure': return failureWords(outcome.val);
    case 'status-check': return `status check ${outcome.val}`;
    case 'task': return `task ${outcome.val.status}`;
    case 'poll-failure': return `poll failed: ${failureWords(outcome.val)}`;
  }
}

function failureWords(observation: Wit.Observation): string {
  const kind = observation.kind;
  switch (kind.tag) {
    case 'http-status': return `http ${kind.val}`;
    case 'transport': return `transport ${kind.val}`;
    case 'protocol-error': return `json-rpc ${kind.val}`;
    case 'tool-error': return 'tool error';
    case 'input-required': return 'input required';
  }
}

/** Thrown inside a call when it must stop; the wrapper turns it into `CallTimedOut` or `CallCancelled`. */
export class StopNow extends Error {
  /** `ended`: a pseudo-call (`initialize`, `tools/list`) in progress that this stop ended, and its error. */
  constructor(readonly stopCause: StopCause, readonly ended?: { tool: string; error: CallTimedOut | CallCancelled }) {
    super(stopCause);
  }
}

/** A call's deadline on its scope's clock, and what passing it means. */
export interface Deadline {
  at: number;
  cause: 'call-timeout' | 'run-timeout';
  /** The limit as given (ms), for the stop's message. */
  limitMs: number | undefined;
}

export interface ScopeOptions {
  /** The clock the deadline is on (ms). */
  now: () => number;
  deadline?: Deadline;
  /** Whether a timer stops the call at the deadline (real time); without it (a fake clock) it is checked at each wait. */
  timer: boolean;
  /** Stops the call at once when aborted. */
  signal?: AbortSignal;
  /** A wait of the wrapper's own clock; none (or undefined returned): a real timer. */
  sleep?: (ms: number) => Promise<void> | undefined;
}

/** A call's stop: its signal, what stopped it, its deadline, and waits that end when it stops. */
export class CallScope {
  private readonly controller = new AbortController();
  private cancelTimer?: () => void;
  private unlisten?: () => void;
  cause?: StopCause;

  constructor(private readonly options: ScopeOptions) {
    const deadline = options.deadline;
    if (deadline && options.timer) {
      const left = deadline.at - options.now();
      if (left <= 0) this.stop(deadline.cause);
      else this.cancelTimer = longTimeout(left, () => this.stop(deadline.cause));
    }
    const signal = options.signal;
    if (signal?.aborted) {
      this.stop('cancelled');
    } else if (signal) {
      const onAbort = () => this.stop('cancelled');
      signal.addEventListener('abort', onAbort, { once: true });
      this.unlisten = () => signal.removeEventListener('abort', onAbort);
    }
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get limitMs(): number | undefined {
    return this.options.deadline?.limitMs;
  }

  stop(cause: StopCause): void {
    if (this.cause) return;
    this.cause = cause;
    this.controller.abort(new StopNow(cause));
  }

  check(): void {
    if (this.cause) throw new StopNow(this.cause);
  }

  /** Resolves as `promise` does, or rejects with `StopNow` the moment the call stops. */
  race<T>(promise: Promise<T>): Promise<T> {
    promise.catch(() => undefined); // what loses the race is not an unhandled rejection
    if (this.cause) return Promise.reject(new StopNow(this.cause));
    const signal = this.signal;
    // A fake clock does not move while a promise hangs: the time left on it runs as real time (as Python's helper waits).
    const deadline = this.options.deadline;
    const cancelTimer = deadline && !this.options.timer
      ? longTimeout(deadline.at - this.options.now(), () => this.stop(deadline.cause)) : undefined;
    return new Promise<T>((resolve, reject) => {
      const done = () => { cancelTimer?.(); signal.removeEventListener('abort', onAbort); };
      const onAbort = () => { done(); reject(new StopNow(this.cause ?? 'cancelled')); };
      signal.addEventListener('abort', onAbort, { once: true });
      promise.then(
        (value) => { done(); resolve(value); },
        (error) => { done(); reject(error); },
      );
    });
  }

  /** Stops the call if its deadline passed (without a timer, a fake clock's, it is seen before each attempt). */
  checkDeadline(): void {
    const deadline = this.options.deadline;
    if (deadline && this.options.now() >= deadline.at) this.stop(deadline.cause);
    this.check();
  }

  /** Waits `ms`, unless that would end past the deadline (then the call stops now) or the call stops first. */
  async pause(ms: number): Promise<void> {
    this.check();
    if (ms <= 0) return;
    const deadline = this.options.deadline;
    if (deadline && this.options.now() + ms > deadline.at) this.stop(deadline.cause);
    this.check();
    const custom = this.options.sleep?.(ms);
    if (custom) return this.race(custom);
    const signal = this.signal;
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => { cancel(); reject(new StopNow(this.cause ?? 'cancelled')); };
      const cancel = longTimeout(ms, () => { signal.removeEventListener('abort', onAbort); resolve(); });
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** The time left to the deadline, in ms (0 once it passed), or undefined without one. */
  timeLeftMs(): bigint | undefined {
    const deadline = this.options.deadline;
    if (deadline === undefined) return undefined;
    const left = Math.floor(deadline.at - this.options.now());
    return left > 0 ? BigInt(left) : 0n;
  }

  dispose(): void {
    this.cancelTimer?.();
    this.unlisten?.();
  }
}

/** The guard of a run, and the escalation of the call that broke one of its invariants (every later call ends with it). */
export interface RunState {
  guard: RunGuard;
  tripped?: Escalated;
}

/** The policy's answer to one report: its verdict, and its decision in words once asked for. */
export interface Answer {
  callId: number;
  attempt: number;
  verdict: Wit.Verdict;
  /** The call's guard, which saw the verdict and checks the words. */
  guard: CallGuard;
  /** The reported outcome's words. */
  words: string;
  decision?: Wit.Decision;
}

export interface CallCoreOptions {
  run: Run;
  /** The tool, the pseudo-tool (`initialize`, `tools/list`), or the name given to `withPolicy`. */
  tool: string;
  /** The server's name for the circuit breakers (contract 0.8.0); undefined: no breaker applies. */
  server?: string;
  /** The N of `step-N`; null for a pseudo-call. */
  step: number | null;
  /** Which policy decides (logged as `policy`). */
  policy: string;
  trace: CallTrace;
  runState: RunState;
  scope: CallScope;
  entropy: EntropySource;
  /** The time the policy is told (ms since the Unix epoch). */
  policyNow: () => bigint | number;
}

/** One call of the policy: where it is, and everything it reports, asks and emits. */
export class CallCore {
  readonly run: Run;
  readonly tool: string;
  readonly scope: CallScope;
  readonly trace: CallTrace;
  key?: string;
  callId?: number;
  effect?: Wit.Effect;
  /** The attempt planned (sent, or to be sent after a wait); 0 before the call was admitted. */
  attempt = 0;
  /** The highest attempt whose own outcome was reported (the run report counted every attempt planned). */
  reported = 0;
  /** An attempt of the call is out. */
  inFlight = false;
  attemptsSent = 0;

  constructor(private readonly o: CallCoreOptions) {
    this.run = o.run;
    this.tool = o.tool;
    this.scope = o.scope;
    this.trace = o.trace;
  }

  fields(): CallFields {
    return { ts: wallSeconds(), run: this.run.runId, policy: this.o.policy, step: this.o.step, call: this.callId ?? null, tool: this.tool };
  }

  /** Asks the policy; if the policy itself fails, the safe fallback: no retry,
   *  an escalation whose note says so (and what the last attempt saw). */
  ask<V>(lastOutcome: string, ask: () => V): V {
    try {
      return ask();
    } catch (e) {
      if (!(e instanceof PolicyTrap || e instanceof InstanceUnusable)) throw e;
      const note = policyFailureNote(e, this.tool, lastOutcome);
      const escalation: Wit.Escalation = { reason: 'unclassified-failure', lastError: lastOutcome, resetsInMs: undefined, effects: [], effectsTotal: 0, note };
      this.line(this.attempt, lastOutcome, 'escalate', note, this.attempt > 0 && this.reported < this.attempt, { escalation: 'unclassified-failure' });
      this.reported = Math.max(this.reported, this.attempt);
      this.escalated(this.attempt, null, escalation);
      throw new Escalated(escalation, this.tool, e);
    }
  }

  /** A call after the run broke an invariant ends at once, with the same escalation. */
  checkTripped(): void {
    const first = this.o.runState.tripped;
    if (first === undefined) return;
    const invariant = (this.o.runState.guard.violation as Violation).invariant;
    this.line(0, 'not sent', 'escalate', first.note, false, { escalation: 'unclassified-failure', invariant });
    this.escalated(0, null, first.escalation);
    throw new Escalated(first.escalation, this.tool, first.policyFailure);
  }

  /** The call's idempotency key, derived once from the run and `actionId`. */
  deriveKey(actionId: string): string {
    this.key = this.ask('not sent', () => this.run.instance.deriveIdempotencyKey(this.run.runId, actionId));
    return this.key;
  }

  /** The call's idempotency key as the application gave it (already in the
   *  arguments): kept as it is, the key `begin` tells the policy and the guard. */
  keepKey(key: string): string {
    this.key = key;
    return key;
  }

  /** Begins the call (`beginCall`, checked by the guard) and waits its admission
   *  delay; rejects with `Escalated` if it was not admitted. A call a circuit
   *  breaker refused as a replan (`replan`, contract 0.8.0) is over, nothing
   *  sent: its lines are written and the policy's message is returned (the
   *  wrapper ends the call as for a replan verdict). */
  async begin(hints: Wit.ToolHints | undefined): Promise<Begun> {
    const start = this.ask('not sent', () => this.run.beginCall(this.o.server, this.tool, this.key, hints, this.o.policyNow()));
    // A breaker change at the start (a probe let through) is the call's: its id when it has one.
    if (start.callId !== 0) this.callId = start.callId;
    if (start.breakerChanged) this.breakerChanges('not sent');
    if (!start.admitted && start.replan) return { replan: this.refusedAsReplan(start) };
    if (!start.admitted) throw this.notAdmitted();
    this.callId = start.callId;
    this.effect = start.effect;
    this.attempt = 1; // a stop during the admission wait abandons the call at its first attempt
    const begun = this.o.runState.guard.begin(this.tool, this.key, hints, start.delayMs);
    // The run counted the admitted call's first attempt: so does this line (attempt 0: never sent).
    if (begun.violation) throw this.violated(0, 'not sent', begun.violation, true);
    await this.wait('admission', 1, start.delayMs, undefined);
    return { start, guard: begun.call };
  }

  /** The call a resumed run names (contract 0.9.0, `run.resumed-call`): where
   *  it is (its id, key and attempt), and its `agent_retry.resume` event.
   *  `answer`: the person's answer's kind. */
  resumedFrom(call: Wit.ResumedCall, answer: ResumeEventAnswer): void {
    this.callId = call.callId;
    this.key = call.idempotencyKey;
    this.attempt = call.attempt;
    this.reported = Math.max(0, call.attempt - 1);
    this.trace.emit(new ResumeEvent({ ...this.fields(), attempt: call.attempt, answer, action: call.action }));
  }

  /** A resumed call whose next attempt is to be sent (`send`): the run-time
   *  guard registers it as it registers a begun call (the same key, no hints,
   *  the ticket's delay), and the ticket's delay (the account budget's) is
   *  waited. From here the call goes on as any call from attempt `call.attempt`. */
  async resumeSend(call: Wit.ResumedCall, ticket: Wit.CallStart): Promise<Begun> {
    this.effect = ticket.effect;
    const begun = this.o.runState.guard.begin(this.tool, this.key, undefined, ticket.delayMs);
    // The resumed run counted the attempt to send: so does this line (attempt 0: never sent).
    if (begun.violation) throw this.violated(0, 'not sent', begun.violation, true);
    await this.wait('admission', call.attempt, ticket.delayMs, undefined);
    return { start: ticket, guard: begun.call };
  }

  /** A resumed call that ends as a replan (`skip`): its replan event, and the
   *  message for the model (`lastDecision(callId)`'s). */
  resumedReplan(call: Wit.ResumedCall): string {
    const decision = this.ask('not sent', () => {
      const said = this.run.lastDecision(call.callId);
      if (said === undefined || said.action.tag !== 'replan') {
        throw this.run.instance.violation('last-decision', `resumed call ${call.callId} is a replan, its last decision says ${said?.action.tag ?? 'nothing'}`);
      }
      return boundedDecision(said);
    });
    const message = decision.action.tag === 'replan' ? decision.action.val : '';
    this.trace.emit(new ReplanEvent({ ...this.fields(), attempt: call.attempt, rule: decision.rule, message, decision }));
    return message;
  }

  /** A resumed run that escalated again (`abort`, or the account budget
   *  refused the retry): its escalation event, and the error to throw. */
  resumedEscalation(call: Wit.ResumedCall): Escalated {
    const escalation = this.ask('not sent', () => {
      const handOff = this.run.escalation();
      if (handOff === undefined) throw this.run.instance.violation('escalation', `resumed call ${call.callId} escalates, and the run has no escalation`);
      return boundedEscalation(handOff);
    });
    const said = this.ask('not sent', () => this.run.lastDecision(call.callId));
    const decision = said === undefined ? undefined : boundedDecision(said);
    this.escalated(call.attempt, decision?.rule ?? null, escalation, decision);
    return new Escalated(escalation, this.tool);
  }

  /** Attempt `attempt` is about to be sent. */
  sending(attempt: number): void {
    this.attempt = attempt;
    this.attemptsSent += 1;
    this.inFlight = true;
    this.trace.startAttempt(attempt);
  }

  /** A call a circuit breaker refused before it was sent, as a replan: its
   *  attempt line (attempt 0, `not sent`, action `replan`, rule
   *  `circuit-open`) and its replan event; the message for the model. */
  private refusedAsReplan(start: Wit.CallStart): { message: string; rule: string } {
    const callId = start.callId;
    const decision = this.ask('not sent', () => {
      const said = callId === 0 ? undefined : this.run.lastDecision(callId);
      if (said === undefined) throw this.run.instance.violation('last-decision', `no decision about call ${callId}, which begin-call refused as a replan`);
      if (said.action.tag !== 'replan') {
        throw this.run.instance.violation('last-decision', `begin-call refused call ${callId} as a replan, its decision says ${said.action.tag}`);
      }
      return boundedDecision(said);
    });
    this.callId = callId;
    const message = decision.action.tag === 'replan' ? decision.action.val : '';
    this.trace.emit(new AttemptEvent({
      ...this.fields(), attempt: 0, key: this.key ?? null, outcome: 'not sent', class: null, rule: decision.rule, action: 'replan',
      delayMs: null, hintMs: null, escalation: null, reason: decision.reason, decision, countsAsAttempt: false,
    }));
    this.trace.emit(new ReplanEvent({ ...this.fields(), attempt: 0, rule: decision.rule, message, decision }));
    return { message, rule: decision.rule };
  }

  /** The circuit breakers' changes the last `beginCall` or report made (asked
   *  right away when it said there are some): an `agent_retry.breaker` event each. */
  breakerChanges(lastOutcome: string): void {
    const changes = this.ask(lastOutcome, () => this.run.takeBreakerChanges());
    for (const change of changes) {
      this.trace.emit(new BreakerEvent({
        ...this.fields(), server: change.server, scope: change.tool === undefined ? 'server' : 'tool', from: change.oldState, to: change.newState,
        untilMs: change.untilMs === undefined ? null : Number(change.untilMs), why: change.why,
      }));
    }
  }

  /** Reports one outcome of attempt `attempt`, checks the verdict with the
   *  guard (before anything acts on it, a hook included) and emits its attempt
   *  event. `ownOutcome`: the attempt's own outcome (not a status check's or a poll's). */
  record(attempt: number, outcome: Outcome, guard: CallGuard, ownOutcome: boolean,
    seen: { onVerdict?: (verdict: Wit.Verdict) => void; reasonSuffix?: string } = {}): Answer {
    const { run, scope } = this;
    const callId = this.callId as number;
    const words = outcomeWords(outcome);
    const now = this.o.policyNow();
    const verdict = this.reporting(attempt, words, () => this.ask(words, () => {
      switch (outcome.tag) {
        case 'success': return run.recordSuccess(callId, attempt, now);
        case 'empty-result': return run.recordEmptyResult(callId, attempt, outcome.val, now);
        case 'failure': return run.recordFailure(callId, attempt, outcome.val, scope.timeLeftMs(), now, this.o.entropy.nextU64());
        case 'status-check': return run.recordStatusCheck(callId, attempt, outcome.val, scope.timeLeftMs(), now, this.o.entropy.nextU64());
        case 'task': return run.recordTaskStatus(callId, attempt, outcome.val, scope.timeLeftMs(), now, this.o.entropy.nextU64());
        case 'poll-failure': return run.recordPollFailure(callId, attempt, outcome.val, scope.timeLeftMs(), now, this.o.entropy.nextU64());
      }
    }));
    const counts = ownOutcome && this.reported < attempt;
    if (ownOutcome) this.reported = Math.max(this.reported, attempt);
    if (verdict.breakerChanged) this.breakerChanges(words);
    const violation = guard.verdict(verdict);
    if (violation) throw this.violated(attempt, words, violation, counts);
    const answer: Answer = { callId, attempt, verdict, guard, words };
    seen.onVerdict?.(verdict);
    // The line's reason is the decision's prose: asked for only when a line is written or a hook is set.
    const decision = this.trace.telemetry.wantsWords ? this.words(answer) : undefined;
    const next = decision?.action;
    this.trace.emit(new AttemptEvent({
      ...this.fields(), attempt, key: this.key ?? null, outcome: words, class: verdict.class,
      rule: decision?.rule ?? run.instance.ruleNames()[verdict.ruleIndex] ?? null, action: verdict.action,
      delayMs: verdict.action === 'retry' || verdict.action === 'poll' ? Number(verdict.delayMs) : null,
      hintMs: verdict.hintMs === undefined ? null : Number(verdict.hintMs),
      escalation: next?.tag === 'escalate' ? next.val.reason : null,
      reason: decision === undefined ? '' : `${decision.reason}${seen.reasonSuffix ?? ''}`, decision, countsAsAttempt: counts,
    }));
    return answer;
  }

  /** Reports through `report`; what it throws other than the policy's failure
   *  (a malformed observation, the caller's bug) abandons the call, and is thrown as it is. */
  private reporting(attempt: number, words: string, report: () => Wit.Verdict): Wit.Verdict {
    try {
      return report();
    } catch (e) {
      if (!(e instanceof Escalated)) this.abandonUnknown(attempt, e, `${errorName(e)} thrown reporting the call's outcome (${words})`);
      throw e;
    }
  }

  /** An error no mapping knows (a bug in the caller's code): the call is
   *  abandoned (its attempt as sent: a write may have left, cancelled) and its
   *  `unmapped error` stop line says so; the caller throws the error unchanged. */
  abandonUnknown(attempt: number, error: unknown, what: string): void {
    this.inFlight = false;
    if (this.callId !== undefined) {
      try {
        this.run.abandonCall(this.callId, attempt, true, 'cancelled');
      } catch {
        // the run cannot be told more
      }
    }
    this.line(attempt, 'unmapped error', 'stop', `${what}: thrown to the caller unchanged; the call is abandoned`, this.reported < attempt);
    this.reported = Math.max(this.reported, attempt);
  }

  /** The answer's decision in full (`lastDecision`), asked once, its texts cut;
   *  it must say what the verdict said (the guard): the words never change what is done. */
  words(answer: Answer): Wit.Decision {
    if (answer.decision) return answer.decision;
    const callId = answer.callId;
    const decision = this.ask(answer.words, () => {
      const said = this.run.lastDecision(callId);
      if (said === undefined) throw this.run.instance.violation('last-decision', `no decision about call ${callId} right after its verdict`);
      return said;
    });
    const violation = answer.guard.decision(decision);
    if (violation) throw this.violated(answer.attempt, answer.words, violation);
    answer.decision = boundedDecision(decision);
    return answer.decision;
  }

  /** Runs the wrapper's status check (none: `unknown`, the policy escalates
   *  rather than risk a second write), a plain function or an async one,
   *  bounded by the call's deadline; one that throws (anything) or answers
   *  anything else is `unknown`. */
  async checkStatus(check: (() => unknown) | undefined): Promise<Wit.StatusCheckResult> {
    if (!check) return 'unknown';
    try {
      // `then` runs a plain function's throw into the promise; a thenable's answer is awaited.
      const found = await this.scope.race(Promise.resolve().then(check));
      return found === 'found' || found === 'absent' || found === 'unknown' ? found : 'unknown';
    } catch (e) {
      if (e instanceof StopNow) throw e;
      this.trace.telemetry.line({
        event: 'agent_retry.status_check_failed', ts: wallSeconds(), run: this.run.runId, policy: this.o.policy, tool: this.tool, error: String(e),
      });
      return 'unknown';
    }
  }

  /** A status check answered: its event, the guard told, and its report. */
  statusChecked(attempt: number, guard: CallGuard, checkTool: string | null, result: Wit.StatusCheckResult): Answer {
    this.trace.emit(new StatusCheckEvent({ ...this.fields(), attempt, checkTool, result }));
    guard.statusChecked(result);
    return this.record(attempt, { tag: 'status-check', val: result }, guard, false);
  }

  /** A task's status was read. */
  taskPolled(attempt: number, taskId: string, status: string): void {
    this.trace.emit(new TaskPollEvent({ ...this.fields(), attempt, taskId, status }));
  }

  /** A wait event (when there is a wait) and the wait. */
  async wait(why: WaitWhy, attempt: number, delayMs: bigint | number, hintMs: bigint | number | undefined, decision?: Wit.Decision): Promise<void> {
    this.scope.check();
    const ms = Number(delayMs);
    if (ms > 0) this.trace.emit(new WaitEvent({ ...this.fields(), attempt, why, waitMs: ms, hintMs: hintMs === undefined ? null : Number(hintMs), decision }));
    await this.scope.pause(ms);
  }

  /** A `replan` answer: its event, and the policy's message for the model. */
  replan(answer: Answer): string {
    const decision = this.words(answer);
    const message = decision.action.tag === 'replan' ? decision.action.val : '';
    this.trace.emit(new ReplanEvent({ ...this.fields(), attempt: answer.attempt, rule: decision.rule, message, decision }));
    return message;
  }

  /** An `escalate` answer: its event, and the error to throw. */
  escalate(answer: Answer): Escalated {
    const decision = this.words(answer);
    const action = decision.action;
    const escalation = action.tag === 'escalate' ? action.val : this.ask(answer.words, () => {
      throw this.run.instance.violation('last-decision', `the verdict said escalate, the decision ${action.tag}`);
    });
    this.escalated(answer.attempt, decision.rule, escalation, decision);
    return new Escalated(escalation, this.tool);
  }

  /** A `poll` verdict for a call without a task: the policy broke its contract (the safe fallback). */
  noTask(answer: Answer): never {
    return this.ask(answer.words, () => {
      throw this.run.instance.violation('record', `a poll verdict for call ${answer.callId} (${this.tool}), which has no task`);
    });
  }

  /** An attempt event the wrapper writes itself (no verdict: a stop, a refusal, a broken invariant). */
  line(attempt: number, outcome: string, action: string, reason: string, countsAsAttempt: boolean,
    extra: { escalation?: Wit.EscalationReason; invariant?: Invariant } = {}): void {
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

  /** A broken invariant: the call escalates as when the policy fails, its line
   *  names the invariant, and every later call of the run ends the same way. */
  violated(attempt: number, lastOutcome: string, violation: Violation, countsAsAttempt = false): Escalated {
    const error = new PolicyBoundaryViolation(`invariant ${violation.invariant}: ${violation.detail}`, { call: 'guard' });
    const note = policyFailureNote(error, this.tool, lastOutcome);
    const escalation: Wit.Escalation = { reason: 'unclassified-failure', lastError: lastOutcome, resetsInMs: undefined, effects: [], effectsTotal: 0, note };
    // Its line stands for the verdict it replaces: an attempt's own outcome counts as the attempt.
    this.line(attempt, lastOutcome, 'escalate', note, countsAsAttempt, { escalation: 'unclassified-failure', invariant: violation.invariant });
    this.escalated(attempt, null, escalation);
    const escalated = new Escalated(escalation, this.tool, error);
    this.o.runState.tripped ??= escalated;
    return escalated;
  }

  /** A call the policy did not admit: the run escalated (attempt 0, `not sent`). */
  private notAdmitted(): Escalated {
    const escalation = this.ask('not sent', () => {
      const handOff = this.run.escalation();
      if (handOff === undefined) throw this.run.instance.violation('escalation', 'a call was not admitted, and the run has no escalation');
      return boundedEscalation(handOff);
    });
    this.line(0, 'not sent', 'escalate', escalation.note, false, { escalation: escalation.reason });
    this.escalated(0, null, escalation);
    return new Escalated(escalation, this.tool);
  }

  /** The call stopped (a deadline, or the caller's signal): the run is told
   *  first (so a write on the wire, or a live task, is listed as possibly
   *  applied), one `stop` line, and the error that says what may have happened. */
  stopped(liveTask = false, during?: string): CallTimedOut | CallCancelled {
    const cause = this.scope.cause ?? 'cancelled';
    const callId = this.callId;
    let unknown = false;
    if (callId !== undefined) {
      try {
        this.run.abandonCall(callId, this.attempt, this.inFlight || liveTask, cause === 'cancelled' ? 'cancelled' : 'deadline');
      } catch {
        // a call a verdict already ended, or a failed policy: the stop goes on
      }
      try {
        unknown = this.run.allEffects().some((effect) => effect.callId === callId && effect.status === 'unknown');
      } catch {
        unknown = true; // the policy cannot say: assume the worst
      }
    }
    const writes = this.effect === 'write' || this.effect === 'delete';
    const mayHaveApplied = writes && (this.inFlight || liveTask || unknown);
    // docs/events.md, "Stop reasons": where the call was, and what is known of its effect
    // (a call never begun has no effect the policy named: nothing of it left).
    const where: StopWhere = this.inFlight ? 'in-flight' : this.attemptsSent === 0 ? 'before-send' : 'between-attempts';
    const applied: StopApplied = callId === undefined ? 'nothing-sent' : !writes ? 'not-a-write'
      : mayHaveApplied ? 'may-have-applied' : 'not-applied';
    const limitMs = this.scope.limitMs;
    const reason = stopReason({
      cause, limitMs: cause === 'cancelled' || limitMs === undefined ? null : Math.round(limitMs), where,
      attempt: where === 'in-flight' ? this.attempt : null, during: where === 'before-send' ? during ?? null : null,
      attemptsSent: this.attemptsSent, applied,
    });
    // The attempt planned and never answered is one the run report counted.
    this.line(this.attempt, cause, 'stop', reason, callId !== undefined && this.reported < this.attempt);
    const stopped = { cause, tool: this.tool, callId, attemptsSent: this.attemptsSent, mayHaveApplied };
    return cause === 'cancelled' ? new CallCancelled(`${this.tool}: ${reason}`, stopped) : new CallTimedOut(`${this.tool}: ${reason}`, stopped);
  }
}

/** A person's answer, as the `agent_retry.resume` event says it. */
export type ResumeEventAnswer = 'retry' | 'done' | 'skip' | 'abort';

/** What `CallCore.begin` gives: the admitted call's start and guard, or the
 *  message of a call a circuit breaker refused as a replan (nothing was sent). */
export type Begun = { start: Wit.CallStart; guard: CallGuard; replan?: undefined } | { replan: { message: string; rule: string } };

/** An event's `ts`: the wall clock's Unix seconds (docs/events.md), whatever clock the wrapper's waits and the policy are on. */
function wallSeconds(): number {
  return Date.now() / 1000;
}

/** An error's name for a line: its class's, or its type's (anything can be thrown). */
export function errorName(error: unknown): string {
  // The class's own name: a subclass that does not set `name` still says what it is.
  return error instanceof Error ? error.constructor.name || error.name : error === null ? 'null' : typeof error;
}
