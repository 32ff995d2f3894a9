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

/** How far a caller's `nowMs` may be from this process's clock (`Date.now()`)
 *  before the embedded backend stops believing it: a day covers every sane host
 *  clock, and the demo's sped-up policy time; a clock in µs (1,000× ahead), one
 *  in the past or 0 is far outside. The Rust host's `MAX_CLOCK_SKEW_MS`. */
export const MAX_CLOCK_SKEW_MS = 24n * 60n * 60n * 1000n;

/** The warning `EmbeddedAccounts` gives, once, the first time a caller's time
 *  is not believed. */
export interface AccountClockEvent {
  event: 'agent_retry.account_clock';
  level: 'warning';
  message: string;
  /** The time the caller passed (a number up to 2^53 − 1, else its digits). */
  host_now_ms: number | string;
  /** The process's clock, used instead for that call. */
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
 *  The buckets are kept in this process's time, as the Redis backend keeps them
 *  in the server's: a `nowMs` more than `MAX_CLOCK_SKEW_MS` from the process's
 *  clock (a worker passing µs, a clock in the past, 0) is not believed; that
 *  call uses the process's clock instead (warned once), so one bad clock cannot
 *  move the account's state for every worker. Simulations that run every
 *  worker on one simulated clock (the test vectors) use
 *  `EmbeddedAccounts.onHostClock()`. */
export class EmbeddedAccounts implements AccountBudgetBackend {
  private readonly tats = new Map<string, bigint>();
  private trustHostClock = false;
  private readonly log: (event: AccountClockEvent) => void;
  private warned = false;

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
    const own = BigInt(Date.now());
    const skew = hostNowMs > own ? hostNowMs - own : own - hostNowMs;
    if (skew <= MAX_CLOCK_SKEW_MS) return hostNowMs;
    if (!this.warned) {
      this.warned = true;
      try {
        this.log({
          event: 'agent_retry.account_clock',
          level: 'warning',
          message: "the account budget got a time far from this process's clock (µs instead of ms? a clock in the past?): " +
            "that call used the process's clock; said once",
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
