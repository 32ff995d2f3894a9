// The contract's types (wit/types.wit, wit/policy.wit) as data, and the mapping
// between their canonical JSON form (tests/vectors/README.md) and jco's form.
//
// jco exposes no types at run time, so the WIT types are data here: wit-types.ts,
// generated from wit/ by tests/contract/make_mirrors.py (`--check` runs in make test).
//
// jco's form: records have lowerCamelCase fields, an option is the value or
// `undefined`, a variant is `{tag, val}`, an enum a string, a u64 a BigInt,
// a list or tuple an array. Canonical JSON: kebab-case keys, `null`,
// `"case"` / `{"case": payload}`, u64 as a number or a "0x..." hex string.

import { FUNCTIONS } from './wit-types.js';
import * as T from './wit-types.js';
import type { WitType } from './wit-kinds.js';

export type { WitType } from './wit-kinds.js';
export { FUNCTIONS };

/** The types the host passes or receives, by WIT name (generated from wit/ into wit-types.ts). */
export const TYPES = {
  observation: T.observation, classification: T.classification, decision: T.decision, runReport: T.runReport, runError: T.runError,
  configError: T.configError, toolHints: T.toolHints, failureKind: T.failureKind, escalation: T.escalation, actionKind: T.actionKind,
  verdict: T.verdict, callStart: T.callStart, statusCheckResult: T.statusCheckResult, delivery: T.delivery, probeAnswer: T.probeAnswer,
  taskReport: T.taskReport, taskStatus: T.taskStatus, pollPlan: T.pollPlan,
} as const;

/** A JSON value that does not fit the WIT type it is passed as. */
export class ValueConversionError extends TypeError {}

/** `hint-ms` -> `hintMs`: jco's field names. */
export function camel(name: string): string {
  return name.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

const HEX_U64 = /^0x[0-9a-fA-F]{1,16}$/;
const U64_MAX = (1n << 64n) - 1n;

function describe(value: unknown): string {
  const text = typeof value === 'bigint' ? `${value}` : JSON.stringify(value) ?? String(value);
  return text.length <= 60 ? text : `${text.slice(0, 57)}...`;
}

function int(value: unknown, lo: number, hi: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) throw new ValueConversionError(`${describe(value)} is not an integer`);
  if (value < lo || value > hi) throw new ValueConversionError(`${value} is out of range`);
  return value;
}

/** A u64 given as a JSON number, a "0x..." hex string, or a BigInt. */
export function parseU64(value: unknown): bigint {
  let n: bigint;
  if (typeof value === 'bigint') n = value;
  else if (typeof value === 'number' && Number.isInteger(value)) n = BigInt(value);
  else if (typeof value === 'string' && HEX_U64.test(value)) n = BigInt(value);
  else throw new ValueConversionError(`${describe(value)} is not a u64`);
  if (n < 0n || n > U64_MAX) throw new ValueConversionError(`${n} is out of range`);
  return n;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function absent(type: WitType): unknown {
  switch (type.kind) {
    case 'option': return null;
    case 'list': return [];
    case 'string': return '';
    case 'bool': return false;
    default: throw new ValueConversionError('is required');
  }
}

/** Canonical JSON -> jco's value of `type`. */
export function toJco(value: unknown, type: WitType): unknown {
  switch (type.kind) {
    case 'bool':
      if (typeof value !== 'boolean') throw new ValueConversionError(`${describe(value)} is not a boolean`);
      return value;
    case 'u16': return int(value, 0, 0xffff);
    case 'u32': return int(value, 0, 0xffffffff);
    case 's32': return int(value, -(2 ** 31), 2 ** 31 - 1);
    case 'u64': return parseU64(value);
    case 'string':
      if (typeof value !== 'string') throw new ValueConversionError(`${describe(value)} is not a string`);
      return value;
    case 'list':
      if (!Array.isArray(value)) throw new ValueConversionError(`${describe(value)} is not an array`);
      return value.map((item) => toJco(item, type.of));
    case 'tuple':
      if (!Array.isArray(value) || value.length !== type.of.length) {
        throw new ValueConversionError(`${describe(value)} is not a tuple of ${type.of.length} items`);
      }
      return value.map((item, i) => toJco(item, type.of[i]));
    case 'record': {
      if (!isObject(value)) throw new ValueConversionError(`${describe(value)} is not an object`);
      const names = type.fields.map(([name]) => name);
      const unknown = Object.keys(value).find((k) => !names.includes(k));
      if (unknown !== undefined) throw new ValueConversionError(`"${unknown}" is not a field of ${JSON.stringify(names)}`);
      const out: Record<string, unknown> = {};
      for (const [name, fieldType] of type.fields) {
        try {
          out[camel(name)] = toJco(name in value ? value[name] : absent(fieldType), fieldType);
        } catch (e) {
          throw new ValueConversionError(`${name}: ${(e as Error).message}`);
        }
      }
      return out;
    }
    case 'variant': {
      let name: string;
      let payload: unknown;
      let hasPayload: boolean;
      if (typeof value === 'string') {
        [name, payload, hasPayload] = [value, undefined, false];
      } else if (isObject(value) && Object.keys(value).length === 1) {
        name = Object.keys(value)[0];
        [payload, hasPayload] = [value[name], true];
      } else {
        throw new ValueConversionError(`${describe(value)} is not a variant case`);
      }
      const found = type.cases.find(([caseName]) => caseName === name);
      if (!found) throw new ValueConversionError(`"${name}" is not a case of ${type.name}`);
      const caseType = found[1];
      if (caseType === null && hasPayload) throw new ValueConversionError(`case "${name}" takes no payload`);
      if (caseType !== null && !hasPayload) throw new ValueConversionError(`case "${name}" needs a payload: {"${name}": ..}`);
      return caseType === null ? { tag: name } : { tag: name, val: toJco(payload, caseType) };
    }
    case 'enum':
      if (typeof value !== 'string' || !type.names.includes(value)) {
        throw new ValueConversionError(`${describe(value)} is not a case of ${type.name}`);
      }
      return value;
    case 'option':
      return value === null ? undefined : toJco(value, type.of);
    case 'result':
      throw new ValueConversionError('results are never passed to the component');
  }
}

/** jco's value of `type` -> canonical JSON (u64 stays a BigInt, for exactness). */
export function fromJco(value: unknown, type: WitType): unknown {
  switch (type.kind) {
    case 'bool': case 'u16': case 'u32': case 's32': case 'string': case 'enum':
      return value;
    case 'u64':
      return BigInt(value as bigint);
    case 'list': case 'tuple':
      return (value as unknown[]).map((item, i) => fromJco(item, type.kind === 'list' ? type.of : type.of[i]));
    case 'record': {
      const source = value as Record<string, unknown>;
      const out: Record<string, unknown> = {};
      for (const [name, fieldType] of type.fields) out[name] = fromJco(source[camel(name)], fieldType);
      return out;
    }
    case 'variant': {
      const { tag, val } = value as { tag: string; val?: unknown };
      const found = type.cases.find(([caseName]) => caseName === tag);
      if (!found) throw new ValueConversionError(`the component returned an unknown case "${tag}" of ${type.name}`);
      return found[1] === null ? tag : { [tag]: fromJco(val, found[1]) };
    }
    case 'option':
      return value === undefined ? null : fromJco(value, type.of);
    case 'result':
      throw new ValueConversionError('results are converted by the caller');
  }
}

/** A check of a jco value: undefined if it fits, else what is wrong (the path
 *  is built only then, so that a passing check costs little). */
type Check = (value: unknown) => string | undefined;
/** `.field` + `: what` or `.field` + `[0]: what`: a path, then what is wrong. */
const under = (step: string, wrong: string) => `${step}${/^[.[(]/.test(wrong) ? '' : ': '}${wrong}`;
const compiled = new WeakMap<WitType, Check>();

function compile(type: WitType): Check {
  const done = compiled.get(type);
  if (done) return done;
  let check: Check;
  switch (type.kind) {
    case 'bool':
      check = (v) => (typeof v === 'boolean' ? undefined : `${describe(v)} is not a boolean`);
      break;
    case 'u16': case 'u32': case 's32': {
      const [lo, hi] = type.kind === 'u16' ? [0, 0xffff] : type.kind === 'u32' ? [0, 0xffffffff] : [-(2 ** 31), 2 ** 31 - 1];
      const kind = type.kind;
      check = (v) => {
        if (typeof v !== 'number' || !Number.isInteger(v)) return `${describe(v)} is not an integer`;
        return v < lo || v > hi ? `${v} is out of range for ${kind} (${lo}..${hi})` : undefined;
      };
      break;
    }
    case 'u64':
      check = (v) => {
        if (typeof v !== 'bigint') return `${describe(v)} is not a bigint (u64)`;
        return v < 0n || v > U64_MAX ? `${v} is out of range for u64` : undefined;
      };
      break;
    case 'string':
      check = (v) => (typeof v === 'string' ? undefined : `${describe(v)} is not a string`);
      break;
    case 'list': {
      let item: Check | undefined;
      const of = type.of;
      check = (v) => {
        if (!Array.isArray(v)) return `${describe(v)} is not an array`;
        item ??= compile(of);
        for (let i = 0; i < v.length; i++) {
          const wrong = item(v[i]);
          if (wrong !== undefined) return under(`[${i}]`, wrong);
        }
        return undefined;
      };
      break;
    }
    case 'tuple': {
      const items = type.of;
      check = (v) => {
        if (!Array.isArray(v) || v.length !== items.length) return `${describe(v)} is not a tuple of ${items.length} items`;
        for (let i = 0; i < items.length; i++) {
          const wrong = compile(items[i])(v[i]);
          if (wrong !== undefined) return under(`[${i}]`, wrong);
        }
        return undefined;
      };
      break;
    }
    case 'record': {
      const fields = type.fields.map(([name, fieldType]) => [camel(name), fieldType] as const);
      check = (v) => {
        if (typeof v !== 'object' || v === null) return `${describe(v)} is not an object`;
        for (const [name, fieldType] of fields) {
          const wrong = compile(fieldType)((v as Record<string, unknown>)[name]);
          if (wrong !== undefined) return under(`.${name}`, wrong);
        }
        return undefined;
      };
      break;
    }
    case 'variant': {
      const cases = new Map(type.cases);
      const name = type.name;
      check = (v) => {
        const tag = (v as { tag?: unknown } | null | undefined)?.tag;
        const payload = typeof tag === 'string' ? cases.get(tag) : undefined;
        if (payload === undefined) return `${describe(tag ?? v)} is not a case of ${name}`;
        if (payload === null) return undefined;
        const wrong = compile(payload)((v as { val?: unknown }).val);
        return wrong === undefined ? undefined : under(`(${String(tag)})`, wrong);
      };
      break;
    }
    case 'enum': {
      const names = new Set(type.names);
      const name = type.name;
      check = (v) => (typeof v === 'string' && names.has(v) ? undefined : `${describe(v)} is not a case of ${name}`);
      break;
    }
    case 'option': {
      const of = type.of;
      check = (v) => (v === undefined || v === null ? undefined : compile(of)(v));
      break;
    }
    case 'result':
      check = () => 'results are never passed to the component';
      break;
  }
  compiled.set(type, check);
  return check;
}

/** Checks a value in jco's form against its WIT type before it is passed to the
 *  component: jco's own lowering wraps integers (a u16 of 66039 becomes 503, a
 *  negative u64 a huge one) and treats any value as a bool. Throws
 *  `ValueConversionError` naming the path; nothing reaches the component. */
export function checkJco(value: unknown, type: WitType, path: string): void {
  const wrong = compile(type)(value);
  if (wrong !== undefined) throw new ValueConversionError(under(path, wrong));
}

/** What is wrong with a jco value for its WIT type, or undefined if nothing is. */
export function jcoProblem(value: unknown, type: WitType): string | undefined {
  return compile(type)(value);
}
