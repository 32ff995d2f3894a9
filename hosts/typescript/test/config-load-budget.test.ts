// The configuration's load (`policy.from-json`) runs on its own fuel tank,
// `fuelPerCall + fuelPerConfigByte * <the text's UTF-8 bytes>`, as in the Rust
// and Python hosts: its cost is linear in the text and it runs off the decision
// path (once per update), so a call's 20 M must not cut off a large valid
// configuration. Every other call keeps a call's tank. The fuel here is this
// host's own count (src/sandbox.ts), an upper bound of wasmtime's.
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { PolicyComponent, locateComponent, type PolicyInstance } from '../src/component.js';
import { ConfigError, InstanceUnusable, PolicyOutOfFuel } from '../src/errors.js';
import { MAX_CONFIG_BYTES, utf8Length } from '../src/limits.js';
import { Integrity, LivePolicy } from '../src/live.js';
import { FUEL_PER_CALL, FUEL_PER_CONFIG_BYTE } from '../src/sandbox.js';
import type { Observation } from '../src/index.js';

const TOOLS = 10_000;
const toolName = (i: number) => `mcp__github__create_pull_request_review_${String(i).padStart(5, '0')}`;
/** `{"tools": {"mcp__github__create_pull_request_review_00000": {"effect": "write"}, ...}}`, 10,000 of them. */
const TEN_THOUSAND_TOOLS = `{"tools": {${Array.from({ length: TOOLS }, (_, i) => `"${toolName(i)}": {"effect": "write"}`).join(', ')}}}`;
const FAILURE: Observation = { kind: { tag: 'http-status', val: 503 }, headers: 'Retry-After: 2', body: '', sessionIdSent: false, delivery: 'answer-started' };

const tankFor = (bytes: number, perByte = FUEL_PER_CONFIG_BYTE) => FUEL_PER_CALL + perByte * bytes;
const instance = async (options?: Parameters<PolicyComponent['instantiate']>[0]): Promise<PolicyInstance> =>
  (await PolicyComponent.load()).instantiate(options);

test('10,000 namespaced tools load within the default budget, and a call finds the last one cheaply', async () => {
  const bytes = utf8Length(TEN_THOUSAND_TOOLS);
  const tank = tankFor(bytes);
  const policyInstance = await instance();
  const started = performance.now();
  const policy = policyInstance.loadPolicy(TEN_THOUSAND_TOOLS);
  const ms = performance.now() - started;
  const loadFuel = policyInstance.fuelUsedByLastCall();
  console.log(`${TOOLS} tools (${bytes} bytes): from-json ${loadFuel} fuel (${(loadFuel / bytes).toFixed(1)} a byte, ` +
    `${(100 * loadFuel / tank).toFixed(0)}% of its tank of ${tank}; over ${(loadFuel / FUEL_PER_CALL).toFixed(1)}x a call's), ${ms.toFixed(1)} ms`);
  assert.ok(loadFuel > FUEL_PER_CALL, 'a call\'s tank alone would not hold it: the test is about the configuration\'s budget');
  assert.ok(loadFuel < tank, `${loadFuel} of ${tank}`);

  // Every other call is back on a call's tank; the tool is found by its hash.
  const run = policy.startRun('many-tools');
  const admission = run.beginCall(undefined, toolName(TOOLS - 1), undefined, undefined, 1n);
  const beginFuel = policyInstance.fuelUsedByLastCall();
  console.log(`begin-call of the last of ${TOOLS} tools: ${beginFuel} fuel (this host's count; wasmtime's is under 20,000)`);
  assert.ok(admission.admitted);
  assert.ok(!admission.safeToRepeat, 'the tool\'s entry (a write) applies: not safe to repeat');
  assert.ok(beginFuel < 20_000 * 2.5, `${beginFuel}`);

  // effective-config serialises the whole configuration: linear in it, on the load's tank.
  const effective = JSON.parse(policy.effectiveConfig()) as { tools: Record<string, { effect: string; idempotent: boolean }> };
  const effectiveFuel = policyInstance.fuelUsedByLastCall();
  console.log(`effective-config of ${TOOLS} tools: ${effectiveFuel} fuel (${(100 * effectiveFuel / tank).toFixed(0)}% of the load's tank of ${tank}; ` +
    `over ${(effectiveFuel / FUEL_PER_CALL).toFixed(1)}x a call's)`);
  assert.ok(effectiveFuel < tank, `${effectiveFuel} of ${tank}`);
  assert.equal(Object.keys(effective.tools).length, TOOLS);
  assert.deepEqual(effective.tools[toolName(TOOLS - 1)], { effect: 'write', idempotent: false });
  assert.deepEqual(effective.tools[toolName(0)], { effect: 'write', idempotent: false });
  policy.close();
});

test('effective-config that outgrows the load\'s tank runs out of fuel, naming that tank', async () => {
  const bytes = utf8Length(TEN_THOUSAND_TOOLS);
  const measured = await instance({ fuelPerCall: null });
  const loaded = measured.loadPolicy(TEN_THOUSAND_TOOLS);
  const loadFuel = measured.fuelUsedByLastCall();
  loaded.effectiveConfig();
  const effectiveFuel = measured.fuelUsedByLastCall();
  // A tank between the two (serialising costs more than parsing here): the load fits, the serialisation does not.
  // The gap can be under one unit a byte times the bytes (bulk copies are charged a unit a byte), so the
  // call's part of the tank takes the remainder; the configuration's part is still nearly all of it.
  assert.ok(effectiveFuel > loadFuel + 2, `${loadFuel} ${effectiveFuel}`);
  const middle = Math.floor((loadFuel + effectiveFuel) / 2);
  const perByte = Math.floor(loadFuel / bytes);
  const fuelPerCall = middle - perByte * bytes;
  const tank = fuelPerCall + perByte * bytes;
  assert.ok(loadFuel < tank && tank < effectiveFuel && fuelPerCall < loadFuel / 100, `${loadFuel} < ${tank} < ${effectiveFuel}`);
  const tight = await instance({ fuelPerCall, fuelPerConfigByte: perByte });
  const policy = tight.loadPolicy(TEN_THOUSAND_TOOLS);
  assert.throws(() => policy.effectiveConfig(), (e: unknown) => e instanceof PolicyOutOfFuel && e.call === 'effective-config' &&
    e.message === `effective-config ran out of fuel (${tank} units: ${fuelPerCall} a call + ${perByte} a configuration byte x ${bytes} bytes) and was stopped`);
});

test('a live configuration of 10,000 tools is accepted (the gate calls effective-config)', async () => {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-many-tools-'));
  copyFileSync(wasm, join(dir, 'policy.wasm'));
  writeFileSync(join(dir, 'policy.json'), TEN_THOUSAND_TOOLS);
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-many-tools-cache-'));
  const live = await LivePolicy.open({ wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity: Integrity.unchecked() }, { cacheDir });
  const current = live.current();
  assert.equal(current.identity.generation, 1);
  assert.equal(current.configJson, TEN_THOUSAND_TOOLS);
});

/** `open` + items + `close`, items joined by commas, as many as fit in `limit` bytes (ASCII). */
function fill(open: string, item: (i: number) => string, close: string, limit = MAX_CONFIG_BYTES): string {
  const items: string[] = [];
  let length = open.length + close.length;
  for (let i = 0; ; i++) {
    const next = item(i);
    const added = next.length + (i > 0 ? 1 : 0);
    if (length + added > limit) break;
    items.push(next);
    length += added;
  }
  return open + items.join(',') + close;
}

// The costliest texts per byte measured, each just under the 1 MiB limit: none
// has a known field, so each is refused with a configuration error, never cut
// off for want of fuel.
const SHAPES: Array<[string, () => string]> = [
  ['members {"k0":0,"k1":1,...}', () => fill('{', (i) => `"k${i}":${i}`, '}')],
  ['zeros {"x":[0,0,...]}', () => fill('{"x":[', () => '0', ']}')],
  ['empty strings {"x":["","",...]}', () => fill('{"x":[', () => '""', ']}')],
  ['empty objects {"x":[{},{},...]}', () => fill('{"x":[', () => '{}', ']}')],
];

for (const [name, make] of SHAPES) {
  test(`the costliest shapes under the 1 MiB limit answer a configuration error, never PolicyOutOfFuel: ${name}`, async () => {
    const text = make();
    const bytes = utf8Length(text);
    assert.ok(bytes <= MAX_CONFIG_BYTES && bytes > MAX_CONFIG_BYTES - 16, `${bytes}`);
    // Measured first, unmetered: what the load costs in this host's count.
    const unmetered = await instance({ fuelPerCall: null });
    const unmeteredStart = performance.now();
    assert.throws(() => unmetered.loadPolicy(text), ConfigError);
    const unmeteredMs = performance.now() - unmeteredStart;
    const fuel = unmetered.fuelUsedByLastCall();
    // Then on the default budget; the event loop is blocked meanwhile.
    const metered = await instance();
    const started = performance.now();
    let error: unknown;
    try {
      metered.loadPolicy(text);
    } catch (e) {
      error = e;
    }
    const ms = performance.now() - started;
    const tank = tankFor(bytes);
    console.log(`${name}: ${bytes} bytes, ${fuel} fuel (${(fuel / bytes).toFixed(1)} a byte, this host's count; ` +
      `its tank ${tank}, ${FUEL_PER_CONFIG_BYTE} a byte); the load blocks the event loop ${ms.toFixed(1)} ms metered ` +
      `(${(error as Error)?.constructor?.name}), ${unmeteredMs.toFixed(1)} ms unmetered`);
    assert.ok(!(error instanceof PolicyOutOfFuel), `${name}: ${(fuel / bytes).toFixed(1)} fuel a byte here is more than its tank holds ` +
      `(${FUEL_PER_CONFIG_BYTE} a byte): ${(error as Error)?.message}`);
    assert.ok(error instanceof ConfigError && error.kind === 'unknown-field', `${name}: ${(error as Error)?.message ?? 'loaded'}`);
  });
}

test('with fuelPerConfigByte: 1 the 10,000 tools run out of fuel, naming the tank; a fresh default instance loads them', async () => {
  const bytes = utf8Length(TEN_THOUSAND_TOOLS);
  const tank = tankFor(bytes, 1);
  const starved = await instance({ fuelPerConfigByte: 1 });
  assert.throws(() => starved.loadPolicy(TEN_THOUSAND_TOOLS), (e: unknown) => e instanceof PolicyOutOfFuel && e.call === 'from-json' &&
    e.message === `from-json ran out of fuel (${tank} units: ${FUEL_PER_CALL} a call + 1 a configuration byte x ${bytes} bytes) and was stopped`);
  assert.throws(() => starved.loadPolicy('{}'), InstanceUnusable);
  const fresh = await instance();
  const policy = fresh.loadPolicy(TEN_THOUSAND_TOOLS);
  assert.ok(fresh.fuelUsedByLastCall() > tank && fresh.fuelUsedByLastCall() < tankFor(bytes));
  policy.close();
});

test('a from-json that does not end is cut off at its tank; the next call is back on a call\'s tank', async () => {
  // No hostile fixture loops in from-json (tests/hostile/build.mjs): entering the
  // guest's from-json again and again within one guarded call burns its fuel the same way.
  const text = JSON.stringify({ 'max-attempts-per-call': 3, tools: { lookup: { effect: 'read' } } }).padEnd(1049, ' ');
  const tank = 1_000_000 + FUEL_PER_CONFIG_BYTE * 1049;
  const runaway = await instance({ fuelPerCall: 1_000_000 });
  const started = performance.now();
  assert.throws(() => runaway.guard('from-json', () => {
    for (;;) runaway.exports.Policy.fromJson(text);
  }, utf8Length(text)), (e: unknown) => e instanceof PolicyOutOfFuel &&
    e.message === `from-json ran out of fuel (${tank} units: 1000000 a call + ${FUEL_PER_CONFIG_BYTE} a configuration byte x 1049 bytes) and was stopped`);
  const ms = performance.now() - started;
  const burned = runaway.fuelUsedByLastCall();
  console.log(`a from-json that does not end: stopped after ${ms.toFixed(1)} ms at ${burned} fuel (tank ${tank})`);
  assert.ok(burned >= tank && burned < tank + 100_000, `${burned}`);

  // A configuration's tank is for its load only: a classify that does not end
  // right after one is stopped at a call's tank.
  const instanceAfterLoad = await instance({ fuelPerCall: 1_000_000 });
  const policy = instanceAfterLoad.loadPolicy(text);
  assert.ok(instanceAfterLoad.fuelUsedByLastCall() < 1_000_000);
  assert.throws(() => instanceAfterLoad.guard('classify', () => {
    for (;;) policy.resource.classify(FAILURE, 0n);
  }), (e: unknown) => e instanceof PolicyOutOfFuel && e.message === 'classify ran out of fuel (1000000 units a call) and was stopped');
  const classifyBurned = instanceAfterLoad.fuelUsedByLastCall();
  assert.ok(classifyBurned >= 1_000_000 && classifyBurned < 1_100_000, `${classifyBurned}`);
});

test('fuelPerConfigByte is checked like fuelPerCall; unmetered stays unmetered', async () => {
  const component = await PolicyComponent.load();
  for (const bad of [-1, 1.5, Number.NaN, 2 ** 53, null, '500']) {
    await assert.rejects(component.instantiate({ fuelPerConfigByte: bad as number }), (e: unknown) => e instanceof RangeError &&
      /fuelPerConfigByte must be a whole number/.test(e.message));
  }
  // fuelPerCall: null: no tank at all, whatever the configuration's size.
  const unmetered = await component.instantiate({ fuelPerCall: null, fuelPerConfigByte: 1 });
  const policy = unmetered.loadPolicy(TEN_THOUSAND_TOOLS);
  assert.ok(unmetered.fuelUsedByLastCall() > tankFor(utf8Length(TEN_THOUSAND_TOOLS), 1));
  policy.close();
});
