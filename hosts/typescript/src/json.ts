// JSON-safe values. jco gives every u64 as a `bigint`, which `JSON.stringify`
// refuses ("Do not know how to serialize a BigInt"). Here a bigint becomes a
// number when it is a safe integer (|n| <= Number.MAX_SAFE_INTEGER, 2^53 - 1),
// else its decimal digits as a string: no value is ever rounded.

/** `T` with every `bigint` as `number | string` (see `toJsonSafe`). */
export type JsonSafe<T> = T extends bigint
  ? number | string
  : T extends (infer U)[]
    ? JsonSafe<U>[]
    : T extends readonly (infer U)[]
      ? readonly JsonSafe<U>[]
      : T extends object
        ? { [K in keyof T]: JsonSafe<T[K]> }
        : T;

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** A bigint as a number if it is a safe integer, else as its decimal digits. */
export function jsonSafeBigInt(value: bigint): number | string {
  return value <= MAX_SAFE && value >= -MAX_SAFE ? Number(value) : value.toString();
}

/** A deep copy of `value` with every bigint made JSON-safe (`jsonSafeBigInt`);
 *  `JSON.stringify(toJsonSafe(x))` never throws on a value from this package. */
export function toJsonSafe<T>(value: T): JsonSafe<T> {
  if (typeof value === 'bigint') return jsonSafeBigInt(value) as JsonSafe<T>;
  if (Array.isArray(value)) return value.map((item) => toJsonSafe(item)) as JsonSafe<T>;
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = toJsonSafe(item);
    return out as JsonSafe<T>;
  }
  return value as JsonSafe<T>;
}

/** `value` with a non-enumerable `toJSON()` returning `toJsonSafe(value)`, so that
 *  `JSON.stringify(value)` works while the fields keep their `bigint`s. */
export function withJson<T extends object>(value: T): T & { toJSON(): JsonSafe<T> } {
  const copy = toJsonSafe(value);
  Object.defineProperty(value, 'toJSON', { value: () => copy, enumerable: false, configurable: true, writable: true });
  return value as T & { toJSON(): JsonSafe<T> };
}
