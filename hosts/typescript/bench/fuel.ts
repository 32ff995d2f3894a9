// Node's fuel count against wasmtime's, for the same calls on the real
// component: this host's metering (src/sandbox.ts) is meant as an upper bound
// of wasmtime's count. wasmtime's side runs in the Python host (wasmtime-py,
// bench/fuel-wasmtime.py, with the repository's .venv); the calls are the
// worst cases of test/sandbox.test.ts and the Rust host's tests/harness/tests/host/sandbox.rs.
//
//   npm run bench:fuel            # prints the table and writes it into README.md ("The sandbox")
//   npm run bench:fuel -- --print # prints only
//
// Fails (exit 1) if Node counts less than wasmtime for any call.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { PolicyComponent } from '../src/component.js';
import type { Observation } from '../src/index.js';

const here = fileURLToPath(new URL('.', import.meta.url)); // dist/bench/
const tsRoot = join(here, '../..');
const repo = join(tsRoot, '../..');
const README = join(tsRoot, 'README.md');
const BEGIN = '<!-- fuel: written by `npm run bench:fuel` (bench/fuel.ts); not edited by hand -->';
const END = '<!-- /fuel -->';

const RULES = Array.from({ length: 64 }, (_, i) => ({ contains: `e_busy_${i}`, class: 'transient' }));
const observed = (kind: Observation['kind'], rest: Partial<Observation> = {}): Observation =>
  ({ kind, headers: '', body: '', structuredContent: undefined, sessionIdSent: false, delivery: 'answer-started', ...rest });

/** The calls of bench/fuel-wasmtime.py, in the same order, with Node's fuel of each. */
async function nodeFuel(): Promise<Record<string, number>> {
  const instance = await (await PolicyComponent.load()).instantiate();
  const fuel: Record<string, number> = {};
  const policy = instance.loadPolicy({ 'tool-error-rules': RULES, tools: { t: { effect: 'read', 'tool-error-rules': RULES } } });
  fuel['from-json'] = instance.fuelUsedByLastCall();
  const run = policy.startRun('worst-case');
  const failure = (name: string, observation: Observation) => {
    const start = run.beginCall(undefined, 't', undefined, undefined, 1n);
    run.recordFailure(start.callId, 1, observation, undefined, 1n, 1n);
    fuel[`record-failure: ${name}`] = instance.fuelUsedByLastCall();
    run.lastDecision(start.callId);
    fuel[`last-decision: ${name}`] = instance.fuelUsedByLastCall();
  };
  failure('HTTP 503 with Retry-After', observed({ tag: 'http-status', val: 503 }, { headers: 'retry-after: 1', body: 'upstream unavailable' }));
  failure('hostile 8 KB tool error', observed({ tag: 'tool-error', val: undefined }, { body: 'e_a '.repeat(1024), structuredContent: `"${'e_b '.repeat(1023)}"` }));

  const long = instance.loadPolicy({ 'max-steps-per-run': 1_000_000 }).startRun('long');
  for (let i = 0; i < 10_000; i++) {
    long.recordSuccess(long.beginCall(undefined, 'issue_refund', `ar1-${i.toString(16).padStart(32, '0')}`, undefined, 1n).callId, 1, 1n);
  }
  fuel['record-success (the 10,000th keyed write)'] = instance.fuelUsedByLastCall();
  const last = long.beginCall(undefined, 'issue_refund', undefined, undefined, 1n).callId;
  long.recordFailure(last, 1, observed({ tag: 'http-status', val: 403 }, { body: 'needs approval' }), undefined, 1n, 1n);
  fuel['record-failure: 403 escalating a run of 10,000 effects'] = instance.fuelUsedByLastCall();
  long.lastDecision(last);
  fuel['last-decision: 403 escalating a run of 10,000 effects'] = instance.fuelUsedByLastCall();
  return fuel;
}

function wasmtimeFuel(): Record<string, number> {
  const python = join(repo, '.venv/bin/python');
  const out = execFileSync(python, [join(tsRoot, 'bench/fuel-wasmtime.py')], { encoding: 'utf8' });
  return JSON.parse(out) as Record<string, number>;
}

function wasmtimeVersion(): string {
  const python = join(repo, '.venv/bin/python');
  return execFileSync(python, ['-c', 'import importlib.metadata as m; print(m.version("wasmtime"))'], { encoding: 'utf8' }).trim();
}

const node = await nodeFuel();
const wasmtime = wasmtimeFuel();
const names = Object.keys(node);
if (names.join('\n') !== Object.keys(wasmtime).join('\n')) {
  throw new Error(`bench/fuel.ts and bench/fuel-wasmtime.py measure different calls: ${names} / ${Object.keys(wasmtime)}`);
}
const ratios = names.map((name) => node[name] / wasmtime[name]);
const fmt = (n: number) => n.toLocaleString('en-US');
const [low, high] = [Math.min(...ratios), Math.max(...ratios)];
const lines = [
  BEGIN,
  `Node's count against wasmtime's (wasmtime-py ${wasmtimeVersion()}, the Python host) for the same calls on the`,
  `component (\`target/component/agent_retry_policy.wasm\`), one instance, in this order: Node counts`,
  `${low.toFixed(2)}–${high.toFixed(2)}× wasmtime's.`,
  '',
  '| call | Node | wasmtime | Node / wasmtime |',
  '|---|---:|---:|---:|',
  ...names.map((name, i) => `| ${name} | ${fmt(node[name])} | ${fmt(wasmtime[name])} | ${ratios[i].toFixed(2)} |`),
  END,
];
const table = lines.join('\n');
console.log(table);
const under = names.filter((_, i) => ratios[i] < 1);
if (under.length > 0) {
  console.error(`Node counts less than wasmtime for: ${under.join(', ')}`);
  process.exitCode = 1;
} else if (!process.argv.includes('--print')) {
  const readme = readFileSync(README, 'utf8');
  const [from, to] = [readme.indexOf(BEGIN), readme.indexOf(END)];
  if (from < 0 || to < from) throw new Error(`README.md has no block between "${BEGIN}" and "${END}" to write`);
  writeFileSync(README, readme.slice(0, from) + table + readme.slice(to + END.length));
  console.log(`written into ${README}`);
}
