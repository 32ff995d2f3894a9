// Typed callbacks on the events of docs/events.md ("Hooks"). A hook is an
// observer: it runs before the wrapper acts, cannot change the decision, and an
// exception it throws is caught and logged once (`agent_retry.hook_failed`).
import type { AttemptEvent, BreakerEvent, EscalationEvent, PolicyUpdateEvent, ReplanEvent, StatusCheckEvent, WaitEvent } from './events.js';

export interface RetryHooks {
  /** Before a wait (`agent_retry.wait`). */
  onWait?: (event: WaitEvent) => void;
  /** An attempt whose verdict is a retry (`agent_retry.attempt`, action `retry`). */
  onRetry?: (event: AttemptEvent) => void;
  /** A call ends with a message for the model (`agent_retry.replan`). */
  onReplan?: (event: ReplanEvent) => void;
  /** A call ends with an escalation, its note included (`agent_retry.escalation`). */
  onEscalate?: (event: EscalationEvent) => void;
  /** A status check answered (`agent_retry.status_check`). */
  onStatusCheck?: (event: StatusCheckEvent) => void;
  /** A circuit breaker changed state (`agent_retry.breaker`). */
  onBreaker?: (event: BreakerEvent) => void;
  /** A live update was accepted, refused or rolled back (`agent_retry.policy_update`). */
  onPolicyUpdate?: (event: PolicyUpdateEvent) => void;
}

export type HookName = keyof RetryHooks;

/** Calls hook `name` with `event` if it is set; a hook that throws is reported
 *  to `failed` (the caller logs it once per hook) and otherwise ignored. */
export function callHook<K extends HookName>(hooks: RetryHooks | undefined, name: K, event: Parameters<NonNullable<RetryHooks[K]>>[0],
  failed: (name: HookName, error: unknown) => void): void {
  const hook = hooks?.[name] as ((event: unknown) => unknown) | undefined;
  if (typeof hook !== 'function') return;
  try {
    const returned = hook.call(hooks, event);
    // An async hook is not awaited (hooks run on the caller's task); its rejection is its failure.
    if (returned instanceof Promise) returned.catch((error: unknown) => failed(name, error));
  } catch (error) {
    failed(name, error);
  }
}
