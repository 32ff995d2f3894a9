// The contract's types (wit/types.wit, wit/policy.wit) as data, and the mapping
// between their canonical JSON form (tests/vectors/README.md) and jco's form.
//
// jco exposes no types at run time, so the WIT types are written out here, once.
// Drift is caught by the conformance vectors and by `make test-hosts-agree`,
// which compares every vector output of this host with the Python host's
// (whose conversion reads the types from the component itself).
//
// jco's form: records have lowerCamelCase fields, an option is the value or
// `undefined`, a variant is `{tag, val}`, an enum a string, a u64 a BigInt,
// a list or tuple an array. Canonical JSON: kebab-case keys, `null`,
// `"case"` / `{"case": payload}`, u64 as a number or a "0x..." hex string.

export type WitType =
  | { kind: 'bool' | 'u16' | 'u32' | 's32' | 'u64' | 'string' }
  | { kind: 'list'; of: WitType }
  | { kind: 'tuple'; of: WitType[] }
  | { kind: 'record'; name: string; fields: Array<[string, WitType]> }
  | { kind: 'variant'; name: string; cases: Array<[string, WitType | null]> }
  | { kind: 'enum'; name: string; names: string[] }
  | { kind: 'option'; of: WitType }
  | { kind: 'result'; ok: WitType | null; err: WitType | null };

const bool: WitType = { kind: 'bool' };
const u16: WitType = { kind: 'u16' };
const u32: WitType = { kind: 'u32' };
const s32: WitType = { kind: 's32' };
const u64: WitType = { kind: 'u64' };
const string: WitType = { kind: 'string' };
const list = (of: WitType): WitType => ({ kind: 'list', of });
const tuple = (...of: WitType[]): WitType => ({ kind: 'tuple', of });
const option = (of: WitType): WitType => ({ kind: 'option', of });
const record = (name: string, fields: Array<[string, WitType]>): WitType => ({ kind: 'record', name, fields });
const variant = (name: string, cases: Array<[string, WitType | null]>): WitType => ({ kind: 'variant', name, cases });
const enumOf = (name: string, ...names: string[]): WitType => ({ kind: 'enum', name, names });
const result = (ok: WitType | null, err: WitType | null): WitType => ({ kind: 'result', ok, err });

const transportError = enumOf('transport-error', 'timeout', 'connection-reset', 'connection-refused', 'stream-closed', 'other');
const failureKind = variant('failure-kind', [['http-status', u16], ['transport', transportError], ['protocol-error', s32], ['tool-error', option(u16)]]);
const failure = record('failure', [
  ['kind', failureKind], ['headers', list(tuple(string, string))], ['body', string], ['structured-content', option(string)],
]);
const outcomeClass = enumOf('outcome-class', 'success', 'transient', 'throttled', 'deterministic', 'permission', 'semantic', 'unclassified');
const headerProblem = record('header-problem', [['name', string], ['value', string], ['problem', string]]);
const classification = record('classification', [
  ['class', outcomeClass], ['hint-ms', option(u64)], ['hint-source', option(string)], ['server-says-retry', option(bool)], ['rule', string],
  ['reason', string], ['header-problems', list(headerProblem)],
]);
const effect = enumOf('effect', 'read', 'write', 'delete');
const toolHints = record('tool-hints', [['read-only', option(bool)], ['destructive', option(bool)], ['idempotent', option(bool)]]);
const callRequest = record('call-request', [['tool', string], ['idempotency-key', option(string)], ['hints', option(toolHints)]]);
const callTicket = record('call-ticket', [['call-id', u32], ['delay-ms', u64], ['effect', effect], ['safe-to-repeat', bool]]);
const escalationReason = enumOf('escalation-reason', 'permission-denied', 'replans-spent', 'call-attempts-spent', 'run-retries-spent',
  'run-steps-spent', 'server-wait-too-long', 'retry-forbidden', 'account-budget-exhausted', 'retry-quota-exhausted', 'unclassified-failure',
  'status-unknown');
const effectStatus = enumOf('effect-status', 'applied', 'unknown');
const effectRecord = record('effect-record', [['call-id', u32], ['tool', string], ['idempotency-key', option(string)], ['status', effectStatus]]);
const escalation = record('escalation', [
  ['reason', escalationReason], ['last-error', option(string)], ['resets-in-ms', option(u64)], ['effects', list(effectRecord)], ['note', string],
]);
const retryPlan = record('retry-plan', [['delay-ms', u64], ['attempt', u32], ['idempotency-key', option(string)]]);
const action = variant('action', [['retry', retryPlan], ['replan', string], ['check-status', null], ['succeed', option(string)], ['escalate', escalation]]);
const decision = record('decision', [
  ['action', action], ['class', outcomeClass], ['attempt', u32], ['hint-ms', option(u64)], ['rule', string], ['reason', string],
]);
const admission = variant('admission', [['send', callTicket], ['escalate', escalation]]);
const statusCheckResult = enumOf('status-check-result', 'found', 'absent', 'unknown');
const outcome = variant('outcome', [['success', null], ['empty-result', string], ['failure', failure], ['status-check', statusCheckResult]]);
const statusCount = record('status-count', [['status', u16], ['count', u32]]);
const runReport = record('run-report', [
  ['run-id', string], ['calls', u32], ['attempts', u32], ['retries', u32], ['status-checks', u32], ['replans', u32],
  ['succeeded-calls', u32], ['waits', u32], ['waited-ms', u64], ['escalation', option(escalationReason)],
  ['statuses', list(statusCount)], ['effects', list(effectRecord)],
]);
const runError = variant('run-error', [
  ['unknown-call', u32], ['call-finished', u32], ['status-check-pending', u32], ['no-status-check-pending', u32], ['run-ended', escalationReason],
]);
const configErrorKind = enumOf('config-error-kind', 'syntax', 'unknown-field', 'wrong-type', 'out-of-range');
const configError = record('config-error', [['kind', configErrorKind], ['field', string], ['message', string]]);

/** The types the host passes or receives, by WIT name. */
export const TYPES = {
  failure, classification, callRequest, outcome, decision, admission, runReport, runError, configError,
} as const;

/** Parameter and result types of the policy interface's functions (resources excluded). */
export const FUNCTIONS = {
  'derive-idempotency-key': { params: [string, string], result: string },
  '[static]policy.from-json': { params: [string], result: result(null, configError) },
  '[method]policy.effective-config': { params: [], result: string },
  '[method]policy.classify': { params: [failure, u64], result: classification },
  '[method]policy.next-delay': { params: [u32, option(u64), option(u64)], result: u64 },
  '[method]policy.start-run': { params: [string], result: null },
  '[method]run.begin-call': { params: [callRequest, u64], result: result(admission, runError) },
  '[method]run.record-outcome': { params: [u32, outcome, u64, option(u64)], result: result(decision, runError) },
  '[method]run.report': { params: [], result: runReport },
} as const satisfies Record<string, { params: readonly WitType[]; result: WitType | null }>;

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
