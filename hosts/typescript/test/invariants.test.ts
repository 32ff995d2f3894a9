// What the wrapper enforces whatever the policy says (src/guard.ts), through
// the real wrapper against the demo server, with the liar component
// (target/hostile/liar.wasm: the real policy, lying as its configuration's
// "x-liar" key says). Each test counts what was sent (the tools/call requests
// under the capturing fetch, or the server's ledger) and reads the escalation
// the host produced: without the guard, each would send again or wait.
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { EmbeddedAccounts } from '../src/accounts.js';
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { PolicyComponent, type Run } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import { Escalated, PolicyBoundaryViolation } from '../src/errors.js';
import { MAX_LIFTED_TEXT_BYTES } from '../src/limits.js';
import { Integrity, LivePolicy } from '../src/live.js';
import { FUEL_PER_CALL } from '../src/sandbox.js';
import { McpConnection, RetryingToolCaller, type RetryingToolCallerOptions } from '../src/mcp.js';
import type { FetchLike } from '../src/mcp/capture.js';
import { DemoServer, ROOT, type Fault, type FaultRule } from './demo-server.js';
import { isAddedEventLine } from './event-lines.js';

const LIAR = join(ROOT, 'target/hostile/liar.wasm');
const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-invariants-cache-'));
const CONFIG = { 'base-delay-ms': 20, 'max-delay-ms': 200 };

const servers: DemoServer[] = [];
const connections: McpConnection[] = [];
after(async () => {
  await Promise.all(connections.map((c) => c.close().catch(() => undefined)));
  await Promise.all(servers.map((s) => s.stop()));
});

let liarComponent: PolicyComponent | undefined;
async function liar(): Promise<PolicyComponent> {
  assert.ok(existsSync(LIAR), `missing ${LIAR}: make hostile (node tests/hostile/build.mjs)`);
  liarComponent ??= await PolicyComponent.load({ wasmPath: LIAR, cacheDir });
  return liarComponent;
}

const http = (status: number, body = ''): Fault => ({ kind: 'http', status, body });

let genuineComponent: PolicyComponent | undefined;
/** A run of the genuine policy (the component this package ships). */
async function genuineRun(config: object, runId: string): Promise<Run> {
  genuineComponent ??= await PolicyComponent.load({ cacheDir });
  const instance = await genuineComponent.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
  return instance.loadPolicy(config).startRun(runId);
}

/** The demo server (started with `serverArgs`) failing on `faults`, a
 *  connection that records every tools/call it sends, and a run of `run`
 *  (default: the liar under `lies`). */
async function setUp(faults: FaultRule[], lies: object, { serverArgs, fuelPerCall, ...options }: RetryingToolCallerOptions & { run?: Run; serverArgs?: string[]; fuelPerCall?: number } = {}) {
  const server = await DemoServer.start({ faults, ledger: true, args: serverArgs });
  servers.push(server);
  const sent: string[] = [];
  // Without the guard the liar retries past every budget: its 10th send stops the call (CallCancelled), so such a test fails, not hangs.
  const runaway = new AbortController();
  const recording: FetchLike = async (url, init) => {
    if (typeof init?.body === 'string') {
      try {
        const message = JSON.parse(init.body) as { method?: string; params?: { name?: string } };
        if (message.method === 'tools/call') sent.push(message.params?.name ?? '');
        if (sent.length >= 10) runaway.abort();
      } catch {
        // not JSON
      }
    }
    return fetch(url, init);
  };
  const connection = McpConnection.http(server.url, { fetch: recording });
  connections.push(connection);
  const instance = await (await liar()).instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n), fuelPerCall });
  const run = options.run ?? instance.loadPolicy({ ...CONFIG, 'x-liar': lies }).startRun('CASE-24');
  const lines: Array<Record<string, unknown>> = [];
  const sleeps: number[] = [];
  const caller = new RetryingToolCaller(connection, run, {
    entropy: new SplitMix64(3n), log: (line) => { if (!isAddedEventLine(line)) lines.push(JSON.parse(line) as Record<string, unknown>); },
    sleep: async (ms) => { sleeps.push(ms); }, ...options,
  });
  const sentTo = (tool: string) => sent.filter((t) => t === tool).length;
  /** `callTool`, answered with what it threw (or undefined). */
  const failure = (tool: string, args: Record<string, unknown>) =>
    caller.callTool(tool, args, { signal: runaway.signal }).then(() => undefined, (e: unknown) => e);
  return { server, caller, lines, sleeps, sentTo, failure };
}

/** Checks that `e` is the policy-failure escalation naming `invariant`; returns it. */
function brokeInvariant(e: unknown, invariant: string): Escalated {
  assert.ok(e instanceof Escalated, String(e));
  assert.equal(e.reason, 'unclassified-failure');
  assert.ok(e.policyFailure instanceof PolicyBoundaryViolation, String(e.policyFailure));
  assert.match(e.note, new RegExp(`^the retry policy failed \\(PolicyBoundaryViolation: invariant ${invariant}: `), e.note);
  return e;
}

const refund = { order_id: 'A1', amount_paise: 500 };

type Failure = (tool: string, args: Record<string, unknown>) => Promise<unknown>;

async function refundForbidden(failure: Failure, lines: Array<Record<string, unknown>>, sentTo: (tool: string) => number) {
  const first = brokeInvariant(await failure('issue_refund', refund), 'client-error-repeated');
  assert.equal(sentTo('issue_refund'), 1, 'the 403 was sent again');
  const line = lines.find((l) => l.invariant !== undefined);
  assert.equal(line?.invariant, 'client-error-repeated');
  assert.equal(line?.action, 'escalate');
  // The rest of the run: the same note at once, nothing sent.
  const later = brokeInvariant(await failure('lookup_order', { order_id: 'A1' }), 'client-error-repeated');
  assert.equal(later.note, first.note);
  assert.equal(sentTo('lookup_order'), 0);
  assert.equal(lines.at(-1)?.invariant, 'client-error-repeated');
}

test('a 403 the liar retries is sent once; the call and the rest of the run escalate (client-error-repeated)', async () => {
  const { failure, lines, sentTo } = await setUp([{ tool: 'issue_refund', fault: http(403, 'refunds above 5000 rupees need a person') }],
    { tools: ['issue_refund'], retry: true });
  await refundForbidden(failure, lines, sentTo);
});

test('an unkeyed write that timed out is not resent on the liar\'s word (unknown-write-resent)', async () => {
  const { server, failure, sentTo } = await setUp([{ tool: 'record_note', call: 1, fault: { kind: 'timeout-after-apply', 'delay-ms': 3000 } }],
    { retry: true }, { attemptTimeoutMs: 300 });
  const e = await failure('record_note', { order_id: 'A1', text: 'called the customer' });
  brokeInvariant(e, 'unknown-write-resent');
  assert.equal(sentTo('record_note'), 1);
  assert.equal(server.ledger().notes.length, 1, 'the note was written more than once');
});

for (const delayMs of [2_592_000_000, 3_600_000]) {
  test(`a retry after ${delayMs} ms is not waited for: one send (delay-over-cap)`, async () => {
    const { failure, sleeps, sentTo } = await setUp([{ tool: 'lookup_order', call: 1, fault: http(503, 'busy') }], { retry: true, 'delay-ms': delayMs });
    brokeInvariant(await failure('lookup_order', { order_id: 'A1' }), 'delay-over-cap');
    assert.deepEqual(sleeps, [], 'the wrapper waited');
    assert.equal(sentTo('lookup_order'), 1);
  });
}

test('with lines logged, a last-decision that says retry where the verdict did not is a violation, nothing resent (verdict-disagrees)', async () => {
  // A 403 on a read: the real policy's verdict does not retry it.
  const { failure, lines, sentTo } = await setUp([{ tool: 'lookup_order', call: 1, fault: http(403, 'no access to this order') }],
    { tools: ['lookup_order'], 'decision-action': 'retry' });
  brokeInvariant(await failure('lookup_order', { order_id: 'A1' }), 'verdict-disagrees');
  assert.equal(sentTo('lookup_order'), 1);
  assert.equal(lines.at(-1)?.invariant, 'verdict-disagrees');
});

test('a retry plan that names another idempotency key is a violation (key-changed)', async () => {
  const { failure, sentTo, server } = await setUp([{ tool: 'issue_refund', call: 1, fault: http(503, 'busy') }], { 'decision-key': 'forged' });
  brokeInvariant(await failure('issue_refund', refund), 'key-changed');
  assert.equal(sentTo('issue_refund'), 1);
  assert.equal(server.ledger().refunds.length, 0);
});

const CUT = / … \[cut: (\d+) bytes\]$/;

test('a 4 MB reason and note lifted from the policy are cut to MAX_LIFTED_TEXT_BYTES in the log and the escalation', async () => {
  // A tank large enough for the liar to say it all: padding 4 MB costs more than the default 20 M, in
  // wasmtime too (its copies are charged a unit a byte, as in this host), so the default stops it by fuel.
  const { failure, lines } = await setUp([{ tool: 'lookup_order', call: 1, fault: http(403, 'no access to this order') }],
    { tools: ['lookup_order'], 'reason-bytes': 4_000_000 }, { fuelPerCall: FUEL_PER_CALL * 100 });
  const e = await failure('lookup_order', { order_id: 'A1' });
  assert.ok(e instanceof Escalated && e.policyFailure === undefined, String(e));
  for (const text of [e.note, String(lines.at(-1)?.reason)]) {
    const found = CUT.exec(text);
    assert.ok(found, `not cut: ${text.slice(0, 80)}… (${Buffer.byteLength(text)} bytes)`);
    const kept = Buffer.byteLength(text) - Buffer.byteLength(found[0]);
    assert.ok(kept <= MAX_LIFTED_TEXT_BYTES && kept > MAX_LIFTED_TEXT_BYTES - 4, `${kept} bytes kept`);
    assert.ok(kept + Number(found[1]) >= 4_000_000, `${kept} kept + ${found[1]} cut is less than the padding`);
  }
  for (const line of lines) assert.ok(JSON.stringify(line).length < MAX_LIFTED_TEXT_BYTES + 4096, `a ${JSON.stringify(line).length}-byte line`);
});

test('a 20 MB reason never reaches the log or the caller whole (cut, or stopped by fuel)', async () => {
  const { failure, lines } = await setUp([{ tool: 'lookup_order', call: 1, fault: http(403, 'no access to this order') }],
    { tools: ['lookup_order'], 'reason-bytes': 20_971_520 });
  const e = await failure('lookup_order', { order_id: 'A1' });
  assert.ok(e instanceof Escalated, String(e));
  // This host's fuel stops the guest before it builds 20 MB of words (PolicyOutOfFuel); were it to, the text is cut.
  assert.ok(e.policyFailure !== undefined || CUT.test(e.note), e.note.slice(0, 200));
  assert.ok(Buffer.byteLength(e.note) < MAX_LIFTED_TEXT_BYTES + 64, `a ${Buffer.byteLength(e.note)}-byte note`);
  for (const line of lines) assert.ok(JSON.stringify(line).length < MAX_LIFTED_TEXT_BYTES + 4096, `a ${JSON.stringify(line).length}-byte line`);
});

test('the liar passes the live-update gate, and the wrapper still stops it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-invariants-live-'));
  copyFileSync(LIAR, join(dir, 'policy.wasm'));
  writeFileSync(join(dir, 'policy.json'), JSON.stringify({ ...CONFIG, 'x-liar': { tools: ['issue_refund'], retry: true } }));
  assert.ok(existsSync(LIAR), `missing ${LIAR}: make hostile`);
  const live = await LivePolicy.open({ wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity: Integrity.unchecked() }, { cacheDir });
  try {
    const loaded = live.current();
    const instance = await loaded.component.instantiate({ accounts: new EmbeddedAccounts(), entropy: new SplitMix64(7n) });
    const run = instance.loadPolicy(loaded.configJson).startRun('CASE-24-live');
    const { failure, lines, sentTo } = await setUp([{ tool: 'issue_refund', fault: http(403, 'refunds above 5000 rupees need a person') }], {},
      { run, policyIdentity: loaded.identity.toString() });
    await refundForbidden(failure, lines, sentTo);
  } finally {
    live.close();
  }
});

// Amendment A (a hostile test): the genuine policy retries a 4xx in which the
// server speaks about retrying; a new session is no retry of a 403; a tool is
// not called again while its task lives.

test('the genuine policy retries a 409 that says x-should-retry: true, and the guard lets it (no invariant)', async () => {
  const { failure, lines, sentTo, caller } = await setUp([{ tool: 'lookup_order', call: 1,
    fault: { kind: 'http', status: 409, headers: [['x-should-retry', 'true']], body: 'conflict, try again' } }], {},
  { run: await genuineRun(CONFIG, 'CASE-24-409') });
  assert.equal(await failure('lookup_order', { order_id: 'A1' }), undefined, 'the call failed');
  assert.equal(sentTo('lookup_order'), 2, 'not retried once');
  assert.deepEqual(lines.filter((l) => l.invariant !== undefined), []);
  assert.deepEqual(lines.filter((l) => l.tool === 'lookup_order').map((l) => [l.attempt, l.outcome, l.action]),
    [[1, 'http 409', 'retry'], [2, 'success', 'succeed']]);
  // The run goes on.
  const next = await caller.callTool('lookup_order', { order_id: 'A2' });
  assert.equal(next.isError, false);
  assert.equal(sentTo('lookup_order'), 3);
});

test('a 403 the liar retries on a new session with a session id is sent once (client-error-repeated)', async () => {
  const { failure, lines, sentTo } = await setUp([{ tool: 'issue_refund', fault: http(403, 'refunds above 5000 rupees need a person') }],
    { tools: ['issue_refund'], retry: true, reconnect: true }, { serverArgs: ['--era', 'handshake', '--sessions'] });
  brokeInvariant(await failure('issue_refund', refund), 'client-error-repeated');
  assert.equal(sentTo('issue_refund'), 1, 'the 403 was sent again on a new session');
  const line = lines.find((l) => l.invariant !== undefined);
  assert.equal(line?.invariant, 'client-error-repeated');
  // The line names the call and the attempt the verdict answered.
  assert.equal(typeof line?.call, 'number');
  assert.equal(line?.attempt, 1);
  assert.equal(line?.outcome, 'http 403');
});

test('an unkeyed write whose task lives is not called again when its poll failed and the policy says retry (task-resent)', async () => {
  // The genuine policy, but every poll failure answered retry (any component could), its words agreeing.
  const real = await genuineRun(CONFIG, 'CASE-24-task');
  let lied = false;
  const run = new Proxy(real, {
    get(target, property) {
      if (property === 'recordPollFailure') {
        return (_callId: number, attempt: number): Wit.Verdict => {
          lied = true;
          return { action: 'retry', class: 'transient', attempt, delayMs: 10n, hintMs: undefined, ruleIndex: 0, hasNote: false, reconnect: false, cancelTask: false, breakerChanged: false };
        };
      }
      if (property === 'lastDecision') {
        return (callId: number): Wit.Decision | undefined => {
          const said = target.lastDecision(callId);
          if (!lied || said === undefined) return said;
          return { ...said, class: 'transient', action: { tag: 'retry', val: { delayMs: 10n, attempt: 2, idempotencyKey: undefined, reconnect: false } }, cancelTask: false };
        };
      }
      const value = Reflect.get(target, property) as unknown;
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  const { server, failure, lines, sentTo } = await setUp([{ tool: 'tasks/get', call: 1, fault: { kind: 'drop' } }], {},
    { run, serverArgs: ['--task-work-ms', '1500', '--task-poll-interval-ms', '100'] });
  brokeInvariant(await failure('archive_orders', { before: '2024-01-01' }), 'task-resent');
  assert.ok(lied, 'no poll failed');
  assert.equal(sentTo('archive_orders'), 1, 'the tool was called again while its task lived');
  const line = lines.find((l) => l.invariant !== undefined);
  assert.equal(line?.invariant, 'task-resent');
  assert.equal(typeof line?.call, 'number');
  assert.equal(line?.attempt, 1);
  // The task the server kept runs to its end: one archive, not two.
  for (let i = 0; i < 200 && server.ledger().archives.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
  assert.equal(server.ledger().archives.length, 1);
});
