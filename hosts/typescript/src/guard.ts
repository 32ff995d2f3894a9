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
  | 'verdict-disagrees'
  | 'task-resent';

/** A broken invariant, with one short sentence that gives the numbers. */
export interface Violation {
  invariant: Invariant;
  detail: string;
}

/** The HTTP answers a request must not be repeated after as it was. */
const CLIENT_ERROR_STATUSES = new Set([400, 401, 403, 404, 409, 422]);
/** The JSON-RPC errors that say the request itself is wrong. */
const CLIENT_ERROR_CODES = new Set([-32600, -32601, -32602]);
/** The client errors after which a new session (`reconnect`) is a different
 *  request: the statuses that refuse a session or a protocol revision. */
const RECONNECT_STATUSES = new Set([400, 404]);
/** Headers in which a server speaks about retrying its own 4xx: the
 *  component's to read (`x-should-retry` only when it says `true`). */
const RETRY_SPEAKING_HEADERS = new Set(['x-envoy-overloaded', 'grpc-status', 'x-amzn-errortype']);

/** Whether an answer's headers (`name: value` lines) carry a server's own word
 *  on retrying: `x-should-retry: true`, `x-envoy-overloaded`, `grpc-status` or
 *  `x-amzn-errortype` (names and the `true` compared case-insensitively). */
function serverSpeaksOfRetrying(headers: string): boolean {
  for (const line of headers.split('\n')) {
    const colon = line.indexOf(':');
    const name = (colon < 0 ? line : line.slice(0, colon)).trim().toLowerCase();
    const value = colon < 0 ? '' : line.slice(colon + 1).trim();
    if (RETRY_SPEAKING_HEADERS.has(name)) return true;
    if (name === 'x-should-retry' && value.toLowerCase() === 'true') return true;
  }
  return false;
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** A cap read from the configuration: a non-negative integer, else the default
 *  (the policy refuses such a configuration at load; the guard never throws). */
function cap(config: Json, name: string, fallback: number): bigint {
  const value = config[name];
  return typeof value === 'number' && Number.isInteger(value) && value >= 0 ? BigInt(value) : BigInt(fallback);
}

/** The preset's fields the guard reads (the guest's `Preset::fields`, mirrored
 *  into config-defaults.ts): what a configuration of that `preset` gets for a
 *  field it leaves out. */
const PRESET_FIELDS: Record<string, Record<string, number>> = {
  'aws-2026': {
    'max-delay-ms': Defaults.AWS_2026_MAX_DELAY_MS,
    'max-attempts-per-call': Defaults.AWS_2026_MAX_ATTEMPTS_PER_CALL,
    'hint-cap-over-backoff-ms': Defaults.AWS_2026_HINT_CAP_OVER_BACKOFF_MS,
  },
};

/** A top-level cap the configuration gives, else its preset's, else the default. */
function field(config: Json, name: string, fallback: number): bigint {
  const preset = typeof config.preset === 'string' && Object.prototype.hasOwnProperty.call(PRESET_FIELDS, config.preset)
    ? PRESET_FIELDS[config.preset][name] : undefined;
  return cap(config, name, preset ?? fallback);
}

/** The caps and tool facts the guard reads from the host's configuration. */
class Limits {
  readonly maxDelayMs: bigint;
  readonly maxHintMs: bigint;
  /** `hint-cap-over-backoff-ms`: with it a hinted wait is at most `maxDelayMs` plus it (0: none, `maxHintMs` caps it). */
  readonly hintCapMs: bigint;
  readonly maxAttemptsPerCall: bigint;
  readonly maxRetriesPerRun: bigint;
  readonly maxStepsPerRun: bigint;
  readonly taskPollMaxDelayMs: bigint;
  readonly maxPollsPerTask: bigint;
  /** `account-budget.max-wait-ms`; 0 without an account budget. */
  readonly accountWaitMs: bigint;
  readonly defaultEffect: Wit.Effect;
  /** Statuses `status-overrides` makes retryable (transient or throttled). */
  readonly retryableStatuses: Set<number>;
  readonly tools: Json;

  constructor(config: Json) {
    this.maxDelayMs = field(config, 'max-delay-ms', Defaults.MAX_DELAY_MS);
    this.maxHintMs = cap(config, 'max-hint-ms', Defaults.MAX_HINT_MS);
    this.hintCapMs = field(config, 'hint-cap-over-backoff-ms', Defaults.HINT_CAP_OVER_BACKOFF_MS);
    this.maxAttemptsPerCall = field(config, 'max-attempts-per-call', Defaults.MAX_ATTEMPTS_PER_CALL);
    this.maxRetriesPerRun = cap(config, 'max-retries-per-run', Defaults.MAX_RETRIES_PER_RUN);
    this.maxStepsPerRun = cap(config, 'max-steps-per-run', Defaults.MAX_STEPS_PER_RUN);
    this.taskPollMaxDelayMs = cap(config, 'task-poll-max-delay-ms', Defaults.TASK_POLL_MAX_DELAY_MS);
    this.maxPollsPerTask = cap(config, 'max-polls-per-task', Defaults.MAX_POLLS_PER_TASK);
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
  /** A client error (above) the configuration does not make retryable, and
   *  whose answer carries no word of the server's on retrying. */
  clientError: boolean;
  /** No answer, and the request may have reached the server. */
  outcomeUnknown: boolean;
  sessionIdSent: boolean;
}

/** What a verdict says, as the guard reads it (`cancelTask`: the wrapper
 *  cancels the call's task before it acts; absent is false). */
export type VerdictFacts = Pick<Wit.Verdict, 'action' | 'delayMs' | 'hintMs' | 'reconnect'> & { cancelTask?: boolean };

/** What a poll of the call's task showed: a status (`task`: the task lives,
 *  unless `cancelled`), the task's end with its result (`success`,
 *  `empty-result`) or its error (`failure`), or a poll that itself failed
 *  (`poll-failure`: the task still lives). The wrapper's outcomes fit it. */
export type PollOutcome =
  | { tag: 'task'; val: Pick<Wit.TaskReport, 'status'> }
  | { tag: 'success' }
  | { tag: 'empty-result'; val?: string }
  | { tag: 'failure'; val: Wit.Observation }
  | { tag: 'poll-failure'; val?: Wit.Observation };

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

  /** A cap by its configuration name, as this guard read it (the gate's
   *  `{"$config": field}` matcher); `retry-wait-cap-ms` is the longest wait of a
   *  retry without a hint: `max-delay-ms` or the account's `max-wait-ms`.
   *  Throws for a name it does not read. */
  cap(field: string): bigint {
    const l = this.limits;
    const caps: Record<string, bigint> = {
      'max-delay-ms': l.maxDelayMs, 'max-hint-ms': l.maxHintMs, 'max-attempts-per-call': l.maxAttemptsPerCall,
      'max-retries-per-run': l.maxRetriesPerRun, 'max-steps-per-run': l.maxStepsPerRun, 'task-poll-max-delay-ms': l.taskPollMaxDelayMs,
      'max-polls-per-task': l.maxPollsPerTask, 'retry-wait-cap-ms': l.maxDelayMs > l.accountWaitMs ? l.maxDelayMs : l.accountWaitMs,
    };
    const value = caps[field];
    if (value === undefined) throw new Error(`$config names ${JSON.stringify(field)}; the host reads ${Object.keys(caps).join(', ')}`);
    return value;
  }

  /** The policy admitted a call whose first send waits `startDelayMs`. */
  begin(tool: string, key: string | undefined, hints: Wit.ToolHints | undefined, startDelayMs: bigint): { call: CallGuard; violation?: Violation } {
    const call = new CallGuard(this, this.limits, key, this.limits.unkeyedWrite(tool, key, hints));
    const limits = this.limits;
    let violation: Violation | undefined;
    if (startDelayMs > limits.accountWaitMs) {
      violation = { invariant: 'delay-over-cap', detail: `a first send after ${startDelayMs} ms; the account's wait cap is ${limits.accountWaitMs} ms` };
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

/** One call's guard: its attempts, what the last one saw, its task, and its last verdict. */
export class CallGuard {
  private attempts = 0n;
  private last?: AttemptFacts;
  /** An unkeyed write an attempt left unknown (sent, no answer), and no status check said absent. */
  private maybeApplied = false;
  /** An unkeyed write the server made a task of: unknown until the task ends
   *  with its result or error (a cancelled task leaves it unknown), or a status check says absent. */
  private taskMaybeApplied = false;
  /** A status check found the write applied. */
  private applied = false;
  /** The call's task lives: a status other than `cancelled` was seen, and
   *  since then no end, no `cancelled` status, no verdict that cancels it. */
  private taskLives = false;
  /** Polls of the call's current task the verdicts planned. */
  private polls = 0n;
  /** Reconnecting retries after a client error sent without a session id. */
  private blindReconnects = 0;
  private lastVerdict?: VerdictFacts;

  constructor(private readonly run: RunGuard, private readonly limits: Limits, private readonly key: string | undefined,
    private readonly unkeyedWrite: boolean) {}

  /** An attempt was sent and its outcome observed: `failure` is what failed,
   *  undefined for a tool result (a success, an empty result, a task); `task`
   *  the status of the task the server made of the call, when it made one. */
  attempted(failure: Wit.Observation | undefined, task?: Pick<Wit.TaskReport, 'status'>): void {
    this.run.steps += 1n;
    this.attempts += 1n;
    this.last = this.factsOf(failure);
    if (this.last.outcomeUnknown && this.unkeyedWrite) this.maybeApplied = true;
    if (task !== undefined) {
      // A new task of the call: its own polls; for an unkeyed write, applied or not once it ends.
      this.polls = 0n;
      this.taskLives = task.status !== 'cancelled';
      if (this.unkeyedWrite) this.taskMaybeApplied = true;
    }
  }

  /** A poll of the call's task answered (or failed): not a step, not an attempt. */
  polled(outcome: PollOutcome): void {
    switch (outcome.tag) {
      case 'task':
        // A cancelled task leaves an unkeyed write unknown; a live one keeps it so.
        this.taskLives = outcome.val.status !== 'cancelled';
        if (this.unkeyedWrite) this.taskMaybeApplied = true;
        return;
      case 'poll-failure':
        // The poll failed, not the task: it still lives, and the call's facts are the task's.
        return;
      default:
        // The task ended with its result or its error: the call's last facts;
        // what the task left unknown is known (not what an earlier attempt left unknown).
        this.taskLives = false;
        this.taskMaybeApplied = false;
        this.last = this.factsOf(outcome.tag === 'failure' ? outcome.val : undefined);
    }
  }

  /** The facts the guard keeps of an answer (or of its absence). */
  private factsOf(failure: Wit.Observation | undefined): AttemptFacts {
    const kind = failure?.kind;
    const status = kind?.tag === 'http-status' ? kind.val : undefined;
    const code = kind?.tag === 'protocol-error' ? kind.val : undefined;
    const clientError = ((status !== undefined && CLIENT_ERROR_STATUSES.has(status) && !this.limits.retryableStatuses.has(status))
      || (code !== undefined && CLIENT_ERROR_CODES.has(code)))
      // The server's own word on retrying its 4xx is the component's to read.
      && !(status !== undefined && serverSpeaksOfRetrying(failure?.headers ?? ''));
    const answered = kind?.tag !== 'transport';
    const outcomeUnknown = !answered && failure?.delivery !== 'not-sent' && kind?.val !== 'connection-refused';
    return { status, code, clientError, outcomeUnknown, sessionIdSent: failure?.sessionIdSent === true };
  }

  /** A status check answered: one step; `absent` clears "maybe applied", `found` marks the call applied. */
  statusChecked(result: Wit.StatusCheckResult): void {
    this.run.steps += 1n;
    if (result === 'absent') {
      this.maybeApplied = false;
      this.taskMaybeApplied = false;
    }
    if (result === 'found') this.applied = true;
  }

  /** A verdict, before the wrapper acts on it (a `cancelTask` one: after it cancels the task). */
  verdict(verdict: VerdictFacts): Violation | undefined {
    this.lastVerdict = verdict;
    // The wrapper cancels the task before it acts: it no longer lives.
    if (verdict.cancelTask === true) this.taskLives = false;
    return this.run.note(this.check(verdict));
  }

  private check(verdict: VerdictFacts): Violation | undefined {
    const limits = this.limits;
    const run = this.run;
    switch (verdict.action) {
      case 'retry': {
        if (this.taskLives) {
          return { invariant: 'task-resent', detail: `the policy asked to call the tool again (attempt ${this.attempts + 1n}) while its task lives` };
        }
        const last = this.last;
        if (last?.clientError) {
          const what = last.status !== undefined ? `a ${last.status} answer` : `a JSON-RPC ${last.code} error`;
          if (!verdict.reconnect) return { invariant: 'client-error-repeated', detail: `the policy asked to retry ${what} as it was` };
          if (last.status === undefined || !RECONNECT_STATUSES.has(last.status)) {
            return { invariant: 'client-error-repeated', detail: `the policy asked to retry ${what} on a new session, which a session does not cause` };
          }
          if (!last.sessionIdSent && ++this.blindReconnects > 1) {
            return { invariant: 'client-error-repeated', detail: `the policy asked again (${this.blindReconnects} times) to retry ${what} on a new session, though no session id was sent` };
          }
        }
        if (this.maybeApplied || this.taskMaybeApplied || this.applied) {
          const why = this.applied ? 'a status check found it applied'
            : this.maybeApplied ? 'its outcome is unknown and no status check said absent'
              : 'its task did not end with a result or an error, and no status check said absent';
          return { invariant: 'unknown-write-resent', detail: `the policy asked to resend an unkeyed write (attempt ${this.attempts + 1n}): ${why}` };
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
        // A hint is waited up to max-hint-ms, or with a hint cap up to the backoff's cap plus it.
        const hintedMs = limits.hintCapMs === 0n ? limits.maxHintMs : limits.maxDelayMs + limits.hintCapMs;
        let capMs = limits.maxDelayMs;
        if (verdict.hintMs !== undefined && hintedMs > capMs) capMs = hintedMs;
        if (limits.accountWaitMs > capMs) capMs = limits.accountWaitMs;
        if (verdict.delayMs > capMs) return { invariant: 'delay-over-cap', detail: `a retry after ${verdict.delayMs} ms; the cap is ${capMs} ms` };
        run.retries += 1n;
        return undefined;
      }
      case 'poll': {
        this.polls += 1n;
        if (this.polls > limits.maxPollsPerTask) {
          return { invariant: 'attempts-over-budget', detail: `poll ${this.polls} of a task; max-polls-per-task is ${limits.maxPollsPerTask}` };
        }
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
