// The run-time guard (src/guard.ts), pure: every case of
// tests/vectors/guard/guard.json replayed event by event (the first violation's
// invariant and event index must be the case's `expect`), and the genuine
// policy's runs (tests/vectors/runs-*.json) watched by the guard as the
// wrapper watches a run: no violation at all.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';

import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { PolicyComponent } from '../src/component.js';
import { defaultVectorDir, loadVectorFiles, readableObservation, runCase } from '../src/conformance.js';
import { RunGuard, type CallGuard, type PollOutcome, type Violation } from '../src/guard.js';

type Json = Record<string, unknown>;
interface GuardCase {
  description: string;
  config: Json;
  events: Json[];
  expect: { violation: string | null; event?: number };
}

const GUARD_FILE = join(defaultVectorDir, 'guard', 'guard.json');
const cases = (JSON.parse(readFileSync(GUARD_FILE, 'utf8')) as { cases: GuardCase[] }).cases;

const big = (v: unknown): bigint => BigInt(v as number);
const hintsOf = (h: unknown): Wit.ToolHints | undefined => {
  if (h === null || h === undefined) return undefined;
  const hints = h as Json;
  const opt = (v: unknown) => (v === null || v === undefined ? undefined : v === true);
  return { readOnly: opt(hints['read-only']), destructive: opt(hints.destructive), idempotent: opt(hints.idempotent) };
};

/** A vector's `decision` event as the decision's action (the fields the guard reads). */
function actionOf(d: Json): Wit.Action {
  const key = d['idempotency-key'] === null || d['idempotency-key'] === undefined ? undefined : String(d['idempotency-key']);
  const delayMs = big(d['delay-ms'] ?? 0);
  const reconnect = d.reconnect === true;
  switch (d.action) {
    case 'retry': return { tag: 'retry', val: { delayMs, attempt: 0, idempotencyKey: key, reconnect } };
    case 'poll': return { tag: 'poll', val: { delayMs, taskId: '', reconnect } };
    case 'replan': return { tag: 'replan', val: '' };
    case 'succeed': return { tag: 'succeed', val: undefined };
    case 'check-status': return { tag: 'check-status' };
    default: return { tag: 'escalate', val: { reason: 'unclassified-failure', lastError: undefined, resetsInMs: undefined, effects: [], effectsTotal: 0, note: '' } };
  }
}

/** A vector's `polled` outcome as the guard takes it. */
function pollOutcomeOf(what: unknown): PollOutcome {
  if (what === 'success') return { tag: 'success' };
  const [tag, payload] = Object.entries(what as Json)[0];
  switch (tag) {
    case 'task': return { tag: 'task', val: { status: (payload as Json).status as Wit.TaskStatus } };
    case 'empty-result': return { tag: 'empty-result', val: String(payload) };
    case 'failure': return { tag: 'failure', val: readableObservation(payload) };
    case 'poll-failure': return { tag: 'poll-failure', val: readableObservation(payload) };
    default: return assert.fail(`unknown polled outcome ${JSON.stringify(what)}`);
  }
}

/** The case's events through one RunGuard: the first violation and its event index. */
export function replay(testCase: GuardCase): { violation?: Violation; event?: number } {
  const run = new RunGuard(JSON.stringify(testCase.config));
  const calls: CallGuard[] = [];
  for (const [i, event] of testCase.events.entries()) {
    const call = () => {
      const guard = calls[event.call === undefined ? calls.length - 1 : Number(event.call)];
      assert.ok(guard, `event ${i}: no call ${String(event.call)}`);
      return guard;
    };
    let violation: Violation | undefined;
    if ('begin' in event) {
      const b = event.begin as Json;
      const begun = run.begin(String(b.tool), b['idempotency-key'] === null ? undefined : String(b['idempotency-key']), hintsOf(b.hints), big(b['delay-ms']));
      calls.push(begun.call);
      violation = begun.violation;
    } else if ('attempted' in event) {
      const what = event.attempted;
      const failure = typeof what === 'object' && what !== null && 'failure' in what ? (what as Json).failure : undefined;
      const task = typeof what === 'object' && what !== null && 'task' in what ? (what as Json).task as Json : undefined;
      call().attempted(failure === undefined ? undefined : readableObservation(failure),
        task === undefined ? undefined : { status: task.status as Wit.TaskStatus });
    } else if ('polled' in event) {
      call().polled(pollOutcomeOf(event.polled));
    } else if ('status-check' in event) {
      call().statusChecked(event['status-check'] as Wit.StatusCheckResult);
    } else if ('verdict' in event) {
      const v = event.verdict as Json;
      violation = call().verdict({
        action: v.action as Wit.ActionKind, delayMs: big(v['delay-ms']), hintMs: v['hint-ms'] === null ? undefined : big(v['hint-ms']), reconnect: v.reconnect === true,
        cancelTask: v['cancel-task'] === true,
      });
    } else if ('decision' in event) {
      violation = call().decision({ action: actionOf(event.decision as Json) });
    } else {
      assert.fail(`event ${i}: unknown event ${JSON.stringify(event)}`);
    }
    if (violation) return { violation, event: i };
  }
  return {};
}

test('guard.json is there', () => {
  assert.ok(cases.length >= 67, `only ${cases.length} cases in ${GUARD_FILE}`);
  const names = new Set(cases.map((c) => c.expect.violation).filter((v) => v !== null));
  assert.deepEqual([...names].sort(), ['attempts-over-budget', 'client-error-repeated', 'delay-over-cap', 'key-changed', 'task-resent', 'unknown-write-resent', 'verdict-disagrees']);
});

describe('guard.json', () => {
  for (const testCase of cases) {
    test(testCase.description, () => {
      const got = replay(testCase);
      const expected = testCase.expect.violation === null ? {} : { invariant: testCase.expect.violation, event: testCase.expect.event };
      const actual = got.violation === undefined ? {} : { invariant: got.violation.invariant, event: got.event };
      assert.deepEqual(actual, expected, got.violation?.detail);
      if (got.violation) assert.ok(/\d/.test(got.violation.detail) || got.violation.detail.length > 10, got.violation.detail);
    });
  }
});

test('the guard keeps the run\'s first violation, and never throws on a configuration', () => {
  for (const text of ['not json', '[]', 'null', '{"max-delay-ms": -1, "tools": 3, "status-overrides": [1], "account-budget": 7}']) {
    const run = new RunGuard(text);
    const { call } = run.begin('issue_refund', undefined, undefined, 0n);
    call.attempted({ kind: { tag: 'transport', val: 'timeout' }, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'sent' });
    const first = call.verdict({ action: 'retry', delayMs: 2_592_000_000n, hintMs: undefined, reconnect: false });
    assert.equal(first?.invariant, 'unknown-write-resent', text);
    call.verdict({ action: 'retry', delayMs: 1n, hintMs: undefined, reconnect: false });
    assert.equal(run.violation?.invariant, 'unknown-write-resent');
  }
});

// The genuine policy's runs, watched by the guard: it never trips. Skipped
// cases report what no wrapper can send, so the guard has no facts to match.
const SKIPPED: Record<string, string> = {};

describe('the genuine policy never trips the guard (runs-*.json)', () => {
  const files = loadVectorFiles(defaultVectorDir).filter((f) => f.file.startsWith('runs-'));
  test('the run vectors are there', () => assert.ok(files.length >= 10, `only ${files.length} runs-*.json files`));
  for (const { file, cases: runCases } of files) {
    for (const testCase of runCases) {
      const skip = SKIPPED[`${file}: ${testCase.description}`];
      test(`${file}: ${testCase.description}`, { skip }, async () => {
        const result = await runCase(await PolicyComponent.load(), file, testCase, { guard: true });
        assert.equal(result.failure, undefined, result.failure);
        assert.deepEqual(result.violations?.map((v) => `step ${v.step + 1}: ${v.violation.invariant}: ${v.violation.detail}`), []);
      });
    }
  }
});
