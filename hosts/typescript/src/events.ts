// The event model of docs/events.md: every attempt, wait, status check, replan,
// escalation, task poll, circuit breaker change and policy update is one event, the same fields in every
// host. The typed events are camelCase; `toLogLine()` gives the log line's JSON
// keys (snake_case) in the documented order. The log lines, the hooks, the
// metrics and the OpenTelemetry spans are all made from these (src/telemetry.ts).
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import type { Invariant } from './guard.js';

/** What every event of a call carries. */
export interface CallFields {
  /** Unix seconds (3 decimals in the line). */
  ts: number;
  run: string;
  /** Which policy decided: the instance's `policyIdentity` or a `LivePolicy`'s identity. */
  policy: string;
  /** The N of `step-N`; null for a pseudo-call (`initialize`, `tools/list`). */
  step: number | null;
  /** The contract's call id; null before the call was admitted. */
  call: number | null;
  /** The tool, a pseudo-tool, or the name given to `withPolicy`. */
  tool: string;
}

/** Unix seconds with 3 decimals, as every line gives `ts`. */
const seconds = (ts: number): number => Math.round(ts * 1000) / 1000;

function callLine(event: string, f: CallFields): Record<string, unknown> {
  return { event, ts: seconds(f.ts), run: f.run, policy: f.policy, step: f.step, call: f.call, tool: f.tool };
}

export interface AttemptFields extends CallFields {
  attempt: number;
  key: string | null;
  /** What was observed, in words that do not change (`success`, `http 503`, ...). */
  outcome: string;
  class: Wit.OutcomeClass | null;
  rule: string | null;
  /** The verdict's action, or `stop` for a call the wrapper stopped. */
  action: string;
  delayMs: number | null;
  hintMs: number | null;
  escalation: Wit.EscalationReason | null;
  reason: string;
  /** Only on the line of a broken invariant (and of the calls after it). */
  invariant?: Invariant;
  /** The policy's words for the verdict, when they were asked for. */
  decision?: Wit.Decision;
  /** This line reports an attempt the run report counts (an attempt's own
   *  outcome, or the stop of one planned and never answered); false for a status
   *  check's or a poll's verdict and a call not admitted. Not in the line. */
  countsAsAttempt: boolean;
}

/** `agent_retry.attempt`: a verdict was read. */
export class AttemptEvent {
  readonly event = 'agent_retry.attempt' as const;
  constructor(fields: AttemptFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return {
      ...callLine(this.event, this), attempt: this.attempt, key: this.key, outcome: this.outcome, class: this.class, rule: this.rule,
      action: this.action, delay_ms: this.delayMs, hint_ms: this.hintMs, escalation: this.escalation, reason: this.reason,
      ...(this.invariant === undefined ? {} : { invariant: this.invariant }),
    };
  }
}
export interface AttemptEvent extends AttemptFields {}

export type WaitWhy = 'retry' | 'poll' | 'admission';

export interface WaitFields extends CallFields {
  /** The attempt the wait comes before (1 for the admission wait). */
  attempt: number;
  why: WaitWhy;
  waitMs: number;
  hintMs: number | null;
  decision?: Wit.Decision;
}

/** `agent_retry.wait`: before the wrapper sleeps. */
export class WaitEvent {
  readonly event = 'agent_retry.wait' as const;
  constructor(fields: WaitFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, why: this.why, wait_ms: this.waitMs, hint_ms: this.hintMs };
  }
}
export interface WaitEvent extends WaitFields {}

export interface ReplanFields extends CallFields {
  attempt: number;
  rule: string;
  /** The policy's message for the model. */
  message: string;
  decision?: Wit.Decision;
}

/** `agent_retry.replan`: a call ends with a message for the model. */
export class ReplanEvent {
  readonly event = 'agent_retry.replan' as const;
  constructor(fields: ReplanFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, rule: this.rule, message: this.message };
  }
}
export interface ReplanEvent extends ReplanFields {}

export interface EscalationFields extends CallFields {
  attempt: number;
  /** The rule that decided; null when no verdict did (the policy failed, a call not admitted). */
  rule: string | null;
  /** The contract's escalation reason (`permission-denied`, ...). */
  reason: Wit.EscalationReason;
  note: string;
  escalationValue: Wit.Escalation;
  decision?: Wit.Decision;
}

/** `agent_retry.escalation`: a call ends with an escalation. */
export class EscalationEvent {
  readonly event = 'agent_retry.escalation' as const;
  constructor(fields: EscalationFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, rule: this.rule, reason: this.reason, note: this.note };
  }
}
export interface EscalationEvent extends EscalationFields {}

export interface StatusCheckFields extends CallFields {
  attempt: number;
  /** What checked: the status check function's name; null when nothing could (then `unknown`). */
  checkTool: string | null;
  result: Wit.StatusCheckResult;
}

/** `agent_retry.status_check`: a status check answered. */
export class StatusCheckEvent {
  readonly event = 'agent_retry.status_check' as const;
  constructor(fields: StatusCheckFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, check_tool: this.checkTool, result: this.result };
  }
}
export interface StatusCheckEvent extends StatusCheckFields {}

export interface TaskPollFields extends CallFields {
  attempt: number;
  taskId: string;
  /** The task's status as reported (`working`, `input-required`, ...), or the poll's end (`completed`, `failed`, `poll failed`). */
  status: string;
}

/** `agent_retry.task_poll`: a task's status was read. */
export class TaskPollEvent {
  readonly event = 'agent_retry.task_poll' as const;
  constructor(fields: TaskPollFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, task_id: this.taskId, status: this.status };
  }
}
export interface TaskPollEvent extends TaskPollFields {}

export interface BreakerFields extends CallFields {
  /** The server the breaker guards (the name the call was begun with). */
  server: string;
  /** `server` for a server's breaker, `tool` for a tool's on it. */
  scope: 'server' | 'tool';
  /** The state before: `closed`, `open` or `half-open`. */
  from: Wit.BreakerState;
  /** The state after. */
  to: Wit.BreakerState;
  /** Until when (the store's clock, ms since the Unix epoch) an open breaker
   *  sends nothing, or a half-open one waits for its probe; null when closed. */
  untilMs: number | null;
  /** Why, in the policy's words ("2 failures in a row", ...). */
  why: string;
}

/** `agent_retry.breaker`: a circuit breaker of the call's server (or of its
 *  tool on it) changed state (contract 0.8.0: `run.take-breaker-changes`). */
export class BreakerEvent {
  readonly event = 'agent_retry.breaker' as const;
  constructor(fields: BreakerFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return {
      ...callLine(this.event, this), server: this.server, scope: this.scope, from: this.from, to: this.to, until_ms: this.untilMs, why: this.why,
    };
  }
}
export interface BreakerEvent extends BreakerFields {}

export interface ResumeFields extends CallFields {
  /** The resumed call's attempt: the one sent for `send`, else its last. */
  attempt: number;
  /** The person's answer: `retry`, `done`, `skip` or `abort`. */
  answer: 'retry' | 'done' | 'skip' | 'abort';
  /** What the host does now (`resumed-call.action`): `send`, `succeed`, `replan` or `escalate`. */
  action: Wit.ResumedAction;
}

/** `agent_retry.resume`: a person answered an escalation and the run resumed
 *  from its snapshot (contract 0.9.0, `policy.resume-run`): once per `resume`. */
export class ResumeEvent {
  readonly event = 'agent_retry.resume' as const;
  constructor(fields: ResumeFields) {
    Object.assign(this, fields);
  }
  toLogLine(): Record<string, unknown> {
    return { ...callLine(this.event, this), attempt: this.attempt, answer: this.answer, action: this.action };
  }
}
export interface ResumeEvent extends ResumeFields {}

/** `agent_retry.policy_update`: a live update was accepted, refused or rolled
 *  back (and the watcher's own notes). The fields are those of 0.7's lines: an
 *  accepted update or a rollback `policy`, `generation`, `wasm_sha256`,
 *  `config_sha256`; a refusal `serving`, `kind`, `reason`. It is its own log line. */
export interface PolicyUpdateEvent {
  event: 'agent_retry.policy_update';
  level: 'info' | 'warning';
  message: 'policy update accepted' | 'policy update refused' | 'policy rolled back' | 'watcher: polling failed' | 'cannot check for a policy update' |
    "the fleet's Redis answers again";
  policy?: string;
  generation?: number;
  wasm_sha256?: string;
  config_sha256?: string;
  serving?: string;
  kind?: string;
  reason?: string;
}

/** What an update event counts as in `agent_retry.policy_updates` (`outcome`), if it is one. */
export function policyUpdateOutcome(event: PolicyUpdateEvent): 'accepted' | 'refused' | 'rolled-back' | undefined {
  switch (event.message) {
    case 'policy update accepted': return 'accepted';
    case 'policy update refused': return 'refused';
    case 'policy rolled back': return 'rolled-back';
    default: return undefined;
  }
}

/** Every event of a call. */
export type CallEvent = AttemptEvent | WaitEvent | ReplanEvent | EscalationEvent | StatusCheckEvent | TaskPollEvent | BreakerEvent | ResumeEvent;
