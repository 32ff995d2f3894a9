// The MCP wrapper's events against the demo server over streamable HTTP
// (`McpConnection.http`): the lines of docs/events.md in order, the hooks, the
// metrics agreeing with the run report (the pseudo-calls included), and each
// attempt's W3C trace context in the `tools/call` request's `params._meta`.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { trace as otelTrace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import type { AttemptEvent, EscalationEvent, WaitEvent } from '../src/events.js';
import { McpConnection, RetryingToolCaller } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { RetryMetrics } from '../src/metrics.js';
import { DemoServer } from './demo-server.js';

const spans = new InMemorySpanExporter();
otelTrace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));

test('a 429 with Retry-After, a keyed write after a 503, then a 403: events, hooks, metrics and trace context', async () => {
  const server = await DemoServer.start({
    ledger: true,
    faults: [
      { tool: 'lookup_order', call: 1, fault: { kind: 'http', status: 429, headers: [['retry-after', '1']], body: 'slow down' } },
      { tool: 'issue_refund', call: 1, fault: { kind: 'http', status: 503, body: 'upstream unavailable' } },
      { tool: 'lookup_order', call: 3, fault: { kind: 'http', status: 403, body: 'no access to this order' } },
    ],
  });
  /** The `params._meta` of every tools/call sent, in order. */
  const metas: Array<{ tool: string; meta: Record<string, unknown> | undefined }> = [];
  const recording: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string' && init.body.includes('"tools/call"')) {
      const message = JSON.parse(init.body) as { params?: { name?: string; _meta?: Record<string, unknown> } };
      metas.push({ tool: message.params?.name ?? '', meta: message.params?._meta });
    }
    return fetch(url, init);
  };
  const connection = McpConnection.http(server.url, { fetch: recording });
  try {
    const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
    const run = instance.loadPolicy({ 'base-delay-ms': 20, 'max-delay-ms': 200 }).startRun('CASE-EVENTS');
    const lines: Array<Record<string, unknown>> = [];
    const metrics = new RetryMetrics();
    const retries: AttemptEvent[] = [];
    const waits: WaitEvent[] = [];
    const escalations: EscalationEvent[] = [];
    const caller = new RetryingToolCaller(connection, run, {
      entropy: new SplitMix64(3n), metrics, log: (l) => lines.push(JSON.parse(l) as Record<string, unknown>),
      hooks: { onRetry: (e) => retries.push(e), onWait: (e) => waits.push(e), onEscalate: (e) => escalations.push(e) },
    });
    assert.ok(!(await caller.callTool('lookup_order', { order_id: 'A1' })).isError);
    assert.ok(!(await caller.callTool('issue_refund', { order_id: 'A1', amount_paise: 500 })).isError);
    await assert.rejects(caller.callTool('lookup_order', { order_id: 'A2' }), (e: unknown) => e instanceof Escalated && e.reason === 'permission-denied');

    const model = lines.filter((l) => l.step !== null);
    const seen = model.map((l) => [l.event, l.tool, l.attempt, l.action ?? l.why ?? l.status ?? l.reason ?? null].join(' '));
    // The refund's second attempt is answered by a task (the demo server's): polled until it completes, as long as it takes.
    const text = seen.join('\n');
    assert.match(text, new RegExp(['^agent_retry.attempt lookup_order 1 retry', 'agent_retry.wait lookup_order 2 retry', 'agent_retry.attempt lookup_order 2 succeed',
      'agent_retry.attempt issue_refund 1 retry', 'agent_retry.wait issue_refund 2 retry',
      '(agent_retry.task_poll issue_refund 2 working\nagent_retry.attempt issue_refund 2 poll\nagent_retry.wait issue_refund 2 poll\n)*'
        + 'agent_retry.task_poll issue_refund 2 completed', 'agent_retry.attempt issue_refund 2 succeed',
      'agent_retry.attempt lookup_order 1 escalate', 'agent_retry.escalation lookup_order 1 permission-denied$'].join('\n')), text);
    // The hooks saw the same, with the hint and the note.
    assert.deepEqual(retries.map((e) => [e.tool, e.outcome]), [['lookup_order', 'http 429'], ['issue_refund', 'http 503']]);
    assert.deepEqual(waits.map((e) => e.why).filter((w) => w === 'retry'), ['retry', 'retry']);
    assert.equal(waits[0].hintMs, 1000);
    assert.ok(waits[0].waitMs >= 1000);
    assert.equal(escalations[0].note, run.escalation()?.note);
    // The keyed write kept its key; one refund applied.
    const key = run.instance.deriveIdempotencyKey('CASE-EVENTS', 'step-2');
    const refundLines = model.filter((l) => l.tool === 'issue_refund' && l.event === 'agent_retry.attempt');
    assert.ok(refundLines.length >= 2 && refundLines.every((l) => l.key === key), JSON.stringify(refundLines.map((l) => l.key)));
    assert.equal(server.ledger().refunds.length, 1);
    // Counts agree with the run report, the tools/list pseudo-call included.
    const report = run.report();
    assert.equal(metrics.total('agent_retry.attempts'), report.attempts);
    assert.equal(metrics.total('agent_retry.waits', { why: 'retry' }), 2);
    assert.equal(metrics.total('agent_retry.waits'), model.filter((l) => l.event === 'agent_retry.wait').length);
    assert.equal(metrics.total('agent_retry.escalations', { reason: 'permission-denied' }), 1);
    // Each tools/call carried its attempt span's traceparent, a new span id each attempt, one trace per call.
    assert.equal(metas.length, 5);
    const parents = metas.map((m) => String(m.meta?.traceparent));
    assert.ok(parents.every((p) => /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/.test(p)), parents.join());
    assert.equal(new Set(parents).size, 5);
    const traceOf = (p: string) => p.split('-')[1];
    assert.equal(traceOf(parents[0]), traceOf(parents[1]));
    assert.notEqual(traceOf(parents[1]), traceOf(parents[2]));
    const sentSpans = new Set(spans.getFinishedSpans().filter((s) => s.name.startsWith('tools/call ')).map((s) => s.spanContext().spanId));
    assert.ok(parents.every((p) => sentSpans.has(p.split('-')[2])), 'each traceparent names a recorded attempt span');
  } finally {
    await connection.close();
    await server.stop();
  }
});
