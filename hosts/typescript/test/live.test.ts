// Live policy updates in the Node host, case by case as the Python host's
// tests/test_live.py (and the Rust host's tests/harness/tests/host/live.rs): configuration and .wasm
// updates take effect for new runs without a restart; a bad, hostile, foreign or
// tampered update is refused and the last good policy keeps serving; rollback;
// the watcher; swaps under load.
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { createHash, createPrivateKey, createPublicKey, sign } from 'node:crypto';
import {
  closeSync, constants, copyFileSync, existsSync, mkdtempSync, openSync, readFileSync, renameSync, rmSync, statSync, unlinkSync, utimesSync, writeFileSync, writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, locateComponent, type Policy } from '../src/component.js';
import { SplitMix64 } from '../src/entropy.js';
import {
  ComponentImportRefused, ComponentLoadError, ContractVersionMismatch, Escalated, NothingToRollBackTo, PolicyBoundaryViolation, PolicyMemoryExceeded,
  PolicyOutOfFuel, PolicyTrap, UpdateConfigError, UpdateError, UpdateFleetError, UpdateIntegrityError, UpdateLoadError, UpdateOlderError, UpdateReadError,
  UpdateSelfTestError,
} from '../src/errors.js';
import * as api from '../src/index.js';
import { RetryingToolCaller } from '../src/mcp.js';
import { signPublication } from '../src/manifest.js';
import { GATE_VECTORS, Integrity, LivePolicy, manifestPath, signaturePath, type Loaded, type LiveOptions, type PolicySource, type PolicyUpdateEvent } from '../src/live.js';

const here = fileURLToPath(import.meta.url);
const packageRoot = resolve(here, '../../..');
const fixtures = resolve(packageRoot, '../../target/hostile');
/** One transpilation cache for this file (fresh: the first .wasm update transpiles). */
const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-live-cache-'));

const READS = '{"default-effect": "read", "max-attempts-per-call": 4}';
const reads = (attempts: number) => `{"default-effect": "read", "max-attempts-per-call": ${attempts}}`;

/** A folder with the component and a configuration, as an operator deploys them. */
function deployed(config = READS, integrity = Integrity.unchecked()): PolicySource & { dir: string } {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-live-'));
  copyFileSync(wasm, join(dir, 'policy.wasm'));
  writeFileSync(join(dir, 'policy.json'), config);
  return { dir, wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity };
}

/** Options that keep the log events (and use this file's cache). */
function recorded(): LiveOptions & { events: PolicyUpdateEvent[] } {
  const events: PolicyUpdateEvent[] = [];
  return { events, cacheDir, log: (event) => events.push(event) };
}

/** The same component with a custom section appended: another digest, the same policy. */
function withCustomSection(wasm: Uint8Array, payload: string): Buffer {
  const name = Buffer.from('agent-retry-test');
  const body = Buffer.concat([Buffer.from([name.length]), name, Buffer.from(payload)]);
  assert.ok(body.length < 128);
  return Buffer.concat([wasm, Buffer.from([0, body.length]), body]);
}

function attempts(policy: Policy, runId: string): number {
  const run = policy.startRun(runId);
  try {
    const start = run.beginCall(undefined, 'lookup_order', undefined, undefined, 1n);
    assert.ok(start.admitted);
    let made = 1;
    const fail = { kind: { tag: 'http-status' as const, val: 503 }, headers: '', body: '', sessionIdSent: false, delivery: 'answer-started' as const };
    while (run.recordFailure(start.callId, made, fail, undefined, 1n, 1n).action === 'retry') made += 1;
    return made;
  } finally {
    run.close();
  }
}

/** Attempts a read makes against a persistent 503 under `loaded`. */
async function attemptsAgainstAPersistent503(loaded: Loaded, seed = 3n): Promise<number> {
  const instance = await loaded.component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(seed) });
  return attempts(instance.loadPolicy(loaded.configJson), 'probe');
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(condition: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

test('a configuration update changes a budget for new runs without a restart', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  const before = live.current(); // a run in flight keeps this
  assert.equal(before.identity.generation, 1);
  assert.match(before.identity.toString(), /^generation 1 \(wasm [0-9a-f]{12}, config [0-9a-f]{12}\)$/);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  writeFileSync(source.config, reads(2));
  const identity = await live.reload();
  assert.equal(identity.generation, 2);
  assert.notEqual(identity.configSha256, before.identity.configSha256);
  assert.equal(identity.wasmSha256, before.identity.wasmSha256);
  assert.equal(identity.configSha256, createHash('sha256').update(reads(2)).digest('hex'));
  assert.equal(live.current().component, before.component, 'the same .wasm is not compiled again');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 2, 'new runs get the new budget');
  assert.ok(before.configJson.includes('"max-attempts-per-call": 4'), 'the run in flight keeps its policy');
  assert.equal(await attemptsAgainstAPersistent503(before), 4);
  const accepted = options.events.find((e) => e.message === 'policy update accepted');
  assert.deepEqual(accepted, {
    event: 'agent_retry.policy_update', level: 'info', message: 'policy update accepted', policy: identity.toString(), generation: 2,
    wasm_sha256: identity.wasmSha256, config_sha256: identity.configSha256,
  });
  assert.equal(live.lastRefusal(), undefined);
  assert.deepEqual(live.metrics, { accepted: 1, refused: 0, rolledBack: 0 });
});

test('a bad configuration is refused and the last good one keeps serving', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  writeFileSync(source.config, '{"max-attempts-per-call": 0}');
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateConfigError && e.kind === 'config' && /max-attempts-per-call/.test(e.message));
  assert.equal(live.current().identity.generation, 1);
  assert.match(live.lastRefusal() ?? '', /max-attempts-per-call/);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4, 'the old policy still decides');
  const refused = options.events.filter((e) => e.message === 'policy update refused');
  assert.equal(refused.length, 1);
  assert.equal(refused[0].level, 'warning');
  assert.equal(refused[0].serving, live.current().identity.toString());
  assert.match(refused[0].serving ?? '', /generation 1/);
  assert.equal(refused[0].kind, 'config');
  assert.match(refused[0].reason ?? '', /max-attempts-per-call/);

  // Not UTF-8, and a file that is gone: refused the same way.
  writeFileSync(source.config, Buffer.from([0xff, 0x7b, 0x7d]));
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateConfigError && /not UTF-8/.test(e.message));
  rmSync(source.config);
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateReadError && e.kind === 'read' && e.path === source.config);
  assert.equal(live.current().identity.generation, 1);
  assert.deepEqual(live.metrics, { accepted: 0, refused: 3, rolledBack: 0 });
});

test('a configuration that breaks an invariant fails the gate vectors (gate.json), naming the case', async () => {
  const source = deployed();
  const live = await LivePolicy.open(source, recorded());
  // It loads, but it would retry a 403.
  writeFileSync(source.config, '{"status-overrides": {"403": "transient"}}');
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateSelfTestError && e.kind === 'self-test' &&
    /the gate vectors \(.*gate\.json\) fail: "a 403 escalates and is never retried"/.test(e.message));
  assert.equal(live.current().identity.generation, 1);
  // The same gate at start.
  await assert.rejects(LivePolicy.open(source, recorded()), UpdateSelfTestError);
});

test('the gate vectors ship with the package: dist/gate.json is tests/vectors/gate.json', () => {
  assert.equal(GATE_VECTORS, resolve(packageRoot, 'dist/gate.json'));
  assert.deepEqual(readFileSync(GATE_VECTORS, 'utf8'), readFileSync(resolve(packageRoot, '../../tests/vectors/gate.json'), 'utf8'));
  const pkg = JSON.parse(readFileSync(resolve(packageRoot, 'package.json'), 'utf8')) as { files: string[] };
  assert.ok(pkg.files.includes('dist/gate.json'), 'in the files npm packs');
});

test('an operator\'s gate vectors (gateVectors) run too: a failing case refuses the update, named; an unreadable file refuses it', async () => {
  const source = deployed();
  const gate = join(source.dir, 'operator-gate.json');
  writeFileSync(gate, shippedVectors('the operator\'s invariants'));
  const live = await LivePolicy.open(source, { ...recorded(), gateVectors: [gate] });
  assert.equal(live.current().identity.generation, 1, 'a configuration of 4 attempts keeps the operator\'s invariants');
  writeFileSync(source.config, reads(2));
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateSelfTestError &&
    e.message.includes(`the gate vectors (${gate}) fail: "${FOUR_ATTEMPTS}"`));
  assert.equal(live.current().identity.generation, 1);
  writeFileSync(source.config, reads(4));
  assert.equal((await live.reload()).generation, 2);
  rmSync(gate);
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateReadError && e.path === gate);
  await assert.rejects(LivePolicy.open(source, { gateVectors: 'one.json' as never }), /gateVectors/);
});

/** Vectors an update ships with (the format of tests/vectors/*.json). The first
 *  case names no `config`: it runs with the update's configuration. */
const FOUR_ATTEMPTS = 'a persistent 503 on a read is retried up to the 4th attempt, then escalates';
const http503 = { failure: { kind: { 'http-status': 503 } } };
const shippedVectors = (description = 'what this update promises') => JSON.stringify({
  description,
  cases: [
    {
      description: FOUR_ATTEMPTS,
      steps: [
        { op: 'begin-call', call: { tool: 'lookup_order' }, expect: { ok: { send: { 'call-id': 1 } } } },
        { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 2 } } } } },
        { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 3 } } } } },
        { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { retry: { attempt: 4 } } } } },
        { op: 'record-outcome', 'call-id': 1, outcome: http503, expect: { ok: { action: { escalate: { reason: 'call-attempts-spent' } } } } },
      ],
    },
    {
      description: 'a 403 escalates at once (its own configuration)',
      config: { 'max-attempts-per-call': 2 },
      steps: [
        { op: 'begin-call', call: { tool: 'lookup_order', hints: { 'read-only': true } } },
        { op: 'record-outcome', 'call-id': 1, outcome: { failure: { kind: { 'http-status': 403 } } }, expect: { ok: { action: { escalate: {} } } } },
      ],
    },
  ],
}, null, 2);

test('an update may ship vectors: they run against the candidate, and one that fails refuses it', async () => {
  const source = { ...deployed(), vectors: '' };
  source.vectors = join(source.dir, 'policy.vectors.json');
  writeFileSync(source.vectors, shippedVectors());
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  assert.equal(live.current().identity.generation, 1, 'shipped with a configuration of 4 attempts: the vectors pass');
  assert.equal((live.source as PolicySource).vectors, source.vectors);

  // The same vectors, shipped with a configuration of 2 attempts: the first case fails at its 3rd step.
  writeFileSync(source.config, reads(2));
  await assert.rejects(live.reload(), (e: unknown) => {
    assert.ok(e instanceof UpdateSelfTestError, String(e));
    assert.equal(e.kind, 'self-test');
    assert.match(e.message, /vectors/);
    assert.ok(e.message.includes(source.vectors), e.message);
    assert.ok(e.message.includes(`"${FOUR_ATTEMPTS}" step 3 (record-outcome): $.ok.action.retry: missing`), e.message);
    return true;
  });
  assert.equal(live.current().identity.generation, 1, 'the last good policy keeps serving');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  assert.match(live.lastRefusal() ?? '', /the update's vectors \(.*\) fail: "/);
  const refused = options.events.filter((e) => e.message === 'policy update refused');
  assert.equal(refused.length, 1);
  assert.equal(refused[0].kind, 'self-test');
  assert.ok(refused[0].reason?.includes(FOUR_ATTEMPTS));
  // The same gate at open.
  await assert.rejects(LivePolicy.open(source, recorded()), (e: unknown) => e instanceof UpdateSelfTestError && e.message.includes(FOUR_ATTEMPTS));

  // Back to 4 attempts: accepted. Then a change of the vectors alone is a change for poll().
  writeFileSync(source.config, reads(4));
  assert.equal((await live.reload()).generation, 2);
  assert.equal(await live.poll(), undefined, 'nothing changed');
  await sleep(20);
  writeFileSync(source.vectors, shippedVectors('the same promise, reworded'));
  assert.equal((await live.poll())?.generation, 3, 'the vectors changed');
  assert.deepEqual(live.metrics, { accepted: 2, refused: 1, rolledBack: 0 });
});

test('malformed shipped vectors, or a vectors file that cannot be read, refuse the update', async () => {
  const source = { ...deployed(), vectors: '' };
  source.vectors = join(source.dir, 'policy.vectors.json');
  writeFileSync(source.vectors, shippedVectors());
  const live = await LivePolicy.open(source, recorded());
  const malformed: Array<[string | Buffer, RegExp]> = [
    ['not json', /not JSON/],
    [Buffer.from([0xff, 0x7b, 0x7d]), /not UTF-8/],
    ['[]', /an object/],
    ['{"description": "x"}', /"cases"/],
    ['{"description": "x", "cases": [{"description": "no steps"}]}', /"steps"/],
    ['{"description": "x", "cases": [{"steps": []}]}', /"description"/],
    ['{"description": "x", "cases": [{"description": "y", "steps": [], "expect": 1}]}', /unknown field "expect"/],
    ['{"description": "x", "cases": [], "extra": true}', /unknown field "extra"/],
    ['{"description": "x", "cases": [{"description": "bad op", "steps": [{"op": "launch"}]}]}', /"bad op" step 1: unknown op "launch"/],
  ];
  for (const [text, why] of malformed) {
    writeFileSync(source.vectors, text);
    await assert.rejects(live.reload(), (e: unknown) => {
      assert.ok(e instanceof UpdateSelfTestError, `${text}: ${String(e)}`);
      assert.match(e.message, /vectors/);
      assert.match(e.message, why, `${text}: ${e.message}`);
      return true;
    });
  }
  // The vectors run after the self-test: a configuration it refuses is reported as such, malformed vectors or not.
  writeFileSync(source.vectors, 'not json');
  writeFileSync(source.config, '{"max-attempts-per-call": 0}');
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateConfigError && /max-attempts-per-call/.test(e.message));
  writeFileSync(source.config, READS);
  rmSync(source.vectors);
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateReadError && e.kind === 'read' && e.path === source.vectors);
  assert.equal(live.current().identity.generation, 1);
  // Without vectors configured, the same update passes as before.
  const plain = await LivePolicy.open({ wasm: source.wasm, config: source.config, integrity: source.integrity }, recorded());
  assert.equal(plain.current().identity.generation, 1);
  assert.equal((plain.source as PolicySource).vectors, undefined);
});

test('a broken or foreign component is refused and rollback returns to the previous policy', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  await assert.rejects(live.rollback(), (e: unknown) => e instanceof NothingToRollBackTo && e.kind === 'nothing-to-roll-back-to');
  const good = readFileSync(source.wasm);

  writeFileSync(source.wasm, '\0asm not really');
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateLoadError && e.kind === 'load' && e.error instanceof ComponentLoadError);

  // The same component, speaking another major contract version.
  const ours = Buffer.from('agent-retry:policy/policy@0.9.0');
  const theirs = Buffer.from('agent-retry:policy/policy@1.0.0');
  assert.ok(good.indexOf(ours) >= 0);
  const foreign = Buffer.from(good);
  for (let at = foreign.indexOf(ours); at >= 0; at = foreign.indexOf(ours, at + 1)) theirs.copy(foreign, at);
  writeFileSync(source.wasm, foreign);
  await assert.rejects(live.reload(), (e: unknown) => {
    assert.ok(e instanceof UpdateLoadError, String(e));
    assert.ok(e.error instanceof ContractVersionMismatch, String(e.error));
    assert.equal(e.error.componentVersion, '1.0.0');
    assert.equal(e.error.hostVersion, '0.9.0');
    assert.match(e.message, /agent-retry:policy@1\.0\.0/);
    assert.match(e.message, /@0\.9\.0/);
    return true;
  });
  assert.equal(live.current().identity.generation, 1, 'nothing was swapped in');

  writeFileSync(source.wasm, good);
  writeFileSync(source.config, reads(3));
  assert.equal((await live.reload()).generation, 2);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 3);
  const back = await live.rollback();
  assert.equal(back.generation, 1);
  assert.equal(live.current().identity, back);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  assert.equal((await live.rollback()).generation, 2, 'a second rollback returns to the one rolled back from');
  assert.deepEqual(live.metrics, { accepted: 1, refused: 2, rolledBack: 2 });
  const rolled = options.events.filter((e) => e.message === 'policy rolled back').map((e) => e.generation);
  assert.deepEqual(rolled, [1, 2]);
  // Generations only grow: the next update is 3, not another 2.
  await live.rollback();
  writeFileSync(source.config, reads(2));
  assert.equal((await live.reload()).generation, 3);
});

test('a new component is transpiled, gated and swapped in; the old one still serves its runs', async () => {
  const source = deployed();
  const live = await LivePolicy.open(source, recorded());
  const before = live.current();
  writeFileSync(source.wasm, withCustomSection(readFileSync(source.wasm), `v2-${process.pid}-${Date.now()}`));
  const identity = await live.reload();
  assert.equal(identity.generation, 2);
  assert.notEqual(identity.wasmSha256, before.identity.wasmSha256);
  assert.equal(identity.wasmSha256, createHash('sha256').update(readFileSync(source.wasm)).digest('hex'));
  assert.equal(identity.configSha256, before.identity.configSha256);
  assert.notEqual(live.current().component, before.component);
  assert.equal(live.current().component.origin, 'transpiled', 'loaded at run time, no rebuild');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  assert.equal(await attemptsAgainstAPersistent503(before), 4, 'the old component still serves its runs');
});

const HOSTILE: Array<[string, (e: UpdateError) => boolean]> = [
  ['endless-loop', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyOutOfFuel && /classify/.test(e.message)],
  ['memory-bomb', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyMemoryExceeded && /cap of 67108864 bytes/.test(e.message)],
  ['trap', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyTrap && /classify trapped/.test(e.message)],
  ['enum-out-of-range', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyBoundaryViolation && /classify/.test(e.message)],
  ['invalid-utf8', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyBoundaryViolation && /derive-idempotency-key/.test(e.message)],
  ['pointer-out-of-bounds', (e) => e instanceof UpdateSelfTestError && e.cause instanceof PolicyBoundaryViolation && /derive-idempotency-key/.test(e.message)],
  ['extra-import', (e) => e instanceof UpdateLoadError && e.error instanceof ComponentImportRefused && e.error.importName === 'wasi:filesystem/preopens@0.2.6'],
  ['extra-import-sockets', (e) => e instanceof UpdateLoadError && e.error instanceof ComponentImportRefused && /wasi:sockets/.test(e.message)],
  ['wrong-world', (e) => e instanceof UpdateLoadError && /exports no agent-retry:policy\/policy/.test(e.message) && /acme:scheduler/.test(e.message)],
  ['other-major', (e) => e instanceof UpdateLoadError && e.error instanceof ContractVersionMismatch && /agent-retry:policy@0\.(8|10)\.0/.test(e.message)],
];

test('every hostile component offered as an update is refused by the gate (or contained by the sandbox while a gate case runs); the last good policy serves', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  const good = live.current();
  let refused = 0;
  for (const [name, expected] of HOSTILE) {
    const path = join(fixtures, `${name}.wasm`);
    assert.ok(existsSync(path), `${path} is missing: node tests/hostile/build.mjs (npm test runs it)`);
    writeFileSync(source.wasm, readFileSync(path));
    const start = performance.now();
    const error = await live.reload().then(() => assert.fail(`${name} was accepted`), (e: unknown) => e);
    assert.ok(error instanceof UpdateError, `${name}: ${String(error)}`);
    assert.ok(expected(error), `${name}: ${error.name}: ${error.message} (cause ${String((error as Error).cause)})`);
    console.log(`${name}: refused in ${(performance.now() - start).toFixed(0)} ms (${error.kind}): ${error.message.slice(0, 120)}`);
    refused += 1;
    assert.equal(live.lastRefusal(), error.message);
    assert.equal(live.current(), good, `${name}: the last good policy keeps serving`);
    assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
    assert.equal(live.metrics.refused, refused);
    assert.equal(options.events.at(-1)?.kind, error.kind);
  }
  assert.equal(live.metrics.accepted, 0);
});

test('a pinned digest refuses a tampered component', async () => {
  let source = deployed();
  const data = readFileSync(source.wasm);
  const digest = createHash('sha256').update(data).digest('hex');
  source = { ...source, integrity: Integrity.pinnedSha256(digest.toUpperCase()) };
  const live = await LivePolicy.open(source, recorded());
  assert.equal(live.current().identity.wasmSha256, digest);
  // One byte changed: the digest no longer matches.
  const tampered = Buffer.from(data);
  tampered[tampered.length - 1] ^= 1;
  writeFileSync(source.wasm, tampered);
  await assert.rejects(live.reload(), (e: unknown) => e instanceof UpdateIntegrityError && e.kind === 'integrity' && e.message.includes(digest));
  assert.equal(live.current().identity.generation, 1);
  assert.throws(() => Integrity.pinnedSha256('not a digest'), RangeError);
});

// Issue 24, row 2, for files: under a key the signed manifest (`<wasm>.manifest`)
// covers the .wasm, the configuration and the vectors; before, a signature
// covered the .wasm alone, so a configuration edited after signing was taken.
test('with a key configured only a signed publication is accepted', async () => {
  const seed = new Uint8Array(32).fill(7);
  const publicKey = createPrivateKey({ key: Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), seed]), format: 'der', type: 'pkcs8' });
  const raw = new Uint8Array(Buffer.from(createPublicKey(publicKey).export({ format: 'jwk' }).x as string, 'base64url'));
  const source = deployed(READS, Integrity.ed25519(raw));
  const manifest = manifestPath(source.wasm);
  assert.equal(manifest, `${source.wasm}.manifest`);
  const data = readFileSync(source.wasm);
  const refusedWith = (pattern: RegExp) => (e: unknown) => e instanceof UpdateIntegrityError && e.kind === 'integrity' && pattern.test(e.message);

  // Unsigned: refused at start; a signature over the .wasm alone (before 0.7) is named and refused.
  await assert.rejects(LivePolicy.open(source, recorded()), refusedWith(/unsigned: no signed manifest at .*policy\.wasm\.manifest/));
  writeFileSync(signaturePath(source.wasm), sign(null, data, publicKey));
  await assert.rejects(LivePolicy.open(source, recorded()), refusedWith(/\(before 0\.7\) is not accepted: sign the whole publication/));

  // Signed for files: accepted.
  writeFileSync(manifest, signPublication(seed, data, READS));
  const live = await LivePolicy.open(source, recorded());
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);

  // The configuration edited after signing (4 attempts became 8): refused, the signed one keeps serving.
  const eight = '{"default-effect": "read", "max-attempts-per-call": 8}';
  writeFileSync(source.config, eight);
  await assert.rejects(live.reload(), refusedWith(/config-sha256 .* changed after signing/));
  assert.equal(live.current().identity.generation, 1);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);

  // Signed by another key: refused.
  writeFileSync(manifest, signPublication(new Uint8Array(32).fill(9), data, eight));
  await assert.rejects(live.reload(), refusedWith(/does not verify under the configured key/));

  // Malformed: refused by name.
  writeFileSync(manifest, 'agent-retry publication 1\n');
  await assert.rejects(live.reload(), refusedWith(/is malformed: it has 1 lines, not 6/));

  // Tampered after signing: refused.
  writeFileSync(manifest, signPublication(seed, data, eight));
  writeFileSync(source.wasm, withCustomSection(data, 'tampered'));
  await assert.rejects(live.reload(), refusedWith(/wasm-sha256 .* changed after signing/));
  writeFileSync(source.wasm, data);

  // Vectors configured but not signed: refused as added after signing.
  const vectors = join(source.dir, 'vectors.json');
  writeFileSync(vectors, '{"description": "shipped", "cases": []}');
  await assert.rejects(LivePolicy.open({ ...source, vectors }, recorded()), refusedWith(/added after signing/));

  // Re-signed: accepted (the edited budget serves now).
  assert.equal((await live.reload()).generation, 2);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 8);
  assert.throws(() => Integrity.ed25519(new Uint8Array(5)), RangeError);
});

test('the watcher picks up a changed configuration and a changed .wasm, keeps going after a refusal, and stops on close', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  assert.equal(await live.poll(), undefined, 'nothing changed');
  const watcher = live.watch(100);
  await sleep(50);
  writeFileSync(source.config, reads(2));
  await until(() => live.current().identity.generation === 2, 'the configuration update');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 2);

  // A .wasm published the safe way (written beside, renamed over).
  const next = `${source.wasm}.new`;
  writeFileSync(next, withCustomSection(readFileSync(source.wasm), `watched-${process.pid}-${Date.now()}`));
  const expected = createHash('sha256').update(readFileSync(next)).digest('hex');
  renameSync(next, source.wasm);
  await until(() => live.current().identity.generation === 3, 'the .wasm update');
  assert.equal(live.current().identity.wasmSha256, expected);

  // A refused change is kept for operators; the watcher goes on.
  writeFileSync(source.config, '{"max-attempts-per-call": 0}');
  await until(() => live.lastRefusal() !== undefined, 'the refusal');
  assert.equal(live.current().identity.generation, 3);
  writeFileSync(source.config, reads(3));
  await until(() => live.current().identity.generation === 4, 'the next good update');
  assert.equal(live.lastRefusal(), undefined);

  watcher.close();
  writeFileSync(source.config, reads(4));
  await sleep(400);
  assert.equal(live.current().identity.generation, 4, 'close() stops the watcher');
  // The polling alone (no fs.watch event needed): poll() sees the change.
  assert.equal((await live.poll())?.generation, 5);
  assert.deepEqual(live.metrics, { accepted: 4, refused: 1, rolledBack: 0 });
});

/** Writes `content` to `path` the safe way (beside, then renamed over), with its modification time `mtime` if given. */
function publishFile(path: string, content: string | Uint8Array, mtime?: Date): void {
  const next = `${path}.new`;
  writeFileSync(next, content);
  if (mtime !== undefined) utimesSync(next, mtime, mtime);
  renameSync(next, path);
}

test('files older than the serving policy\'s (their modification time set back) are refused as older; the same files reloaded are not', async () => {
  const source = deployed();
  const options = recorded();
  const live = await LivePolicy.open(source, options);
  assert.equal((await live.reload()).generation, 2, 'the same files again: equal is not older');
  const serving = live.current();
  // A configuration whose files are an hour older than the serving ones (an old release copied with its times: cp -p, rsync -t, tar x).
  const hourAgo = new Date((Math.floor(Date.now() / 1000) - 3600) * 1000); // whole seconds: utimes takes them as a float
  publishFile(source.config, reads(2), hourAgo);
  utimesSync(source.wasm, hourAgo, hourAgo);
  const isOlder = (e: unknown) => {
    assert.ok(e instanceof UpdateOlderError, String(e));
    assert.equal(e.kind, 'older');
    assert.match(e.message, /^older than the serving policy: the files' newest modification time \d{4}-\d\d-\d\dT[\d:.]+Z, while the serving policy's is the files' newest modification time/);
    assert.ok(e.message.includes(`time ${hourAgo.toISOString().slice(0, -1)}000000Z, while`), e.message);
    return true;
  };
  await assert.rejects(live.reload(), isOlder);
  assert.equal(live.current(), serving, 'the serving policy is unchanged');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  assert.equal(await live.poll(), undefined, 'a refused change is tried once');
  assert.match(live.lastRefusal() ?? '', /^older than the serving policy/);
  const refused = options.events.filter((e) => e.message === 'policy update refused');
  assert.equal(refused.length, 1);
  assert.equal(refused[0].kind, 'older');
  // The same content written now is newer: taken.
  publishFile(source.config, reads(2));
  assert.equal((await live.poll())?.generation, 3);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 2);
  // A rollback is not an update: never refused as older, though what it returns to was read earlier.
  assert.equal((await live.rollback()).generation, 2);
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 4);
  assert.deepEqual(live.metrics, { accepted: 2, refused: 1, rolledBack: 1 });
});

test('one update at a time: two reloads started at once while the files change between their reads end with the newest files serving', async () => {
  const source = deployed();
  const live = await LivePolicy.open(source, recorded());
  const good = readFileSync(source.wasm);
  // The first files: another .wasm (a long gate: transpiled and compiled) and 3 attempts, the
  // configuration a FIFO, so that the test knows when the first reload has read it.
  const v2 = withCustomSection(good, `race-${process.pid}-${Date.now()}`);
  publishFile(source.wasm, v2);
  unlinkSync(source.config);
  const made = spawnSync('mkfifo', [source.config]);
  assert.equal(made.status, 0, `mkfifo: ${made.stderr}`);
  assert.ok(statSync(source.config).isFIFO());
  const first = live.reload();
  const second = live.reload();
  // Hands 3 attempts to the reader of the FIFO (the first reload: it reads the .wasm, then the configuration).
  const deadline = Date.now() + 10_000;
  let fd: number | undefined;
  while (fd === undefined) {
    try {
      fd = openSync(source.config, constants.O_WRONLY | constants.O_NONBLOCK);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENXIO' || Date.now() > deadline) throw e;
      await sleep(2);
    }
  }
  writeSync(fd, reads(3));
  closeSync(fd);
  // The files change between the two reads: the original .wasm and 2 attempts, renamed over.
  publishFile(source.wasm, good);
  publishFile(source.config, reads(2));
  const [a, b] = await Promise.all([first, second]);
  const sha = (bytes: string | Uint8Array) => createHash('sha256').update(bytes).digest('hex');
  assert.deepEqual([a.generation, a.wasmSha256, a.configSha256], [2, sha(v2), sha(reads(3))], 'the first read the first files');
  assert.deepEqual([b.generation, b.wasmSha256, b.configSha256], [3, sha(good), sha(reads(2))], 'the second read the newest');
  assert.equal(live.current().identity, b, 'the newest files serve');
  assert.equal(await attemptsAgainstAPersistent503(live.current()), 2);
  assert.equal(await live.poll(), undefined, 'and poll() has nothing new');
  assert.deepEqual(live.metrics, { accepted: 2, refused: 0, rolledBack: 0 });
});

test('a watch interval past 2^31 - 1 ms does not overflow node\'s timer (it would poll every ms)', async () => {
  const live = await LivePolicy.open(deployed(), recorded());
  const warnings: string[] = [];
  const onWarning = (warning: Error) => warnings.push(warning.name);
  process.on('warning', onWarning);
  try {
    const watcher = live.watch(2 ** 40);
    await sleep(50);
    watcher.close();
  } finally {
    process.off('warning', onWarning);
  }
  assert.deepEqual(warnings.filter((name) => name === 'TimeoutOverflowWarning'), []);
});

test('a watcher does not keep the process alive', async () => {
  const source = deployed();
  const script = `import { LivePolicy, Integrity } from ${JSON.stringify(pathToFileURL(join(packageRoot, 'dist/src/index.js')).href)};
    const live = await LivePolicy.open({ wasm: ${JSON.stringify(source.wasm)}, config: ${JSON.stringify(source.config)}, integrity: Integrity.unchecked() });
    live.watch(50);
    console.log('watching', String(live.current().identity));`;
  const start = performance.now();
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { timeout: 20_000 });
  assert.match(stdout, /^watching generation 1/);
  assert.ok(performance.now() - start < 15_000);
});

test('decisions never fail while the policy is swapped back and forth under load, and each is attributed to one policy from the log', async () => {
  // JavaScript runs on one thread: "under load" is four workers that run agent
  // runs through the MCP wrapper without pause, yielding between runs, while the
  // main loop swaps the configuration (and the .wasm, between two builds) twenty
  // times. Every decision is one of the wrapper's log lines, naming the policy
  // that made it; the check reads those lines only.
  const source = deployed();
  const live = await LivePolicy.open(source, recorded());
  const builds = [readFileSync(source.wasm), withCustomSection(readFileSync(source.wasm), `load-${process.pid}-${Date.now()}`)];
  const digests = builds.map((b) => createHash('sha256').update(b).digest('hex'));
  const tools = [{ name: 'lookup', inputSchema: { type: 'object' as const }, annotations: { readOnlyHint: true } }];
  const client = {
    listTools: async () => ({ tools }),
    callTool: async () => ({ isError: true, content: [{ type: 'text', text: 'upstream returned 503, try again' }] }),
  } as unknown as Client;
  const lines: string[] = [];
  let stop = false;
  const runs: string[] = [];
  const failures: unknown[] = [];
  const worker = async (w: number) => {
    try {
      let n = 0;
      while (!stop) {
        const loaded = live.current(); // a run keeps the policy it started with
        const instance = await loaded.component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(BigInt(w)) });
        const policy = instance.loadPolicy(loaded.configJson);
        for (let i = 0; i < 20 && !stop; i++) {
          const runId = `w${w}-${n++}`;
          const run = policy.startRun(runId);
          const caller = new RetryingToolCaller(client, run, {
            tools, sleep: async () => {}, log: (line) => lines.push(line), policyIdentity: loaded.identity.toString(),
          });
          await assert.rejects(caller.callTool('lookup', {}), (e: unknown) => e instanceof Escalated);
          run.close();
          runs.push(runId);
          await new Promise((r) => setImmediate(r));
        }
        policy.close();
      }
    } catch (e) {
      failures.push(e);
    }
  };
  const first = live.current().identity;
  // generation -> the identity as logged, its build's digest, the attempts its configuration allows
  const swappedIn = new Map<number, { identity: string; wasm: string; attempts: number }>([[first.generation, { identity: first.toString(), wasm: digests[0], attempts: 4 }]]);
  const workers = [0, 1, 2, 3].map(worker);
  try {
    for (let swap = 0; swap < 20; swap++) {
      const attemptsAllowed = swap % 2 === 0 ? 2 : 4;
      writeFileSync(source.config, reads(attemptsAllowed));
      writeFileSync(source.wasm, builds[(swap + 1) % 2]);
      const identity = await live.reload();
      swappedIn.set(identity.generation, { identity: identity.toString(), wasm: identity.wasmSha256, attempts: attemptsAllowed });
      await sleep(15);
    }
  } finally {
    stop = true;
    await Promise.all(workers);
  }
  assert.deepEqual(failures, []);
  assert.ok(runs.length >= 80, `${runs.length} runs`);
  // From the log alone.
  const byRun = new Map<string, Array<Record<string, unknown>>>();
  for (const text of lines) {
    const line = JSON.parse(text) as Record<string, unknown>;
    if (line.event !== 'agent_retry.attempt') continue;
    const list = byRun.get(line.run as string) ?? [];
    list.push(line);
    byRun.set(line.run as string, list);
  }
  const generations = new Set<number>();
  const seenBuilds = new Set<string>();
  for (const run of runs) {
    const logged = byRun.get(run) ?? [];
    const policies = new Set(logged.map((l) => l.policy as string));
    assert.equal(policies.size, 1, `${run}'s lines name exactly one policy: ${[...policies]}`);
    const [policy] = policies;
    const generation = Number(/^generation (\d+) /.exec(policy)?.[1]);
    const expected = swappedIn.get(generation);
    assert.ok(expected, `${run}: generation ${generation} was swapped in`);
    assert.equal(policy, expected.identity, `${run}: the identity reload() swapped in for generation ${generation}`);
    assert.ok(policy.includes(`wasm ${expected.wasm.slice(0, 12)}`), `${run}: ${policy} names its build's digest`);
    assert.equal(expected.wasm, digests[generation === 1 ? 0 : (generation - 1) % 2], `generation ${generation} is the build written for it`);
    const actions = logged.map((l) => l.action);
    assert.deepEqual(actions, [...Array(expected.attempts - 1).fill('retry'), 'escalate'], `${run} (generation ${generation}) decided with its own policy`);
    assert.equal(logged.at(-1)?.escalation, 'call-attempts-spent');
    generations.add(generation);
    seenBuilds.add(expected.wasm);
  }
  console.log(`${runs.length} runs attributed from the log across ${generations.size} generations and ${seenBuilds.size} builds during 20 swaps`);
  assert.ok(generations.size > 2, `the swaps were seen by the workers: ${[...generations].sort((a, b) => a - b)}`);
  assert.equal(seenBuilds.size, 2, 'both builds decided');
});

test('every refusal is an UpdateError with its kind, exported from the package', () => {
  const kinds = [
    new UpdateReadError('/x', 'gone'), new UpdateIntegrityError('x'), new UpdateLoadError(new ComponentLoadError('x')),
    new UpdateConfigError('x'), new UpdateSelfTestError('x'), new UpdateFleetError('x'), new UpdateOlderError('x'), new NothingToRollBackTo(),
  ].map((e) => {
    assert.ok(e instanceof UpdateError);
    return e.kind;
  });
  assert.deepEqual(kinds, ['read', 'integrity', 'load', 'config', 'self-test', 'fleet', 'older', 'nothing-to-roll-back-to']);
  for (const name of ['LivePolicy', 'Integrity', 'PolicyIdentity', 'UpdateError', 'UpdateReadError', 'UpdateIntegrityError', 'UpdateLoadError',
    'UpdateConfigError', 'UpdateSelfTestError', 'UpdateFleetError', 'UpdateOlderError', 'NothingToRollBackTo', 'publishPolicy', 'Fleet', 'FleetError',
    'parseRevision', 'MAX_REVISION', 'DEFAULT_PREFIX',
    'REDIS_TIMEOUT_MS', 'MAX_CLOCK_SKEW_MS', 'EmbeddedAccounts']) {
    assert.ok(name in api, `${name} is exported`);
  }
});
