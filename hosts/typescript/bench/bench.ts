// Per-decision cost of the policy component in Node (jco), against p-retry's
// per-attempt overhead measured in the same run.
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
import pRetry from 'p-retry';

import { EmbeddedAccounts } from '../src/accounts.js';
import { PolicyComponent } from '../src/component.js';
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

async function main(): Promise<void> {
  const rounds = arg('rounds', 5);
  const decisions = arg('decisions', 20_000);
  const failures = arg('failures', 9);
  const instance = await (await PolicyComponent.load()).instantiate({ accounts: new EmbeddedAccounts() });

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
      run.recordOutcome(admission.val.callId, FAILURE, now, 0x123456789abcdef0n);
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

  const decision = await perOpUs(componentDecisions, decisions, rounds);
  const baseline = await perOpUs(pRetryAttempts, decisions * 5, rounds);
  const rows: Array<[string, number]> = [
    ['component decision (begin-call + record-outcome + next-delay)', decision],
    [`p-retry per attempt (fails ${failures}x, no delay)`, baseline],
  ];
  for (const [label, value] of rows) console.log(`node:   ${label.padEnd(64)} ${value.toFixed(1).padStart(8)} µs`);
  console.log(`node:   ratio decision / p-retry attempt: ${(decision / baseline).toFixed(2)}`);
}

await main();
