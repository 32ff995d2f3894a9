// The host's own pieces: the GCRA account budget, entropy, loading, the typed
// wrappers and the value conversion.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { EmbeddedAccounts, U64_MAX, gcra } from '../src/accounts.js';
import { INSTALLED, MAX_EFFECTS_PAGE, PolicyComponent, PolicyInstance, Run, locateComponent } from '../src/component.js';
import { toJsonSafe } from '../src/json.js';
import { SplitMix64, OsEntropy, randomBytes } from '../src/entropy.js';
import {
  ComponentLoadError, ComponentNotFound, ConfigError, InstanceUnusable, PolicyBoundaryViolation, PolicyInputTooLarge, PolicyTrap, RunMisuse,
} from '../src/errors.js';
import type { Observation } from '../src/index.js';
import { FUNCTIONS, TYPES, ValueConversionError, camel, toJco, type WitType } from '../src/wit.js';

test('GCRA admits a burst, then one per interval', () => {
  const accounts = EmbeddedAccounts.onHostClock(); // simulated time from 0
  const bucket = { capacity: 3, refillIntervalMs: 100n };
  const take = (now: bigint) => accounts.reserve('a', 1, bucket, 250n, now);
  assert.deepEqual([take(0n), take(0n), take(0n)], Array(3).fill({ granted: true, waitMs: 0n }));
  assert.deepEqual(take(0n), { granted: true, waitMs: 100n });
  assert.deepEqual(take(0n), { granted: true, waitMs: 200n });
  assert.deepEqual(take(0n), { granted: false, waitMs: 300n }); // over max-wait: nothing taken
  assert.deepEqual(take(0n), { granted: false, waitMs: 300n });
  assert.deepEqual(take(300n), { granted: true, waitMs: 0n });
  assert.deepEqual(accounts.reserve('b', 3, bucket, 0n, 0n), { granted: true, waitMs: 0n });
});

test('GCRA saturates at u64', () => {
  const bucket = { capacity: 0xffffffff, refillIntervalMs: U64_MAX };
  assert.deepEqual(gcra(U64_MAX, 0xffffffff, bucket, U64_MAX, U64_MAX), [{ granted: true, waitMs: 0n }, U64_MAX]);
  assert.deepEqual(gcra(0n, 1, { capacity: 1, refillIntervalMs: 10n }, 0n, 5n), [{ granted: true, waitMs: 0n }, 15n]);
});

test('SplitMix64 is the reference sequence and OS entropy varies', () => {
  const source = new SplitMix64(0n);
  assert.equal(source.nextU64(), 0xe220a8397b1dcdafn);
  assert.equal(source.nextU64(), 0x6e789e6aa1b965f4n);
  const os = new OsEntropy();
  assert.notEqual(os.nextU64(), os.nextU64());
  assert.deepEqual([...randomBytes(new SplitMix64(0n), 3)], [0xaf, 0xcd, 0x1d]);
});

test('a missing component names the fix', () => {
  assert.throws(() => locateComponent('/nonexistent/policy.wasm'), (e: unknown) => e instanceof ComponentNotFound && /make wasm/.test(e.message));
});

test('a transpilation from another build is refused', async () => {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed for this test (make wasm)');
  const dir = mkdtempSync(join(tmpdir(), 'other-build-'));
  const copy = join(dir, 'policy.wasm');
  copyFileSync(wasm, copy);
  // Another build of the same contract: the same component plus a custom section.
  const custom = Buffer.concat([Buffer.from([4]), Buffer.from('note'), Buffer.from('x')]);
  writeFileSync(copy, Buffer.concat([readFileSync(copy), Buffer.from([0, custom.length]), custom]));
  // Against the package's own transpilation (generatedDir named): refused, with the fix.
  const generatedDir = join(fileURLToPath(import.meta.url), '../../generated');
  await assert.rejects(PolicyComponent.load({ wasmPath: copy, generatedDir }),
    (e: unknown) => e instanceof ComponentLoadError && /transpiled from another build/.test(e.message) && /npm run transpile/.test(e.message));
  await assert.rejects(PolicyComponent.load({ generatedDir: dir }), (e: unknown) => e instanceof ComponentNotFound);
  // Without generatedDir the other build is transpiled at run time (test/runtime-load.test.ts).
  const component = await PolicyComponent.load({ wasmPath: copy, cacheDir: mkdtempSync(join(tmpdir(), 'other-build-cache-')) });
  assert.equal(component.origin, 'transpiled');
  const digest = createHash('sha256').update(readFileSync(copy)).digest('hex');
  assert.equal(component.source.sha256, digest);
  // Its identity names its own bytes, not the bundled component's.
  assert.equal(component.identity, `agent-retry:policy@0.9.0 wasm ${digest.slice(0, 12)}`);
  assert.equal((await component.instantiate()).policyIdentity, component.identity);
  assert.notEqual(component.identity, (await PolicyComponent.load()).identity);
});

test("the bundled component's identity is its contract version and the SHA-256 of the .wasm it was transpiled from", async () => {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  const bytes = readFileSync(wasm);
  const digest = createHash('sha256').update(bytes).digest('hex');
  const component = await PolicyComponent.fromBytes(bytes);
  assert.equal(component.origin, 'bundled');
  assert.equal(component.identity, `agent-retry:policy@0.9.0 wasm ${digest.slice(0, 12)}`);
  assert.match(component.identity, /^agent-retry:policy@\d+\.\d+\.\d+ wasm [0-9a-f]{12}$/);
  const instance = await component.instantiate();
  assert.equal(instance.policyIdentity, component.identity);
});

test('instances share the process account budget', async () => {
  const component = await PolicyComponent.load();
  const accounts = EmbeddedAccounts.onHostClock(); // simulated time
  const config = { 'account-budget': { 'account-id': 'acme', capacity: 1, 'refill-interval-ms': 400 } };
  const first = (await component.instantiate({ accounts })).loadPolicy(config).startRun('w1');
  const second = (await component.instantiate({ accounts })).loadPolicy(config).startRun('w2');
  const a = first.beginCall(undefined, 'lookup', undefined, undefined, 1_000_000n);
  const b = second.beginCall(undefined, 'lookup', undefined, undefined, 1_000_000n);
  assert.ok(a.admitted && b.admitted);
  assert.equal(a.delayMs, 0n);
  assert.equal(b.delayMs, 400n); // the first took the only token
});

test('wasi:random comes from the host entropy source', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ entropy: new SplitMix64(42n) });
  const policy = instance.loadPolicy({ 'base-delay-ms': 1_000_000, 'max-delay-ms': 1_000_000 });
  const expected = policy.nextDelay(1, undefined, new SplitMix64(42n).nextU64());
  assert.equal(policy.nextDelay(1), expected);
});

test('typed errors for a bad config and a misused run', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  assert.throws(() => instance.loadPolicy({ 'max-attempts-per-call': 0 }),
    (e: unknown) => e instanceof ConfigError && e.kind === 'out-of-range' && e.field === 'max-attempts-per-call');
  const run = instance.loadPolicy({}).startRun('r');
  assert.throws(() => run.recordSuccess(7, 1, 1n),
    (e: unknown) => e instanceof RunMisuse && e.error.tag === 'unknown-call' && e.error.val === 7);
});

test('canonical values that do not fit their WIT type are rejected', () => {
  for (const bad of [{ kind: { 'http-status': 70000 } }, { kind: { nope: 1 } }, { kind: 'http-status' }, { kind: { 'http-status': 503 }, extra: 1 }]) {
    assert.throws(() => toJco({ delivery: 'sent', ...bad }, TYPES.observation), ValueConversionError);
  }
  assert.throws(() => toJco({ kind: { 'http-status': 503 }, delivery: 'maybe' }, TYPES.observation), ValueConversionError);
  assert.deepEqual(toJco({ kind: { 'http-status': 503 }, headers: 'Retry-After: 2', delivery: 'answer-started' }, TYPES.observation),
    { kind: { tag: 'http-status', val: 503 }, headers: 'Retry-After: 2', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'answer-started' });
  assert.deepEqual(toJco({ kind: { 'tool-error': null }, body: 'x', 'structured-content': '{"a":1}', 'session-id-sent': true, delivery: 'unknown' }, TYPES.observation),
    { kind: { tag: 'tool-error', val: undefined }, headers: '', body: 'x', structuredContent: '{"a":1}', sessionIdSent: true, delivery: 'unknown' });
});

test('closed handles refuse calls', async () => {
  const run = (await (await PolicyComponent.load()).instantiate()).loadPolicy({}).startRun('r');
  assert.equal(run.report().runId, 'r');
  run.close();
  assert.throws(() => run.report(), InstanceUnusable);
});

test('a failing account backend fails the call as a trap and the instance is not reused', async () => {
  const down = { reserve(): never { throw new Error('redis is down'); }, refund(): void {} };
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: down });
  const run = instance.loadPolicy({ 'account-budget': { 'account-id': 'acme', capacity: 1, 'refill-interval-ms': 10 } }).startRun('r');
  assert.throws(() => run.beginCall(undefined, 'lookup', undefined, undefined, 0n), (e: unknown) => e instanceof PolicyTrap && /redis is down/.test(e.message));
  assert.throws(() => run.report(), InstanceUnusable);
});

test('a refund gives tokens back but never past a full bucket', () => {
  const accounts = EmbeddedAccounts.onHostClock(); // simulated time
  const bucket = { capacity: 3, refillIntervalMs: 100n };
  for (let i = 0; i < 3; i++) accounts.reserve('q', 1, bucket, 0n, 0n);
  assert.deepEqual(accounts.reserve('q', 1, bucket, 0n, 0n), { granted: false, waitMs: 100n });
  accounts.refund('q', 1, bucket, 0n);
  assert.deepEqual(accounts.reserve('q', 1, bucket, 0n, 0n), { granted: true, waitMs: 0n });
  accounts.refund('q', 50, bucket, 0n);
  for (let i = 0; i < 3; i++) assert.deepEqual(accounts.reserve('q', 1, bucket, 0n, 0n), { granted: true, waitMs: 0n });
  assert.deepEqual(accounts.reserve('q', 1, bucket, 0n, 0n), { granted: false, waitMs: 100n });
  assert.deepEqual(accounts.reserve('q', 0, bucket, 0n, 0n), { granted: true, waitMs: 0n });
});

test("the written-out WIT types agree with jco's declarations of the component's", () => {
  // src/wit.ts is written by hand; jco's .d.ts comes from the component itself.
  const dts = readFileSync(join(fileURLToPath(import.meta.url), '../../generated/interfaces/agent-retry-policy-types.d.ts'), 'utf8');
  const pascal = (name: string) => name.split('-').map((w) => w[0].toUpperCase() + w.slice(1)).join('');
  const interfaceFields = (name: string) => {
    const body = new RegExp(`^export interface ${name} \\{\\n([\\s\\S]*?)^\\}`, 'm').exec(dts);
    assert.ok(body, `jco declares no interface ${name}`);
    return [...body[1].matchAll(/^\s+'?([A-Za-z]+)'?\??:/gm)].map((m) => m[1]);
  };
  const seen = new Set<string>();
  const visit = (type: WitType | null): void => {
    if (type === null) return;
    switch (type.kind) {
      case 'list': case 'option': visit(type.of); return;
      case 'tuple': type.of.forEach(visit); return;
      case 'result': visit(type.ok); visit(type.err); return;
      case 'record': case 'enum': case 'variant': break;
      default: return;
    }
    if (seen.has(type.name)) return;
    seen.add(type.name);
    if (type.kind === 'record') {
      assert.deepEqual(interfaceFields(pascal(type.name)), type.fields.map(([f]) => camel(f)), `record ${type.name}`);
      type.fields.forEach(([, t]) => visit(t));
    } else if (type.kind === 'enum') {
      const cases = new RegExp(`^export type ${pascal(type.name)} = (.*);$`, 'm').exec(dts);
      assert.ok(cases, `jco declares no enum ${type.name}`);
      assert.deepEqual(cases[1].split(' | ').map((c) => c.slice(1, -1)), type.names, `enum ${type.name}`);
    } else {
      const cases = new RegExp(`^export type ${pascal(type.name)} = (.*);$`, 'm').exec(dts);
      assert.ok(cases, `jco declares no variant ${type.name}`);
      assert.deepEqual(cases[1].split(' | '), type.cases.map(([c]) => pascal(type.name) + pascal(c)), `variant ${type.name}`);
      type.cases.forEach(([, t]) => visit(t));
    }
  };
  Object.values(TYPES).forEach(visit);
  Object.values(FUNCTIONS).forEach((f) => { f.params.forEach(visit); visit(f.result); });
  assert.ok(seen.size >= 25, `only ${seen.size} named types visited`);
});

test('reports are JSON-safe: u64 as a number when safe, else as a string of its digits', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ entropy: new SplitMix64(7n) });
  const run = instance.loadPolicy({}).startRun('json');
  const start = run.beginCall(undefined, 'lookup_order', undefined, undefined, 1_000n);
  assert.ok(start.admitted);
  run.recordFailure(start.callId, 1, observation({ tag: 'http-status', val: 503 }, { headers: 'Retry-After: 1' }), undefined, 1_000n);
  const report = run.report();
  assert.equal(typeof report.waitedMs, 'bigint'); // the typed field keeps its bigint
  const parsed = JSON.parse(JSON.stringify(report)) as Record<string, unknown>;
  assert.equal(parsed.runId, 'json');
  assert.equal(parsed.waitedMs, Number(report.waitedMs));
  assert.ok(!Object.keys(report).includes('toJSON'), 'toJSON is not an enumerable field');
  assert.deepEqual(toJsonSafe({ a: 2n ** 53n - 1n, b: 2n ** 53n, c: [2n ** 64n - 1n], d: -5n, e: 'x' }),
    { a: 9007199254740991, b: '9007199254740992', c: ['18446744073709551615'], d: -5, e: 'x' });
});

test('an installed package gives a package user\'s advice, not the repository\'s', () => {
  assert.equal(INSTALLED, false); // these tests run in the repository
  assert.throws(() => locateComponent('/nonexistent/agent_retry_policy.wasm'), (e: unknown) =>
    e instanceof ComponentNotFound && /make wasm/.test(e.message));
});

// One report per attempt, start-run's run error, effects paged.

const fail503 = observation({ tag: 'http-status', val: 503 });

test('a report names the attempt it reports: a second report of one attempt is refused and changes nothing', async () => {
  const run = (await (await PolicyComponent.load()).instantiate({ entropy: new SplitMix64(1n) })).loadPolicy({}).startRun('attempts');
  const start = run.beginCall(undefined, 'lookup_order', undefined, { readOnly: true }, 1n);
  assert.ok(start.admitted);
  const callId = start.callId;
  const first = run.recordFailure(callId, 1, fail503, undefined, 1n, 1n);
  assert.ok(first.action === 'retry' && first.attempt === 1);
  // The same 503 recorded twice: refused, no second retry.
  assert.throws(() => run.recordFailure(callId, 1, fail503, undefined, 1n, 1n), (e: unknown) =>
    e instanceof RunMisuse && e.error.tag === 'attempt-mismatch' && e.error.val.callId === callId && e.error.val.expected === 2 &&
    e.error.val.reported === 1 && /attempt-mismatch \(\{"callId":1,"expected":2,"reported":1\}\)/.test(e.message));
  assert.throws(() => run.recordFailure(callId, 3, fail503, undefined, 1n, 1n), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'attempt-mismatch');
  assert.deepEqual([run.report().attempts, run.report().retries], [2, 1]);
  assert.equal(run.recordSuccess(callId, 2, 1n).action, 'succeed');
});

test('an id over 256 bytes is refused before it crosses, with the run error the component gives', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy({});
  // The component's own answers, asked directly (what the host must give without asking).
  const direct = (call: () => unknown): unknown => {
    try {
      instance.guard('direct', call); // on a full tank, as the host's own calls
    } catch (e) {
      return (e as { payload?: unknown }).payload;
    }
    return undefined;
  };
  const jcoPolicy = policy.resource;
  const long = 'r'.repeat(257);
  const accents = 'é'.repeat(129); // 129 characters, 258 bytes: counted in UTF-8 bytes
  for (const runId of [long, accents]) {
    const expected = direct(() => jcoPolicy.startRun(runId));
    assert.deepEqual(expected, { tag: 'too-large', val: { input: 'run-id', sizeBytes: Buffer.byteLength(runId), limitBytes: 256 } });
    policy.effectiveConfig(); // the last call that crossed
    const fuelOfConfig = instance.fuelUsedByLastCall();
    assert.throws(() => policy.startRun(runId), (e: unknown) => e instanceof RunMisuse && (assert.deepEqual(e.error, expected), true));
    assert.equal(instance.fuelUsedByLastCall(), fuelOfConfig, 'start-run did not cross the boundary');
  }
  assert.equal(policy.startRun('r'.repeat(256)).runId.length, 256); // the limit itself is fine
  const run = policy.startRun('ok');
  const jcoRun = run.resource;
  for (const [tool, key] of [['t'.repeat(300), undefined], ['issue_refund', 'k'.repeat(257)]] as const) {
    const expected = direct(() => jcoRun.beginCall(undefined, tool, key, undefined, 1n));
    assert.equal((expected as { tag: string }).tag, 'too-large');
    assert.throws(() => run.beginCall(undefined, tool, key, undefined, 1n), (e: unknown) => e instanceof RunMisuse && (assert.deepEqual(e.error, expected), true));
  }
  assert.ok(run.beginCall(undefined, 'lookup', undefined, undefined, 1n).admitted); // the run goes on
});

test('derive-idempotency-key refuses an id over 256 bytes with a typed host error; the instance stays usable', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  assert.throws(() => instance.deriveIdempotencyKey('r'.repeat(257), 'step-1'), (e: unknown) =>
    e instanceof PolicyInputTooLarge && !(e instanceof PolicyTrap) && e.input === 'run-id' && e.sizeBytes === 257 && e.limitBytes === 256);
  assert.throws(() => instance.deriveIdempotencyKey('run', 'ä'.repeat(200)), (e: unknown) =>
    e instanceof PolicyInputTooLarge && e.input === 'action-id' && e.sizeBytes === 400 && /action-id is 400 bytes, more than the 256/.test(e.message));
  assert.equal(instance.brokenBy, undefined);
  assert.match(instance.deriveIdempotencyKey('r'.repeat(256), 'a'.repeat(256)), /^ar1-[0-9a-f]{32}$/);
});

test('a configuration over 1 MiB is answered as the component answers it, without crossing', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const text = JSON.stringify({ tools: { t: { effect: 'read' } }, pad: 'x'.repeat(1 << 20) });
  let expected: unknown;
  try {
    instance.guard('direct', () => instance.exports.Policy.fromJson(text)); // the component's own answer, on a full tank
  } catch (e) {
    expected = (e as { payload?: unknown }).payload;
  }
  assert.deepEqual(expected, { kind: 'too-large', field: '', message: `the configuration is ${text.length} bytes, more than the 1048576-byte limit` });
  instance.deriveIdempotencyKey('a', 'b');
  const fuelOfKey = instance.fuelUsedByLastCall();
  assert.throws(() => instance.loadPolicy(text), (e: unknown) =>
    e instanceof ConfigError && e.kind === 'too-large' && e.field === '' && e.detail === (expected as { message: string }).message);
  assert.equal(instance.fuelUsedByLastCall(), fuelOfKey, 'from-json did not cross the boundary');
  // Counted in UTF-8 bytes: 600,000 characters of 2 bytes are over.
  assert.throws(() => instance.loadPolicy(`"${'é'.repeat(600_000)}"`), (e: unknown) => e instanceof ConfigError && e.kind === 'too-large');
  assert.throws(() => instance.loadPolicy(`{"x":"${'x'.repeat(1000)}"}`), (e: unknown) => e instanceof ConfigError && e.kind === 'unknown-field');
});

test('a report lists at most 20 effects and counts all; effects() pages through every one', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ fuelPerCall: null });
  const run = instance.loadPolicy({ 'max-steps-per-run': 1_000_000 }).startRun('effects');
  const total = 2_345;
  for (let i = 1; i <= total; i++) {
    run.recordSuccess(run.beginCall(undefined, 'issue_refund', `k-${i}`, undefined, 1n).callId, 1, 1n);
  }
  const report = run.report();
  assert.equal(report.effectsTotal, total);
  assert.deepEqual(report.effects.map((e) => e.callId), [...Array.from({ length: 10 }, (_, i) => i + 1), ...Array.from({ length: 10 }, (_, i) => total - 9 + i)]);
  assert.equal(JSON.parse(JSON.stringify(report)).effectsTotal, total);
  assert.deepEqual(run.effects(0, 3).map((e) => e.idempotencyKey), ['k-1', 'k-2', 'k-3']);
  assert.equal(run.effects(0, 5_000).length, 1_000, 'never more than 1,000 a page');
  assert.equal(run.effects(0).length, MAX_EFFECTS_PAGE);
  assert.deepEqual(run.effects(total - 1, 10).map((e) => e.callId), [total]);
  assert.deepEqual(run.effects(total, 10), []);
  const all = run.allEffects();
  assert.equal(all.length, total);
  assert.ok(all.every((e, i) => e.callId === i + 1 && e.idempotencyKey === `k-${i + 1}` && e.status === 'applied'));
  assert.deepEqual(instance.loadPolicy({}).startRun('none').allEffects(), []);
  // An escalation lists the same bounded effects and counts them all.
  const last = run.beginCall(undefined, 'issue_refund', 'k-last', undefined, 1n).callId;
  assert.equal(run.recordFailure(last, 1, observation({ tag: 'http-status', val: 403 }, { body: 'needs approval' }), undefined, 1n, 1n).action, 'escalate');
  const decision = run.lastDecision(last);
  assert.ok(decision?.action.tag === 'escalate');
  assert.equal(decision.action.val.effectsTotal, total);
  assert.equal(decision.action.val.effects.length, 20);
});

// Contract 0.5.0 on: one run path; the verdict, and its words from lastDecision.

test('every report answers a verdict that says what lastDecision says', async () => {
  const component = await PolicyComponent.load();
  const config = { 'max-steps-per-run': 1000, tools: { issue_refund: { effect: 'write' }, lookup_order: { effect: 'read' } } };
  const instance = await component.instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  const run = instance.loadPolicy(config).startRun('same');
  const rules = instance.ruleNames();
  assert.ok(rules.length > 5 && rules.includes('http-status') && rules.includes('lost-session'), JSON.stringify(rules));
  assert.equal(instance.ruleNames(), rules, 'asked once per instance');
  assert.equal(run.escalation(), undefined);
  const key = `ar1-${'0'.repeat(31)}1`;
  type Step = Observation | 'success' | { empty: string } | { check: 'found' | 'absent' | 'unknown' };
  const scenario: Array<[string, string | undefined, Step[]]> = [
    ['issue_refund', key, [observation({ tag: 'http-status', val: 503 }, { body: 'upstream unavailable' }), 'success']],
    ['lookup_order', undefined, [observation({ tag: 'http-status', val: 429 }, { headers: 'retry-after: 1', body: 'slow down' }), 'success']],
    ['lookup_order', undefined, [observation({ tag: 'http-status', val: 404 }, { sessionIdSent: true, delivery: 'answer-started' }), 'success']],
    ['lookup_order', undefined, [{ empty: 'no rows' }]],
    ['issue_refund', undefined, [observation({ tag: 'transport', val: 'timeout' }, { delivery: 'sent' }), { check: 'absent' }, 'success']],
    ['lookup_order', undefined, [observation({ tag: 'tool-error', val: undefined }, { body: 'invalid argument: order_id' })]],
    ['issue_refund', undefined, [observation({ tag: 'http-status', val: 403 }, { headers: 'x-reason: needs approval', body: 'needs approval' })]],
  ];
  const now = 1_764_460_800_000n;
  let reconnected = false;
  for (const [tool, idempotencyKey, steps] of scenario) {
    const start = run.beginCall(undefined, tool, idempotencyKey, undefined, now);
    assert.ok(start.admitted, JSON.stringify(toJsonSafe(start)));
    let attempt = 1;
    for (const step of steps) {
      const verdict = step === 'success' ? run.recordSuccess(start.callId, attempt, now)
        : 'empty' in step ? run.recordEmptyResult(start.callId, attempt, step.empty, now)
          : 'check' in step ? run.recordStatusCheck(start.callId, attempt, step.check, undefined, now, 7n)
            : run.recordFailure(start.callId, attempt, step, undefined, now, 7n);
      const decision = run.lastDecision(start.callId);
      assert.ok(decision);
      assert.equal(run.lastDecision(start.callId + 1), undefined, 'the last decision was about another call');
      const action = decision.action;
      assert.deepEqual(verdict, {
        action: action.tag, class: decision.class, attempt: decision.attempt, delayMs: action.tag === 'retry' ? action.val.delayMs : 0n,
        hintMs: decision.hintMs, ruleIndex: rules.indexOf(decision.rule),
        hasNote: action.tag === 'replan' || action.tag === 'escalate' || (action.tag === 'succeed' && action.val !== undefined),
        reconnect: action.tag === 'retry' && action.val.reconnect, cancelTask: decision.cancelTask,
        breakerChanged: false, // no circuit-breaker configuration: no breaker changes
      });
      reconnected ||= verdict.reconnect;
      // A retry sends the next attempt; a status check reports the attempt it checked.
      if (verdict.action === 'retry') attempt = verdict.attempt + 1;
    }
  }
  assert.ok(reconnected, 'the 404 to a request that carried a session id is a lost session: retry with reconnect');
  assert.equal(run.escalation()?.reason, 'permission-denied');
  const last = run.lastDecision(7);
  assert.ok(last?.action.tag === 'escalate');
  assert.deepEqual(run.escalation(), last.action.val);
  assert.throws(() => run.beginCall(undefined, 'lookup_order', undefined, undefined, now), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'run-ended');
});

// Contract 0.7.0: a call answered by a task is polled as the policy says.

test('a task is polled as the policy says: poll verdicts, a poll failure polled again, a completed task reported as an attempt', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  const run = instance.loadPolicy({ tools: { issue_refund: { effect: 'write', 'idle-timeout-ms': 1000, 'attempt-timeout-ms': 5000 } } }).startRun('task');
  const now = 1_764_460_800_000n;
  const start = run.beginCall(undefined, 'issue_refund', `ar1-${'0'.repeat(31)}2`, undefined, now);
  assert.equal(start.idleTimeoutMs, 1000n);
  assert.equal(start.attemptTimeoutMs, 5000n);
  const working = { taskId: 'T-1', status: 'working' as const, pollIntervalMs: 250n, ttlMs: 60_000n, ageMs: 0n, message: '' };
  const first = run.recordTaskStatus(start.callId, 1, working, undefined, now, 7n);
  assert.equal(first.action, 'poll');
  assert.equal(first.cancelTask, false);
  assert.ok(first.delayMs >= 250n, `the server's interval is a floor: ${first.delayMs}`);
  const decision = run.lastDecision(start.callId);
  assert.ok(decision?.action.tag === 'poll' && decision.action.val.taskId === 'T-1');
  // A poll that failed on a lost session is polled again on a new one; the tool is not called again.
  const lost = run.recordPollFailure(start.callId, 1, observation({ tag: 'http-status', val: 404 }, { sessionIdSent: true, delivery: 'answer-started' }),
    undefined, now + 300n, 7n);
  assert.equal(lost.action, 'poll');
  assert.equal(lost.reconnect, true);
  // A message over the host's limit is cut before it crosses.
  const long = run.recordTaskStatus(start.callId, 1, { ...working, ageMs: 600n, message: 'x'.repeat(100_000) }, undefined, now + 600n, 7n);
  assert.equal(long.action, 'poll');
  assert.equal(run.recordSuccess(start.callId, 1, now + 900n).action, 'succeed');
  const report = run.report();
  assert.equal(report.tasks, 1);
  assert.ok(report.polls >= 2, JSON.stringify(toJsonSafe(report)));
  assert.equal(report.attempts, 1);
  // A poll failure for a call that has no task is misuse.
  const plain = run.beginCall(undefined, 'lookup_order', undefined, { readOnly: true, destructive: false, idempotent: true }, now + 1000n);
  assert.throws(() => run.recordPollFailure(plain.callId, 1, observation({ tag: 'transport', val: 'timeout' }, { delivery: 'sent' }), undefined, now + 1000n, 7n),
    (e: unknown) => e instanceof RunMisuse && e.error.tag === 'no-task');
});

test('a task past its time to live escalates and cancels it; input nobody answers escalates input-required', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  const policy = instance.loadPolicy({ tools: { issue_refund: { effect: 'write' } } });
  const now = 1_764_460_800_000n;
  const expired = policy.startRun('ttl');
  const call = expired.beginCall(undefined, 'issue_refund', `ar1-${'0'.repeat(31)}3`, undefined, now).callId;
  const verdict = expired.recordTaskStatus(call, 1, { taskId: 'T-2', status: 'working', ttlMs: 1000n, ageMs: 5000n, message: 'still going' },
    undefined, now, 7n);
  assert.equal(verdict.action, 'escalate');
  assert.equal(verdict.cancelTask, true);
  assert.equal(expired.escalation()?.reason, 'task-expired');
  const asked = policy.startRun('input');
  const confirm = asked.beginCall(undefined, 'issue_refund', `ar1-${'0'.repeat(31)}4`, undefined, now).callId;
  const input = asked.recordFailure(confirm, 1, observation({ tag: 'input-required' }, { body: 'Confirm order A1?', delivery: 'answer-started' }),
    undefined, now, 7n);
  assert.equal(input.action, 'escalate');
  assert.equal(input.class, 'needs-input');
  assert.equal(asked.escalation()?.reason, 'input-required');
  assert.match(asked.escalation()?.note ?? '', /Confirm order A1\?/);
});

test('time-left-ms cuts a retry to the deadline; with none, the server may ask for its wait', async () => {
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  const policy = instance.loadPolicy({ tools: { lookup_order: { effect: 'read' } } });
  const asks = observation({ tag: 'http-status', val: 503 }, { headers: 'Retry-After: 5', delivery: 'answer-started' });
  const free = policy.startRun('no-deadline');
  assert.equal(free.recordFailure(free.beginCall(undefined, 'lookup_order', undefined, undefined, 1n).callId, 1, asks, undefined, 1n, 1n).action, 'retry');
  const tight = policy.startRun('deadline');
  const verdict = tight.recordFailure(tight.beginCall(undefined, 'lookup_order', undefined, undefined, 1n).callId, 1, asks, 1000n, 1n, 1n);
  assert.equal(verdict.action, 'escalate');
  assert.equal(tight.escalation()?.reason, 'deadline-too-near');
});

test('read-probe-answer: the policy reads a probe\'s answer', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  for (const status of [401, 403, 408, 429, 500, 503]) assert.equal(instance.readProbeAnswer(status, undefined), 'failure', String(status));
  for (const status of [400, 404, 405, 413]) assert.equal(instance.readProbeAnswer(status, undefined), 'older-server', String(status));
  assert.equal(instance.readProbeAnswer(undefined, -32601), 'older-server');
  assert.throws(() => instance.readProbeAnswer(70000, undefined), /read-probe-answer argument 1: 70000 is out of range for u16/);
});

test('a call not admitted leaves its hand-off in the run: escalation()', async () => {
  const component = await PolicyComponent.load();
  const config = { 'account-budget': { 'account-id': 'acme', capacity: 1, 'refill-interval-ms': 60_000, 'max-wait-ms': 0 } };
  const run = (await component.instantiate({ accounts: EmbeddedAccounts.onHostClock() })).loadPolicy(config).startRun('budget');
  assert.ok(run.beginCall(undefined, 'lookup', undefined, undefined, 1n).admitted);
  const start = run.beginCall(undefined, 'lookup', undefined, undefined, 1n);
  assert.deepEqual([start.admitted, start.callId, start.delayMs], [false, 0, 0n]);
  assert.equal(run.escalation()?.reason, 'account-budget-exhausted');
});

test('the run calls check their arguments, apply the limits and refuse ids over 256 bytes', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const run = instance.loadPolicy({}).startRun('args');
  assert.throws(() => run.beginCall(undefined, 't'.repeat(257), undefined, undefined, 1n), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'too-large');
  assert.throws(() => run.beginCall(undefined, 't', 'k'.repeat(257), undefined, 1n), (e: unknown) => e instanceof RunMisuse && e.error.tag === 'too-large');
  assert.throws(() => run.beginCall(undefined, 't', undefined, { readOnly: 1 as never }, 1n), /begin-call argument 4\.readOnly: 1 is not a boolean/);
  assert.throws(() => run.beginCall(undefined, 't', undefined, undefined, -1n), /begin-call argument 5: -1 is out of range for u64/);
  const start = run.beginCall(undefined, 'lookup', undefined, { readOnly: true }, 1n);
  assert.ok(start.admitted);
  const status = (val: number): Observation => observation({ tag: 'http-status', val });
  assert.throws(() => run.recordFailure(start.callId, 1, status(66039), undefined, 1n, 0n),
    (e: unknown) => e instanceof ValueConversionError && /record-failure observation\.kind\(http-status\): 66039 is out of range for u16/.test(e.message));
  assert.throws(() => run.recordFailure(start.callId, 1, { ...status(503), headers: 5 as never }, undefined, 1n), /\.headers: 5 is not a string/);
  assert.throws(() => run.recordFailure(start.callId, 1, { ...status(503), delivery: 'later' as never }, undefined, 1n), /\.delivery: "later" is not a case of delivery/);
  assert.throws(() => run.recordFailure(-1, 1, status(503), undefined, 1n), /record-failure argument 1: -1 is out of range for u32/);
  assert.throws(() => run.recordFailure(start.callId, 1, status(503), -5n, 1n), /record-failure argument 4: -5 is out of range for u64/);
  assert.throws(() => run.recordFailure(start.callId, 1, status(503), undefined, 1n, 2n ** 64n), /record-failure argument 6: .* out of range for u64/);
  assert.throws(() => run.recordSuccess(start.callId, 2 ** 32, 1n), /record-success argument 2: 4294967296 is out of range for u32/);
  assert.throws(() => run.recordStatusCheck(start.callId, 1, 'maybe' as never, undefined, 1n), /record-status-check argument 3/);
  assert.throws(() => run.lastDecision(1.5), /last-decision argument 1: 1.5 is not an integer/);
  // Nothing reached the component; a 40 MB body and 5,000 header lines are cut to the limits and decided.
  const lines = Array.from({ length: 5000 }, (_, i) => `x-h${i}: ${'v'.repeat(10_000)}`).join('\n');
  const huge = observation({ tag: 'http-status', val: 503 }, { headers: lines, body: 'x'.repeat(40_000_000) });
  const verdict = run.recordFailure(start.callId, 1, huge, undefined, 1n, 0n);
  assert.deepEqual([verdict.action, verdict.class], ['retry', 'transient']);
  assert.deepEqual([run.report().attempts, run.report().retries], [2, 1]);
  assert.equal(run.recordEmptyResult(start.callId, 2, 'é'.repeat(40_000), 1n).action, 'replan'); // 80,000 bytes, cut
});

test('a rule index outside rule-names is a PolicyBoundaryViolation and the instance is refused afterwards', () => {
  const verdict = { action: 'succeed', class: 'success', attempt: 1, delayMs: 0n, hintMs: undefined, ruleIndex: 9, hasNote: false, reconnect: false };
  const exports = { ruleNames: () => ['success', 'http-status'] } as unknown as ConstructorParameters<typeof PolicyInstance>[0];
  const instance = new PolicyInstance(exports);
  const run = new Run(instance, { recordSuccess: () => verdict } as never, 'fake');
  assert.throws(() => run.recordSuccess(1, 1, 1n), (e: unknown) => e instanceof PolicyBoundaryViolation &&
    /record-success returned a value the contract does not allow: rule-index 9 is outside rule-names \(2 names\)/.test(e.message));
  assert.throws(() => run.recordSuccess(1, 1, 1n), InstanceUnusable);
});

test('a verdict that reconnects without a retry is a PolicyBoundaryViolation', () => {
  const verdict = { action: 'replan', class: 'deterministic', attempt: 1, delayMs: 0n, hintMs: undefined, ruleIndex: 0, hasNote: true, reconnect: true };
  const exports = { ruleNames: () => ['http-status'] } as unknown as ConstructorParameters<typeof PolicyInstance>[0];
  const run = new Run(new PolicyInstance(exports), { recordSuccess: () => verdict } as never, 'fake');
  assert.throws(() => run.recordSuccess(1, 1, 1n), (e: unknown) => e instanceof PolicyBoundaryViolation && /reconnect is set on a replan verdict/.test(e.message));
});

/** An observation with the defaults a test leaves out. */
function observation(kind: Observation['kind'], rest: Partial<Observation> = {}): Observation {
  return { kind, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'unknown', ...rest };
}
