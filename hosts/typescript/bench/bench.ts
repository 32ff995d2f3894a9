// The decision benchmark in Node (jco), as docs/benchmark.md defines it for
// every host: one iteration is three calls in one run through the run path
// (contract 0.7.0: `begin-call`, `record-failure`, `record-success`):
//
//   1. a keyed write (`issue_refund`) fails with 503, is retried, succeeds;
//   2. a read (`lookup_order`) is throttled (429, `retry-after: 1`), retried, succeeds;
//   3. a read succeeds at once.
//
// Reported per successful call (N iterations of call 3 alone) and per failed
// attempt ((scenario - 3 successful calls) / 2), each the median of several
// rounds after a warm-up round, beside its baselines measured in the same run,
// the rounds interleaved so that every figure sees the same machine:
//
// - the no-op boundary floor: the same loops against target/noop/agent_retry_noop.wasm
//   (same world, same signatures, no work), loaded at run time as a live update
//   loads a .wasm (jco's API, into the transpilation cache) and sandboxed like
//   the real component; and both unsandboxed (jco's glue over the core modules
//   as transpiled, its exports called directly: no fuel, no memory cap, no
//   argument checks), which gives the sandbox's cost;
// - p-retry: `pRetry` with `retries: 1, minTimeout: 0, maxTimeout: 0` (p-retry
//   sets no timer for a delay of 0); per call: a function that succeeds at
//   once; per attempt: one that fails once then succeeds, minus that;
//
// No decision's prose is asked for (`lastDecision`), no delay is slept, a run
// is replaced every 1,000 iterations.
//
//   npm run bench [-- --iterations 20000 --rounds 7]
//
// Not a test: the figures depend on the machine; the ratios are what to compare.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';

import pRetry from 'p-retry';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent, defaultCacheDir, type Policy, type PolicyInstance } from '../src/component.js';
import type { Observation } from '../src/index.js';
import { FUEL_PER_CALL } from '../src/sandbox.js';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, '../../../..');
const NOOP_WASM = join(repoRoot, 'target/noop/agent_retry_noop.wasm');
const CONFIG = JSON.stringify({
  'max-steps-per-run': 1_000_000, 'max-retries-per-run': 100_000,
  tools: { issue_refund: { effect: 'write' }, lookup_order: { effect: 'read' } },
});
const KEY = `ar1-${'0123456789abcdef'.repeat(2)}`;
const F503: Observation = { kind: { tag: 'http-status', val: 503 }, headers: '', body: 'upstream unavailable', sessionIdSent: false, delivery: 'answer-started' };
const F429: Observation = { kind: { tag: 'http-status', val: 429 }, headers: 'retry-after: 1', body: 'slow down', sessionIdSent: false, delivery: 'answer-started' };
const ENTROPY = 0x123456789abcdef0n;
const T0 = 1_764_460_800_000n;
const RUN_ITERATIONS = 1_000;

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
};

/** The two loops of one subject: the scenario, and call 3 alone. */
interface Subject {
  label: string;
  scenario(n: number): void;
  success(n: number): void;
}

/** The typed API through the sandbox: the flat path. */
function flatSubject(label: string, policy: Policy): Subject {
  return {
    label,
    scenario(n) {
      let run = policy.startRun('bench');
      for (let i = 0; i < n; i++) {
        if (i % RUN_ITERATIONS === RUN_ITERATIONS - 1) {
          run.close();
          run = policy.startRun(`bench-${i}`);
        }
        const now = T0 + BigInt(i);
        let start = run.beginCall(undefined, 'issue_refund', KEY, undefined, now);
        run.recordFailure(start.callId, 1, F503, undefined, now, ENTROPY);
        run.recordSuccess(start.callId, 2, now);
        start = run.beginCall(undefined, 'lookup_order', undefined, undefined, now);
        run.recordFailure(start.callId, 1, F429, undefined, now, ENTROPY);
        run.recordSuccess(start.callId, 2, now);
        start = run.beginCall(undefined, 'lookup_order', undefined, undefined, now);
        run.recordSuccess(start.callId, 1, now);
      }
      run.close();
    },
    success(n) {
      let run = policy.startRun('bench');
      for (let i = 0; i < n; i++) {
        if (i % RUN_ITERATIONS === RUN_ITERATIONS - 1) {
          run.close();
          run = policy.startRun(`bench-${i}`);
        }
        const now = T0 + BigInt(i);
        const start = run.beginCall(undefined, 'lookup_order', undefined, undefined, now);
        run.recordSuccess(start.callId, 1, now);
      }
      run.close();
    },
  };
}

/** jco's exports of a run, called directly (no sandbox). */
interface RawRun {
  beginCall(server: string | undefined, tool: string, key: string | undefined, hints: undefined, now: bigint): { callId: number };
  recordSuccess(callId: number, attempt: number, now: bigint): unknown;
  recordFailure(callId: number, attempt: number, observation: Observation, timeLeftMs: bigint | undefined, now: bigint, entropy: bigint): unknown;
  [Symbol.dispose](): void;
}
interface RawPolicy {
  startRun(id: string): RawRun;
  [Symbol.dispose](): void;
}

/** The flat path on jco's exports called directly (the headers joined as the typed API joins them). */
function rawSubject(label: string, policy: RawPolicy): Subject {
  return {
    label,
    scenario(n) {
      let run = policy.startRun('bench');
      for (let i = 0; i < n; i++) {
        if (i % RUN_ITERATIONS === RUN_ITERATIONS - 1) {
          run[Symbol.dispose]();
          run = policy.startRun(`bench-${i}`);
        }
        const now = T0 + BigInt(i);
        let start = run.beginCall(undefined, 'issue_refund', KEY, undefined, now);
        run.recordFailure(start.callId, 1, F503, undefined, now, ENTROPY);
        run.recordSuccess(start.callId, 2, now);
        start = run.beginCall(undefined, 'lookup_order', undefined, undefined, now);
        run.recordFailure(start.callId, 1, F429, undefined, now, ENTROPY);
        run.recordSuccess(start.callId, 2, now);
        start = run.beginCall(undefined, 'lookup_order', undefined, undefined, now);
        run.recordSuccess(start.callId, 1, now);
      }
      run[Symbol.dispose]();
    },
    success(n) {
      let run = policy.startRun('bench');
      for (let i = 0; i < n; i++) {
        if (i % RUN_ITERATIONS === RUN_ITERATIONS - 1) {
          run[Symbol.dispose]();
          run = policy.startRun(`bench-${i}`);
        }
        const now = T0 + BigInt(i);
        run.recordSuccess(run.beginCall(undefined, 'lookup_order', undefined, undefined, now).callId, 1, now);
      }
      run[Symbol.dispose]();
    },
  };
}

/** A transpilation's glue over its core modules as transpiled: no sandbox. */
async function unsandboxed(dir: string): Promise<RawPolicy> {
  const modules = new Map<string, WebAssembly.Module>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.wasm'))) modules.set(file, await WebAssembly.compile(readFileSync(join(dir, file))));
  const glue = await import(pathToFileURL(join(dir, 'agent_retry_policy.js')).href);
  const accounts = EmbeddedAccounts.onHostClock();
  const root = await glue.instantiate((path: string) => modules.get(path), {
    'agent-retry:policy/account-budget': {
      reserve: (id: string, tokens: number, bucket: never, maxWait: bigint, now: bigint) => {
        const r = accounts.reserve(id, tokens, bucket, maxWait, now);
        return { tag: r.granted ? 'granted' : 'refused', val: r.waitMs };
      },
      refund: (id: string, tokens: number, bucket: never, now: bigint) => accounts.refund(id, tokens, bucket, now),
    },
    'agent-retry:policy/types': {},
    'wasi:random/random': { getRandomU64: () => 0n, getRandomBytes: (n: bigint) => new Uint8Array(Number(n)) },
  });
  return root.policy.Policy.fromJson(CONFIG) as RawPolicy;
}

function median(samples: number[]): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function timeUs(batch: (n: number) => void, n: number): number {
  const start = performance.now();
  batch(n);
  return ((performance.now() - start) / n) * 1000;
}

async function timeUsAsync(batch: (n: number) => Promise<void>, n: number): Promise<number> {
  const start = performance.now();
  await batch(n);
  return ((performance.now() - start) / n) * 1000;
}

/** The floor of the design not taken (the component in a worker thread, the main
 *  thread blocked in Atomics.wait with a deadline for each call): one empty
 *  round trip through shared memory, per call, with no arguments serialised. */
async function workerRoundTripUs(n: number, rounds: number): Promise<number> {
  const shared = new Int32Array(new SharedArrayBuffer(16));
  const worker = new Worker(`
    const { workerData } = require('node:worker_threads');
    const s = new Int32Array(workerData);
    for (;;) {
      // Wait on the value just checked: re-reading it for the wait raced with the
      // main thread (it stored 1 and notified in between, and the worker then
      // slept on 1 with no notify to come: "the worker did not answer").
      let seen;
      while ((seen = Atomics.load(s, 0)) !== 1) Atomics.wait(s, 0, seen);
      s[2] = s[1] + 1;
      Atomics.store(s, 0, 2);
      Atomics.notify(s, 0);
    }`, { eval: true, workerData: shared.buffer });
  // Online, not a fixed pause: under load a worker took longer than 100 ms to start.
  await new Promise((resolve) => worker.once('online', resolve));
  const batch = (count: number) => {
    for (let i = 0; i < count; i++) {
      shared[1] = i;
      Atomics.store(shared, 0, 1);
      Atomics.notify(shared, 0);
      while (Atomics.load(shared, 0) === 1) {
        if (Atomics.wait(shared, 0, 1, 1000) === 'timed-out') throw new Error('the worker did not answer');
      }
      Atomics.store(shared, 0, 0);
    }
  };
  batch(Math.max(Math.floor(n / 10), 1));
  const samples: number[] = [];
  for (let r = 0; r < rounds; r++) samples.push(timeUs(batch, n));
  await worker.terminate();
  return median(samples);
}

/** The scenario's decisions, checked once on the real component before anything is timed. */
function checkScenario(policy: Policy): void {
  const run = policy.startRun('check');
  const write = run.beginCall(undefined, 'issue_refund', KEY, undefined, T0);
  const retryWrite = run.recordFailure(write.callId, 1, F503, undefined, T0, ENTROPY);
  const read = run.beginCall(undefined, 'lookup_order', undefined, undefined, T0);
  const retryRead = run.recordFailure(read.callId, 1, F429, undefined, T0, ENTROPY);
  const ok = [write.admitted && write.effect === 'write', retryWrite.action === 'retry', run.recordSuccess(write.callId, 2, T0).action === 'succeed',
    read.admitted && read.effect === 'read', retryRead.action === 'retry' && retryRead.delayMs >= 1_000n && retryRead.hintMs === 1_000n,
    run.recordSuccess(read.callId, 2, T0).action === 'succeed'];
  run.close();
  if (!ok.every(Boolean)) throw new Error(`the scenario is not decided as docs/benchmark.md says: ${JSON.stringify(ok)}`);
}

/** The most fuel each call burned over one run of 1,000 iterations (3,000 calls). */
function fuelOver(instance: PolicyInstance, policy: Policy): Record<string, number> {
  const most: Record<string, number> = {};
  const note = (name: string) => { most[name] = Math.max(most[name] ?? 0, instance.fuelUsedByLastCall()); };
  const run = policy.startRun('fuel');
  for (let i = 0; i < RUN_ITERATIONS; i++) {
    let start = run.beginCall(undefined, 'issue_refund', KEY, undefined, T0);
    note('begin-call');
    run.recordFailure(start.callId, 1, F503, undefined, T0, ENTROPY);
    note('record-failure (503)');
    run.recordSuccess(start.callId, 2, T0);
    note('record-success');
    start = run.beginCall(undefined, 'lookup_order', undefined, undefined, T0);
    run.recordFailure(start.callId, 1, F429, undefined, T0, ENTROPY);
    note('record-failure (429, retry-after)');
    run.recordSuccess(start.callId, 2, T0);
    start = run.beginCall(undefined, 'lookup_order', undefined, undefined, T0);
    run.recordSuccess(start.callId, 1, T0);
    if (i === 0) {
      run.lastDecision(start.callId);
      note('last-decision (a success)');
    }
  }
  run.close();
  return most;
}

async function main(): Promise<void> {
  const iterations = arg('iterations', 20_000);
  const rounds = arg('rounds', 7);

  const component = await PolicyComponent.load();
  const instance = await component.instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  const policy = instance.loadPolicy(CONFIG);
  checkScenario(policy);

  // The floor, loaded as a live update loads a .wasm: jco's API at run time.
  const cacheDir = defaultCacheDir();
  const noop = await PolicyComponent.load({ wasmPath: NOOP_WASM, cacheDir });
  const noopInstance = await noop.instantiate({ accounts: EmbeddedAccounts.onHostClock() });
  // The no-op names no rules (`rule-names` is empty) while its verdicts name rule 0:
  // the host's check of a verdict's rule index would refuse it. Its instance is
  // given one name, so the floor pays that check as the policy does.
  if (noopInstance.ruleNames().length === 0) {
    const one = Object.freeze(['noop']);
    (noopInstance as unknown as { ruleNames: () => readonly string[] }).ruleNames = () => one;
  }
  const noopPolicy = noopInstance.loadPolicy(CONFIG);

  const subjects: Subject[] = [
    flatSubject('policy, flat path', policy),
    flatSubject('no-op floor, flat path', noopPolicy),
    rawSubject('policy, flat path, unsandboxed', await unsandboxed(resolve(here, '../generated'))),
    rawSubject('no-op floor, flat path, unsandboxed', await unsandboxed(join(cacheDir, noop.wasmSha256))),
  ];

  const pRetryOptions = { retries: 1, minTimeout: 0, maxTimeout: 0 };
  const pRetryOnce = async (n: number) => {
    for (let c = 0; c < n; c++) await pRetry(async () => 'ok', pRetryOptions);
  };
  const pRetryFailOnce = async (n: number) => {
    for (let c = 0; c < n; c++) {
      let failed = false;
      await pRetry(async () => {
        if (!failed) {
          failed = true;
          throw new Error('flaky');
        }
        return 'ok';
      }, pRetryOptions);
    }
  };

  // Warm-up round, then the rounds, interleaved.
  const warm = Math.max(Math.floor(iterations / 5), 1);
  for (const s of subjects) {
    s.scenario(warm);
    s.success(warm);
  }
  await pRetryOnce(warm);
  await pRetryFailOnce(warm);
  const samples = subjects.map(() => ({ success: [] as number[], failed: [] as number[], scenario: [] as number[] }));
  const pRetrySamples = { call: [] as number[], attempt: [] as number[] };
  for (let r = 0; r < rounds; r++) {
    subjects.forEach((s, i) => {
      const scenario = timeUs((n) => s.scenario(n), iterations);
      const success = timeUs((n) => s.success(n), iterations);
      samples[i].scenario.push(scenario);
      samples[i].success.push(success);
      samples[i].failed.push((scenario - 3 * success) / 2);
    });
    const once = await timeUsAsync(pRetryOnce, iterations);
    const failOnce = await timeUsAsync(pRetryFailOnce, iterations);
    pRetrySamples.call.push(once);
    pRetrySamples.attempt.push(failOnce - once);
  }
  const roundTrip = await workerRoundTripUs(iterations, rounds);
  const fuel = fuelOver(instance, policy);

  const figures = samples.map((s) => ({ success: median(s.success), failed: median(s.failed), scenario: median(s.scenario) }));
  const [flat, floor, rawFlat, rawFloor] = figures;
  const pCall = median(pRetrySamples.call);
  const pAttempt = median(pRetrySamples.attempt);
  const us = (v: number) => `${v.toFixed(2).padStart(7)} µs`;
  const x = (a: number, b: number) => `${(a / b).toFixed(2)}×`;

  console.log(`node ${process.version}: ${component.identity} (${component.origin}); floor ${noop.identity} (${noop.origin})`);
  console.log(`node: ${iterations} iterations a round, median of ${rounds} rounds after a warm-up round; a run every ${RUN_ITERATIONS} iterations`);
  console.log(`node:   ${''.padEnd(50)} ${'successful call'.padStart(16)} ${'failed attempt'.padStart(16)} ${'scenario'.padStart(12)}`);
  subjects.forEach((s, i) => {
    console.log(`node:   ${s.label.padEnd(50)} ${us(figures[i].success).padStart(16)} ${us(figures[i].failed).padStart(16)} ${us(figures[i].scenario).padStart(12)}`);
  });
  console.log(`node:   ${'p-retry (retries: 1, no delay): a call, an attempt'.padEnd(50)} ${us(pCall).padStart(16)} ${us(pAttempt).padStart(16)}`);
  console.log(`node: failed attempt / p-retry's per attempt: ${x(flat.failed, pAttempt)} (target ≤ 1.5×)`);
  console.log(`node: successful call / p-retry's per call: ${x(flat.success, pCall)}`);
  console.log(`node: vs the no-op floor (sandboxed): failed attempt ${x(flat.failed, floor.failed)}, successful call ${x(flat.success, floor.success)}; ` +
    `unsandboxed: failed attempt ${x(rawFlat.failed, rawFloor.failed)}, successful call ${x(rawFlat.success, rawFloor.success)}`);
  console.log(`node: the sandbox's cost (fuel metering, memory cap, argument checks): scenario ${us(flat.scenario - rawFlat.scenario).trim()} ` +
    `(${((flat.scenario / rawFlat.scenario - 1) * 100).toFixed(0)}%), failed attempt ${x(flat.failed, rawFlat.failed)}, successful call ${x(flat.success, rawFlat.success)}; ` +
    `on the floor: scenario ${x(floor.scenario, rawFloor.scenario)}`);
  console.log(`node: a worker thread instead (the design not taken): an empty Atomics round trip ${roundTrip.toFixed(1)} µs a call, ` +
    'before any argument is serialised');
  console.log(`node: fuel, the most one call burned over a run of ${RUN_ITERATIONS} iterations (of ${FUEL_PER_CALL} a call): ` +
    Object.entries(fuel).map(([name, units]) => `${name} ${units}`).join(', '));
}

await main();
