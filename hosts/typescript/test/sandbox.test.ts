// The sandbox: hostile components (built by tests/hostile/build.mjs from
// the real one) are contained within the limits with a typed error, the instance
// is refused afterwards, and a fresh instance of the good component serves.
// The hostile .wasm files are loaded as any user's .wasm is: by path, transpiled
// at run time into a cache (a fresh one for this file), so the sandbox is shown to
// apply to that path; one test loads build.mjs's own transpilation (generatedDir).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, type PolicyInstance } from '../src/component.js';
import { checkImports, componentImportNames } from '../src/contract.js';
import {
  ComponentImportRefused, Escalated, InstanceUnusable, PolicyBoundaryViolation, PolicyMemoryExceeded, PolicyOutOfFuel, PolicyTrap,
} from '../src/errors.js';
import { RetryingToolCaller } from '../src/mcp.js';
import { FUEL_PER_CALL, MAX_MEMORY_BYTES, instrumentCoreModule } from '../src/sandbox.js';
import { ValueConversionError } from '../src/wit.js';
import type { Observation } from '../src/index.js';
import { readFileSync } from 'node:fs';
import { isAddedEventLine } from './event-lines.js';

const fixtures = join(fileURLToPath(import.meta.url), '../../../../../target/hostile');
const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-sandbox-cache-'));
const hostile = async (name: string, maxMemoryBytes?: number) => {
  assert.ok(existsSync(join(fixtures, `${name}.wasm`)), 'run node tests/hostile/build.mjs from the repository root (make hostile; npm test does)');
  const component = await PolicyComponent.load({ wasmPath: join(fixtures, `${name}.wasm`), maxMemoryBytes, cacheDir });
  assert.ok(component.origin === 'transpiled' || component.origin === 'cache', `${name}: loaded at run time, not from ${component.origin}`);
  return component;
};
const FAILURE: Observation = { kind: { tag: 'http-status', val: 503 }, headers: 'Retry-After: 2', body: '', sessionIdSent: false, delivery: 'answer-started' };
/** An observation with the defaults a test leaves out. */
const observed = (kind: Observation['kind'], rest: Partial<Observation> = {}): Observation =>
  ({ kind, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'answer-started', ...rest });

/** A fresh instance of the good component serves; and the event loop is free (a timer fires). */
async function hostKeepsServing(): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 1));
  const fresh = await (await PolicyComponent.load()).instantiate();
  assert.equal(fresh.loadPolicy({}).classify(FAILURE, 0n).class, 'transient');
}

/** The call fails with `kind`, the instance refuses the next call, the host serves. */
async function contained(instance: PolicyInstance, call: () => unknown, kind: new (...a: never[]) => PolicyTrap, what: RegExp) {
  const start = performance.now();
  assert.throws(call, (e: unknown) => e instanceof kind && what.test(e.message) && e.constructor === kind);
  const ms = performance.now() - start;
  assert.throws(() => instance.deriveIdempotencyKey('r', 'a'), (e: unknown) => e instanceof InstanceUnusable && /instantiate a new one/.test(e.message));
  await hostKeepsServing();
  return ms;
}

test('an endless loop runs out of fuel, the call fails with PolicyOutOfFuel and the host goes on', async () => {
  const instance = await (await hostile('endless-loop')).instantiate();
  const policy = instance.loadPolicy({});
  const ms = await contained(instance, () => policy.classify(FAILURE, 0n), PolicyOutOfFuel, /classify ran out of fuel \(20000000 units/);
  console.log(`endless loop stopped after ${ms.toFixed(1)} ms (${FUEL_PER_CALL} fuel)`);
  assert.ok(ms < 5_000, `${ms} ms`);
});

test('fuel per call is configurable (fuelPerCall), as in the Rust and Python hosts', async () => {
  const component = await PolicyComponent.load();
  const starved = await component.instantiate({ fuelPerCall: 500, fuelPerConfigByte: 0 });
  assert.throws(() => starved.loadPolicy({}), PolicyOutOfFuel);
  assert.throws(() => starved.loadPolicy({}), InstanceUnusable);
  const instance = await (await hostile('endless-loop')).instantiate({ fuelPerCall: 100_000 });
  const start = performance.now();
  assert.throws(() => instance.loadPolicy({}).classify(FAILURE, 0n), /100000 units/);
  assert.ok(performance.now() - start < 1_000);
  const roomy = await component.instantiate({ fuelPerCall: null });
  assert.equal(roomy.loadPolicy({}).classify(FAILURE, 0n).class, 'transient');
  await assert.rejects(component.instantiate({ fuelPerCall: 0 }), RangeError);
});

test('a memory bomb stops at the 64 MiB cap with PolicyMemoryExceeded', async () => {
  const instance = await (await hostile('memory-bomb')).instantiate();
  const policy = instance.loadPolicy({});
  const ms = await contained(instance, () => policy.classify(FAILURE, 0n), PolicyMemoryExceeded, /cap of 67108864 bytes/);
  console.log(`memory bomb stopped after ${ms.toFixed(1)} ms at ${instance.memoryBytes()} bytes`);
  assert.ok(instance.memoryBytes() <= MAX_MEMORY_BYTES);
  assert.ok(instance.memoryBytes() > MAX_MEMORY_BYTES - (1 << 20), 'the bomb grew to the cap');
});

test('the memory cap is configurable (maxMemoryBytes)', async () => {
  const instance = await (await hostile('memory-bomb', 8 << 20)).instantiate();
  const policy = instance.loadPolicy({});
  assert.throws(() => policy.classify(FAILURE, 0n), (e: unknown) => e instanceof PolicyMemoryExceeded && /cap of 8388608 bytes/.test(e.message));
  assert.ok(instance.memoryBytes() <= 8 << 20);
  // A cap below what the module starts with refuses the component at load.
  await assert.rejects(PolicyComponent.load({ maxMemoryBytes: 1 << 20 }), /starts at \d+ bytes, over the sandbox's cap of 1048576 bytes/);
  // The real policy fits its vectors' worst cases in the default (the vectors run sandboxed).
});

test('a trap is a PolicyTrap and the instance is refused afterwards', async () => {
  const instance = await (await hostile('trap')).instantiate();
  const policy = instance.loadPolicy({});
  await contained(instance, () => policy.classify(FAILURE, 0n), PolicyTrap, /classify trapped: unreachable/);
});

test('a transpilation made ahead (generatedDir) is sandboxed the same way', async () => {
  assert.ok(existsSync(join(fixtures, 'trap', 'source.json')), 'tests/hostile/build.mjs writes target/hostile/trap/');
  const component = await PolicyComponent.load({ wasmPath: join(fixtures, 'trap.wasm'), generatedDir: join(fixtures, 'trap') });
  assert.equal(component.origin, 'generated');
  const instance = await component.instantiate();
  const policy = instance.loadPolicy({});
  await contained(instance, () => policy.classify(FAILURE, 0n), PolicyTrap, /classify trapped: unreachable/);
});

test('an enum case that does not exist (discriminant 42) is a PolicyBoundaryViolation', async () => {
  const instance = await (await hostile('enum-out-of-range')).instantiate();
  const policy = instance.loadPolicy({});
  await contained(instance, () => policy.classify(FAILURE, 0n), PolicyBoundaryViolation, /classify returned a value the contract does not allow: invalid discriminant/);
});

test('a string that is not UTF-8 is a PolicyBoundaryViolation, not a garbage string', async () => {
  const instance = await (await hostile('invalid-utf8')).instantiate();
  await contained(instance, () => instance.deriveIdempotencyKey('r', 'step-1'), PolicyBoundaryViolation, /derive-idempotency-key returned a value .*not valid/);
});

test('a pointer outside the guest memory is a PolicyBoundaryViolation', async () => {
  const instance = await (await hostile('pointer-out-of-bounds')).instantiate();
  await contained(instance, () => instance.deriveIdempotencyKey('r', 'step-1'), PolicyBoundaryViolation, /derive-idempotency-key returned a value/);
});

test('an import outside the contract (wasi:filesystem) is refused at load, naming it', async () => {
  await assert.rejects(hostile('extra-import'), (e: unknown) => e instanceof ComponentImportRefused &&
    e.importName === 'wasi:filesystem/preopens@0.2.6' && /imports wasi:filesystem\/preopens@0.2.6, which is outside the agent-retry contract/.test(e.message));
  const real = readFileSync(join(fileURLToPath(import.meta.url), '../../../../../target/component/agent_retry_policy.wasm'));
  assert.deepEqual(componentImportNames(real).sort(),
    ['agent-retry:policy/account-budget@0.9.0', 'agent-retry:policy/shared-state@0.9.0', 'agent-retry:policy/types@0.9.0', 'wasi:random/random@0.2.6']);
  checkImports(componentImportNames(real));
  for (const name of ['wasi:sockets/tcp@0.2.0', 'wasi:random/random@0.3.0', 'agent-retry:policy/account-budget@0.8.0', 'agent-retry:policy/types@0.10.0',
    'agent-retry:policy/shared-state@0.8.0', 'agent-retry:policy/other-state@0.9.0', 'wasi:cli/environment@0.2.0']) {
    assert.throws(() => checkImports([name]), (e: unknown) => e instanceof ComponentImportRefused && e.importName === name);
  }
  await hostKeepsServing();
});

test('arguments out of their WIT range are refused, not wrapped: a u16 of 66039', async () => {
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy({});
  const run = policy.startRun('r');
  const admission = run.beginCall(undefined, 'lookup', undefined, undefined, 0n);
  assert.ok(admission.admitted);
  const callId = admission.callId;
  const status = (val: number): Observation => observed({ tag: 'http-status', val });
  assert.throws(() => run.recordFailure(callId, 1, status(66039), undefined, 1n),
    (e: unknown) => e instanceof ValueConversionError && /record-failure observation\.kind\(http-status\): 66039 is out of range for u16 \(0\.\.65535\)/.test(e.message));
  assert.throws(() => policy.classify(status(-1), 0n), ValueConversionError);
  assert.throws(() => policy.classify(status(503.5), 0n), ValueConversionError);
  assert.throws(() => policy.classify({ ...status(503), kind: { tag: 'transport', val: 'gone' as never } }, 0n), /"gone" is not a case of transport-error/);
  assert.throws(() => policy.classify({ ...status(503), kind: { tag: 'nope' } as never }, 0n), /is not a case of failure-kind/);
  assert.throws(() => policy.classify(status(503), -1n), /out of range for u64/);
  assert.throws(() => policy.classify(status(503), 2n ** 64n), /out of range for u64/);
  assert.throws(() => policy.classify(status(503), 1.5), ValueConversionError);
  assert.throws(() => policy.nextDelay(2 ** 32), /out of range for u32/);
  assert.throws(() => run.beginCall(undefined, 'x', undefined, { readOnly: 1 as never }, 0n), /is not a boolean/);
  assert.throws(() => policy.classify({ ...status(503), headers: 5 as never }, 0n), /\.headers: 5 is not a string/);
  assert.throws(() => policy.classify({ ...status(503), sessionIdSent: 'yes' as never }, 0n), /\.sessionIdSent: "yes" is not a boolean/);
  // Nothing reached the component: the instance still serves, and 503 is still 503.
  const verdict = run.recordFailure(callId, 1, status(503), undefined, 1n, 0n);
  assert.equal(verdict.class, 'transient');
  assert.equal(policy.classify(status(503), 0n).class, 'transient');
});

test('the sandbox rewrites the core modules and refuses instructions it cannot meter', () => {
  // (module (func (loop (br 0))))  with an exception-handling `try` (0x06) instead of the loop: refused.
  const module = (body: number[]) => Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0,
    10, body.length + 2, 1, body.length, ...body]);
  const loop = module([0, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b]);
  assert.ok(WebAssembly.validate(loop));
  assert.ok(WebAssembly.validate(instrumentCoreModule(loop)));
  assert.throws(() => instrumentCoreModule(module([0, 0x06, 0x40, 0x0b, 0x0b])), /cannot meter \(opcode 0x6\)/);
});

test('when the policy fails, the MCP wrapper does not retry and escalates saying so', async () => {
  // The account backend fails on the second reservation (the retry's): record-failure traps.
  let reservations = 0;
  const flaky = new EmbeddedAccounts();
  const accounts = {
    reserve: (...args: Parameters<EmbeddedAccounts['reserve']>) => {
      if (++reservations > 1) throw new Error('budget store down');
      return flaky.reserve(...args);
    },
    refund: () => {},
  };
  const instance = await (await PolicyComponent.load()).instantiate({ accounts });
  const run = instance.loadPolicy({ 'account-budget': { 'account-id': 'acme', capacity: 10, 'refill-interval-ms': 10 } }).startRun('mcp');
  let sent = 0;
  const tools = [{ name: 'lookup', inputSchema: { type: 'object' as const }, annotations: { readOnlyHint: true } }];
  const client = {
    listTools: async () => ({ tools }),
    callTool: async () => {
      sent += 1;
      return { isError: true, content: [{ type: 'text', text: 'upstream returned 503, try again' }] };
    },
  } as unknown as Client;
  const lines: string[] = [];
  // The tools are given: no `tools/list` pseudo-call takes the first reservation.
  const caller = new RetryingToolCaller(client, run, { tools, sleep: async () => {}, log: (line) => { if (!isAddedEventLine(line)) lines.push(line); } });
  await assert.rejects(caller.callTool('lookup', {}), (e: unknown) => e instanceof Escalated && e.policyFailure instanceof PolicyTrap &&
    e.reason === 'unclassified-failure' && /the retry policy failed \(PolicyTrap: record-failure trapped: budget store down\); not retried/.test(e.note));
  assert.equal(sent, 1, 'not retried');
  assert.match(lines.at(-1) ?? '', /"action":"escalate".*the retry policy failed/);
  // The broken instance refuses the next call the same way; a fresh one serves.
  await assert.rejects(caller.callTool('lookup', {}), (e: unknown) => e instanceof Escalated && e.policyFailure instanceof InstanceUnusable);
  await hostKeepsServing();
});

test('the real policy\'s worst cases fit in the default fuel (counted per instruction, as an upper bound)', async () => {
  // The Rust host's sandbox tests, with their figures printed beside this host's.
  const rules = Array.from({ length: 64 }, (_, i) => ({ contains: `e_busy_${i}`, class: 'transient' }));
  const instance = await (await PolicyComponent.load()).instantiate();
  const policy = instance.loadPolicy({ 'tool-error-rules': rules, tools: { t: { effect: 'read', 'tool-error-rules': rules } } });
  const run = policy.startRun('worst-case');
  // One record-failure, then its last-decision's prose (built only when asked for).
  const fuelOf = (failure: Observation) => {
    const start = run.beginCall(undefined, 't', undefined, undefined, 1n);
    assert.ok(start.admitted);
    run.recordFailure(start.callId, 1, failure, undefined, 1n, 1n);
    const fuel = instance.fuelUsedByLastCall();
    const decision = run.lastDecision(start.callId);
    assert.ok(decision);
    return [fuel, instance.fuelUsedByLastCall(), decision] as const;
  };
  const [hostile, hostileWords, decision] = fuelOf(observed({ tag: 'tool-error', val: undefined }, { body: 'e_a '.repeat(1024), structuredContent: `"${'e_b '.repeat(1023)}"` }));
  assert.equal(decision.rule, 'tool-error:scan-limit');
  const [http, httpWords] = fuelOf(observed({ tag: 'http-status', val: 503 }, { headers: 'retry-after: 1', body: 'upstream unavailable' }));

  const long = instance.loadPolicy({ 'max-steps-per-run': 1_000_000 }).startRun('long');
  for (let i = 0; i < 10_000; i++) {
    long.recordSuccess(long.beginCall(undefined, 'issue_refund', `ar1-${i.toString(16).padStart(32, '0')}`, undefined, 1n).callId, 1, 1n);
  }
  const last = long.beginCall(undefined, 'issue_refund', undefined, undefined, 1n).callId;
  assert.equal(long.recordFailure(last, 1, observed({ tag: 'http-status', val: 403 }, { body: 'needs approval' }), undefined, 1n, 1n).action, 'escalate');
  const escalationFuel = instance.fuelUsedByLastCall();
  const escalation = long.lastDecision(last);
  const escalationWordsFuel = instance.fuelUsedByLastCall();
  assert.ok(escalation?.action.tag === 'escalate' && escalation.action.val.effectsTotal === 10_000 && escalation.action.val.effects.length === 20);
  console.log(`fuel of one record-failure, then its last-decision (Node's count): HTTP 503 with Retry-After ${http} + ${httpWords}, ` +
    `hostile 8 KB tool error ${hostile} + ${hostileWords}, the escalation of a run of 10,000 effects (listing 20 of them) ${escalationFuel} + ` +
    `${escalationWordsFuel}; budget ${FUEL_PER_CALL}`);
  assert.ok(hostile < FUEL_PER_CALL && escalationFuel < FUEL_PER_CALL && hostileWords < FUEL_PER_CALL && escalationWordsFuel < FUEL_PER_CALL);
});
