// The conformance vector runner (tests/vectors/README.md) for the Node host.
//
// Every case runs against a fresh instance with a fresh embedded account budget
// on the vectors' simulated clock (`EmbeddedAccounts.onHostClock()`);
// inputs are converted from canonical JSON by each function's WIT parameter
// types (wit.ts), outputs converted back and matched against the expectations.
//
// The vectors keep their readable steps (`begin-call` with a `call`,
// `record-outcome` with an `outcome`, `classify` with a readable `failure`);
// contract 0.7.0 has one run path, and this module is the one place that
// translates the readable steps onto it (`readableObservation`, `runStep`):
// `begin-call` -> `begin-call` with the call's `server` (none when absent),
// + `escalation()` when the call is not admitted, or `last-decision(call-id)`
// when it is over as a replan (`call-start.replan`: a circuit breaker is open);
// `record-outcome` of a success -> `record-success`, of an empty
// result -> `record-empty-result`, of a failure -> `record-failure` with an
// observation built from the readable failure (header pairs joined as
// `name: value` lines, `session-id-sent` false and `delivery` `unknown` when
// absent), of a status check -> `record-status-check`, of a task
// (`{"task": {task-id, status, poll-interval-ms?, ttl-ms?, age-ms?, message?}}`)
// -> `record-task-status`, of a poll failure (`{"poll-failure": failure}`) ->
// `record-poll-failure`; each report's answer is `last-decision(call-id)`,
// after checking that the verdict says what it says (action, class, attempt,
// delay, hint, rule, has-note, reconnect, cancel-task; a poll is checked as a
// retry is, its delay and reconnect from its plan). As hosts/rust/src/steps.rs.
//
// Each case has a fresh shared state (the component's `shared-state` import),
// shared by every run of the case: compare and set by version as the embedded
// store, but with no expiry and no bounds (`VectorSharedState`), and `load`
// answers the `now-ms` it was passed. `put-shared-state` stores a text in it
// (no component call), `shared-state` reads one, `breaker-changes` is
// `run.take-breaker-changes()` (never called otherwise).
//
// Contract 0.9.0's steps: `last-decision` (`run.last-decision(call-id)`),
// `escalation` (`run.escalation()`), `snapshot` (`run.snapshot(arguments-json,
// now-ms)`; the runner keeps the text it answered) and `resume` (the last
// snapshot, or `snapshot-text`, with `edit` `[from, to]` applied once, to
// `policy.resume-run(snapshot, answer, now-ms)`, then `run.resumed-call()`: the
// resumed run becomes the current one, and the call's attempt is its
// `attempt`). As hosts/rust/src/steps.rs.
//
// observations.json has its own shape (`runObservationFile`): each case is one
// raw observation of a `lookup_order` call and the verdict it must produce.
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
import { RunGuard, type CallGuard, type Violation } from './guard.js';
import type { Loaded, SharedStateBackend } from './shared-state.js';
import { joinedHeaders, utf8Length } from './limits.js';
import { FUNCTIONS, TYPES, camel, fromJco, parseU64, toJco, type WitType } from './wit.js';
import { bool, list, option, record, string, tuple } from './wit-kinds.js';

/** The clock at the start of every case: 2025-11-30T00:00:00Z. */
export const DEFAULT_START_MS = 1_764_460_800_000n;
/** The entropy of a step that gives none: the middle of the range. */
export const DEFAULT_ENTROPY = 0x8000_0000_0000_0000n;

const STEP_KEYS = new Set(['op', 'expect', 'now-ms', 'entropy', 'config', 'config-text', 'failure', 'retry', 'hint-ms',
  'run-id', 'action-id', 'call', 'call-id', 'attempt', 'outcome', 'start', 'max-count', 'comment', 'time-left-ms', 'http-status',
  'json-rpc-code', 'sent', 'why', 'key', 'value', 'arguments-json', 'answer', 'edit', 'snapshot-text']);

/** The file of raw transport observations (its own shape: `runObservationFile`). */
export const OBSERVATIONS_FILE = 'observations.json';

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

/** Every `*.json` in `dir` but schema.json and observations.json (its own
 *  shape: `loadObservationFile`), sorted by name. */
export function loadVectorFiles(dir: string): Array<{ file: string; cases: VectorCase[] }> {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json') && f !== 'schema.json' && f !== OBSERVATIONS_FILE)
    .sort()
    .map((file) => ({ file, cases: (JSON.parse(readFileSync(join(dir, file), 'utf8')) as { cases: VectorCase[] }).cases }));
}

/** A canonical JSON value as the vectors carry it (integers past 2^53 as BigInts). */
export type Json = null | boolean | number | bigint | string | Json[] | { [key: string]: Json };

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

/** The vectors' shared state: compare and set by version, no expiry and no
 *  bounds (vectors are deterministic); `load` answers the `nowMs` it was passed. */
export class VectorSharedState implements SharedStateBackend {
  private readonly entries = new Map<string, { value: string; version: bigint }>();

  load(key: string, nowMs: bigint): Loaded {
    const entry = this.entries.get(key);
    return { value: entry?.value, version: entry?.version ?? 0n, nowMs };
  }

  storeIf(key: string, expectedVersion: bigint, value: string, _ttlMs: bigint): boolean {
    if ((this.entries.get(key)?.version ?? 0n) !== expectedVersion) return false;
    this.entries.set(key, { value, version: expectedVersion + 1n });
    return true;
  }

  /** Stores `value` as a store would (its version raised by one), whatever is there. */
  put(key: string, value: string): void {
    this.entries.set(key, { value, version: (this.entries.get(key)?.version ?? 0n) + 1n });
  }

  /** The text stored under `key`, or null. */
  get(key: string): string | null {
    return this.entries.get(key)?.value ?? null;
  }
}

/** A jco resource's methods, called by name (`Subject` drives the component through them). */
export type Resource = Record<string, (...args: unknown[]) => unknown>;

/** The component, called with canonical JSON values. */
export class Subject {
  policy?: Resource;
  run?: Resource;

  private constructor(readonly instance: PolicyInstance, readonly sharedState: VectorSharedState) {}

  static async create(component: PolicyComponent): Promise<Subject> {
    // A fixed seed keeps even the guest's own draws reproducible; the vectors
    // always pass entropy, so it is never used.
    // The vectors run on a simulated clock (DEFAULT_START_MS, then the steps'
    // `now-ms`): the budget keeps its buckets in that time, not the process's.
    const sharedState = new VectorSharedState();
    const instance = await component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), sharedState, entropy: new SplitMix64(0n) });
    return new Subject(instance, sharedState);
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
        // An ok without a type here is a resource (kept as it is) or nothing (`abandon-call`'s
        // `undefined` from jco, null in canonical JSON).
        return { ok: resultType.ok ? (fromJco(value, resultType.ok) as Json) : value === undefined ? null : (value as Json) };
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

  /** `policy.resume-run`, then `run.resumed-call()`: `{"ok": resumed-call}`
   *  (the resumed run becomes the current run) or `{"err": snapshot-error}`. */
  resumeRun(snapshot: string, answer: unknown, now: bigint): Json {
    const resumed = this.call('[method]policy.resume-run', this.needPolicy(), [snapshot, answer, now]) as { ok?: unknown; err?: Json };
    if (!('ok' in resumed)) return resumed as Json;
    this.run = resumed.ok as Resource;
    return { ok: this.call('[method]run.resumed-call', this.run, []) };
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
  /** The component's `rule-names()`: a verdict's `rule-index` indexes it. */
  ruleNames: readonly string[];
  started: boolean;
  /** Per call id, the attempt sent last: 1 after `begin-call` answered `send`,
   *  then each retry plan's `attempt` (what a `record-outcome` reports by default). */
  attempts: Map<number, number>;
  /** With `RunCaseOptions.guard`: the run-time guard watching the steps as the wrapper's watches its run. */
  guard?: GuardWatch;
  /** The last snapshot a `snapshot` step took, for the next `resume` (contract 0.9.0). */
  snapshot?: string;
}

/** The guard over a case's run: each call's guard, whether its last verdict
 *  was a poll (what follows is the poll's answer, not an attempt), and the
 *  violations seen (the step's index, from 0). */
interface GuardWatch {
  configText: string;
  run: RunGuard;
  calls: Map<number, { guard: CallGuard; polling: boolean }>;
  violations: Array<{ step: number; violation: Violation }>;
  step: number;
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

/** A readable failure of the vectors: the observation's fields, with the
 *  headers as `[name, value]` pairs. */
const READABLE_FAILURE: WitType = record('failure', [['kind', TYPES.failureKind], ['headers', list(tuple(string, string))], ['body', string],
  ['structured-content', option(string)], ['session-id-sent', bool], ['delivery', TYPES.delivery]]);
/** A readable `call` of a `begin-call` step. */
const READABLE_CALL: WitType = record('call', [['server', option(string)], ['tool', string], ['idempotency-key', option(string)],
  ['hints', option(TYPES.toolHints)]]);

/** A readable `call`, in jco's form. */
type ReadableCall = { server?: string; tool: string; idempotencyKey?: string; hints?: Wit.ToolHints };

/** A readable failure (canonical JSON) as the contract's observation (jco's
 *  form): the header pairs joined as `name: value` lines with `\n`;
 *  `session-id-sent` false and `delivery` `unknown` when absent. Throws a
 *  `HarnessError` if it does not fit. */
export function readableObservation(failure: unknown): Wit.Observation {
  const given = typeof failure === 'object' && failure !== null && !Array.isArray(failure) ? failure as Record<string, unknown> : undefined;
  const withDefaults = given && !('delivery' in given) ? { ...given, delivery: 'unknown' } : failure;
  let readable: { kind: Wit.FailureKind; headers: Array<[string, string]>; body: string; structuredContent?: string; sessionIdSent: boolean; delivery: Wit.Delivery };
  try {
    readable = toJco(withDefaults, READABLE_FAILURE) as typeof readable;
  } catch (e) {
    throw new HarnessError(`failure: ${(e as Error).message}`);
  }
  return {
    kind: readable.kind, headers: joinedHeaders(readable.headers), body: readable.body, structuredContent: readable.structuredContent,
    sessionIdSent: readable.sessionIdSent, delivery: readable.delivery,
  };
}

const TASK_REPORT_KEYS = ['task-id', 'status', 'poll-interval-ms', 'ttl-ms', 'age-ms', 'message'];

/** A readable task report (`{task-id, status, poll-interval-ms?, ttl-ms?,
 *  age-ms?, message?}`) as the contract's `task-report` in canonical JSON:
 *  absent or null options are none, an absent message is empty. Throws a
 *  `HarnessError` for an unknown field. */
export function readableTaskReport(task: unknown): Record<string, unknown> {
  if (typeof task !== 'object' || task === null || Array.isArray(task)) throw new HarnessError(`a task report must be an object: ${canonicalText(task)}`);
  const given = task as Record<string, unknown>;
  const unknownKey = Object.keys(given).find((k) => !TASK_REPORT_KEYS.includes(k));
  if (unknownKey !== undefined) throw new HarnessError(`unknown task report field "${unknownKey}"`);
  const field = (name: string, absent: unknown) => given[name] === undefined || given[name] === null ? absent : given[name];
  return {
    'task-id': field('task-id', null), status: field('status', null), 'poll-interval-ms': field('poll-interval-ms', null),
    'ttl-ms': field('ttl-ms', null), 'age-ms': field('age-ms', null), message: field('message', ''),
  };
}

function readableCall(call: unknown): ReadableCall {
  try {
    return toJco(call, READABLE_CALL) as ReadableCall;
  } catch (e) {
    throw new HarnessError(`call: ${(e as Error).message}`);
  }
}

function optionalInt(step: Record<string, unknown>, name: string, lo: number, hi: number): number | undefined {
  const value = step[name];
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'number' && Number.isInteger(value) && value >= lo && value <= hi) return value;
  throw new HarnessError(`"${name}" must be an integer from ${lo} to ${hi} or null`);
}

function runStep(subject: Subject, step: Record<string, unknown>, state: State): Json {
  if (typeof step !== 'object' || step === null || Array.isArray(step)) throw new HarnessError('a step must be an object');
  const unknown = Object.keys(step).find((k) => !STEP_KEYS.has(k));
  if (unknown !== undefined) throw new HarnessError(`unknown step field "${unknown}"`);
  const now = optionalU64(step, 'now-ms');
  if (now !== null) state.now = now;
  const entropy = optionalU64(step, 'entropy') ?? DEFAULT_ENTROPY;
  const op = text(step, 'op');
  if (['begin-call', 'record-outcome', 'report', 'effects', 'breaker-changes', 'last-decision', 'escalation', 'snapshot'].includes(op) && !state.started) {
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
      return subject.callLowered('[method]policy.classify', subject.needPolicy(), [readableObservation(field(step, 'failure')), state.now]);
    case 'next-delay':
      return subject.call('[method]policy.next-delay', subject.needPolicy(), [u32(step, 'retry'), optionalU64(step, 'hint-ms'), entropy]);
    case 'derive-idempotency-key':
      return subject.call('derive-idempotency-key', undefined, [text(step, 'run-id'), text(step, 'action-id')]);
    case 'read-probe-answer':
      return subject.callLowered('read-probe-answer', undefined,
        [optionalInt(step, 'http-status', 0, 0xffff), optionalInt(step, 'json-rpc-code', -(2 ** 31), 2 ** 31 - 1)]);
    case 'start-run': {
      const answer = subject.startRun(text(step, 'run-id'));
      if (at(answer, 'ok') !== undefined) {
        state.started = true;
        state.attempts.clear();
        // A new run: a new guard, as a new wrapper run has.
        if (state.guard) {
          state.guard.run = new RunGuard(state.guard.configText);
          state.guard.calls.clear();
        }
      }
      return answer;
    }
    case 'begin-call':
      return beginCall(subject, readableCall(field(step, 'call')), state);
    case 'record-outcome': {
      const callId = u32(step, 'call-id');
      const attempt = 'attempt' in step ? u32(step, 'attempt') : state.attempts.get(callId) ?? 1;
      const answer = recordOutcome(subject, callId, attempt, field(step, 'outcome'), optionalU64(step, 'time-left-ms'), entropy, state);
      const next = asU32(at(answer, 'ok', 'action', 'retry', 'attempt'));
      if (next !== undefined) state.attempts.set(callId, next);
      return answer;
    }
    case 'abandon-call': {
      const callId = u32(step, 'call-id');
      const attempt = 'attempt' in step ? u32(step, 'attempt') : state.attempts.get(callId) ?? 1;
      const sent = step.sent === undefined ? true : step.sent;
      if (typeof sent !== 'boolean') throw new HarnessError('"sent" must be a boolean');
      return subject.call('[method]run.abandon-call', subject.needRun(), [callId, attempt, sent, text(step, 'why')]);
    }
    case 'report':
      return subject.call('[method]run.report', subject.needRun(), []);
    case 'effects':
      return subject.call('[method]run.effects', subject.needRun(), [u32(step, 'start'), u32(step, 'max-count')]);
    case 'put-shared-state':
      // The runner's own write, as a store makes one: no component call, no output.
      subject.sharedState.put(text(step, 'key'), text(step, 'value'));
      return null;
    case 'shared-state':
      return subject.sharedState.get(text(step, 'key'));
    case 'breaker-changes':
      return subject.callLowered('[method]run.take-breaker-changes', subject.needRun(), []);
    case 'last-decision':
      return subject.call('[method]run.last-decision', subject.needRun(), [u32(step, 'call-id')]);
    case 'escalation':
      return subject.call('[method]run.escalation', subject.needRun(), []);
    case 'snapshot': {
      const given = step['arguments-json'];
      if (given !== undefined && given !== null && typeof given !== 'string') throw new HarnessError('"arguments-json" must be a string');
      const answer = subject.call('[method]run.snapshot', subject.needRun(), [given ?? null, state.now]);
      const taken = at(answer, 'ok');
      state.snapshot = typeof taken === 'string' ? taken : undefined;
      return answer;
    }
    case 'resume':
      return resume(subject, step, state);
    default:
      throw new HarnessError(`unknown op "${op}"`);
  }
}

/** A `resume` step (contract 0.9.0): the last snapshot's text, or
 *  `snapshot-text`, with `edit` (`[from, to]`: the first `from` replaced by
 *  `to`, which must occur), passed to `policy.resume-run` with `answer`; then
 *  `run.resumed-call()`. `{"ok": resumed-call}` (the resumed run becomes the
 *  current one, and the call's attempt is its `attempt`) or `{"err": snapshot-error}`. */
function resume(subject: Subject, step: Record<string, unknown>, state: State): Json {
  let snapshot: string;
  if ('snapshot-text' in step) {
    if (typeof step['snapshot-text'] !== 'string') throw new HarnessError('snapshot-text must be a string');
    snapshot = step['snapshot-text'];
  } else {
    if (state.snapshot === undefined) throw new HarnessError('resume needs a snapshot step first, or snapshot-text');
    snapshot = state.snapshot;
  }
  if ('edit' in step) {
    const edit = step.edit;
    if (!Array.isArray(edit) || edit.length !== 2) throw new HarnessError('edit must be [from, to]');
    const [from, to] = edit as unknown[];
    if (typeof from !== 'string' || typeof to !== 'string') throw new HarnessError('edit must be two strings');
    if (!snapshot.includes(from)) throw new HarnessError(`edit: ${JSON.stringify(from)} is not in the snapshot`);
    const i = snapshot.indexOf(from);
    snapshot = snapshot.slice(0, i) + to + snapshot.slice(i + from.length);
  }
  const answer = subject.resumeRun(snapshot, field(step, 'answer'), state.now);
  const call = at(answer, 'ok') as Record<string, Json> | undefined;
  if (call !== undefined) {
    state.started = true;
    const callId = asU32(call['call-id']);
    const attempt = asU32(call.attempt);
    if (callId !== undefined && attempt !== undefined) state.attempts.set(callId, attempt);
    // A resumed run: a new guard, as a new wrapper's, which registers a call it sends as it registers a begun one.
    const watch = state.guard;
    if (watch) {
      watch.run = new RunGuard(watch.configText);
      watch.calls.clear();
      const ticket = call.ticket as Record<string, Json> | null | undefined;
      if (call.action === 'send' && ticket && callId !== undefined) {
        const begun = watch.run.begin(String(call.tool), typeof call['idempotency-key'] === 'string' ? call['idempotency-key'] : undefined,
          undefined, BigInt(ticket['delay-ms'] as number | bigint));
        watch.calls.set(callId, { guard: begun.call, polling: false });
        if (begun.violation) watch.violations.push({ step: watch.step, violation: begun.violation });
      }
    }
  }
  return answer;
}

/** A `begin-call` step: `begin-call` (and `escalation()` when the call is not
 *  admitted, `last-decision(call-id)` when it is over as a replan), answered
 *  readably: `{"ok": {"send": {...}}}`, `{"ok": {"escalate": escalation}}`,
 *  `{"ok": {"replan": decision}}` or `{"err": run-error}`. */
function beginCall(subject: Subject, call: ReadableCall, state: State): Json {
  const run = subject.needRun();
  const answer = subject.callLowered('[method]run.begin-call', run, [call.server, call.tool, call.idempotencyKey, call.hints, state.now]);
  const start = at(answer, 'ok') as Record<string, Json> | undefined;
  if (start === undefined) return answer; // {"err": run-error}
  if (start.admitted === true) {
    const callId = asU32(start['call-id']);
    if (callId !== undefined) state.attempts.set(callId, 1);
    const watch = state.guard;
    if (watch && callId !== undefined) {
      const begun = watch.run.begin(call.tool, call.idempotencyKey, call.hints, BigInt(start['delay-ms'] as number | bigint));
      watch.calls.set(callId, { guard: begun.call, polling: false });
      if (begun.violation) watch.violations.push({ step: watch.step, violation: begun.violation });
    }
    return {
      ok: {
        send: {
          'call-id': start['call-id'], 'delay-ms': start['delay-ms'], effect: start.effect, 'safe-to-repeat': start['safe-to-repeat'],
          'idle-timeout-ms': start['idle-timeout-ms'], 'attempt-timeout-ms': start['attempt-timeout-ms'],
        },
      },
    };
  }
  if (start.replan === true) {
    // Over before it was sent: a circuit breaker of the server is open; the message is the call's decision.
    const callId = asU32(start['call-id']);
    if (callId === undefined || callId === 0) throw new HarnessError(`begin-call answered a replan with call-id ${canonicalText(start['call-id'])}`);
    const decision = subject.callLowered('[method]run.last-decision', run, [callId]);
    if (decision === null) throw new HarnessError(`begin-call answered a replan, but last-decision(${callId}) is none`);
    const action = at(decision, 'action');
    if (typeof action !== 'object' || action === null || !('replan' in action)) {
      throw new HarnessError(`begin-call answered a replan, but last-decision(${callId}) says ${canonicalText(action)}`);
    }
    return { ok: { replan: decision } };
  }
  const escalation = subject.callLowered('[method]run.escalation', run, []);
  if (escalation === null) throw new HarnessError('begin-call did not admit the call, but escalation() is none');
  return { ok: { escalate: escalation } };
}

/** A readable `outcome` reported on the single path, answered as
 *  `{"ok": decision}` (`last-decision`, after checking the verdict against it)
 *  or `{"err": run-error}`. */
function recordOutcome(subject: Subject, callId: number, attempt: number, outcome: unknown, timeLeft: bigint | null, entropy: bigint,
  state: State): Json {
  const answer = report(subject, callId, attempt, outcome, timeLeft ?? undefined, entropy, state);
  const verdict = at(answer, 'ok') as Record<string, Json> | undefined;
  if (verdict === undefined) return answer; // {"err": run-error}
  const decision = decisionOf(subject, callId, verdict, state);
  if (state.guard) watchOutcome(state.guard, callId, outcome, verdict, decision);
  return { ok: decision };
}

/** The guard sees an answered report as the wrapper shows it one: the attempt
 *  (or status check), the verdict, then the words. An outcome after a poll
 *  verdict, and a poll failure, is the poll's answer (`polled`): no attempt. */
function watchOutcome(watch: GuardWatch, callId: number, outcome: unknown, verdict: Record<string, Json>, decision: Json): void {
  const call = watch.calls.get(callId);
  if (call === undefined) return;
  const tag = typeof outcome === 'string' ? outcome : Object.keys(outcome as object)[0];
  const payload = typeof outcome === 'object' && outcome !== null ? (outcome as Record<string, unknown>)[tag] : undefined;
  const task = tag === 'task' ? { status: readableTaskReport(payload).status as Wit.TaskStatus } : undefined;
  if (tag === 'status-check') call.guard.statusChecked(payload as Wit.StatusCheckResult);
  else if (call.polling || tag === 'poll-failure') {
    // A poll's answer (or a poll that failed): a task status, the task's end, or the poll's failure.
    if (task !== undefined) call.guard.polled({ tag: 'task', val: task });
    else if (tag === 'failure') call.guard.polled({ tag: 'failure', val: readableObservation(payload) });
    else if (tag === 'poll-failure') call.guard.polled({ tag: 'poll-failure', val: readableObservation(payload) });
    else if (tag === 'empty-result') call.guard.polled({ tag: 'empty-result', val: String(payload) });
    else call.guard.polled({ tag: 'success' });
  } else call.guard.attempted(tag === 'failure' ? readableObservation(payload) : undefined, task);
  const seen = (violation: Violation | undefined) => { if (violation) watch.violations.push({ step: watch.step, violation }); };
  const hint = verdict['hint-ms'];
  seen(call.guard.verdict({
    action: verdict.action as Wit.ActionKind, delayMs: BigInt(verdict['delay-ms'] as number | bigint),
    hintMs: hint === null || hint === undefined ? undefined : BigInt(hint as number | bigint), reconnect: verdict.reconnect === true,
    cancelTask: verdict['cancel-task'] === true,
  }));
  call.polling = verdict.action === 'poll';
  seen(call.guard.decision(toJco(decision, TYPES.decision) as Wit.Decision));
}

/** Reports a readable outcome: the verdict (`{"ok": verdict}`) or `{"err": run-error}`. */
function report(subject: Subject, callId: number, attempt: number, outcome: unknown, timeLeft: bigint | undefined, entropy: bigint,
  state: State): Json {
  const run = subject.needRun();
  if (outcome === 'success') return subject.callLowered('[method]run.record-success', run, [callId, attempt, state.now]);
  const [tag, payload] = typeof outcome === 'object' && outcome !== null && !Array.isArray(outcome) && Object.keys(outcome).length === 1
    ? Object.entries(outcome)[0] : [undefined, undefined];
  switch (tag) {
    case 'empty-result':
      if (typeof payload !== 'string') throw new HarnessError('"empty-result" takes a string');
      return subject.callLowered('[method]run.record-empty-result', run, [callId, attempt, payload, state.now]);
    case 'failure':
      return subject.callLowered('[method]run.record-failure', run, [callId, attempt, readableObservation(payload), timeLeft, state.now, entropy]);
    case 'status-check':
      if (payload !== 'found' && payload !== 'absent' && payload !== 'unknown') throw new HarnessError('"status-check" takes "found", "absent" or "unknown"');
      return subject.callLowered('[method]run.record-status-check', run, [callId, attempt, payload, timeLeft, state.now, entropy]);
    case 'task':
      return subject.callLowered('[method]run.record-task-status', run, [callId, attempt, lowerArg('[method]run.record-task-status', 2, readableTaskReport(payload)),
        timeLeft, state.now, entropy]);
    case 'poll-failure':
      return subject.callLowered('[method]run.record-poll-failure', run, [callId, attempt, readableObservation(payload), timeLeft, state.now, entropy]);
    default:
      throw new HarnessError('an outcome is "success", {"empty-result": text}, {"failure": ...}, {"status-check": ...}, {"task": ...} ' +
        `or {"poll-failure": ...}, not ${canonicalText(outcome)}`);
  }
}

/** `last-decision(call-id)` right after a verdict, checked against it. */
function decisionOf(subject: Subject, callId: number, verdict: Record<string, Json>, state: State): Json {
  const decision = subject.callLowered('[method]run.last-decision', subject.needRun(), [callId]);
  if (decision === null) throw new HarnessError(`last-decision(${callId}) is none after a verdict ${canonicalText(verdict)}`);
  const disagreement = verdictDisagrees(verdict, decision as Record<string, Json>, state.ruleNames);
  if (disagreement !== undefined) {
    throw new HarnessError(`the verdict ${canonicalText(verdict)} disagrees with last-decision ${canonicalText(decision)}: ${disagreement}`);
  }
  return decision;
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
  // A poll carries its delay and reconnect as a retry does.
  const plan = kind === 'retry' || kind === 'poll' ? payload as Record<string, Json> : undefined;
  const delay = plan ? plan['delay-ms'] : 0n;
  if (!same(verdict['delay-ms'], delay)) return `delay-ms ${canonicalText(verdict['delay-ms'])}, the decision's is ${canonicalText(delay)}`;
  if (!same(verdict['hint-ms'], decision['hint-ms'])) return `hint-ms ${canonicalText(verdict['hint-ms'])}, the decision's is ${canonicalText(decision['hint-ms'])}`;
  const index = verdict['rule-index'] as number;
  if (ruleNames[index] !== decision.rule) {
    return `rule-index ${index} names ${canonicalText(ruleNames[index] ?? null)}, the decision's rule is ${canonicalText(decision.rule)}`;
  }
  const hasNote = kind === 'replan' || kind === 'escalate' || (kind === 'succeed' && payload !== null);
  if (verdict['has-note'] !== hasNote) return `has-note ${canonicalText(verdict['has-note'])}, the decision's action ${canonicalText(action)} ${hasNote ? 'has' : 'has no'} note`;
  const reconnect = plan ? plan.reconnect === true : false;
  if (verdict.reconnect !== reconnect) return `reconnect ${canonicalText(verdict.reconnect)}, the decision's is ${canonicalText(reconnect)}`;
  if (verdict['cancel-task'] !== decision['cancel-task']) {
    return `cancel-task ${canonicalText(verdict['cancel-task'])}, the decision's is ${canonicalText(decision['cancel-task'])}`;
  }
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
    if (keys.length === 1 && keys[0] === '$any') {
      const options = e.$any;
      if (!Array.isArray(options) || options.length === 0) return `${path}: $any takes a non-empty array of matchers, not ${show(options)}`;
      const misses: string[] = [];
      for (const option of options) {
        const mismatch = match(option, actual, path);
        if (mismatch === undefined) return undefined;
        misses.push(mismatch);
      }
      return `${path}: none of the ${options.length} matchers of $any matches: ${misses.join('; ')}`;
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
  /** What the policy threw, when that is the failure (a trap, fuel run out):
   *  the live-update gate refuses the update with it as the cause. */
  error?: unknown;
  /** With `RunCaseOptions.guard`: what the run-time guard refused, by step (from 0). */
  violations?: Array<{ step: number; violation: Violation }>;
}

export interface RunCaseOptions {
  /** The configuration (JSON text) a case without `config` loads; default `{}`.
   *  The live-update gate passes the update's own configuration. */
  defaultConfigText?: string;
  /** Watch the run with the run-time guard (built from the case's configuration
   *  text) as the wrapper would: `CaseResult.violations`. */
  guard?: boolean;
}

/** A fresh subject with the case's configuration loaded and `rule-names()`
 *  read, or the reason it could not be made. */
async function prepare(component: PolicyComponent, config: unknown, defaultConfigText: string | undefined):
  Promise<{ subject: Subject; state: State; configText: string } | { failure: string; error?: unknown }> {
  const subject = await Subject.create(component);
  let names: Json;
  try {
    names = subject.call('rule-names', undefined, []);
  } catch (e) {
    return { failure: `rule-names: ${(e as Error).message}`, error: e };
  }
  if (!Array.isArray(names) || !names.every((n) => typeof n === 'string')) return { failure: 'rule-names is not a list of strings' };
  let loaded: Json;
  const hasConfig = config !== undefined && config !== null;
  const configText = hasConfig ? canonicalText(config) : defaultConfigText ?? '{}';
  try {
    loaded = subject.loadPolicy(configText);
  } catch (e) {
    return { failure: `loading the case's config: ${(e as Error).message}`, error: e };
  }
  if (!(typeof loaded === 'object' && loaded !== null && 'ok' in loaded)) return { failure: `the case's config was rejected: ${canonicalText(loaded)}` };
  return { subject, configText, state: { now: DEFAULT_START_MS, ruleNames: names as string[], started: false, attempts: new Map() } };
}

/** `expected` with each `{"$config": field}` replaced by that field of the
 *  configuration the case runs under, read by the host (the guard's reading),
 *  never by the component under test. */
export function withConfigValues(expected: Json, configText: string): Json {
  if (Array.isArray(expected)) return expected.map((v) => withConfigValues(v, configText));
  if (typeof expected === 'object' && expected !== null) {
    const keys = Object.keys(expected);
    const field = (expected as Record<string, Json>).$config;
    if (keys.length === 1 && typeof field === 'string') return Number(new RunGuard(configText).cap(field));
    return Object.fromEntries(keys.map((k) => [k, withConfigValues((expected as Record<string, Json>)[k], configText)]));
  }
  return expected;
}

export async function runCase(component: PolicyComponent, file: string, testCase: VectorCase, options: RunCaseOptions = {}): Promise<CaseResult> {
  const result: CaseResult = { file, description: testCase.description, outputs: [] };
  const ready = await prepare(component, testCase.config, options.defaultConfigText);
  if ('failure' in ready) {
    result.failure = ready.failure;
    result.error = ready.error;
    return result;
  }
  const { subject, state } = ready;
  if (options.guard) {
    state.guard = { configText: ready.configText, run: new RunGuard(ready.configText), calls: new Map(), violations: [], step: 0 };
    result.violations = state.guard.violations;
  }
  for (const [i, step] of testCase.steps.entries()) {
    if (state.guard) state.guard.step = i;
    let output: Json;
    try {
      output = runStep(subject, step, state);
    } catch (e) {
      result.failure = `step ${i + 1}: ${(e as Error).message}`;
      result.error = e;
      return result;
    }
    result.outputs.push(output);
    if ('expect' in step) {
      const mismatch = match(withConfigValues(step.expect as Json, ready.configText), output);
      if (mismatch) {
        result.failure = `step ${i + 1} (${String(step.op)}): ${mismatch}`;
        return result;
      }
    }
  }
  return result;
}

// observations.json: raw transport observations and the verdict each produces.

/** What a case of observations.json expects of the verdict. */
export interface ObservationExpect {
  action: Wit.ActionKind;
  class: Wit.OutcomeClass;
  /** Not checked when absent. */
  rule?: string;
  reconnect: boolean;
}

/** One case of observations.json: a demo-server fault (`answer`), whether the
 *  wrapper's request carries an `Mcp-Session-Id`, the readable failure the
 *  host's capture must make of it, and the verdict that must follow. */
export interface ObservationCase {
  description: string;
  comment?: string;
  answer: Record<string, unknown>;
  'session-id-sent': boolean;
  observation: Record<string, unknown>;
  expect: ObservationExpect;
}

export interface ObservationFile {
  description: string;
  config: unknown;
  cases: ObservationCase[];
}

/** The tool every case of observations.json calls (attempt 1). */
export const OBSERVATION_TOOL = 'lookup_order';

/** observations.json (or another file of its shape), checked as strictly as
 *  the vector files: a `HarnessError` says what is wrong. */
export function parseObservationFile(text: string): ObservationFile {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new HarnessError(`not JSON: ${(e as Error).message}`);
  }
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(value) || typeof value.description !== 'string' || !Array.isArray(value.cases)) {
    throw new HarnessError('an observation file is an object {"description", "config", "cases"}');
  }
  const extra = Object.keys(value).find((k) => !['description', 'config', 'cases', 'comment'].includes(k));
  if (extra !== undefined) throw new HarnessError(`unknown field "${extra}" in the file`);
  const cases = value.cases.map((c: unknown, i: number): ObservationCase => {
    if (!isObject(c) || typeof c.description !== 'string') throw new HarnessError(`case ${i + 1} is not an object with a "description"`);
    const unknownKey = Object.keys(c).find((k) => !['description', 'comment', 'answer', 'session-id-sent', 'observation', 'expect'].includes(k));
    if (unknownKey !== undefined) throw new HarnessError(`unknown field "${unknownKey}" in case "${c.description}"`);
    if (!isObject(c.answer) || typeof c['session-id-sent'] !== 'boolean' || !isObject(c.observation) || !isObject(c.expect)) {
      throw new HarnessError(`case "${c.description}" needs "answer", "session-id-sent", "observation" and "expect"`);
    }
    const expect = c.expect;
    if (typeof expect.action !== 'string' || typeof expect.class !== 'string' || !(expect.rule === undefined || typeof expect.rule === 'string')
      || typeof expect.reconnect !== 'boolean') {
      throw new HarnessError(`case "${c.description}": "expect" has "action", "class", maybe "rule" (strings) and "reconnect" (a boolean)`);
    }
    return c as unknown as ObservationCase;
  });
  return { description: value.description, config: value.config ?? null, cases };
}

export function loadObservationFile(dir: string): ObservationFile | undefined {
  let text: string;
  try {
    text = readFileSync(join(dir, OBSERVATIONS_FILE), 'utf8');
  } catch {
    return undefined;
  }
  return parseObservationFile(text);
}

/** What a verdict says, as a case of observations.json names it. */
export function verdictFacts(verdict: Wit.Verdict, ruleNames: readonly string[]): ObservationExpect {
  return { action: verdict.action, class: verdict.class, rule: ruleNames[verdict.ruleIndex] ?? `(rule-index ${verdict.ruleIndex})`, reconnect: verdict.reconnect };
}

/** Where the facts of a verdict differ from a case's `expect`, or undefined. */
export function expectMismatch(expect: ObservationExpect, got: ObservationExpect): string | undefined {
  const wrong = (['action', 'class', 'rule', 'reconnect'] as const).filter((k) => expect[k] !== undefined && expect[k] !== got[k]);
  return wrong.length === 0 ? undefined
    : `expected ${wrong.map((k) => `${k} ${JSON.stringify(expect[k])}`).join(', ')}; the verdict says ${wrong.map((k) => `${k} ${JSON.stringify(got[k])}`).join(', ')}`;
}

/** One case of observations.json, pure: a run, `begin-call lookup_order`,
 *  `record-failure(observation)` of attempt 1, the verdict checked against
 *  `last-decision` and compared with `expect` (action, class, rule, reconnect). */
export async function runObservationCase(component: PolicyComponent, file: ObservationFile, testCase: ObservationCase,
  fileName = OBSERVATIONS_FILE): Promise<CaseResult> {
  const result: CaseResult = { file: fileName, description: testCase.description, outputs: [] };
  const ready = await prepare(component, file.config, undefined);
  if ('failure' in ready) {
    result.failure = ready.failure;
    result.error = ready.error;
    return result;
  }
  const { subject, state } = ready;
  try {
    subject.startRun('run-1');
    state.started = true;
    const start = beginCall(subject, { tool: OBSERVATION_TOOL }, state);
    const callId = asU32(at(start, 'ok', 'send', 'call-id'));
    if (callId === undefined) throw new HarnessError(`begin-call ${OBSERVATION_TOOL} was not admitted: ${canonicalText(start)}`);
    const answer = report(subject, callId, 1, { failure: testCase.observation }, undefined, DEFAULT_ENTROPY, state);
    const verdict = at(answer, 'ok') as Record<string, Json> | undefined;
    if (verdict === undefined) throw new HarnessError(`record-failure answered ${canonicalText(answer)}`);
    const decision = decisionOf(subject, callId, verdict, state);
    result.outputs.push({ verdict: verdict as Json, decision });
    const got: ObservationExpect = {
      action: verdict.action as Wit.ActionKind, class: verdict.class as Wit.OutcomeClass,
      rule: state.ruleNames[verdict['rule-index'] as number] ?? '', reconnect: verdict.reconnect === true,
    };
    const mismatch = expectMismatch(testCase.expect, got);
    if (mismatch !== undefined) result.failure = mismatch;
  } catch (e) {
    result.failure = (e as Error).message;
  }
  return result;
}

/** Every case of every file: the vector files (each case run twice on fresh
 *  instances with `twice`, which must give the same outputs byte for byte),
 *  then observations.json's cases, if the directory has it. */
export async function runAll(component: PolicyComponent, dir: string, twice = true): Promise<CaseResult[]> {
  const results: CaseResult[] = [];
  for (const { file, cases } of loadVectorFiles(dir)) {
    for (const testCase of cases) {
      const first = await runCase(component, file, testCase);
      if (twice && first.failure === undefined) {
        const second = await runCase(component, file, testCase);
        if (second.failure !== undefined || canonicalText(second.outputs) !== canonicalText(first.outputs)) {
          first.failure = `not deterministic: a second run gave ${second.failure ?? canonicalText(second.outputs)}`;
        }
      }
      results.push(first);
    }
  }
  const observations = loadObservationFile(dir);
  for (const testCase of observations?.cases ?? []) results.push(await runObservationCase(component, observations as ObservationFile, testCase));
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
  // The step vectors, as the Rust runner dumps them (observations.json is
  // checked against its expectations here and through the wrapper).
  if (dump) writeFileSync(dump, results.filter((r) => r.file !== 'observations.json').map(dumpLine).join(''));
  const failed = results.filter((r) => r.failure).length;
  console.log(`${results.length - failed} passed, ${failed} failed`);
  return failed || results.length === 0 ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { console.error(e); process.exit(2); });
}
