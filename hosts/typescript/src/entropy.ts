// Jitter randomness supplied by the host: the OS by default, or SplitMix64 from a
// seed for runs that must replay exactly (the algorithm of
// hosts/rust/src/entropy.rs, so a seed gives the same sequence in every host).
import { getRandomValues } from 'node:crypto';

const MASK = (1n << 64n) - 1n;
/** The guest never asks for more than a few bytes; cap what a bad one could ask. */
export const MAX_RANDOM_BYTES = 4096;

export interface EntropySource {
  /** The next 64 bits, in [0, 2^64). */
  nextU64(): bigint;
}

/** The operating system's randomness. */
export class OsEntropy implements EntropySource {
  private readonly buffer = new BigUint64Array(1);
  nextU64(): bigint {
    getRandomValues(this.buffer);
    return this.buffer[0];
  }
}

export function splitmix64Mix(z: bigint): bigint {
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
  return z ^ (z >> 31n);
}

/** SplitMix64: `x += 0x9E3779B97F4A7C15`, then the mix, mod 2^64. */
export class SplitMix64 implements EntropySource {
  private state: bigint;
  constructor(seed: bigint) {
    if (seed < 0n || seed > MASK) throw new RangeError(`a SplitMix64 seed is a u64, got ${seed}`);
    this.state = seed;
  }
  nextU64(): bigint {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK;
    return splitmix64Mix(this.state);
  }
}

/** `length` bytes (at most MAX_RANDOM_BYTES): whole u64 draws, little-endian, as
 *  the Rust host fills `get-random-bytes`. */
export function randomBytes(source: EntropySource, length: number): Uint8Array {
  const n = Math.min(length, MAX_RANDOM_BYTES);
  const words = new BigUint64Array(Math.ceil(n / 8));
  for (let i = 0; i < words.length; i++) words[i] = source.nextU64();
  // BigUint64Array is in the platform's byte order; write little-endian explicitly.
  const bytes = new Uint8Array(words.length * 8);
  const view = new DataView(bytes.buffer);
  words.forEach((w, i) => view.setBigUint64(i * 8, w, true));
  return bytes.slice(0, n);
}
