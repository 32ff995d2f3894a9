// LivePolicy's update events through the fan-out (docs/events.md): the
// `onPolicyUpdate` hook and the `agent_retry.policy_updates` counter, for an
// accepted update, a refused one and a rollback; a hook that throws changes
// nothing.
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { locateComponent } from '../src/component.js';
import { UpdateConfigError } from '../src/errors.js';
import type { PolicyUpdateEvent } from '../src/events.js';
import { Integrity, LivePolicy } from '../src/live.js';
import { RetryMetrics } from '../src/metrics.js';

const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-live-events-cache-'));

function deployed(config: string): { dir: string; wasm: string; config: string; integrity: Integrity } {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  const dir = mkdtempSync(join(tmpdir(), 'agent-retry-live-events-'));
  copyFileSync(wasm, join(dir, 'policy.wasm'));
  writeFileSync(join(dir, 'policy.json'), config);
  return { dir, wasm: join(dir, 'policy.wasm'), config: join(dir, 'policy.json'), integrity: Integrity.unchecked() };
}

test('onPolicyUpdate and the policy_updates counter see every accepted, refused and rolled-back update', async () => {
  const source = deployed('{"max-attempts-per-call": 4}');
  const metrics = new RetryMetrics();
  const hooked: PolicyUpdateEvent[] = [];
  const logged: PolicyUpdateEvent[] = [];
  const live = await LivePolicy.open(source, { cacheDir, metrics, log: (e) => logged.push(e), hooks: { onPolicyUpdate: (e) => hooked.push(e) } });
  writeFileSync(source.config, '{"max-attempts-per-call": 2}');
  await live.reload();
  writeFileSync(source.config, '{"max-attempts-per-call": "many"}');
  await assert.rejects(live.reload(), UpdateConfigError);
  await live.rollback();
  assert.deepEqual(hooked.map((e) => e.message), ['policy update accepted', 'policy update refused', 'policy rolled back']);
  assert.deepEqual(hooked, logged, 'the hook gets the same records as the log');
  assert.equal(hooked[1].kind, 'config');
  assert.deepEqual(metrics.snapshot().agent_retry_policy_updates_total, [
    { labels: { outcome: 'accepted' }, value: 1 },
    { labels: { outcome: 'refused' }, value: 1 },
    { labels: { outcome: 'rolled-back' }, value: 1 },
  ]);
  assert.deepEqual(live.metrics, { accepted: 1, refused: 1, rolledBack: 1 });
  assert.match(metrics.toPrometheus(), /^agent_retry_policy_updates_total\{outcome="rolled-back"\} 1$/m);
});

test('a policy-update hook that throws changes nothing', async () => {
  const source = deployed('{}');
  let calls = 0;
  const live = await LivePolicy.open(source, { cacheDir, log: () => undefined, hooks: { onPolicyUpdate: () => { calls += 1; throw new Error('hook bug'); } } });
  writeFileSync(source.config, '{"max-attempts-per-call": 2}');
  const identity = await live.reload();
  assert.equal(live.current().identity, identity);
  await live.rollback();
  assert.equal(calls, 2);
});
