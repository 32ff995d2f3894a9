// OpenTelemetry (src/otel.ts) through @opentelemetry/api with the SDK's
// in-memory exporters: the MCP wrapper's spans (`execute_tool`, a client span
// `tools/call` per attempt), W3C trace context in the `tools/call` request's
// `params._meta`, metric instruments, an exporter that throws, and the API
// package absent (a child process whose loader refuses it).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { test } from 'node:test';

import { metrics as otelMetrics, trace as otelTrace } from '@opentelemetry/api';
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { withPolicy } from '../src/any-call.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { ObservedFailure } from '../src/errors.js';
import { RetryingToolCaller } from '../src/mcp.js';
import { RetryMetrics } from '../src/metrics.js';
import { loadOtel, resetOtelForTests } from '../src/otel.js';
import { FakeClock } from '../src/testing.js';

const here = dirname(fileURLToPath(import.meta.url));

const spans = new InMemorySpanExporter();
/** A processor that throws as each span ends (after the in-memory one took it), and as each starts when
 *  `breakStarts` is set: the wrapper must not care. */
let breakStarts = false;
const throwing: SpanProcessor = {
  onStart: () => {
    if (breakStarts) throw new Error('processor onStart fails');
  },
  onEnd: () => { throw new Error('processor onEnd fails'); },
  forceFlush: async () => undefined,
  shutdown: async () => undefined,
};
otelTrace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans), throwing] }));
const metricReader = new PeriodicExportingMetricReader({ exporter: new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE), exportIntervalMillis: 3_600_000 });
otelMetrics.setGlobalMeterProvider(new MeterProvider({ readers: [metricReader] }));

async function newRun(runId: string, config: object = {}): Promise<Run> {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(4n) });
  return instance.loadPolicy({ 'base-delay-ms': 1, 'max-delay-ms': 5, ...config }).startRun(runId);
}

/** An MCP server in memory whose `lookup` tool fails `failures` times (an isError result saying HTTP 503), recording each request's `_meta`. */
async function connectedClient(failures: number, annotate = true): Promise<{ client: Client; metas: Array<Record<string, unknown> | undefined> }> {
  const server = new McpServer({ name: 'otel-test', version: '1.0.0' });
  const metas: Array<Record<string, unknown> | undefined> = [];
  let calls = 0;
  server.registerTool('lookup', { description: 'reads', ...(annotate ? { annotations: { readOnlyHint: true } } : {}) }, async (extra) => {
    metas.push(extra._meta as Record<string, unknown> | undefined);
    calls += 1;
    if (calls <= failures) {
      return { content: [{ type: 'text', text: '503 Service Unavailable' }], structuredContent: { status: 503 }, isError: true };
    }
    return { content: [{ type: 'text', text: 'found' }] };
  });
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  const client = new Client({ name: 'otel-test-client', version: '1.0.0' });
  await client.connect(clientSide);
  return { client, metas };
}

const attribute = (span: ReadableSpan, name: string) => span.attributes[name];

test('the MCP wrapper: a call span, a client span per attempt, and each attempt\'s traceparent in params._meta', async () => {
  spans.reset();
  const { client, metas } = await connectedClient(1);
  const run = await newRun('RUN-OTEL-MCP');
  const metrics = new RetryMetrics();
  const lines: Array<Record<string, unknown>> = [];
  const caller = new RetryingToolCaller(client, run, { log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>), metrics });
  const result = await caller.callTool('lookup', {});
  assert.notEqual(result.isError, true, JSON.stringify(result));
  assert.deepEqual(result.content, [{ type: 'text', text: 'found' }]);
  await client.close();

  const finished = spans.getFinishedSpans();
  const call = finished.find((s) => s.name === 'execute_tool lookup') as ReadableSpan;
  assert.ok(call, finished.map((s) => s.name).join());
  const attempts = finished.filter((s) => s.name === 'tools/call lookup');
  assert.equal(attempts.length, 2);
  assert.equal(call.kind, 0); // internal
  assert.equal(attribute(call, 'gen_ai.operation.name'), 'execute_tool');
  assert.equal(attribute(call, 'gen_ai.tool.name'), 'lookup');
  assert.equal(attribute(call, 'agent_retry.run'), 'RUN-OTEL-MCP');
  assert.equal(attribute(call, 'agent_retry.policy'), caller.policyIdentity);
  assert.equal(attribute(call, 'agent_retry.action'), 'succeed');
  assert.equal(attribute(call, 'agent_retry.attempts'), 2);
  for (const [i, span] of attempts.entries()) {
    assert.equal(span.kind, 2); // client
    assert.equal(span.parentSpanContext?.spanId, call.spanContext().spanId);
    assert.equal(attribute(span, 'mcp.method.name'), 'tools/call');
    assert.equal(attribute(span, 'gen_ai.tool.name'), 'lookup');
    assert.equal(attribute(span, 'agent_retry.attempt'), i + 1);
    assert.equal(attribute(span, 'http.request.resend_count'), i === 0 ? undefined : i);
    // The server got this attempt's own trace context.
    const sent = metas[i];
    assert.equal(sent?.traceparent, `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`);
  }
  assert.equal(attribute(attempts[0], 'error.type'), 'tool error');
  assert.equal(attempts[0].status.code, 2);
  assert.equal(attribute(attempts[0], 'agent_retry.action'), 'retry');
  // The wait before attempt 2 is an event of the call span.
  const waits = call.events.filter((e) => e.name === 'agent_retry.wait');
  assert.equal(waits.length, lines.filter((l) => l.event === 'agent_retry.wait').length);
  // The pseudo-call tools/list makes no span; its attempt counts in the metrics as in the report.
  assert.ok(!finished.some((s) => s.name.includes('tools/list')));
  assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
  assert.ok(run.report().attempts >= 3, 'tools/list and two tools/call attempts');
  // The attempt lines kept their fields and order.
  const attemptLine = lines.find((l) => l.event === 'agent_retry.attempt' && l.tool === 'lookup') as Record<string, unknown>;
  assert.deepEqual(Object.keys(attemptLine), ['event', 'ts', 'run', 'policy', 'step', 'call', 'tool', 'attempt', 'key', 'outcome', 'class', 'rule', 'action',
    'delay_ms', 'hint_ms', 'escalation', 'reason']);
});

test('a span processor that throws as spans start loses the spans, never the call', async () => {
  spans.reset();
  breakStarts = true;
  try {
    const { client, metas } = await connectedClient(1);
    const run = await newRun('RUN-OTEL-BROKEN');
    const metrics = new RetryMetrics();
    const result = await new RetryingToolCaller(client, run, { log: null, metrics }).callTool('lookup', {});
    assert.deepEqual(result.content, [{ type: 'text', text: 'found' }]);
    assert.equal(metas.length, 2);
    assert.ok(metas.every((m) => m?.traceparent === undefined), 'no span, no trace context');
    assert.equal(metrics.total('agent_retry.attempts'), run.report().attempts);
    await client.close();
  } finally {
    breakStarts = false;
  }
});

test('tools without annotations: one warning per connection, naming them', async () => {
  const { client } = await connectedClient(0, false);
  const lines: Array<Record<string, unknown>> = [];
  const log = (l: string) => lines.push(JSON.parse(l) as Record<string, unknown>);
  const run = await newRun('RUN-HINTS');
  await new RetryingToolCaller(client, run, { log }).callTool('lookup', {});
  await new RetryingToolCaller(client, await newRun('RUN-HINTS-2'), { log }).callTool('lookup', {});
  const warnings = lines.filter((l) => l.event === 'agent_retry.tools_without_hints');
  assert.equal(warnings.length, 1, 'once for the connection, not per caller');
  assert.deepEqual(warnings[0].tools, ['lookup']);
  assert.equal(warnings[0].count, 1);
  assert.match(String(warnings[0].reason), /docs\/users\.md#a-tool-without-annotations-is-an-unkeyed-write/);
  await client.close();

  const annotated = await connectedClient(0, true);
  const quiet: string[] = [];
  await new RetryingToolCaller(annotated.client, await newRun('RUN-HINTS-3'), { log: (l) => quiet.push(l) }).callTool('lookup', {});
  assert.ok(!quiet.some((l) => l.includes('tools_without_hints')));
  await annotated.client.close();
});

test('the metric instruments are recorded through the API', async () => {
  const { client } = await connectedClient(1);
  const run = await newRun('RUN-OTEL-METRICS');
  await new RetryingToolCaller(client, run, { log: null }).callTool('lookup', {});
  await client.close();
  const { resourceMetrics } = await metricReader.collect();
  const names = resourceMetrics.scopeMetrics.filter((s) => s.scope.name === 'agent-retry-policy').flatMap((s) => s.metrics.map((m) => m.descriptor.name));
  assert.ok(names.includes('agent_retry.attempts'), names.join());
  const histogram = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).find((m) => m.descriptor.name === 'agent_retry.wait.duration');
  if (histogram) assert.equal(histogram.descriptor.unit, 's');
});

test('loadOtel: an import that fails gives undefined, once', async () => {
  resetOtelForTests();
  let imports = 0;
  const failing = () => {
    imports += 1;
    return Promise.reject(Object.assign(new Error("Cannot find package '@opentelemetry/api'"), { code: 'ERR_MODULE_NOT_FOUND' }));
  };
  assert.equal(await loadOtel(failing), undefined);
  assert.equal(await loadOtel(failing), undefined);
  assert.equal(imports, 1);
  resetOtelForTests();
  assert.ok(await loadOtel(), 'the installed API loads');
});

test('without @opentelemetry/api installed, withPolicy works, counts, and records no span', () => {
  const dir = mkdtempSync(join(tmpdir(), 'no-otel-'));
  // A loader that refuses the package, as if it were not installed.
  const hooks = join(dir, 'hooks.mjs');
  writeFileSync(hooks, `export async function resolve(specifier, context, next) {
  if (specifier === '@opentelemetry/api' || specifier.startsWith('@opentelemetry/')) {
    throw Object.assign(new Error("Cannot find package '" + specifier + "'"), { code: 'ERR_MODULE_NOT_FOUND' });
  }
  return next(specifier, context);
}
`);
  const register = join(dir, 'register.mjs');
  writeFileSync(register, `import { register } from 'node:module';\nregister(${JSON.stringify(pathToFileURL(hooks).href)});\n`);
  const script = join(dir, 'main.mjs');
  const src = (name: string) => JSON.stringify(pathToFileURL(resolve(here, '../src', name)).href);
  writeFileSync(script, `
import { withPolicy } from ${src('any-call.js')};
import { loadOtel } from ${src('otel.js')};
import { PolicyComponent } from ${src('component.js')};
import { EmbeddedAccounts } from ${src('accounts.js')};
import { RetryMetrics } from ${src('metrics.js')};
import { FakeClock } from ${src('testing.js')};
let failedImport = false;
try { await import('@opentelemetry/api'); } catch { failedImport = true; }
const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts() });
const run = instance.loadPolicy({ tools: { t: { effect: 'read' } } }).startRun('RUN-NO-OTEL');
const metrics = new RetryMetrics();
let n = 0;
const value = await withPolicy(run, 't', async () => {
  n += 1;
  if (n === 1) { const e = new TypeError('fetch failed'); e.cause = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED', syscall: 'connect' }); throw e; }
  return 'ok';
}, { clock: new FakeClock(), metrics });
console.log(JSON.stringify({ failedImport, otel: (await loadOtel()) === undefined ? 'absent' : 'present', value, attempts: metrics.total('agent_retry.attempts'), report: run.report().attempts }));
`);
  const child = spawnSync(process.execPath, ['--import', pathToFileURL(register).href, script], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(child.status, 0, child.stderr);
  const out = JSON.parse(child.stdout.trim().split('\n').at(-1) as string) as Record<string, unknown>;
  assert.deepEqual(out, { failedImport: true, otel: 'absent', value: 'ok', attempts: 2, report: 2 });
});

test('a circuit breaker change (contract 0.8.0) is an agent_retry.breaker span event on the call span, and counted', async () => {
  const run = await newRun('RUN-OTEL-BREAKER', { 'circuit-breaker': { 'failures-to-open': 2, 'cooldown-ms': 60000 }, tools: { get_quote: { effect: 'read' } } });
  spans.reset();
  const unavailable = { kind: { tag: 'http-status', val: 503 }, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'unknown' } as const;
  await withPolicy(run, 'get_quote', () => { throw new ObservedFailure(unavailable); }, { server: 'quotes', clock: new FakeClock(1_700_000_000_000) })
    .then(() => assert.fail('the call cannot succeed'), () => undefined);
  const call = spans.getFinishedSpans().find((s) => s.name === 'execute_tool get_quote');
  assert.ok(call, spans.getFinishedSpans().map((s) => s.name).join(', '));
  const opened = call.events.filter((e) => e.name === 'agent_retry.breaker' && e.attributes?.['agent_retry.to'] === 'open');
  assert.ok(opened.length >= 1, JSON.stringify(call.events.map((e) => [e.name, e.attributes])));
  for (const event of opened) {
    assert.equal(event.attributes?.['agent_retry.server'], 'quotes');
    assert.equal(event.attributes?.['agent_retry.from'], 'closed');
    assert.ok(['server', 'tool'].includes(String(event.attributes?.['agent_retry.scope'])));
    assert.equal(typeof event.attributes?.['agent_retry.until_ms'], 'number');
    assert.equal(typeof event.attributes?.['agent_retry.why'], 'string');
  }
  const { resourceMetrics } = await metricReader.collect();
  const changes = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).find((m) => m.descriptor.name === 'agent_retry.breaker.changes');
  assert.ok(changes, 'the agent_retry.breaker.changes counter was recorded');
  const open = changes.dataPoints.filter((p) => p.attributes.to === 'open').reduce((sum, p) => sum + Number(p.value), 0);
  assert.equal(open, opened.length);
});
