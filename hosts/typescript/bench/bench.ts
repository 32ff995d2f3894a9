// Per-decision cost of the policy component in Node (jco), against p-retry's
// per-attempt overhead measured in the same run; and the sandbox's cost: the
// same decisions on jco's output called directly (no fuel metering, no memory
// cap, no argument checks), as this host ran before it had a sandbox.
//
// A decision is what a host pays per failed attempt: `run.begin-call` +
// `run.record-outcome` (an HTTP 503 with a Retry-After header) +
// `policy.next-delay`, through the component. p-retry's figure is a retry loop
// over a function that fails N times with no delay (p-retry skips the timer when
// the delay is 0), divided by the attempts made.
//
//   npm run bench [-- --rounds 5]
//
// Not a test: the figures depend on the machine.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { Worker } from 'node:worker_threads';

import pRetry from 'p-retry';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
import { FUEL_PER_CALL } from '../src/sandbox.js';
import type { Outcome } from '../src/index.js';

const CONFIG = { 'max-steps-per-run': 1_000_000, 'max-retries-per-run': 100_000, 'max-attempts-per-call': 100 };
const FAILURE: Outcome = {
  tag: 'failure',
  val: { kind: { tag: 'http-status', val: 503 }, headers: [['retry-after', '1']], body: 'upstream unavailable' },
};

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
};

async function perOpUs(batch: (n: number) => unknown, n: number, rounds: number): Promise<number> {
  await batch(Math.max(Math.floor(n / 10), 1)); // warm up
  const samples: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const start = performance.now();
    await batch(n);
    samples.push(((performance.now() - start) / n) * 1000);
  }
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)];
}

/** The floor of the other design (the component in a worker thread, the main
 *  thread blocked in Atomics.wait with a deadline for each call): one empty
 *  round trip through shared memory, per call, with no arguments serialised. */
async function workerRoundTripUs(n: number, rounds: number): Promise<number> {
  const shared = new Int32Array(new SharedArrayBuffer(16));
  const worker = new Worker(`
    const { workerData } = require('node:worker_threads');
    const s = new Int32Array(workerData);
    for (;;) {
      while (Atomics.load(s, 0) !== 1) Atomics.wait(s, 0, Atomics.load(s, 0));
      s[2] = s[1] + 1;
      Atomics.store(s, 0, 2);
      Atomics.notify(s, 0);
    }`, { eval: true, workerData: shared.buffer });
  // Online, not a fixed pause: under load a worker took longer than 100 ms to
  // start, and the first round trip timed out ('the worker did not answer').
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
  const result = await perOpUs(batch, n, rounds);
  await worker.terminate();
  return result;
}

async function main(): Promise<void> {
  const rounds = arg('rounds', 5);
  const decisions = arg('decisions', 20_000);
  const failures = arg('failures', 9);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: EmbeddedAccounts.onHostClock() });

  const componentDecisions = (n: number) => {
    const policy = instance.loadPolicy(CONFIG);
    let run = policy.startRun('bench');
    for (let i = 0; i < n; i++) {
      if (i % 500 === 499) { // keep each run far from its budgets
        run.close();
        run = policy.startRun(`bench-${i}`);
      }
      const now = 1_764_460_800_000n + BigInt(i);
      const admission = run.beginCall({ tool: 'lookup_order', idempotencyKey: 'ar1-key' }, now);
      if (admission.tag !== 'send') throw new Error('the bench run was refused');
      run.recordOutcome(admission.val.callId, 1, FAILURE, now, 0x123456789abcdef0n);
      policy.nextDelay(1, undefined, 0x0fedcba987654321n);
    }
    run.close();
    policy.close();
  };

  const pRetryAttempts = async (attempts: number) => {
    const calls = Math.max(Math.floor(attempts / (failures + 1)), 1);
    for (let c = 0; c < calls; c++) {
      let remaining = failures;
      await pRetry(async () => {
        if (remaining > 0) {
          remaining -= 1;
          throw new Error('flaky');
        }
        return 'ok';
      }, { retries: failures, minTimeout: 0, maxTimeout: 0, factor: 1, randomize: false });
    }
  };

  // The unsandboxed call: jco's glue over the core modules as transpiled, its
  // exports called directly.
  const generatedDir = resolve(dirname(fileURLToPath(import.meta.url)), '../generated');
  const raw = new Map<string, WebAssembly.Module>();
  for (const file of readdirSync(generatedDir).filter((f) => f.endsWith('.wasm'))) {
    raw.set(file, await WebAssembly.compile(readFileSync(join(generatedDir, file))));
  }
  const glue = await import(pathToFileURL(join(generatedDir, 'agent_retry_policy.js')).href);
  const accounts = EmbeddedAccounts.onHostClock();
  const rawRoot = await glue.instantiate((path: string) => raw.get(path), {
    'agent-retry:policy/account-budget': {
      reserve: (id: string, tokens: number, bucket: never, maxWait: bigint, now: bigint) => {
        const r = accounts.reserve(id, tokens, bucket, maxWait, now);
        return { tag: r.granted ? 'granted' : 'refused', val: r.waitMs };
      },
      refund: (id: string, tokens: number, bucket: never, now: bigint) => accounts.refund(id, tokens, bucket, now),
    },
    'agent-retry:policy/types': {},
    'wasi:random/random': { getRandomU64: () => 0n },
  });
  const unsandboxedDecisions = (n: number) => {
    const policy = rawRoot.policy.Policy.fromJson(JSON.stringify(CONFIG));
    let run = policy.startRun('bench');
    for (let i = 0; i < n; i++) {
      if (i % 500 === 499) {
        run[Symbol.dispose]();
        run = policy.startRun(`bench-${i}`);
      }
      const now = 1_764_460_800_000n + BigInt(i);
      const admission = run.beginCall({ tool: 'lookup_order', idempotencyKey: 'ar1-key' }, now);
      if (admission.tag !== 'send') throw new Error('the bench run was refused');
      run.recordOutcome(admission.val.callId, 1, FAILURE, now, 0x123456789abcdef0n);
      policy.nextDelay(1, undefined, 0x0fedcba987654321n);
    }
    run[Symbol.dispose]();
    policy[Symbol.dispose]();
  };

  // Fuel of one decision's calls, for the record.
  const fuelRun = instance.loadPolicy(CONFIG).startRun('fuel');
  const fuelNow = 1_764_460_800_000n;
  const fuelAdmission = fuelRun.beginCall({ tool: 'lookup_order', idempotencyKey: 'ar1-key' }, fuelNow);
  const beginFuel = instance.fuelUsedByLastCall();
  if (fuelAdmission.tag !== 'send') throw new Error('the bench run was refused');
  fuelRun.recordOutcome(fuelAdmission.val.callId, 1, FAILURE, fuelNow, 0x123456789abcdef0n);
  const recordFuel = instance.fuelUsedByLastCall();

  // Interleaved, so that both see the same machine.
  const decision = await perOpUs(componentDecisions, decisions, rounds);
  const unsandboxed = await perOpUs(unsandboxedDecisions, decisions, rounds);
  const decisionAgain = await perOpUs(componentDecisions, decisions, rounds);
  const unsandboxedAgain = await perOpUs(unsandboxedDecisions, decisions, rounds);
  const baseline = await perOpUs(pRetryAttempts, decisions * 5, rounds);
  const roundTrip = await workerRoundTripUs(decisions, rounds);
  const sandboxed = Math.min(decision, decisionAgain);
  const bare = Math.min(unsandboxed, unsandboxedAgain);
  const rows: Array<[string, number]> = [
    ['component decision (begin-call + record-outcome + next-delay)', sandboxed],
    ['  the same, unsandboxed (jco exports called directly)', bare],
    [`p-retry per attempt (fails ${failures}x, no delay)`, baseline],
  ];
  for (const [label, value] of rows) console.log(`node:   ${label.padEnd(64)} ${value.toFixed(1).padStart(8)} µs`);
  console.log(`node:   sandbox cost per decision: ${(sandboxed - bare).toFixed(1)} µs (${((sandboxed / bare - 1) * 100).toFixed(0)}%; ` +
    `runs: sandboxed ${decision.toFixed(1)}, ${decisionAgain.toFixed(1)}; unsandboxed ${unsandboxed.toFixed(1)}, ${unsandboxedAgain.toFixed(1)} µs)`);
  console.log(`node:   a worker thread instead (the design not taken): an empty Atomics round trip ${roundTrip.toFixed(1)} µs a call, ` +
    `${(3 * roundTrip).toFixed(1)} µs for a decision's three calls before any argument is serialised`);
  console.log(`node:   fuel: begin-call ${beginFuel}, record-outcome of a 503 with Retry-After ${recordFuel} (of ${FUEL_PER_CALL} a call)`);
  console.log(`node:   ratio decision / p-retry attempt: ${(sandboxed / baseline).toFixed(2)}`);
}

await main();
