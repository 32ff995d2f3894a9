// The account budget the component imports: an atomic take-or-wait on a token
// bucket per account, embedded in this process and shared by every instance.
// The algorithm is `gcra` in hosts/rust/src/accounts/embedded.rs, copied exactly,
// including saturation at u64 (BigInt does not overflow, so every saturating
// operation is written out).

import { jsonSafeBigInt } from './json.js';

export const U64_MAX = (1n << 64n) - 1n;

/** The bucket's shape, as the policy's configuration gives it on every call. */
export interface Bucket {
  capacity: number;
  refillIntervalMs: bigint;
}

/** Granted: taken, usable after `waitMs`. Refused: nothing taken, room in `waitMs`. */
export interface Reservation {
  granted: boolean;
  waitMs: bigint;
}

/** A shared account budget. `reserve` and `refund` must be atomic across every caller. */
export interface AccountBudgetBackend {
  reserve(accountId: string, tokens: number, bucket: Bucket, maxWaitMs: bigint, nowMs: bigint): Reservation;
  /** Gives tokens back, never past a full bucket. */
  refund(accountId: string, tokens: number, bucket: Bucket, nowMs: bigint): void;
}

const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);
const max = (a: bigint, b: bigint): bigint => (a > b ? a : b);

/** GCRA: the bucket kept as the theoretical arrival time (TAT) of the next token.
 *  Returns the reservation and the TAT to store. Taking 0 tokens is granted at
 *  once and changes nothing. */
export function gcra(storedTatMs: bigint, tokens: number, bucket: Bucket, maxWaitMs: bigint, nowMs: bigint): [Reservation, bigint] {
  if (tokens === 0) return [{ granted: true, waitMs: 0n }, storedTatMs];
  const emission = bucket.refillIntervalMs;
  const tolerance = min(BigInt(bucket.capacity) * emission, U64_MAX);
  const tat = max(storedTatMs, nowMs);
  const newTat = min(tat + min(BigInt(tokens) * emission, U64_MAX), U64_MAX);
  const allowedAt = max(newTat - tolerance, 0n);
  const waitMs = max(allowedAt - nowMs, 0n);
  if (waitMs > maxWaitMs) return [{ granted: false, waitMs }, storedTatMs];
  return [{ granted: true, waitMs }, newTat];
}

/** Gives `tokens` back: the TAT moves back by `tokens` intervals, but not before
 *  `now` (a TAT at or before now is a full bucket). Returns the TAT to store. */
export function gcraRefund(storedTatMs: bigint, tokens: number, bucket: Bucket, nowMs: bigint): bigint {
  const back = min(BigInt(tokens) * bucket.refillIntervalMs, U64_MAX);
  return max(max(storedTatMs - back, 0n), min(nowMs, storedTatMs));
}

/** How far a caller's `nowMs` may be from this process's clock before the
 *  embedded backend warns (once) that the caller's clock is off: a skewed
 *  worker, a clock stepped back, µs instead of ms, 0. The buckets never use it.
 *  The Rust host's `MAX_CLOCK_SKEW_MS`. */
export const MAX_CLOCK_SKEW_MS = 5_000n;

/** The warning `EmbeddedAccounts` gives, once, the first time a caller's time
 *  is not believed. */
export interface AccountClockEvent {
  event: 'agent_retry.account_clock';
  level: 'warning';
  message: string;
  /** The time the caller passed (a number up to 2^53 − 1, else its digits). */
  host_now_ms: number | string;
  /** The process's clock, which the buckets keep. */
  process_now_ms: number;
}

export interface EmbeddedAccountsOptions {
  /** Receives the warning about a caller's clock (once per backend). Default:
   *  one JSON line through `console.warn`. */
  log?: (event: AccountClockEvent) => void;
}

const defaultClockLog = (event: AccountClockEvent): void => {
  console.warn(JSON.stringify(event));
};

/** One bucket per account in this process, shared by every run and every
 *  component instance that holds the same `EmbeddedAccounts`. Node runs
 *  JavaScript on one thread, so a synchronous `reserve` is atomic for every
 *  instance in the process.
 *
 *  The buckets are kept on this process's monotonic clock (the wall clock when
 *  the backend was made, plus `performance.now()` since), as the Redis backend
 *  keeps them on the server's. A caller's `nowMs` is not used: a step of the
 *  wall clock moves nothing, and a worker whose clock is an hour off can neither
 *  lock the account for the others nor take more than its share (a wait is a
 *  duration, the same on any clock); one more than `MAX_CLOCK_SKEW_MS` off is
 *  warned about once. Simulations that run every worker on one simulated clock
 *  (the test vectors) use `EmbeddedAccounts.onHostClock()`. */
export class EmbeddedAccounts implements AccountBudgetBackend {
  private readonly tats = new Map<string, bigint>();
  private trustHostClock = false;
  private readonly log: (event: AccountClockEvent) => void;
  private warned = false;
  private readonly epochMsAtStart = Date.now();
  private readonly startedMs = performance.now();

  /** Buckets in this process's time (see the class's documentation). */
  constructor(options: EmbeddedAccountsOptions = {}) {
    this.log = options.log ?? defaultClockLog;
  }

  /** Buckets in whatever time the callers pass: for simulations and test
   *  vectors in which every caller shares one simulated clock. A caller in µs
   *  poisons such a backend for every other caller; hence not the default. */
  static onHostClock(options: EmbeddedAccountsOptions = {}): EmbeddedAccounts {
    const accounts = new EmbeddedAccounts(options);
    accounts.trustHostClock = true;
    return accounts;
  }

  /** Whether the callers' time is trusted as it is (`onHostClock`). */
  get trustsHostClock(): boolean {
    return this.trustHostClock;
  }

  /** The time to keep the buckets in for a call that says `hostNowMs`. */
  private nowMs(hostNowMs: bigint): bigint {
    if (this.trustHostClock) return hostNowMs;
    const own = BigInt(this.epochMsAtStart + Math.floor(performance.now() - this.startedMs));
    const skew = hostNowMs > own ? hostNowMs - own : own - hostNowMs;
    if (skew > MAX_CLOCK_SKEW_MS && !this.warned) {
      this.warned = true;
      try {
        this.log({
          event: 'agent_retry.account_clock',
          level: 'warning',
          message: `the account budget got a time more than ${MAX_CLOCK_SKEW_MS} ms from this process's clock (a skewed or stepped clock? ` +
            "µs instead of ms?); the buckets keep the process's clock; said once",
          host_now_ms: jsonSafeBigInt(hostNowMs),
          process_now_ms: Number(own),
        });
      } catch {
        // A failing logger must not fail the reservation.
      }
    }
    return own;
  }

  reserve(accountId: string, tokens: number, bucket: Bucket, maxWaitMs: bigint, nowMs: bigint): Reservation {
    const now = this.nowMs(nowMs);
    const stored = this.tats.get(accountId) ?? 0n;
    const [reservation, newTat] = gcra(stored, tokens, bucket, maxWaitMs, now);
    if (newTat !== stored) this.tats.set(accountId, newTat);
    return reservation;
  }

  refund(accountId: string, tokens: number, bucket: Bucket, nowMs: bigint): void {
    const now = this.nowMs(nowMs);
    const stored = this.tats.get(accountId);
    if (stored !== undefined) this.tats.set(accountId, gcraRefund(stored, tokens, bucket, now));
  }
}

/** The default: every instance in the process draws on the same buckets, in the process's time. */
export const PROCESS_ACCOUNTS = new EmbeddedAccounts();
