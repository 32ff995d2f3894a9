// Helpers for tests of code that runs under the policy: a clock whose waits
// take no time, and jitter entropy that replays (SplitMix64 from a seed, the
// same sequence in every host).
import { SplitMix64, type EntropySource } from './entropy.js';

/** A fake clock: `nowMs()` is `startMs` plus every wait so far; `sleep(ms)`
 *  moves it at once and records the wait. Give it as `withPolicy`'s `clock`. */
export class FakeClock {
  private now: number;
  /** Every wait asked for, in ms, in order. */
  readonly sleeps: number[] = [];

  constructor(startMs: number = Date.UTC(2026, 0, 1)) {
    if (!Number.isSafeInteger(startMs) || startMs < 0) throw new RangeError(`startMs must be a non-negative integer of ms, not ${startMs}`);
    this.now = startMs;
  }

  nowMs(): number {
    return this.now;
  }

  async sleep(ms: number): Promise<void> {
    const wait = Number.isFinite(ms) && ms > 0 ? Math.floor(ms) : 0;
    this.sleeps.push(wait);
    this.now += wait;
  }

  /** Moves the clock without a wait (time passing elsewhere). */
  advance(ms: number): void {
    if (Number.isFinite(ms) && ms > 0) this.now += Math.floor(ms);
  }
}

/** Jitter entropy that replays: SplitMix64 from `seed` (a u64). */
export function fixedEntropy(seed: number | bigint): EntropySource {
  return new SplitMix64(BigInt(seed));
}
