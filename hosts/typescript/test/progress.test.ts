// Per-tool timeouts and progress (contract 0.7.0): each attempt takes its idle
// and total timeouts from the policy (`beginCall`: `idle-timeout-ms`,
// `attempt-timeout-ms`, set per tool in the configuration); the wrapper sends a
// progress token with each `tools/call`, every `notifications/progress` starts
// the idle timeout again and reaches `onProgress`. Against the demo server's
// `export_report {seconds}` (progress every `--progress-interval-ms`), whose
// ledger records each run, the notifications it sent and whether it finished.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated } from '../src/errors.js';
import { McpConnection, RetryingToolCaller, type McpSdkName, type ProgressEvent, type VerdictEvent } from '../src/mcp.js';
import { DemoServer } from './demo-server.js';

/** The idle timeout the policy gives `export_report`: shorter than the export, longer than its progress interval. */
const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200, 'max-attempts-per-call': 2, tools: { export_report: { 'idle-timeout-ms': 1000 } } };
const FLAGS = ['--progress-interval-ms'];

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

async function setUp(progressIntervalMs: number, sdk: McpSdkName) {
  const server = await DemoServer.start({ ledger: true, args: ['--progress-interval-ms', String(progressIntervalMs)], require: FLAGS });
  servers.push(server);
  const connection = McpConnection.http(server.url, { sdk });
  connections.push(connection);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy(CONFIG).startRun(`progress-${sdk}-${progressIntervalMs}`);
  const progress: ProgressEvent[] = [];
  const verdicts: VerdictEvent[] = [];
  const caller = new RetryingToolCaller(connection, run, {
    log: null, onProgress: (event) => progress.push(event), onVerdict: (event) => verdicts.push(event),
  });
  return { server, caller, run, progress, verdicts };
}

for (const sdk of ['v2', 'v1'] as const) {
  test(`sdk ${sdk}: an export of 3 s with progress every 200 ms outlives its idle timeout of 1 s in one attempt`, async () => {
    const { server, caller, run, progress, verdicts } = await setUp(200, sdk);
    const result = await caller.callTool('export_report', { seconds: 3 });
    assert.notEqual(result.isError, true, JSON.stringify(result));
    assert.deepEqual((result.structuredContent as { report_id?: string }).report_id, 'RP-1');
    const reports = server.ledger().reports;
    assert.equal(reports.length, 1, 'one run: no attempt was cut and sent again');
    assert.equal(reports[0].finished, true);
    assert.notEqual(reports[0].progress_token, null, 'the tools/call carried a progress token');
    assert.ok(reports[0].notifications >= 10, `the server sent its progress: ${reports[0].notifications}`);
    // Every notification reached the application, for the one attempt of the call.
    assert.equal(progress.length, reports[0].notifications);
    const call = verdicts.find((v) => v.tool === 'export_report')?.callId;
    assert.ok(progress.every((p) => p.tool === 'export_report' && p.attempt === 1 && p.callId === call), JSON.stringify(progress[0]));
    // As the server sent them: rising, against one total, with its message.
    assert.ok(progress.every((p, i) => p.total === progress[0].total && (i === 0 || p.progress > progress[i - 1].progress)), JSON.stringify(progress));
    assert.match(progress[0].message ?? '', new RegExp(`exported ${progress[0].progress} of ${progress[0].total}`));
    assert.deepEqual(verdicts.filter((v) => v.tool === 'export_report').map((v) => [v.attempt, v.reported.tag, v.verdict.action]), [[1, 'success', 'succeed']]);
    assert.equal(run.report().retries, 0);
  });
}

test('a silent export (no progress within the idle timeout) is cut at the policy\'s idle timeout and reported as a timeout', async () => {
  // Progress every 10 s: nothing comes within the tool's idle timeout of 1 s.
  const { server, caller, progress, verdicts } = await setUp(10_000, 'v2');
  await assert.rejects(caller.callTool('export_report', { seconds: 3 }), (e: unknown) => e instanceof Escalated);
  const attempts = verdicts.filter((v) => v.tool === 'export_report');
  assert.deepEqual(attempts.map((v) => v.attempt), [1, 2], 'each attempt cut, then the attempts spent');
  for (const v of attempts) {
    assert.ok(v.reported.tag === 'failure' && v.reported.val.kind.tag === 'transport' && v.reported.val.kind.val === 'timeout',
      JSON.stringify(v.reported));
  }
  assert.equal(progress.length, 0);
  const reports = server.ledger().reports;
  assert.equal(reports.length, 2);
  assert.ok(reports.every((r) => !r.finished && r.notifications === 0), JSON.stringify(reports));
});

test('the attemptTimeoutMs option, set, caps the policy\'s idle timeout', async () => {
  // Progress every 200 ms would keep a 1 s idle timeout alive; a cap of 100 ms cuts the attempt first.
  const server = await DemoServer.start({ ledger: true, args: ['--progress-interval-ms', '200'], require: FLAGS });
  servers.push(server);
  const connection = McpConnection.http(server.url);
  connections.push(connection);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy({ ...CONFIG, 'max-attempts-per-call': 1 }).startRun('capped');
  const verdicts: VerdictEvent[] = [];
  const caller = new RetryingToolCaller(connection, run, { log: null, attemptTimeoutMs: 100, onVerdict: (v) => verdicts.push(v) });
  await assert.rejects(caller.callTool('export_report', { seconds: 1 }), (e: unknown) => e instanceof Escalated);
  const first = verdicts.find((v) => v.tool === 'export_report');
  assert.ok(first?.reported.tag === 'failure' && first.reported.val.kind.tag === 'transport' && first.reported.val.kind.val === 'timeout');
  assert.equal(server.ledger().reports[0]?.finished, false);
});
