// The run-time guard: the few invariants no policy may break, enforced by the
// wrapper from what it knows itself (the configuration text it holds, the
// hints it passed, what it sent and saw), never from the component's answers
// about itself. Pure: no I/O, no clock; the same rules as the Rust and Python
// hosts' guards, proven by tests/vectors/guard/guard.json.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import * as Defaults from './config-defaults.js';

/** What the guard enforces (kebab-case in vectors and log lines). */
export type Invariant =
  | 'client-error-repeated'
  | 'unknown-write-resent'
  | 'key-changed'
  | 'delay-over-cap'
  | 'attempts-over-budget'
  | 'verdict-disagrees';

/** A broken invariant, with one short sentence that gives the numbers. */
export interface Violation {
  invariant: Invariant;
  detail: string;
}

/** The HTTP answers a request must not be repeated after as it was. */
const CLIENT_ERROR_STATUSES = new Set([400, 401, 403, 404, 409, 422]);
/** The JSON-RPC errors that say the request itself is wrong. */
const CLIENT_ERROR_CODES = new Set([-32600, -32601, -32602]);

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** A cap read from the configuration: a non-negative integer, else the default
 *  (the policy refuses such a configuration at load; the guard never throws). */
function cap(config: Json, name: string, fallback: number): bigint {
  const value = config[name];
  return typeof value === 'number' && Number.isInteger(value) && value >= 0 ? BigInt(value) : BigInt(fallback);
}

/** The caps and tool facts the guard reads from the host's configuration. */
class Limits {
  readonly maxDelayMs: bigint;
  readonly maxHintMs: bigint;
  readonly maxAttemptsPerCall: bigint;
  readonly maxRetriesPerRun: bigint;
  readonly maxStepsPerRun: bigint;
  readonly taskPollMaxDelayMs: bigint;
  /** `account-budget.max-wait-ms`; 0 without an account budget. */
  readonly accountWaitMs: bigint;
  readonly defaultEffect: Wit.Effect;
  /** Statuses `status-overrides` makes retryable (transient or throttled). */
  readonly retryableStatuses: Set<number>;
  readonly tools: Json;

  constructor(config: Json) {
    this.maxDelayMs = cap(config, 'max-delay-ms', Defaults.MAX_DELAY_MS);
    this.maxHintMs = cap(config, 'max-hint-ms', Defaults.MAX_HINT_MS);
    this.maxAttemptsPerCall = cap(config, 'max-attempts-per-call', Defaults.MAX_ATTEMPTS_PER_CALL);
    this.maxRetriesPerRun = cap(config, 'max-retries-per-run', Defaults.MAX_RETRIES_PER_RUN);
    this.maxStepsPerRun = cap(config, 'max-steps-per-run', Defaults.MAX_STEPS_PER_RUN);
    this.taskPollMaxDelayMs = cap(config, 'task-poll-max-delay-ms', Defaults.TASK_POLL_MAX_DELAY_MS);
    const account = config['account-budget'];
    this.accountWaitMs = isObject(account) ? cap(account, 'max-wait-ms', Defaults.MAX_WAIT_MS) : 0n;
    const effect = config['default-effect'];
    this.defaultEffect = effect === 'read' || effect === 'write' || effect === 'delete' ? effect : Defaults.DEFAULT_EFFECT as Wit.Effect;
    this.retryableStatuses = new Set();
    const overrides = config['status-overrides'];
    if (isObject(overrides)) {
      for (const [status, cls] of Object.entries(overrides)) {
        if ((cls === 'transient' || cls === 'throttled') && /^\d{3}$/.test(status)) this.retryableStatuses.add(Number(status));
      }
    }
    this.tools = isObject(config.tools) ? config.tools : {};
  }

  /** Whether a call may not be sent twice: a non-idempotent write without a
   *  key (the guest's `tool_policy`/`effect_from_hints`, from the host's facts). */
  unkeyedWrite(tool: string, key: string | undefined, hints: Wit.ToolHints | undefined): boolean {
    if (key !== undefined) return false;
    const entry = Object.prototype.hasOwnProperty.call(this.tools, tool) ? this.tools[tool] : undefined;
    let effect: Wit.Effect;
    let idempotent: boolean;
    if (isObject(entry) && 'effect' in entry) {
      effect = entry.effect === 'read' || entry.effect === 'delete' ? entry.effect : 'write';
      idempotent = entry.idempotent === true;
    } else if (isObject(entry) && ('readOnlyHint' in entry || 'destructiveHint' in entry || 'idempotentHint' in entry)) {
      effect = entry.readOnlyHint === true ? 'read' : 'write';
      idempotent = entry.readOnlyHint === true || entry.idempotentHint === true;
    } else if (hints !== undefined) {
      effect = hints.readOnly === true ? 'read' : this.defaultEffect === 'read' ? 'write' : this.defaultEffect;
      idempotent = hints.readOnly === true || hints.idempotent === true;
    } else {
      effect = this.defaultEffect;
      idempotent = false;
    }
    return effect === 'write' && !idempotent;
  }
}

/** The facts of the attempt last sent, as the wrapper observed them. */
interface AttemptFacts {
  status?: number;
  code?: number;
  /** A client error (above) the configuration does not make retryable. */
  clientError: boolean;
  /** No answer, and the request may have reached the server. */
  outcomeUnknown: boolean;
  sessionIdSent: boolean;
}

/** What a verdict says, as the guard reads it. */
export type VerdictFacts = Pick<Wit.Verdict, 'action' | 'delayMs' | 'hintMs' | 'reconnect'>;

/** The run's guard: built once per wrapper run from the configuration text the
 *  host holds (never the component's `effective-config`). */
export class RunGuard {
  private readonly limits: Limits;
  /** Attempts sent and status checks made in the run. */
  steps = 0n;
  /** Retries the guard let through in the run. */
  retries = 0n;
  /** The first violation of the run: the rest of the run escalates with it. */
  violation?: Violation;

  /** `config`: the configuration text (or its parsed JSON). Text that does not
   *  parse is the defaults (the policy would have refused it). */
  constructor(config: unknown = '{}') {
    let parsed: unknown = config;
    if (typeof config === 'string') {
      try {
        parsed = JSON.parse(config);
      } catch {
        parsed = {};
      }
    }
    this.limits = new Limits(isObject(parsed) ? parsed : {});
  }

  /** The policy admitted a call whose first send waits `startDelayMs`. */
  begin(tool: string, key: string | undefined, hints: Wit.ToolHints | undefined, startDelayMs: bigint): { call: CallGuard; violation?: Violation } {
    const call = new CallGuard(this, this.limits, key, this.limits.unkeyedWrite(tool, key, hints));
    const limits = this.limits;
    let violation: Violation | undefined;
    if (startDelayMs > limits.accountWaitMs) {
      violation = { invariant: 'delay-over-cap', detail: `a first send after ${startDelayMs} ms; the account wait cap is ${limits.accountWaitMs} ms` };
    } else if (this.steps >= limits.maxStepsPerRun) {
      violation = { invariant: 'attempts-over-budget', detail: `a call begun after ${this.steps} steps; max-steps-per-run is ${limits.maxStepsPerRun}` };
    }
    return { call, violation: this.note(violation) };
  }

  /** Keeps the run's first violation; returns `violation`. */
  note(violation: Violation | undefined): Violation | undefined {
    if (violation !== undefined) this.violation ??= violation;
    return violation;
  }
}

/** One call's guard: its attempts, what the last one saw, and its last verdict. */
export class CallGuard {
  private attempts = 0n;
  private last?: AttemptFacts;
  /** An unkeyed write whose outcome is unknown, and no status check said absent. */
  private maybeApplied = false;
  /** A status check found the write applied. */
  private applied = false;
  /** Reconnecting retries after a client error sent without a session id. */
  private blindReconnects = 0;
  private lastVerdict?: VerdictFacts;

  constructor(private readonly run: RunGuard, private readonly limits: Limits, private readonly key: string | undefined,
    private readonly unkeyedWrite: boolean) {}

  /** An attempt was sent and its outcome observed: `failure` is what failed,
   *  undefined for a tool result (a success, an empty result, a task). */
  attempted(failure: Wit.Observation | undefined): void {
    this.run.steps += 1n;
    this.attempts += 1n;
    const kind = failure?.kind;
    const status = kind?.tag === 'http-status' ? kind.val : undefined;
    const code = kind?.tag === 'protocol-error' ? kind.val : undefined;
    const clientError = (status !== undefined && CLIENT_ERROR_STATUSES.has(status) && !this.limits.retryableStatuses.has(status))
      || (code !== undefined && CLIENT_ERROR_CODES.has(code));
    const answered = kind?.tag !== 'transport';
    const outcomeUnknown = !answered && failure?.delivery !== 'not-sent' && kind?.val !== 'connection-refused';
    this.last = { status, code, clientError, outcomeUnknown, sessionIdSent: failure?.sessionIdSent === true };
    if (outcomeUnknown && this.unkeyedWrite) this.maybeApplied = true;
  }

  /** A status check answered: one step; `absent` clears "maybe applied", `found` marks the call applied. */
  statusChecked(result: Wit.StatusCheckResult): void {
    this.run.steps += 1n;
    if (result === 'absent') this.maybeApplied = false;
    if (result === 'found') this.applied = true;
  }

  /** A verdict, before the wrapper acts on it. */
  verdict(verdict: VerdictFacts): Violation | undefined {
    this.lastVerdict = verdict;
    return this.run.note(this.check(verdict));
  }

  private check(verdict: VerdictFacts): Violation | undefined {
    const limits = this.limits;
    const run = this.run;
    switch (verdict.action) {
      case 'retry': {
        const last = this.last;
        if (last?.clientError) {
          const what = last.status !== undefined ? `a ${last.status} answer` : `a JSON-RPC ${last.code} error`;
          if (!verdict.reconnect) return { invariant: 'client-error-repeated', detail: `the policy asked to retry ${what} as it was` };
          if (!last.sessionIdSent && ++this.blindReconnects > 1) {
            return { invariant: 'client-error-repeated', detail: `the policy asked again to retry ${what} on a new session, though no session id was sent` };
          }
        }
        if (this.maybeApplied || this.applied) {
          const why = this.applied ? 'a status check found it applied' : 'its outcome is unknown and no status check said absent';
          return { invariant: 'unknown-write-resent', detail: `the policy asked to resend an unkeyed write: ${why}` };
        }
        if (this.attempts + 1n > limits.maxAttemptsPerCall) {
          return { invariant: 'attempts-over-budget', detail: `attempt ${this.attempts + 1n} of a call; max-attempts-per-call is ${limits.maxAttemptsPerCall}` };
        }
        if (run.steps + 1n > limits.maxStepsPerRun) {
          return { invariant: 'attempts-over-budget', detail: `step ${run.steps + 1n} of the run; max-steps-per-run is ${limits.maxStepsPerRun}` };
        }
        if (run.retries + 1n > limits.maxRetriesPerRun) {
          return { invariant: 'attempts-over-budget', detail: `retry ${run.retries + 1n} of the run; max-retries-per-run is ${limits.maxRetriesPerRun}` };
        }
        let capMs = limits.maxDelayMs;
        if (verdict.hintMs !== undefined && limits.maxHintMs > capMs) capMs = limits.maxHintMs;
        if (limits.accountWaitMs > capMs) capMs = limits.accountWaitMs;
        if (verdict.delayMs > capMs) return { invariant: 'delay-over-cap', detail: `a retry after ${verdict.delayMs} ms; the cap is ${capMs} ms` };
        run.retries += 1n;
        return undefined;
      }
      case 'poll': {
        const capMs = limits.taskPollMaxDelayMs > limits.maxHintMs ? limits.taskPollMaxDelayMs : limits.maxHintMs;
        if (verdict.delayMs > capMs) return { invariant: 'delay-over-cap', detail: `a poll after ${verdict.delayMs} ms; the cap is ${capMs} ms` };
        return undefined;
      }
      case 'check-status':
        if (run.steps + 1n > limits.maxStepsPerRun) {
          return { invariant: 'attempts-over-budget', detail: `a status check as step ${run.steps + 1n}; max-steps-per-run is ${limits.maxStepsPerRun}` };
        }
        return undefined;
      default:
        return undefined;
    }
  }

  /** The decision in words (`last-decision`), when the wrapper reads it: it
   *  must say what the last verdict said, and a retry must keep the call's key. */
  decision(decision: Pick<Wit.Decision, 'action'>): Violation | undefined {
    return this.run.note(this.checkDecision(decision.action));
  }

  private checkDecision(action: Wit.Action): Violation | undefined {
    const verdict = this.lastVerdict;
    if (verdict === undefined) return undefined;
    if (action.tag !== verdict.action) {
      return { invariant: 'verdict-disagrees', detail: `the verdict said ${verdict.action}, last-decision says ${action.tag}` };
    }
    if (action.tag === 'retry' || action.tag === 'poll') {
      const plan = action.val;
      if (plan.delayMs !== verdict.delayMs) {
        return { invariant: 'verdict-disagrees', detail: `the verdict waits ${verdict.delayMs} ms, last-decision ${plan.delayMs} ms` };
      }
      if (plan.reconnect !== verdict.reconnect) {
        return { invariant: 'verdict-disagrees', detail: `the verdict says reconnect ${verdict.reconnect}, last-decision ${plan.reconnect}` };
      }
    }
    if (action.tag === 'retry' && action.val.idempotencyKey !== this.key) {
      return { invariant: 'key-changed', detail: 'a retry plan names another idempotency key than the one the call sends' };
    }
    return undefined;
  }
}
