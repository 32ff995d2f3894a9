// The errors a host sees. Each says what went wrong and what to do about it.
import type { ConfigError as ConfigErrorValue, Escalation, RunError } from '../generated/interfaces/agent-retry-policy-types.js';

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

/** The component trapped. The instance is unusable afterwards: instantiate a new one. */
export class PolicyTrap extends AgentRetryError {}

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

/** The component's `run-error`: the host used a run wrongly. Nothing in the run changed. */
export class RunMisuse extends AgentRetryError {
  readonly error: RunError;
  constructor(error: RunError) {
    super(`run misuse: ${error.tag} (${String(error.val)})`);
    this.error = error;
  }
}

/** The policy stopped the run: a person must act. `note` says why, the last
 *  error, and which effects were already made. */
export class Escalated extends AgentRetryError {
  readonly escalation: Escalation;
  readonly reason: Escalation['reason'];
  readonly note: string;
  readonly tool?: string;
  constructor(escalation: Escalation, tool?: string) {
    super(escalation.note);
    this.escalation = escalation;
    this.reason = escalation.reason;
    this.note = escalation.note;
    this.tool = tool;
  }
}
