// The event model (docs/events.md) through `withPolicy`: the shared scenario of
// tests/events/scenario.json run with a fake clock, fixed entropy and in-memory
// OpenTelemetry exporters, dumped to target/events/node.json and compared with
// tests/events/expected.json when the Python host has written it; the hooks;
// the metrics against the run report; Prometheus text.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

import { metrics as otelMetrics, trace as otelTrace } from '@opentelemetry/api';
import {
  AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader, type ResourceMetrics,
} from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { Escalated, ObservedFailure, ReplanNeeded } from '../src/errors.js';
import type { AttemptEvent, EscalationEvent, ReplanEvent, StatusCheckEvent, WaitEvent } from '../src/events.js';
import type { RetryHooks } from '../src/hooks.js';
import { RetryMetrics } from '../src/metrics.js';
import { readableObservation } from '../src/conformance.js';
import { FakeClock, fixedEntropy } from '../src/testing.js';
import { SplitMix64 } from '../src/entropy.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
const SCENARIO = JSON.parse(readFileSync(resolve(ROOT, 'tests/events/scenario.json'), 'utf8')) as {
  run_id: string; clock_start_ms: number; entropy_seed: number; policy_identity: string; config: object;
  calls: Array<{ tool: string; answers: Array<{ failure?: unknown; ok?: unknown }> }>;
};

// One tracer and one meter provider for the file (the API's globals are set once).
const spans = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
otelTrace.setGlobalTracerProvider(tracerProvider);
const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
const metricReader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 3_600_000 });
const meterProvider = new MeterProvider({ readers: [metricReader] });
otelMetrics.setGlobalMeterProvider(meterProvider);

async function newRun(runId: string, config: object, seed = 1n): Promise<Run> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(seed) });
  return instance.loadPolicy(config).startRun(runId);
}

/** The span tree as the hosts dump it: the finished spans in the order they ended, each with its parent's name. */
function spanDump(finished: ReadableSpan[]): Array<Record<string, unknown>> {
  const byId = new Map(finished.map((s) => [s.spanContext().spanId, s]));
  const kinds = ['internal', 'server', 'client', 'producer', 'consumer'];
  const statuses = ['unset', 'ok', 'error'];
  return finished.map((s) => ({
    name: s.name,
    parent: s.parentSpanContext ? byId.get(s.parentSpanContext.spanId)?.name ?? null : null,
    kind: kinds[s.kind],
    status: statuses[s.status.code],
    attributes: sorted(s.attributes),
    events: s.events.map((e) => ({ name: e.name, attributes: sorted(e.attributes ?? {}) })),
  }));
}

function sorted<T>(value: T): T {
  if (Array.isArray(value)) return value.map(sorted) as T;
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sorted((value as Record<string, unknown>)[k])])) as T;
  }
  return value;
}

/** The OpenTelemetry metric points, by instrument name: the sum of a counter's points, a histogram's count. */
function otelTotals(resource: ResourceMetrics | undefined): Record<string, number> {
  const totals: Record<string, number> = {};
  for (const scope of resource?.scopeMetrics ?? []) {
    if (scope.scope.name !== 'agent-retry-policy') continue;
    for (const metric of scope.metrics) {
      let sum = 0;
      for (const point of metric.dataPoints as Array<{ value: number | { count: number } }>) sum += typeof point.value === 'number' ? point.value : point.value.count;
      totals[metric.descriptor.name] = (totals[metric.descriptor.name] ?? 0) + sum;
    }
  }
  return totals;
}

async function collectOtelMetrics(): Promise<ResourceMetrics | undefined> {
  const { resourceMetrics } = await metricReader.collect();
  return resourceMetrics;
}

test('the shared scenario: events, spans and metrics, dumped to target/events/node.json', async () => {
  spans.reset();
  const before = otelTotals(await collectOtelMetrics());
  const run = await newRun(SCENARIO.run_id, SCENARIO.config);
  const clock = new FakeClock(SCENARIO.clock_start_ms);
  const entropy = fixedEntropy(SCENARIO.entropy_seed);
  const metrics = new RetryMetrics();
  const lines: Array<Record<string, unknown>> = [];
  const ends: string[] = [];
  for (const call of SCENARIO.calls) {
    try {
      const value = await withPolicy(run, call.tool, async (attempt) => {
        const answer = call.answers[attempt.number - 1];
        assert.ok(answer, `${call.tool}: attempt ${attempt.number} has no scripted answer`);
        if (answer.failure !== undefined) throw new ObservedFailure(readableObservation(answer.failure));
        return answer.ok;
      }, { clock, entropy, metrics, policyIdentity: SCENARIO.policy_identity, log: (line) => lines.push(JSON.parse(line) as Record<string, unknown>) });
      ends.push(`value ${JSON.stringify(value)}`);
    } catch (e) {
      if (e instanceof ReplanNeeded) ends.push('replan');
      else if (e instanceof Escalated) ends.push(`escalate ${e.reason}`);
      else throw e;
    }
  }
  const events = lines.map(({ ts, ...rest }) => {
    assert.equal(typeof ts, 'number');
    return sorted(rest);
  });
  const dump = sorted({ events, spans: spanDump(spans.getFinishedSpans()), metrics: metrics.snapshot() });
  mkdirSync(resolve(ROOT, 'target/events'), { recursive: true });
  writeFileSync(resolve(ROOT, 'target/events/node.json'), `${JSON.stringify(dump, null, 2)}\n`);

  // What the scenario says happens: a 503 and a 429 retried, a success; a 400 replanned; a 403 escalated.
  assert.deepEqual(ends, ['value {"price_cents":1200}', 'replan', 'escalate permission-denied']);
  assert.deepEqual(events.map((e) => [e.event, e.tool, e.attempt, e.action ?? e.why ?? null]), [
    ['agent_retry.attempt', 'get_quote', 1, 'retry'],
    ['agent_retry.wait', 'get_quote', 2, 'retry'],
    ['agent_retry.attempt', 'get_quote', 2, 'retry'],
    ['agent_retry.wait', 'get_quote', 3, 'retry'],
    ['agent_retry.attempt', 'get_quote', 3, 'succeed'],
    ['agent_retry.attempt', 'update_address', 1, 'replan'],
    ['agent_retry.replan', 'update_address', 1, null],
    ['agent_retry.attempt', 'get_quote', 1, 'escalate'],
    ['agent_retry.escalation', 'get_quote', 1, null],
  ]);
  assert.deepEqual(events.map((e) => e.outcome).filter((o) => o !== undefined), ['http 503', 'http 429', 'success', 'http 400', 'http 403']);
  // Every line carries the run, the policy and the step; the keyed write its key, the same one.
  assert.ok(events.every((e) => e.run === SCENARIO.run_id && e.policy === SCENARIO.policy_identity));
  assert.deepEqual(events.map((e) => e.step), [1, 1, 1, 1, 1, 2, 2, 3, 3]);
  const keyOf = run.instance.deriveIdempotencyKey(SCENARIO.run_id, 'step-2');
  assert.deepEqual(events.filter((e) => e.tool === 'update_address' && e.event === 'agent_retry.attempt').map((e) => e.key), [keyOf]);
  assert.ok(events.filter((e) => e.tool === 'get_quote' && e.event === 'agent_retry.attempt').every((e) => e.key === null));
  // The 429's Retry-After (1 s) is the hint, and the wait honours it; the clock moved by exactly the waits.
  const throttled = events[2];
  assert.equal(throttled.hint_ms, 1000);
  assert.ok((throttled.delay_ms as number) >= 1000, `a wait of ${throttled.delay_ms} ms after Retry-After: 1`);
  assert.deepEqual(clock.sleeps, [events[0].delay_ms, events[2].delay_ms]);
  assert.equal(clock.nowMs(), SCENARIO.clock_start_ms + clock.sleeps.reduce((a, b) => a + b, 0));
  const escalation = events[8];
  assert.equal(escalation.reason, 'permission-denied');
  assert.ok(typeof escalation.note === 'string' && escalation.note.length > 0);

  // The metrics agree with the run report.
  const report = run.report();
  assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
  assert.equal(report.attempts, 5);
  assert.equal(metrics.total('agent_retry.attempts', { action: 'retry' }), 2);
  assert.equal(metrics.total('agent_retry.waits'), report.waits);
  assert.equal(metrics.total('agent_retry.replans'), 1);
  assert.equal(metrics.total('agent_retry.escalations', { reason: 'permission-denied' }), 1);

  // The span tree: a call span per call, an attempt span per attempt under it.
  const tree = dump.spans as Array<{ name: string; parent: string | null; kind: string; status: string; attributes: Record<string, unknown>;
    events: Array<{ name: string; attributes: Record<string, unknown> }> }>;
  assert.deepEqual(tree.map((s) => [s.name, s.parent, s.kind, s.status]), [
    ['attempt get_quote', 'execute_tool get_quote', 'internal', 'error'],
    ['attempt get_quote', 'execute_tool get_quote', 'internal', 'error'],
    ['attempt get_quote', 'execute_tool get_quote', 'internal', 'unset'],
    ['execute_tool get_quote', null, 'internal', 'unset'],
    ['attempt update_address', 'execute_tool update_address', 'internal', 'error'],
    ['execute_tool update_address', null, 'internal', 'unset'],
    ['attempt get_quote', 'execute_tool get_quote', 'internal', 'error'],
    ['execute_tool get_quote', null, 'internal', 'error'],
  ]);
  // Each attempt span is the child of its own call's span.
  const finished = spans.getFinishedSpans();
  for (const [attempt, call] of [[0, 3], [1, 3], [2, 3], [4, 5], [6, 7]]) {
    assert.equal(finished[attempt].parentSpanContext?.spanId, finished[call].spanContext().spanId);
    assert.equal(finished[attempt].spanContext().traceId, finished[call].spanContext().traceId);
  }
  assert.notEqual(finished[3].spanContext().traceId, finished[5].spanContext().traceId, 'each call is its own trace here (no parent span)');
  assert.deepEqual(tree.map((s) => s.attributes['agent_retry.attempts']), [undefined, undefined, undefined, 3, undefined, 1, undefined, 1]);
  assert.deepEqual(tree.map((s) => s.attributes['http.request.resend_count']), [undefined, 1, 2, undefined, undefined, undefined, undefined, undefined]);
  assert.equal(tree[3].attributes['agent_retry.action'], 'succeed');
  assert.equal(tree[3].attributes['gen_ai.operation.name'], 'execute_tool');
  assert.equal(tree[3].attributes['agent_retry.step'], 1);
  assert.equal(tree[0].attributes['error.type'], 'http 503');
  assert.equal(tree[5].attributes['agent_retry.action'], 'replan');
  assert.equal(tree[7].attributes['error.type'], 'permission-denied');
  assert.deepEqual(tree[3].events.map((e) => [e.name, e.attributes['agent_retry.why'], e.attributes['agent_retry.attempt']]),
    [['agent_retry.wait', 'retry', 2], ['agent_retry.wait', 'retry', 3]]);
  assert.deepEqual(tree[7].events.map((e) => [e.name, e.attributes['agent_retry.reason']]), [['agent_retry.escalation', 'permission-denied']]);

  // OpenTelemetry's instruments counted the same.
  const after = otelTotals(await collectOtelMetrics());
  const delta = (name: string) => (after[name] ?? 0) - (before[name] ?? 0);
  assert.equal(delta('agent_retry.attempts'), report.attempts);
  assert.equal(delta('agent_retry.waits'), report.waits);
  assert.equal(delta('agent_retry.wait.duration'), report.waits);
  assert.equal(delta('agent_retry.escalations'), 1);

  // Python's dump is the cross-host expectation once it exists.
  const expectedPath = resolve(ROOT, 'tests/events/expected.json');
  if (existsSync(expectedPath)) {
    const expected = JSON.parse(readFileSync(expectedPath, 'utf8')) as Record<string, unknown>;
    assert.deepEqual(dump.events, expected.events, 'events differ from tests/events/expected.json');
    assert.deepEqual(dump.metrics, expected.metrics, 'metrics differ from tests/events/expected.json');
    if (Array.isArray(expected.spans) && expected.spans.length > 0) assert.deepEqual(dump.spans, expected.spans, 'spans differ from tests/events/expected.json');
  }
});

/** A run of a 503, a 429 and a success through `withPolicy`, with `hooks`. */
async function throttledThenOk(hooks: RetryHooks, log?: (line: string) => void) {
  const run = await newRun('RUN-HOOKS', { tools: { get_quote: { effect: 'read' } } });
  const answers = [
    { kind: { 'http-status': 503 }, headers: [], body: 'busy' },
    { kind: { 'http-status': 429 }, headers: [['retry-after', '2']], body: '' },
  ];
  const clock = new FakeClock(1_700_000_000_000);
  const value = await withPolicy(run, 'get_quote', async ({ number }) => {
    if (number <= answers.length) throw new ObservedFailure(readableObservation(answers[number - 1]));
    return 'quote';
  }, { clock, entropy: fixedEntropy(1), hooks, log });
  return { run, value, clock };
}

test('hooks fire with their events, before the wrapper acts', async () => {
  const seen: string[] = [];
  const waits: WaitEvent[] = [];
  const retries: AttemptEvent[] = [];
  let clockAtWait: number | undefined;
  let clock: FakeClock | undefined;
  const hooks: RetryHooks = {
    onRetry: (e) => { retries.push(e); seen.push(`retry ${e.attempt} ${e.outcome}`); },
    onWait: (e) => { waits.push(e); seen.push(`wait ${e.attempt} ${e.why}`); clockAtWait ??= clock?.nowMs(); },
    onReplan: () => seen.push('replan'),
    onEscalate: () => seen.push('escalate'),
  };
  const result = await throttledThenOk(hooks);
  clock = result.clock;
  assert.equal(result.value, 'quote');
  assert.deepEqual(seen, ['retry 1 http 503', 'wait 2 retry', 'retry 2 http 429', 'wait 3 retry']);
  // The hook gets the decision in words and the policy's identity.
  assert.equal(retries[0].decision?.action.tag, 'retry');
  assert.equal(retries[0].policy, result.run.instance.policyIdentity);
  assert.equal(waits[1].hintMs, 2000);
  assert.equal(waits[1].waitMs, retries[1].delayMs);
  assert.deepEqual(result.clock.sleeps, waits.map((w) => w.waitMs));
});

test('a hook that throws is logged once and the call goes on', async () => {
  const lines: Array<Record<string, unknown>> = [];
  let calls = 0;
  const { value } = await throttledThenOk({
    onRetry: () => {
      calls += 1;
      throw new Error('hook bug');
    },
    onWait: () => Promise.reject(new Error('async hook bug')) as unknown as void,
  }, (line) => lines.push(JSON.parse(line) as Record<string, unknown>));
  assert.equal(value, 'quote');
  assert.equal(calls, 2, 'the hook is still called after it threw');
  await new Promise((resolve) => setImmediate(resolve));
  const failed = lines.filter((l) => l.event === 'agent_retry.hook_failed');
  assert.deepEqual(failed.map((l) => [l.hook, l.error]), [['onRetry', 'Error: hook bug'], ['onWait', 'Error: async hook bug']]);
});

test('a replan and an escalation reach their hooks with the message and the note', async () => {
  const run = await newRun('RUN-ENDS', { tools: { update_address: { effect: 'write', idempotent: true }, get_quote: { effect: 'read' } } });
  const replans: ReplanEvent[] = [];
  const escalations: EscalationEvent[] = [];
  const checks: StatusCheckEvent[] = [];
  const hooks: RetryHooks = { onReplan: (e) => replans.push(e), onEscalate: (e) => escalations.push(e), onStatusCheck: (e) => checks.push(e) };
  const bad = readableObservation({ kind: { 'http-status': 400 }, headers: [], body: 'postcode must be 5 digits' });
  await assert.rejects(withPolicy(run, 'update_address', async () => { throw new ObservedFailure(bad); }, { hooks, clock: new FakeClock() }),
    (e: unknown) => e instanceof ReplanNeeded && e.message === replans[0]?.message && e.rule === replans[0]?.rule);
  assert.equal(replans.length, 1);
  assert.ok(replans[0].message.length > 0);
  const denied = readableObservation({ kind: { 'http-status': 403 }, headers: [], body: 'forbidden' });
  await assert.rejects(withPolicy(run, 'get_quote', async () => { throw new ObservedFailure(denied); }, { hooks, clock: new FakeClock() }),
    (e: unknown) => e instanceof Escalated && e.note === escalations[0]?.note && e.reason === 'permission-denied');
  assert.equal(escalations[0].reason, 'permission-denied');
  assert.equal(escalations[0].escalationValue.reason, 'permission-denied');
  assert.equal(checks.length, 0);
});

test('RetryMetrics prints Prometheus text with the documented names, labels and buckets', async () => {
  const metrics = new RetryMetrics();
  const run = await newRun('RUN-PROM', { tools: { get_quote: { effect: 'read' } } });
  const clock = new FakeClock();
  let n = 0;
  await withPolicy(run, 'get_quote', async () => {
    n += 1;
    if (n === 1) throw new ObservedFailure(readableObservation({ kind: { 'http-status': 503 }, headers: [], body: '' }));
    return 1;
  }, { clock, metrics, entropy: fixedEntropy(3) });
  const text = metrics.toPrometheus();
  assert.match(text, /^# TYPE agent_retry_attempts_total counter$/m);
  assert.match(text, /^agent_retry_attempts_total\{class="transient",action="retry"\} 1$/m);
  assert.match(text, /^agent_retry_attempts_total\{class="success",action="succeed"\} 1$/m);
  assert.match(text, /^agent_retry_replans_total 0$/m);
  assert.match(text, /^# TYPE agent_retry_wait_seconds histogram$/m);
  const wait = clock.sleeps[0] / 1000;
  const buckets = [...text.matchAll(/^agent_retry_wait_seconds_bucket\{why="retry",le="([^"]+)"\} (\d+)$/gm)].map((m) => [m[1], Number(m[2])]);
  assert.deepEqual(buckets.map(([le]) => le), ['0.05', '0.1', '0.25', '0.5', '1', '2.5', '5', '10', '30', '60', '+Inf']);
  for (const [le, count] of buckets) assert.equal(count, le === '+Inf' || wait <= Number(le) ? 1 : 0, `bucket le=${le}`);
  assert.match(text, new RegExp(`^agent_retry_wait_seconds_sum\\{why="retry"\\} ${wait}$`, 'm'));
  assert.match(text, /^agent_retry_wait_seconds_count\{why="retry"\} 1$/m);
  assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
  // Every line is a comment or a sample: nothing a scraper would refuse.
  for (const line of text.trimEnd().split('\n')) assert.match(line, /^(# (HELP|TYPE) \S+ .+|[a-z_]+(\{[^}]*\})? [0-9.e+-]+|[a-z_]+(\{[^}]*\})? \+Inf)$/, line);
});

test('a hook cannot change what is counted or done: the events are frozen for it', async () => {
  const run = await newRun('RUN-FROZEN', { tools: { get_quote: { effect: 'read' } } });
  const metrics = new RetryMetrics();
  const lines: Array<Record<string, unknown>> = [];
  const denied = readableObservation({ kind: { 'http-status': 403 }, headers: [], body: 'forbidden' });
  const hooks: RetryHooks = {
    onEscalate: (e) => {
      (e as { note: string }).note = 'rewritten';
      (e.escalationValue as { note: string }).note = 'rewritten';
    },
  };
  await assert.rejects(withPolicy(run, 'get_quote', async () => { throw new ObservedFailure(denied); },
    { hooks, metrics, clock: new FakeClock(), log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }),
  (e: unknown) => e instanceof Escalated && e.note !== 'rewritten' && e.note === run.escalation()?.note);
  assert.equal(metrics.total('agent_retry.escalations', { reason: 'permission-denied' }), 1);
  assert.deepEqual(lines.filter((l) => l.event === 'agent_retry.hook_failed').map((l) => l.hook), ['onEscalate']);
});

test('a hook that throws a huge error is logged once, bounded', async () => {
  const lines: string[] = [];
  const { value } = await throttledThenOk({ onRetry: () => { throw new Error('x'.repeat(5_000_000)); } }, (line) => lines.push(line));
  assert.equal(value, 'quote');
  const failed = lines.filter((l) => l.includes('agent_retry.hook_failed'));
  assert.equal(failed.length, 1);
  assert.ok(failed[0].length < 100_000, `a ${failed[0].length}-byte line`);
  assert.match(failed[0], /\[cut: \d+ bytes\]/);
});
