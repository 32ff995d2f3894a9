// What the wrappers (the MCP `RetryingToolCaller` and `withPolicy`) share about
// the policy's decisions: the texts lifted from the guest, bounded, and the note
// of the safe fallback when the policy itself failed.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { cutLiftedText } from './limits.js';

/** The note of the wrapper's safe fallback when the policy failed (or broke an invariant). */
export function policyFailureNote(e: Error, tool: string, lastOutcome: string): string {
  return `the retry policy failed (${e.name}: ${e.message}); not retried. Last outcome of ${tool}: ${lastOutcome}. `
    + 'Effects of this run are not known to the host: check before sending again.';
}

/** An escalation with its texts (note, last error) cut to `MAX_LIFTED_TEXT_BYTES`. */
export function boundedEscalation(escalation: Wit.Escalation): Wit.Escalation {
  const note = cutLiftedText(escalation.note);
  const lastError = escalation.lastError === undefined ? undefined : cutLiftedText(escalation.lastError);
  return note === escalation.note && lastError === escalation.lastError ? escalation : { ...escalation, note, lastError };
}

/** A decision with every text lifted from the guest (reason, replan message,
 *  success note, escalation) cut to `MAX_LIFTED_TEXT_BYTES`. */
export function boundedDecision(decision: Wit.Decision): Wit.Decision {
  const action = decision.action;
  let bounded: Wit.Action = action;
  if (action.tag === 'replan') bounded = { tag: 'replan', val: cutLiftedText(action.val) };
  else if (action.tag === 'succeed' && action.val !== undefined) bounded = { tag: 'succeed', val: cutLiftedText(action.val) };
  else if (action.tag === 'escalate') bounded = { tag: 'escalate', val: boundedEscalation(action.val) };
  return { ...decision, action: bounded, reason: cutLiftedText(decision.reason) };
}

