// A fleet worker for test/fleet.test.ts, run as a child process (the Rust
// host's `agent-retry watch --fleet`): opens the policy published in Redis,
// watches it, and prints JSON lines on stdout:
//
//   {"event":"serving","policy":{generation, wasm_sha256, config_sha256}}   at open and on every accepted update
//   {"event":"refused","kind":…,"reason":…}                                 an update refused
//   {"event":"log","message":…,"reason":…}                                  other update events (Redis away, back)
//   {"event":"open-failed","kind":…,"reason":…}                             then it exits 1
//
// and answers commands on stdin: `decide` → {"event":"decided","attempts":N,"policy":…}
// (attempts a read makes against a persistent 503 under the serving policy),
// `status` → {"event":"status","policy":…,"refused":N,"subscribed":bool}.
//
// Configured by the environment (FLEET_WORKER=1 or it does nothing: `node
// --test dist/test/` loads every file here): FLEET_URL, FLEET_PREFIX,
// FLEET_INTERVAL_MS, FLEET_PUBLIC_KEY (hex), AGENT_RETRY_CACHE_DIR.
import { createInterface } from 'node:readline';

import { EmbeddedAccounts } from '../src/accounts.js';
import { SplitMix64 } from '../src/entropy.js';
import { UpdateError } from '../src/errors.js';
import { Integrity, LivePolicy, type PolicyUpdateEvent } from '../src/live.js';

const say = (line: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(line)}\n`);

async function main(): Promise<void> {
  const env = process.env;
  const integrity = env.FLEET_PUBLIC_KEY ? Integrity.ed25519(Buffer.from(env.FLEET_PUBLIC_KEY, 'hex')) : Integrity.unchecked();
  const log = (event: PolicyUpdateEvent) => {
    if (event.message === 'policy update accepted') {
      say({ event: 'serving', policy: { generation: event.generation, wasm_sha256: event.wasm_sha256, config_sha256: event.config_sha256 } });
    }
    else if (event.message === 'policy update refused') say({ event: 'refused', kind: event.kind, reason: event.reason });
    else say({ event: 'log', message: event.message, reason: event.reason });
  };
  let live: LivePolicy;
  try {
    live = await LivePolicy.openFleet({ url: env.FLEET_URL ?? '', prefix: env.FLEET_PREFIX || undefined }, integrity, { log });
  } catch (e) {
    say({ event: 'open-failed', kind: e instanceof UpdateError ? e.kind : 'other', reason: (e as Error)?.message ?? String(e) });
    process.exit(1);
  }
  say({ event: 'serving', policy: live.current().identity });
  const watcher = live.watch(Number(env.FLEET_INTERVAL_MS ?? 2000));
  // stdin keeps the process alive (the watcher does not); its end ends the worker.
  for await (const line of createInterface({ input: process.stdin })) {
    const command = line.trim();
    if (command === 'decide') {
      const loaded = live.current();
      const instance = await loaded.component.instantiate({ accounts: EmbeddedAccounts.onHostClock(), entropy: new SplitMix64(3n) });
      const policy = instance.loadPolicy(loaded.configJson);
      const run = policy.startRun('worker');
      const start = run.beginCall(undefined, 'lookup_order', undefined, { readOnly: true }, 1n);
      let attempts = 0;
      if (start.admitted) {
        attempts = 1;
        const fail = { kind: { tag: 'http-status' as const, val: 503 }, headers: '', body: '', sessionIdSent: false, delivery: 'answer-started' as const };
        while (run.recordFailure(start.callId, attempts, fail, undefined, 1n, 1n).action === 'retry') attempts += 1;
      }
      run.close();
      policy.close();
      say({ event: 'decided', attempts, policy: loaded.identity });
    } else if (command === 'status') {
      say({ event: 'status', policy: live.current().identity, refused: live.metrics.refused, accepted: live.metrics.accepted, subscribed: watcher.native });
    }
  }
  live.close();
}

if (process.env.FLEET_WORKER === '1') {
  main().catch((e) => {
    say({ event: 'crashed', reason: String((e as Error)?.stack ?? e) });
    process.exit(2);
  });
}
