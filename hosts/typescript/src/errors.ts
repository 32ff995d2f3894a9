// The errors a host sees. Each says what went wrong and what to do about it.
import type {
  ConfigError as ConfigErrorValue, Escalation, Observation, RunError, SnapshotError as SnapshotErrorValue, SnapshotErrorKind,
} from '../generated/interfaces/agent-retry-policy-types.js';

export class AgentRetryError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The policy component (or its transpiled form) is missing or stale. */
export class ComponentNotFound extends AgentRetryError {}

/** The component could not be instantiated, or is not the one that was transpiled. */
export class ComponentLoadError extends AgentRetryError {}

/** The component speaks another major version of the contract than this host
 *  (`componentVersion` is '' for an unversioned export). Nothing was loaded. */
export class ContractVersionMismatch extends ComponentLoadError {
  constructor(message: string, readonly componentVersion: string, readonly hostVersion: string) {
    super(message);
  }
}

/** The component imports something outside the contract (`importName`, e.g.
 *  `wasi:filesystem/types@0.2.6`): refused at load, nothing was run. */
export class ComponentImportRefused extends ComponentLoadError {
  constructor(message: string, readonly importName: string) {
    super(message);
  }
}

/** The component trapped (a bug, or a sandbox limit: the subclasses). The
 *  instance is unusable afterwards: instantiate a new one. `call` is the
 *  export that was running. */
export class PolicyTrap extends AgentRetryError {
  readonly call: string;
  constructor(message: string, options?: { cause?: unknown; call?: string }) {
    super(message, options);
    this.call = options?.call ?? '';
  }
}

/** A call burned its fuel (`fuelPerCall`, about one unit per wasm instruction;
 *  for `from-json`, plus `fuelPerConfigByte` a byte of the configuration): the
 *  guest was stopped there, the host goes on. The message names the tank. */
export class PolicyOutOfFuel extends PolicyTrap {}

/** The guest asked for more linear memory than the cap (`maxMemoryBytes`). */
export class PolicyMemoryExceeded extends PolicyTrap {}

/** The guest returned a value the contract does not allow (an enum or variant
 *  case that does not exist, a string that is not UTF-8, a pointer outside its
 *  memory). */
export class PolicyBoundaryViolation extends PolicyTrap {}

/** An input over its limit (src/limits.ts: a run id or action id over 256
 *  bytes passed to `deriveIdempotencyKey`), refused before it crossed the
 *  boundary: nothing ran, and the instance is fine. */
export class PolicyInputTooLarge extends AgentRetryError {
  constructor(readonly input: string, readonly sizeBytes: number, readonly limitBytes: number) {
    super(`${input} is ${sizeBytes} bytes, more than the ${limitBytes} the policy takes; refused before the call`);
  }
}

/** A call on an instance that trapped before, or on a closed handle. */
export class InstanceUnusable extends AgentRetryError {}

/** The policy configuration was rejected; nothing was loaded. */
export class ConfigError extends AgentRetryError {
  readonly kind: ConfigErrorValue['kind'];
  readonly field: string;
  readonly detail: string;
  constructor(error: ConfigErrorValue) {
    super(`invalid agent-retry configuration (${error.kind})${error.field ? ` at ${error.field}` : ''}: ${error.message}`);
    this.kind = error.kind;
    this.field = error.field;
    this.detail = error.message;
  }
}

/** An `McpConnection` that cannot work as configured: a URL scheme other than
 *  http or https, an SDK major that is not installed. Thrown to the caller (at
 *  construction where it can be told then), never a failure for the policy to
 *  retry. `option` names the argument at fault (`url`, `sdk`). */
export class ConnectionConfigError extends AgentRetryError {
  constructor(readonly option: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The component's `run-error`: the host used a run wrongly. Nothing in the run changed. */
export class RunMisuse extends AgentRetryError {
  readonly error: RunError;
  constructor(error: RunError) {
    const payload = typeof error.val === 'object' && error.val !== null ? JSON.stringify(error.val) : String(error.val);
    super(`run misuse: ${error.tag} (${payload})`);
    this.error = error;
  }
}

/** The policy stopped the run: a person must act. `note` says why, the last
 *  error, and which effects were already made (and, from contract 0.9.0,
 *  which answers to `resume` are safe). */
export class Escalated extends AgentRetryError {
  readonly escalation: Escalation;
  readonly reason: Escalation['reason'];
  readonly note: string;
  readonly tool?: string;
  /** Set when the policy itself failed (a `PolicyTrap`, or its instance was
   *  unusable): the wrapper's safe fallback, no retry and this escalation. */
  readonly policyFailure?: Error;
  /** The escalated run's snapshot (contract 0.9.0, `run.snapshot`): a JSON
   *  document to store and answer later with `caller.resume(snapshot, answer)`,
   *  in any host. Set by the MCP wrapper when the policy escalated the run;
   *  undefined when the run could not be snapshotted (`snapshotError` says
   *  why: another call of the run in flight, `calls-open`) or the policy
   *  itself failed. */
  snapshot?: string;
  /** Why `snapshot` is undefined, when the policy refused it. */
  snapshotError?: SnapshotError;
  constructor(escalation: Escalation, tool?: string, policyFailure?: Error) {
    super(escalation.note);
    this.escalation = escalation;
    this.reason = escalation.reason;
    this.note = escalation.note;
    this.tool = tool;
    this.policyFailure = policyFailure;
  }
}

/** The component's `snapshot-error` (contract 0.9.0): a snapshot not taken
 *  (`not-escalated`, `calls-open`, `too-large`) or not resumed (`malformed`,
 *  `tampered`, `other-contract`, `too-large`). `kind` is the kebab-case kind,
 *  `message` the component's words (naming the field or the versions).
 *  Nothing was sent, and no run changed. */
export class SnapshotError extends AgentRetryError {
  readonly kind: SnapshotErrorKind;
  constructor(error: SnapshotErrorValue) {
    super(error.message);
    this.kind = error.kind;
  }
  /** The record as the component gave it. */
  get value(): SnapshotErrorValue {
    return { kind: this.kind, message: this.message };
  }
}

/** The MCP session was lost and could not be re-established, and the policy
 *  did not escalate: a caller built on a bare `Client` whose pipe closed or
 *  whose retry the policy said needs a new session (`reconnect`: it cannot
 *  reconnect; build it on an `McpConnection`), or the policy answered `replan`
 *  to the `initialize` or `tools/list` pseudo-call. `tool` is the call it
 *  happened in. */
export class SessionLost extends AgentRetryError {
  constructor(message: string, readonly tool?: string) {
    super(message);
  }
}

/** Why the wrapper stopped waiting for a call: its own limit (`callTimeoutMs`),
 *  the run's (`runTimeoutMs`), or the caller's `AbortSignal`. */
export type StopCause = 'call-timeout' | 'run-timeout' | 'cancelled';

/** What the wrapper knows of a call it stopped waiting for. */
export interface Stopped {
  cause: StopCause;
  tool: string;
  /** The policy's id of the call; undefined if it had not been admitted. */
  callId?: number;
  /** Attempts of the call sent, the one in flight included. */
  attemptsSent: number;
  /** The call is a write or a delete (the ticket's effect) and either an
   *  attempt was in flight when it stopped, or its task still lived, or the
   *  run lists its effect as `unknown`: check before sending it again. */
  mayHaveApplied: boolean;
}

/** A call the wrapper stopped waiting for (`CallTimedOut`, `CallCancelled`).
 *  `cause` here is the stop's cause (not `Error.cause`). Its message is
 *  `{tool}: {reason}`, the reason of its stop line (docs/events.md, "Stop reasons"). */
export class CallStopped extends AgentRetryError implements Stopped {
  override readonly cause: StopCause;
  readonly tool: string;
  readonly callId?: number;
  readonly attemptsSent: number;
  readonly mayHaveApplied: boolean;
  constructor(message: string, stopped: Stopped) {
    super(message);
    this.cause = stopped.cause;
    this.tool = stopped.tool;
    this.callId = stopped.callId;
    this.attemptsSent = stopped.attemptsSent;
    this.mayHaveApplied = stopped.mayHaveApplied;
  }
}

/** The call's limit (`callTimeoutMs`, cause `call-timeout`) or the run's
 *  (`runTimeoutMs`, cause `run-timeout`) passed. */
export class CallTimedOut extends CallStopped {}

/** The caller's `AbortSignal` aborted the call (cause `cancelled`). */
export class CallCancelled extends CallStopped {}

/** A policy update was refused (`LivePolicy`, src/live.ts); the last good
 *  policy keeps serving. `kind` says which check refused it: "read",
 *  "integrity", "load", "config", "self-test", "fleet", "older" or "nothing-to-roll-back-to";
 *  `reason` says why. */
export abstract class UpdateError extends AgentRetryError {
  abstract readonly kind: 'read' | 'integrity' | 'load' | 'config' | 'self-test' | 'fleet' | 'older' | 'nothing-to-roll-back-to';
  constructor(readonly reason: string, message?: string, options?: { cause?: unknown }) {
    super(message ?? reason, options);
  }
}

/** A file of the update (the .wasm or the configuration) could not be read. */
export class UpdateReadError extends UpdateError {
  readonly kind = 'read' as const;
  constructor(readonly path: string, reason: string, options?: { cause?: unknown }) {
    super(reason, `cannot read ${path}: ${reason}`, options);
  }
}

/** The .wasm's digest does not match the pinned one, or its signature is
 *  missing or does not verify under the configured key. */
export class UpdateIntegrityError extends UpdateError {
  readonly kind = 'integrity' as const;
  constructor(reason: string) {
    super(reason, `integrity check failed: ${reason}`);
  }
}

/** The component cannot run in this host (not a valid component, another
 *  contract version, foreign imports). `error` is the `ComponentLoadError`. */
export class UpdateLoadError extends UpdateError {
  readonly kind = 'load' as const;
  constructor(readonly error: ComponentLoadError) {
    super(error.message, error.message, { cause: error });
  }
}

/** The configuration does not load in the component. */
export class UpdateConfigError extends UpdateError {
  readonly kind = 'config' as const;
  constructor(reason: string, options?: { cause?: unknown }) {
    super(reason, `the configuration does not load: ${reason}`, options);
  }
}

/** The candidate failed a case of the gate vectors (tests/vectors/gate.json,
 *  the operator's `gateVectors`, or the update's own vectors: the invariants
 *  the host relies on, as data), or trapped while one ran. The kind keeps its
 *  name (`self-test`) across hosts. */
export class UpdateSelfTestError extends UpdateError {
  readonly kind = 'self-test' as const;
  constructor(reason: string, options?: { cause?: unknown }) {
    super(reason, `the self-test failed: ${reason}`, options);
  }
}

/** The fleet's Redis cannot be read, or nothing is published there (`LivePolicy.openFleet`). */
export class UpdateFleetError extends UpdateError {
  readonly kind = 'fleet' as const;
  constructor(reason: string, options?: { cause?: unknown }) {
    super(reason, `cannot read the fleet's policy: ${reason}`, options);
  }
}

/** The candidate is older than the serving policy: a fleet's publication whose
 *  revision is lower than the serving policy's (a stale replica, a Redis
 *  restored from an old dump), or files whose newest modification time is
 *  older than the serving policy's files' (equal is not older: the same files
 *  may be reloaded). A rollback is not an update and is never refused so. The
 *  kind is `older` in every host. */
export class UpdateOlderError extends UpdateError {
  readonly kind = 'older' as const;
  constructor(reason: string) {
    super(reason, `older than the serving policy: ${reason}`);
  }
}

/** `rollback()` with no previous policy. */
export class NothingToRollBackTo extends UpdateError {
  readonly kind = 'nothing-to-roll-back-to' as const;
  constructor() {
    super('there is no previous policy to roll back to');
  }
}

/** `withPolicy`: the policy answered `replan`: the call ends and `message`
 *  goes to the model (the framework's own retry signal). `rule` names the rule
 *  that decided. Nothing more is sent for this call. */
export class ReplanNeeded extends AgentRetryError {
  constructor(message: string, readonly rule: string, readonly tool?: string) {
    super(message);
  }
}

/** What a function run by `withPolicy` may throw to report a failure as the
 *  contract's observation directly (status, headers, body, transport, delivery),
 *  instead of an error a mapping translates. */
export class ObservedFailure extends AgentRetryError {
  constructor(readonly observation: Observation, message?: string) {
    super(message ?? `observed failure: ${describeKind(observation.kind)}`);
  }
}

function describeKind(kind: Observation['kind']): string {
  return 'val' in kind && kind.val !== undefined ? `${kind.tag} ${String(kind.val)}` : kind.tag;
}
