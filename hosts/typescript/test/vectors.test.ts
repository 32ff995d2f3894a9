// Every conformance vector (tests/vectors/*.json) through the component in Node
// (jco), with the canonical JSON mapping and step semantics of
// tests/vectors/README.md, translated onto contract 0.7.0's single run path in
// one place (src/conformance.ts). Each case runs twice on fresh instances and
// must give byte-identical outputs; every verdict must say what its
// last-decision says. observations.json runs pure (record-failure of each raw
// observation; the verdict's action, class, rule and reconnect).
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import { PolicyComponent } from '../src/component.js';
import {
  canonicalText, defaultVectorDir, loadObservationFile, loadVectorFiles, match, readableObservation, runAll, runCase, runObservationCase, verdictDisagrees,
} from '../src/conformance.js';

const files = loadVectorFiles(defaultVectorDir);
const tally = { passed: 0, failed: 0 };

after(() => {
  console.log(`vectors: ${tally.passed} passed, ${tally.failed} failed`);
});

test('the vectors are all there', () => {
  const count = files.reduce((n, f) => n + f.cases.length, 0);
  assert.ok(count >= 325 && files.some((f) => f.file === 'limits.json'), `only ${count} cases in ${defaultVectorDir}`);
});

for (const { file, cases } of files) {
  describe(file, () => {
    for (const testCase of cases) {
      test(testCase.description, async () => {
        const component = await PolicyComponent.load();
        const first = await runCase(component, file, testCase);
        const second = await runCase(component, file, testCase);
        const ok = first.failure === undefined && second.failure === undefined
          && canonicalText(first.outputs) === canonicalText(second.outputs);
        tally[ok ? 'passed' : 'failed'] += 1;
        assert.equal(first.failure, undefined, first.failure);
        assert.equal(canonicalText(second.outputs), canonicalText(first.outputs), 'a second run on a fresh instance gave other outputs');
      });
    }
  });
}

const observations = loadObservationFile(defaultVectorDir);

test('observations.json is there, with the lost-session rows', () => {
  assert.ok(observations, `no observations.json in ${defaultVectorDir}`);
  assert.ok(observations.cases.length >= 10, `only ${observations.cases.length} cases`);
  assert.ok(observations.cases.some((c) => c.expect.reconnect), 'no case reconnects');
});

describe('observations.json (pure)', () => {
  for (const testCase of observations?.cases ?? []) {
    test(testCase.description, async () => {
      const result = await runObservationCase(await PolicyComponent.load(), observations!, testCase);
      tally[result.failure === undefined ? 'passed' : 'failed'] += 1;
      assert.equal(result.failure, undefined, result.failure);
    });
  }
});

test('an observation case fails on the wrong expectation', async () => {
  const testCase = observations!.cases.find((c) => c.expect.reconnect)!;
  const flipped = { ...testCase, expect: { ...testCase.expect, reconnect: false } };
  const result = await runObservationCase(await PolicyComponent.load(), observations!, flipped);
  assert.match(result.failure ?? '', /reconnect false.*reconnect true/);
});

test('a readable failure becomes an observation: header lines, defaults', () => {
  assert.deepEqual(readableObservation({ kind: { 'http-status': 503 }, headers: [['Retry-After', '1'], ['X-A', 'b']], body: 'busy' }), {
    kind: { tag: 'http-status', val: 503 }, headers: 'Retry-After: 1\nX-A: b', body: 'busy', structuredContent: undefined, sessionIdSent: false, delivery: 'unknown',
  });
  assert.equal(readableObservation({ kind: { transport: 'tls' }, 'session-id-sent': true, delivery: 'not-sent' }).delivery, 'not-sent');
  assert.throws(() => readableObservation({ kind: { transport: 'dns' } }), /transport-error/);
});

test('$any matches if any of its matchers does; an object matcher needs its keys', () => {
  assert.equal(match({ $any: [{ retry: {} }, 'escalate'] }, 'escalate'), undefined);
  assert.equal(match({ $any: [{ retry: {} }, { escalate: {} }] }, { retry: { attempt: 2 } }), undefined);
  assert.match(match({ $any: [{ retry: {} }, 'escalate'] }, 'replan') ?? '', /none of the 2 matchers/);
  assert.match(match({ reconnect: false }, { attempt: 2 }) ?? '', /reconnect: missing/);
});

test('the runner reports a wrong expectation', async () => {
  // The runner must be able to fail: change one expected delay and one expected class.
  const source = JSON.parse(readFileSync(join(defaultVectorDir, 'runs-transient.json'), 'utf8'));
  const first = source.cases[0];
  const retryStep = first.steps.find((s: { op: string }) => s.op === 'record-outcome');
  retryStep.expect.ok.action.retry['delay-ms'] += 1;
  const second = structuredClone(source.cases[1]);
  second.description += ' (tampered)';
  second.steps[1].expect.ok.class = 'transient';
  const dir = mkdtempSync(join(tmpdir(), 'vectors-'));
  writeFileSync(join(dir, 'tampered.json'), JSON.stringify({ description: 'tampered', cases: [first, second] }));
  copyFileSync(join(defaultVectorDir, 'keys.json'), join(dir, 'keys.json'));
  const results = await runAll(await PolicyComponent.load(), dir);
  const failures = results.filter((r) => r.failure).map((r) => r.failure as string);
  assert.equal(failures.length, 2, failures.join('\n'));
  assert.match(failures[0], /delay-ms/);
  assert.match(failures[1], /class/);
  assert.ok(results.filter((r) => r.file === 'keys.json').every((r) => r.failure === undefined));
});

test('the runner checks each verdict against the decision it stands for', () => {
  const rules = ['status:transient', 'success'];
  const decision = { action: { retry: { 'delay-ms': 1200n, attempt: 2, 'idempotency-key': null, reconnect: true } }, class: 'transient', attempt: 1,
    'hint-ms': null, rule: 'status:transient', reason: 'HTTP 503' };
  const verdict = { action: 'retry', class: 'transient', attempt: 1, 'delay-ms': 1200n, 'hint-ms': null, 'rule-index': 0, 'has-note': false, reconnect: true };
  assert.match(verdictDisagrees({ ...verdict, reconnect: false }, decision, rules) ?? '', /reconnect false, the decision's is true/);
  assert.equal(verdictDisagrees(verdict, decision, rules), undefined);
  assert.match(verdictDisagrees({ ...verdict, 'delay-ms': 0n }, decision, rules) ?? '', /delay-ms 0, the decision's is 1200/);
  assert.match(verdictDisagrees({ ...verdict, 'rule-index': 1 }, decision, rules) ?? '', /rule-index 1 names "success"/);
  assert.match(verdictDisagrees({ ...verdict, 'has-note': true }, decision, rules) ?? '', /has-note true/);
  assert.match(verdictDisagrees({ ...verdict, action: 'replan' }, decision, rules) ?? '', /action "replan", the decision's is retry/);
  const succeeded = { ...decision, action: { succeed: 'the write was applied' }, class: 'success', rule: 'success' };
  const done = { ...verdict, action: 'succeed', class: 'success', 'delay-ms': 0n, 'rule-index': 1, reconnect: false };
  assert.match(verdictDisagrees(done, succeeded, rules) ?? '', /has-note false/);
  assert.equal(verdictDisagrees({ ...done, 'has-note': true }, succeeded, rules), undefined);
});
