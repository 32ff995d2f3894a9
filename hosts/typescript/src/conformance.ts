// The conformance vector runner (tests/vectors/README.md) for the Node host.
//
// Every case runs against a fresh instance with a fresh embedded account budget
// on the vectors' simulated clock (`EmbeddedAccounts.onHostClock()`);
// inputs are converted from canonical JSON by each function's WIT parameter
// types (wit.ts), outputs converted back and matched against the expectations.
//
// Flat mode (`{ flat: true }`, contract 0.4.0) runs a case through the hot path
// instead: a `begin-call` step as `begin-call-flat` (+ `escalation()` when the
// call is not admitted), a `record-outcome` of a success or a failure as
// `record-success` / `record-failure` (headers joined as `Run.recordFailure`
// joins them) + `last-decision(call-id)`, each turned back into the rich
// answer; every other step as in rich mode. Each verdict must agree with the
// decision `last-decision` gives (action, class, attempt, delay, hint, rule,
// whether it has a note), and the outputs must equal rich mode's exactly.
// `runAll` runs every case both ways; `--dump` writes rich mode's outputs.
//
//   node dist/src/conformance.js [VECTOR_DIR] [--dump OUTPUTS.jsonl]
//
// prints a line per failed case and `N passed, N failed`.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { EmbeddedAccounts } from './accounts.js';
import { PolicyComponent, type PolicyInstance } from './component.js';
import { SplitMix64 } from './entropy.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { joinedHeaders, utf8Length } from './limits.js';
import { FUNCTIONS, camel, fromJco, parseU64, toJco, type WitType } from './wit.js';

/** The clock at the start of every case: 2025-11-30T00:00:00Z. */
export const DEFAULT_START_MS = 1_764_460_800_000n;
/** The entropy of a step that gives none: the middle of the range. */
export const DEFAULT_ENTROPY = 0x8000_0000_0000_0000n;

const STEP_KEYS = new Set(['op', 'expect', 'now-ms', 'entropy', 'config', 'config-text', 'failure', 'retry', 'hint-ms',
  'run-id', 'action-id', 'call', 'call-id', 'attempt', 'outcome', 'start', 'max-count', 'comment']);

export const defaultVectorDir = resolve(dirname(fileURLToPath(import.meta.url)), '../../../../tests/vectors');

/** A bad vector or a trap: not an answer of the component. */
export class HarnessError extends Error {}

export interface VectorCase {
  description: string;
  comment?: string;
  config?: unknown;
  steps: Array<Record<string, unknown>>;
}

/** A vector file: `{"description", "cases": [...]}`. */
export interface VectorFile {
  description: string;
  cases: VectorCase[];
}

const FILE_KEYS = new Set(['description', 'cases']);
const CASE_KEYS = new Set(['description', 'comment', 'config', 'steps']);

/** Parses one vector file's text, as strictly as the Rust host's format
 *  (`hosts/rust/src/vectors/format.rs`: no unknown fields; a case has a
 *  `description` and `steps`, maybe a `comment` and a `config`). Throws a
 *  `HarnessError` saying what is wrong. A step is checked when it runs. */
export function parseVectorFile(text: string): VectorFile {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new HarnessError(`not JSON: ${(e as Error).message}`);
  }
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(value)) throw new HarnessError('a vector file is an object {"description", "cases"}');
  const unknownKey = (object: Record<string, unknown>, known: Set<string>) => Object.keys(object).find((k) => !known.has(k));
  const extra = unknownKey(value, FILE_KEYS);
  if (extra !== undefined) throw new HarnessError(`unknown field "${extra}" in the file`);
  if (typeof value.description !== 'string') throw new HarnessError('the file has no "description" (a string)');
  if (!Array.isArray(value.cases)) throw new HarnessError('the file has no "cases" (an array)');
  const cases = value.cases.map((c: unknown, i: number): VectorCase => {
    const where = `case ${i + 1}`;
    if (!isObject(c)) throw new HarnessError(`${where} is not an object`);
    const extraKey = unknownKey(c, CASE_KEYS);
    if (extraKey !== undefined) throw new HarnessError(`unknown field "${extraKey}" in ${where}`);
    if (typeof c.description !== 'string') throw new HarnessError(`${where} has no "description" (a string)`);
    if (!Array.isArray(c.steps)) throw new HarnessError(`case "${c.description}" has no "steps" (an array)`);
    if (c.comment !== undefined && c.comment !== null && typeof c.comment !== 'string') throw new HarnessError(`case "${c.description}": "comment" is not a string`);
    return c as unknown as VectorCase;
  });
  return { description: value.description, cases };
}

/** Every `*.json` in `dir` but schema.json, sorted by name. */
export function loadVectorFiles(dir: string): Array<{ file: string; cases: VectorCase[] }> {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json') && f !== 'schema.json')
    .sort()
    .map((file) => ({ file, cases: (JSON.parse(readFileSync(join(dir, file), 'utf8')) as { cases: VectorCase[] }).cases }));
}

type Json = null | boolean | number | bigint | string | Json[] | { [key: string]: Json };

/** JSON text with sorted keys and BigInts as exact digits: the Rust runner sends
 *  configs in serde_json's compact, key-sorted form, and outputs are compared
 *  across runs and hosts in this form. */
export function canonicalText(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'bigint') return value.toString();
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonicalText).join(',')}]`;
  const object = value as Record<string, unknown>;
  return `{${Object.keys(object).sort().map((k) => `${JSON.stringify(k)}:${canonicalText(object[k])}`).join(',')}}`;
}

function optionalU64(step: Record<string, unknown>, name: string): bigint | null {
  const value = step[name];
  if (value === undefined || value === null) return null;
  try {
    return parseU64(value);
  } catch (e) {
    throw new HarnessError(`"${name}": ${(e as Error).message}`);
  }
}

function u32(step: Record<string, unknown>, name: string): number {
  const value = step[name];
  if (typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= 0xffffffff) return value;
  throw new HarnessError(`"${name}" must be a u32`);
}

function text(step: Record<string, unknown>, name: string): string {
  const value = step[name];
  if (typeof value !== 'string') throw new HarnessError(`"${name}" must be a string`);
  return value;
}

function field(step: Record<string, unknown>, name: string): unknown {
  if (!(name in step)) throw new HarnessError(`the step has no "${name}"`);
  return step[name];
}

type Resource = Record<string, (...args: unknown[]) => unknown>;

/** The component, called with canonical JSON values. */
export class Subject {
  policy?: Resource;
  run?: Resource;

  private constructor(readonly instance: PolicyInstance) {}

  static async create(component: PolicyComponent): Promise<Subject> {
    // A fixed seed keeps even the guest's own draws reproducible; the vectors
    // always pass entropy, so it is never used.
    // The vectors run on a simulated clock (DEFAULT_START_MS, then the steps'
    // `now-ms`): the budget keeps its buckets in that time, not the process's.
    return new Subject(await component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(0n) }));
  }

  /** Calls export `name` with canonical arguments converted by its WIT types.
   *  `configBytes`: the call runs on a configuration's tank (from-json's is set here). */
  call(name: keyof typeof FUNCTIONS, self: Resource | undefined, args: unknown[], configBytes?: number): Json {
    return this.callLowered(name, self, args.map((arg, i) => lowerArg(name, i, arg)), configBytes);
  }

  /** Calls export `name` with arguments already in jco's form. */
  callLowered(name: keyof typeof FUNCTIONS, self: Resource | undefined, lowered: unknown[], configBytes?: number): Json {
    const spec = FUNCTIONS[name];
    const exports = this.instance.exports as unknown as Record<string, unknown> & { Policy: Resource };
    const method = name.includes(']') ? camel(name.slice(name.indexOf('.') + 1)) : camel(name);
    const target: Resource = name.startsWith('[static]') ? exports.Policy : self ?? (exports as unknown as Resource);
    const invoke = () => target[method].apply(target, lowered);
    // A configuration's load runs on its own tank, sized by the text (as loadPolicy's).
    if (name === '[static]policy.from-json') configBytes = utf8Length(lowered[0] as string);
    const resultType = spec.result as WitType | null;
    if (resultType?.kind === 'result') {
      try {
        const value = this.instance.guard(name, invoke, configBytes);
        return { ok: resultType.ok ? (fromJco(value, resultType.ok) as Json) : (value as Json) };
      } catch (e) {
        if (e instanceof Error && 'payload' in e && e.constructor.name === 'ComponentError') {
          return { err: resultType.err ? (fromJco((e as { payload: unknown }).payload, resultType.err) as Json) : null };
        }
        throw e;
      }
    }
    const value = this.instance.guard(name, invoke, configBytes);
    return resultType ? (fromJco(value, resultType) as Json) : (value as Json);
  }

  loadPolicy(configText: string): Json {
    const loaded = this.call('[static]policy.from-json', undefined, [configText]) as { ok?: unknown; err?: Json };
    if (!('ok' in loaded)) return loaded as Json;
    const policy = loaded.ok as Resource;
    // Serialising the configuration is linear in it: the load's tank.
    const effective = this.call('[method]policy.effective-config', policy, [], utf8Length(configText)) as string;
    this.policy = policy;
    return { ok: JSON.parse(effective) as Json };
  }

  needPolicy(): Resource {
    if (!this.policy) throw new HarnessError('no policy loaded');
    return this.policy;
  }

  needRun(): Resource {
    if (!this.run) throw new HarnessError('no run');
    return this.run;
  }

  /** `{"ok": null}` (the started run becomes the current run) or `{"err": run-error}`
   *  (the previous run stays current). */
  startRun(runId: string): Json {
    const answer = this.call('[method]policy.start-run', this.needPolicy(), [runId]) as { ok?: unknown; err?: Json };
    if (!('ok' in answer)) return answer as Json;
    this.run = answer.ok as Resource;
    return { ok: null };
  }
}

/** Argument `i` of export `name`, canonical JSON -> jco's form (a `HarnessError` if it does not fit). */
function lowerArg(name: keyof typeof FUNCTIONS, i: number, arg: unknown): unknown {
  try {
    return toJco(arg, FUNCTIONS[name].params[i]);
  } catch (e) {
    throw new HarnessError(`${name}: argument ${i + 1}: ${(e as Error).message}`);
  }
}

interface State {
  now: bigint;
  /** Flat mode: the component's `rule-names()` (else undefined: rich mode). */
  ruleNames?: string[];
  started: boolean;
  /** Per call id, the attempt sent last: 1 after `begin-call` answered `send`,
   *  then each retry plan's `attempt` (what a `record-outcome` reports by default). */
  attempts: Map<number, number>;
}

/** `value[a][b]...` of a JSON answer, or undefined. */
function at(value: unknown, ...path: string[]): unknown {
  let here = value;
  for (const key of path) {
    if (typeof here !== 'object' || here === null || Array.isArray(here)) return undefined;
    here = (here as Record<string, unknown>)[key];
  }
  return here;
}

const asU32 = (value: unknown): number | undefined =>
  typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= 0xffffffff ? value : undefined;

function runStep(subject: Subject, step: Record<string, unknown>, state: State): Json {
  if (typeof step !== 'object' || step === null || Array.isArray(step)) throw new HarnessError('a step must be an object');
  const unknown = Object.keys(step).find((k) => !STEP_KEYS.has(k));
  if (unknown !== undefined) throw new HarnessError(`unknown step field "${unknown}"`);
  const now = optionalU64(step, 'now-ms');
  if (now !== null) state.now = now;
  const entropy = optionalU64(step, 'entropy') ?? DEFAULT_ENTROPY;
  const op = text(step, 'op');
  if (['begin-call', 'record-outcome', 'report', 'effects'].includes(op) && !state.started) {
    subject.startRun('run-1');
    state.started = true;
  }
  switch (op) {
    case 'load-policy': {
      const hasConfig = 'config' in step;
      const hasText = 'config-text' in step;
      if (hasConfig && !hasText) return subject.loadPolicy(canonicalText(step.config));
      if (hasText && !hasConfig && typeof step['config-text'] === 'string') return subject.loadPolicy(step['config-text']);
      throw new HarnessError('load-policy takes "config" (JSON) or "config-text" (a string)');
    }
    case 'classify':
      return subject.call('[method]policy.classify', subject.needPolicy(), [field(step, 'failure'), state.now]);
    case 'next-delay':
      return subject.call('[method]policy.next-delay', subject.needPolicy(), [u32(step, 'retry'), optionalU64(step, 'hint-ms'), entropy]);
    case 'derive-idempotency-key':
      return subject.call('derive-idempotency-key', undefined, [text(step, 'run-id'), text(step, 'action-id')]);
    case 'start-run': {
      const answer = subject.startRun(text(step, 'run-id'));
      if (at(answer, 'ok') !== undefined) {
        state.started = true;
        state.attempts.clear();
      }
      return answer;
    }
    case 'begin-call': {
      if (state.ruleNames) return beginCallFlat(subject, step, state);
      const answer = subject.call('[method]run.begin-call', subject.needRun(), [field(step, 'call'), state.now]);
      const callId = asU32(at(answer, 'ok', 'send', 'call-id'));
      if (callId !== undefined) state.attempts.set(callId, 1);
      return answer;
    }
    case 'record-outcome': {
      const callId = u32(step, 'call-id');
      const attempt = 'attempt' in step ? u32(step, 'attempt') : state.attempts.get(callId) ?? 1;
      const outcome = field(step, 'outcome');
      if (state.ruleNames) {
        const lowered = lowerArg('[method]run.record-outcome', 2, outcome) as Wit.Outcome;
        if (lowered.tag === 'success' || lowered.tag === 'failure') {
          const answer = recordFlat(subject, callId, attempt, lowered, entropy, state);
          const next = asU32(at(answer, 'ok', 'action', 'retry', 'attempt'));
          if (next !== undefined) state.attempts.set(callId, next);
          return answer;
        }
      }
      const answer = subject.call('[method]run.record-outcome', subject.needRun(), [callId, attempt, outcome, state.now, entropy]);
      const next = asU32(at(answer, 'ok', 'action', 'retry', 'attempt'));
      if (next !== undefined) state.attempts.set(callId, next);
      return answer;
    }
    case 'report':
      return subject.call('[method]run.report', subject.needRun(), []);
    case 'effects':
      return subject.call('[method]run.effects', subject.needRun(), [u32(step, 'start'), u32(step, 'max-count')]);
    default:
      throw new HarnessError(`unknown op "${op}"`);
  }
}

// Flat mode's steps.

/** A `begin-call` step through `begin-call-flat` (and `escalation()` when the
 *  call is not admitted), answered as `begin-call` answers: `{"ok": admission}`. */
function beginCallFlat(subject: Subject, step: Record<string, unknown>, state: State): Json {
  const request = lowerArg('[method]run.begin-call', 0, field(step, 'call')) as Wit.CallRequest;
  const run = subject.needRun();
  const answer = subject.callLowered('[method]run.begin-call-flat', run, [request.tool, request.idempotencyKey, request.hints, state.now]);
  const start = at(answer, 'ok') as Record<string, Json> | undefined;
  if (start === undefined) return answer; // {"err": run-error}
  if (start.admitted === true) {
    const callId = asU32(start['call-id']);
    if (callId !== undefined) state.attempts.set(callId, 1);
    return { ok: { send: { 'call-id': start['call-id'], 'delay-ms': start['delay-ms'], effect: start.effect, 'safe-to-repeat': start['safe-to-repeat'] } } };
  }
  const escalation = subject.callLowered('[method]run.escalation', run, []);
  if (escalation === null) throw new HarnessError('begin-call-flat did not admit the call, but escalation() is none');
  return { ok: { escalate: escalation } };
}

/** A `record-outcome` step of a success or a failure through `record-success` /
 *  `record-failure` + `last-decision(call-id)`, answered as `record-outcome`
 *  answers: `{"ok": decision}` (after checking the verdict against it) or `{"err": run-error}`. */
function recordFlat(subject: Subject, callId: number, attempt: number, outcome: Wit.Outcome, entropy: bigint, state: State): Json {
  const run = subject.needRun();
  let answer: Json;
  if (outcome.tag === 'success') {
    answer = subject.callLowered('[method]run.record-success', run, [callId, attempt, state.now]);
  } else if (outcome.tag === 'failure') {
    const f = outcome.val;
    answer = subject.callLowered('[method]run.record-failure', run,
      [callId, attempt, f.kind, joinedHeaders(f.headers), f.body, f.structuredContent, state.now, entropy]);
  } else {
    throw new HarnessError(`flat mode records a success or a failure, not ${outcome.tag}`);
  }
  const verdict = at(answer, 'ok') as Record<string, Json> | undefined;
  if (verdict === undefined) return answer; // {"err": run-error}
  const decision = subject.callLowered('[method]run.last-decision', run, [callId]);
  if (decision === null) throw new HarnessError(`last-decision(${callId}) is none after a verdict ${canonicalText(verdict)}`);
  const disagreement = verdictDisagrees(verdict, decision as Record<string, Json>, state.ruleNames ?? []);
  if (disagreement !== undefined) {
    throw new HarnessError(`the verdict ${canonicalText(verdict)} disagrees with last-decision ${canonicalText(decision)}: ${disagreement}`);
  }
  return { ok: decision };
}

/** Where a verdict (canonical JSON) says otherwise than the decision it stands for, or undefined. */
export function verdictDisagrees(verdict: Record<string, Json>, decision: Record<string, Json>, ruleNames: readonly string[]): string | undefined {
  const action = decision.action;
  const kind = typeof action === 'string' ? action : Object.keys(action as object)[0];
  const payload = typeof action === 'string' ? null : (action as Record<string, Json>)[kind];
  const same = (a: Json | undefined, b: Json | undefined) => canonicalText(a) === canonicalText(b);
  if (verdict.action !== kind) return `action ${canonicalText(verdict.action)}, the decision's is ${kind}`;
  if (verdict.class !== decision.class) return `class ${canonicalText(verdict.class)}, the decision's is ${canonicalText(decision.class)}`;
  if (!same(verdict.attempt, decision.attempt)) return `attempt ${canonicalText(verdict.attempt)}, the decision's is ${canonicalText(decision.attempt)}`;
  const delay = kind === 'retry' ? (payload as Record<string, Json>)['delay-ms'] : 0n;
  if (!same(verdict['delay-ms'], delay)) return `delay-ms ${canonicalText(verdict['delay-ms'])}, the decision's is ${canonicalText(delay)}`;
  if (!same(verdict['hint-ms'], decision['hint-ms'])) return `hint-ms ${canonicalText(verdict['hint-ms'])}, the decision's is ${canonicalText(decision['hint-ms'])}`;
  const index = verdict['rule-index'] as number;
  if (ruleNames[index] !== decision.rule) {
    return `rule-index ${index} names ${canonicalText(ruleNames[index] ?? null)}, the decision's rule is ${canonicalText(decision.rule)}`;
  }
  const hasNote = kind === 'replan' || kind === 'escalate' || (kind === 'succeed' && payload !== null);
  if (verdict['has-note'] !== hasNote) return `has-note ${canonicalText(verdict['has-note'])}, the decision's action ${canonicalText(action)} ${hasNote ? 'has' : 'has no'} note`;
  return undefined;
}

// Matching `expect` (tests/vectors/README.md, "Expectations").

const isNumber = (v: unknown): v is number | bigint => (typeof v === 'number' || typeof v === 'bigint');

function scalarEqual(expected: unknown, actual: unknown): boolean {
  // JSON equality: a u64 output (BigInt) equals the same integer written as a number.
  if (typeof actual === 'bigint' && typeof expected === 'number') return Number.isInteger(expected) && BigInt(expected) === actual;
  return typeof expected === typeof actual && expected === actual;
}

/** `undefined` if `actual` matches `expected`, else where and why not. */
export function match(expected: unknown, actual: unknown, path = '$'): string | undefined {
  const show = canonicalText;
  if (typeof expected === 'object' && expected !== null && !Array.isArray(expected)) {
    const keys = Object.keys(expected);
    const e = expected as Record<string, unknown>;
    if (keys.length === 1 && keys[0] === '$contains') {
      const needle = e.$contains;
      if (typeof actual === 'string' && typeof needle === 'string' && actual.includes(needle)) return undefined;
      return `${path}: expected a string containing ${JSON.stringify(needle)}, got ${show(actual)}`;
    }
    if (keys.length === 1 && keys[0] === '$range') {
      const bounds = e.$range;
      if (Array.isArray(bounds) && bounds.length === 2 && bounds.every(isNumber) && isNumber(actual)
        && Number(bounds[0]) <= Number(actual) && Number(actual) <= Number(bounds[1])) return undefined;
      return `${path}: expected a number in ${show(bounds)}, got ${show(actual)}`;
    }
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) return `${path}: expected an object, got ${show(actual)}`;
    const a = actual as Record<string, unknown>;
    for (const key of keys) {
      if (!(key in a)) return `${path}.${key}: missing in ${show(actual)}`;
      const mismatch = match(e[key], a[key], `${path}.${key}`);
      if (mismatch) return mismatch;
    }
    return undefined;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) return `${path}: expected an array, got ${show(actual)}`;
    if (expected.length !== actual.length) return `${path}: expected ${expected.length} items, got ${actual.length}: ${show(actual)}`;
    for (let i = 0; i < expected.length; i++) {
      const mismatch = match(expected[i], actual[i], `${path}[${i}]`);
      if (mismatch) return mismatch;
    }
    return undefined;
  }
  return scalarEqual(expected, actual) ? undefined : `${path}: expected ${show(expected)}, got ${show(actual)}`;
}

export interface CaseResult {
  file: string;
  description: string;
  outputs: Json[];
  failure?: string;
}

export interface RunCaseOptions {
  /** The configuration (JSON text) a case without `config` loads; default `{}`.
   *  The live-update gate passes the update's own configuration. */
  defaultConfigText?: string;
  /** Flat mode (contract 0.4.0's hot path; the module comment says how). Default: rich. */
  flat?: boolean;
}

export async function runCase(component: PolicyComponent, file: string, testCase: VectorCase, options: RunCaseOptions = {}): Promise<CaseResult> {
  const result: CaseResult = { file, description: testCase.description, outputs: [] };
  const subject = await Subject.create(component);
  const state: State = { now: DEFAULT_START_MS, started: false, attempts: new Map() };
  if (options.flat) {
    try {
      const names = subject.call('rule-names', undefined, []);
      if (!Array.isArray(names) || !names.every((n) => typeof n === 'string')) throw new HarnessError('rule-names is not a list of strings');
      state.ruleNames = names as string[];
    } catch (e) {
      result.failure = `rule-names: ${(e as Error).message}`;
      return result;
    }
  }
  let loaded: Json;
  try {
    const hasConfig = testCase.config !== undefined && testCase.config !== null;
    loaded = subject.loadPolicy(hasConfig ? canonicalText(testCase.config) : options.defaultConfigText ?? '{}');
  } catch (e) {
    result.failure = `loading the case's config: ${(e as Error).message}`;
    return result;
  }
  if (!(typeof loaded === 'object' && loaded !== null && 'ok' in loaded)) {
    result.failure = `the case's config was rejected: ${canonicalText(loaded)}`;
    return result;
  }
  for (const [i, step] of testCase.steps.entries()) {
    let output: Json;
    try {
      output = runStep(subject, step, state);
    } catch (e) {
      result.failure = `step ${i + 1}: ${(e as Error).message}`;
      return result;
    }
    result.outputs.push(output);
    if ('expect' in step) {
      const mismatch = match(step.expect, output);
      if (mismatch) {
        result.failure = `step ${i + 1} (${String(step.op)}): ${mismatch}`;
        return result;
      }
    }
  }
  return result;
}

/** A case in rich mode, then in flat mode on a fresh instance: the rich run's
 *  result (its outputs, as `--dump` writes them), failed if the flat run fails
 *  or gives other outputs. */
export async function runCaseBothWays(component: PolicyComponent, file: string, testCase: VectorCase, options: RunCaseOptions = {}): Promise<CaseResult> {
  const rich = await runCase(component, file, testCase, { ...options, flat: false });
  if (rich.failure !== undefined) return rich;
  const flat = await runCase(component, file, testCase, { ...options, flat: true });
  if (flat.failure !== undefined) {
    rich.failure = `flat mode: ${flat.failure}`;
  } else if (canonicalText(flat.outputs) !== canonicalText(rich.outputs)) {
    const i = flat.outputs.findIndex((o, n) => canonicalText(o) !== canonicalText(rich.outputs[n]));
    rich.failure = `flat mode: step ${i + 1} (${String(testCase.steps[i]?.op)}) gave ${canonicalText(flat.outputs[i])}, rich mode ${canonicalText(rich.outputs[i])}`;
  }
  return rich;
}

/** Every case of every file, in rich mode and in flat mode (`runCaseBothWays`).
 *  With `twice`, each case runs again (rich) on a fresh instance and must give
 *  the same outputs, byte for byte. */
export async function runAll(component: PolicyComponent, dir: string, twice = true): Promise<CaseResult[]> {
  const results: CaseResult[] = [];
  for (const { file, cases } of loadVectorFiles(dir)) {
    for (const testCase of cases) {
      const first = await runCaseBothWays(component, file, testCase);
      if (twice && first.failure === undefined) {
        const second = await runCase(component, file, testCase);
        if (second.failure !== undefined || canonicalText(second.outputs) !== canonicalText(first.outputs)) {
          first.failure = `not deterministic: a second run gave ${second.failure ?? canonicalText(second.outputs)}`;
        }
      }
      results.push(first);
    }
  }
  return results;
}

/** One line per case: `["file","description"] outputs`, as the Python runner writes it. */
export function dumpLine(result: CaseResult): string {
  return `${JSON.stringify([result.file, result.description])} ${canonicalText(result.outputs)}\n`;
}

async function main(argv: string[]): Promise<number> {
  const dumpAt = argv.indexOf('--dump');
  const dump = dumpAt >= 0 ? argv[dumpAt + 1] : undefined;
  const positional = argv.filter((a, i) => !a.startsWith('--') && (dumpAt < 0 || i !== dumpAt + 1));
  const component = await PolicyComponent.load();
  const results = await runAll(component, positional[0] ?? defaultVectorDir);
  for (const r of results) if (r.failure) console.log(`FAILED ${r.file}: ${r.description}: ${r.failure}`);
  if (dump) writeFileSync(dump, results.map(dumpLine).join(''));
  const failed = results.filter((r) => r.failure).length;
  console.log(`${results.length - failed} passed, ${failed} failed`);
  return failed || results.length === 0 ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { console.error(e); process.exit(2); });
}
