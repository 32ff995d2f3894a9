// Live updates in the Node host: what an update costs (read, gate, load, swap:
// `LivePolicy.reload()`) and what decisions cost while one is in flight.
//
//   npm run bench:live [-- --rounds 5]
//
// - update latency: a new .wasm never seen (jco transpiles it on a worker thread:
//   cold), a .wasm whose transpilation is in the cache (cached), and a
//   configuration change on the same .wasm (no load at all);
// - decisions: the same decision as bench.ts (begin-call, record-outcome of a 503
//   with Retry-After, next-delay) made in slices of 200 on the main thread, each
//   slice yielding to the event loop, at rest and while a cold and a cached
//   .wasm update is in flight; the mean per decision and the longest stall
//   between two slices (the event loop blocked by the update's own work).
//
// Not a test: the figures depend on the machine, and nothing is asserted.
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { EmbeddedAccounts } from '../src/accounts.js';
import { locateComponent } from '../src/component.js';
import { Integrity, LivePolicy } from '../src/live.js';
import type { Observation } from '../src/index.js';

const CONFIG = { 'max-steps-per-run': 1_000_000, 'max-retries-per-run': 100_000, 'max-attempts-per-call': 100 };
const FAILURE: Observation = {
  kind: { tag: 'http-status', val: 503 }, headers: 'retry-after: 1', body: 'upstream unavailable', sessionIdSent: false, delivery: 'answer-started',
};
const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
};
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const range = (xs: number[], digits = 0) => `${median(xs).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)})`;

/** Another build of the component: a custom section appended (another digest, the same policy). */
function build(wasm: Buffer, tag: string): Buffer {
  const name = Buffer.from('agent-retry-bench');
  const body = Buffer.concat([Buffer.from([name.length]), name, Buffer.from(tag)]);
  return Buffer.concat([wasm, Buffer.from([0, body.length]), body]);
}

async function main(): Promise<void> {
  const rounds = arg('rounds', 5);
  const wasm = locateComponent();
  if (!wasm) throw new Error('the component is needed: make wasm');
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-bench-live-'));
  const source = { wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity: Integrity.unchecked() };
  copyFileSync(wasm, source.wasm);
  writeFileSync(source.config, JSON.stringify(CONFIG));
  const original = readFileSync(source.wasm);
  const live = await LivePolicy.open(source, { cacheDir: mkdtempSync(join(tmpdir(), 'agent-retry-bench-cache-')), log: () => {} });
  const stamp = `${process.pid}-${Date.now()}`;
  const builds = Array.from({ length: rounds + 1 }, (_, i) => build(original, `${stamp}-${i}`));

  // Decisions in slices on the main thread, on the policy serving when each slice starts.
  const decide = async (stopWhen: () => boolean, minimum: number) => {
    const loaded = live.current();
    const instance = await loaded.component.instantiate({ accounts: EmbeddedAccounts.onHostClock() });
    const policy = instance.loadPolicy(loaded.configJson);
    let run = policy.startRun('bench');
    let n = 0;
    let busy = 0;
    let stall = 0;
    let last = performance.now();
    while (n < minimum || !stopWhen()) {
      const start = performance.now();
      stall = Math.max(stall, start - last);
      for (let i = 0; i < 200; i++, n++) {
        if (n % 500 === 499) {
          run.close();
          run = policy.startRun(`bench-${n}`);
        }
        const now = 1_764_460_800_000n + BigInt(n);
        const start = run.beginCall(undefined, 'lookup_order', 'ar1-key', undefined, now);
        if (!start.admitted) throw new Error('the bench run was refused');
        run.recordFailure(start.callId, 1, FAILURE, undefined, now, 0x123456789abcdef0n);
        policy.nextDelay(1, undefined, 0x0fedcba987654321n);
      }
      last = performance.now();
      busy += last - start;
      await new Promise((r) => setImmediate(r));
    }
    run.close();
    policy.close();
    return { us: (busy / n) * 1000, stall, n };
  };

  const cold: number[] = [];
  const cached: number[] = [];
  const configOnly: number[] = [];
  const atRest: number[] = [];
  const duringCold: number[] = [];
  const duringCached: number[] = [];
  const stallRest: number[] = [];
  const stallCold: number[] = [];
  const stallCached: number[] = [];
  await decide(() => true, 20_000); // warm up
  writeFileSync(source.wasm, builds[0]); // transpiled into the cache, unmeasured
  await live.reload();
  for (let r = 0; r < rounds; r++) {
    const fresh = builds[r + 1];
    // Cold: a .wasm never seen, with decisions running beside the update.
    writeFileSync(source.wasm, fresh);
    let done = false;
    let start = performance.now();
    const coldUpdate = live.reload().then(() => {
      cold.push(performance.now() - start);
      done = true;
    });
    const c = await decide(() => done, 0);
    await coldUpdate;
    duringCold.push(c.us);
    stallCold.push(c.stall);
    // Cached: the build before (its transpilation is cached; not the serving one, so compiled and gated again).
    writeFileSync(source.wasm, builds[r]);
    done = false;
    start = performance.now();
    const cachedUpdate = live.reload().then(() => {
      cached.push(performance.now() - start);
      done = true;
    });
    const k = await decide(() => done, 0);
    await cachedUpdate;
    duringCached.push(k.us);
    stallCached.push(k.stall);
    // A configuration change on the serving .wasm: gate and swap only.
    writeFileSync(source.config, JSON.stringify({ ...CONFIG, 'max-attempts-per-call': 100 - (r % 2) }));
    start = performance.now();
    await live.reload();
    configOnly.push(performance.now() - start);
    // At rest: as many decisions as a cold update saw, or at least 20,000.
    const rest = await decide(() => true, Math.max(c.n, 20_000));
    atRest.push(rest.us);
    stallRest.push(rest.stall);
  }
  console.log(`live updates (Node ${process.version}, ${rounds} rounds; median (min–max))`);
  console.log(`  update latency (read + gate + load + swap):`);
  console.log(`    new .wasm, cold (jco transpiles on a worker)   ${range(cold)} ms`);
  console.log(`    new .wasm, transpilation cached                ${range(cached)} ms`);
  console.log(`    configuration only (same .wasm)                ${range(configOnly, 1)} ms`);
  console.log(`  per decision (begin-call + record-outcome + next-delay), main thread:`);
  console.log(`    at rest                                        ${range(atRest, 2)} µs   longest stall ${range(stallRest, 1)} ms`);
  console.log(`    during a cold .wasm update                     ${range(duringCold, 2)} µs   longest stall ${range(stallCold, 1)} ms`);
  console.log(`    during a cached .wasm update                   ${range(duringCached, 2)} µs   longest stall ${range(stallCached, 1)} ms`);
  console.log(`  updates: ${JSON.stringify(live.metrics)}`);
}

await main();
