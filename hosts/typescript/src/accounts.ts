// The account budget the component imports: an atomic take-or-wait on a token
// bucket per account, embedded in this process and shared by every instance.
// The algorithm is `gcra` in hosts/rust/src/accounts/embedded.rs, copied exactly,
// including saturation at u64 (BigInt does not overflow, so every saturating
// operation is written out).

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

/** One bucket per account in this process. Node runs JavaScript on one thread,
 *  so a synchronous `reserve` is atomic for every instance in the process. */
export class EmbeddedAccounts implements AccountBudgetBackend {
  private readonly tats = new Map<string, bigint>();

  reserve(accountId: string, tokens: number, bucket: Bucket, maxWaitMs: bigint, nowMs: bigint): Reservation {
    const stored = this.tats.get(accountId) ?? 0n;
    const [reservation, newTat] = gcra(stored, tokens, bucket, maxWaitMs, nowMs);
    if (newTat !== stored) this.tats.set(accountId, newTat);
    return reservation;
  }

  refund(accountId: string, tokens: number, bucket: Bucket, nowMs: bigint): void {
    const stored = this.tats.get(accountId);
    if (stored !== undefined) this.tats.set(accountId, gcraRefund(stored, tokens, bucket, nowMs));
  }
}

/** The default: every instance in the process draws on the same buckets. */
export const PROCESS_ACCOUNTS = new EmbeddedAccounts();
