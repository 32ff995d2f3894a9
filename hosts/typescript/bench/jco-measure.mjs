// Measures one jco transpilation of the component: per-call cost of a decision
// (begin-call + record-outcome + next-delay), of next-delay and
// derive-idempotency-key alone, and of instantiation. Used by jco-versions.sh.
//   node jco-measure.mjs <transpiled-dir>
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
const dir = process.argv[2];
const { instantiate } = await import(join(process.cwd(), dir, 'agent_retry_policy.js'));
const modules = {};
for (const f of ['agent_retry_policy.core.wasm','agent_retry_policy.core2.wasm','agent_retry_policy.core3.wasm'])
  modules[f] = await WebAssembly.compile(await readFile(join(dir, f)));
const imports = {
  'agent-retry:policy/account-budget': { reserve: () => ({ tag: 'granted', val: 0n }), refund: () => {} },
  'wasi:random/random': { getRandomU64: () => 42n, getRandomBytes: (n) => new Uint8Array(Number(n)) },
};
let root = await instantiate((p) => modules[p], imports);
const N0 = 50; let ti = performance.now();
for (let i = 0; i < N0; i++) root = await instantiate((p) => modules[p], imports);
const instUs = (performance.now() - ti) / N0 * 1000;
const { policy } = root;
const pol = policy.Policy.fromJson('{"max-steps-per-run":1000000,"max-retries-per-run":100000,"max-attempts-per-call":100}');
const failure = { tag: 'failure', val: { kind: { tag: 'http-status', val: 503 }, headers: [['retry-after', '1']], body: 'oops' } };
let run = pol.startRun('r');
function one(i) {
  const a = run.beginCall({ tool: 'lookup', idempotencyKey: 'k' }, 1000n + BigInt(i));
  run.recordOutcome(a.val.callId, failure, 1000n + BigInt(i), 12345n);
  pol.nextDelay(1, undefined, 999n);
}
for (let i = 0; i < 2000; i++) { if (i % 500 === 0) run = pol.startRun('w' + i); one(i); }
const N = 20000; const t = performance.now();
for (let i = 0; i < N; i++) { if (i % 500 === 0) run = pol.startRun('r' + i); one(i); }
const per = (performance.now() - t) / N * 1000;
let tk = performance.now(); for (let i = 0; i < N; i++) policy.deriveIdempotencyKey('a', 'b'); const key = (performance.now() - tk) / N * 1000;
let tn = performance.now(); for (let i = 0; i < N; i++) pol.nextDelay(1, undefined, 999n); const nd = (performance.now() - tn) / N * 1000;
console.log(JSON.stringify({ dir, decision_us: +per.toFixed(2), nextDelay_us: +nd.toFixed(3), deriveKey_us: +key.toFixed(3), instantiate_us: +instUs.toFixed(0), js_bytes: (await readFile(join(dir, 'agent_retry_policy.js'))).length }));
