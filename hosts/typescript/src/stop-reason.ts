// The reason of a stop line (docs/events.md, "Stop reasons"), the same in
// every host and every wrapper: a pure function of where the call was and what
// is known of its effect, checked against tests/events/stop_reasons.json.
import type { StopCause } from './errors.js';

/** Where a call was when it stopped: an attempt's request out, between attempts, or before any was sent. */
export type StopWhere = 'in-flight' | 'between-attempts' | 'before-send';

/** What is known of a stopped call's effect. */
export type StopApplied = 'nothing-sent' | 'not-a-write' | 'may-have-applied' | 'not-applied';

/** The inputs of a stop's reason (docs/events.md, "Stop reasons"). */
export interface StopReasonInputs {
  cause: StopCause;
  /** The limit in whole ms: needed for a timeout, not used for a cancellation. */
  limitMs?: number | null;
  where: StopWhere;
  /** The attempt in flight: needed for `in-flight`. */
  attempt?: number | null;
  /** The pseudo-call (`initialize`, `tools/list`) in progress for a call not sent yet: said only `before-send`. */
  during?: string | null;
  attemptsSent: number;
  applied: StopApplied;
}

const APPLIED: Record<StopApplied, string> = {
  'nothing-sent': 'nothing of it was sent',
  'not-a-write': 'it is not a write',
  'may-have-applied': 'the write may have been applied: check before sending it again',
  'not-applied': 'the write was not applied',
};

/** `{stopped} {where} ({attemptsSent} sent); {applied}`, e.g. `the call's limit
 *  of 5000 ms passed while attempt 2 was in flight (2 sent); the write may have
 *  been applied: check before sending it again`. Throws a `TypeError` for
 *  inputs it cannot word (a timeout without its limit, an unknown value). */
export function stopReason(inputs: StopReasonInputs): string {
  const { cause, limitMs, where, attempt, during, attemptsSent, applied } = inputs;
  let stopped: string;
  if (cause === 'cancelled') {
    stopped = 'the call was cancelled';
  } else if (cause === 'call-timeout' || cause === 'run-timeout') {
    if (limitMs === undefined || limitMs === null) throw new TypeError(`a ${cause} stop needs its limitMs`);
    stopped = `the ${cause === 'call-timeout' ? 'call' : 'run'}'s limit of ${limitMs} ms passed`;
  } else {
    throw new TypeError(`unknown stop cause ${String(cause)}`);
  }
  let at: string;
  if (where === 'in-flight') {
    if (attempt === undefined || attempt === null) throw new TypeError('an in-flight stop needs its attempt');
    at = `while attempt ${attempt} was in flight`;
  } else if (where === 'between-attempts') {
    at = 'between attempts';
  } else if (where === 'before-send') {
    at = during === undefined || during === null ? 'before the call was sent' : `while its ${during} ran, before the call was sent`;
  } else {
    throw new TypeError(`unknown stop place ${String(where)}`);
  }
  if (!Object.prototype.hasOwnProperty.call(APPLIED, applied)) throw new TypeError(`unknown stop effect ${String(applied)}`);
  return `${stopped} ${at} (${attemptsSent} sent); ${APPLIED[applied]}`;
}
