// Every conformance vector (tests/vectors/*.json) through the component in Node
// (jco), with the canonical JSON mapping and step semantics of
// tests/vectors/README.md. Each case runs twice on fresh instances and must give
// byte-identical outputs, and once more in flat mode (contract 0.4.0's hot path:
// begin-call-flat, record-success, record-failure, last-decision, escalation),
// which must agree with its verdicts and give the rich outputs exactly.
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import { PolicyComponent } from '../src/component.js';
import { canonicalText, defaultVectorDir, loadVectorFiles, runAll, runCase, runCaseBothWays, verdictDisagrees } from '../src/conformance.js';

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
        const first = await runCaseBothWays(component, file, testCase);
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

test('flat mode checks each verdict against the decision it stands for', () => {
  const rules = ['status:transient', 'success'];
  const decision = { action: { retry: { 'delay-ms': 1200n, attempt: 2, 'idempotency-key': null } }, class: 'transient', attempt: 1, 'hint-ms': null,
    rule: 'status:transient', reason: 'HTTP 503' };
  const verdict = { action: 'retry', class: 'transient', attempt: 1, 'delay-ms': 1200n, 'hint-ms': null, 'rule-index': 0, 'has-note': false };
  assert.equal(verdictDisagrees(verdict, decision, rules), undefined);
  assert.match(verdictDisagrees({ ...verdict, 'delay-ms': 0n }, decision, rules) ?? '', /delay-ms 0, the decision's is 1200/);
  assert.match(verdictDisagrees({ ...verdict, 'rule-index': 1 }, decision, rules) ?? '', /rule-index 1 names "success"/);
  assert.match(verdictDisagrees({ ...verdict, 'has-note': true }, decision, rules) ?? '', /has-note true/);
  assert.match(verdictDisagrees({ ...verdict, action: 'replan' }, decision, rules) ?? '', /action "replan", the decision's is retry/);
  const succeeded = { ...decision, action: { succeed: 'the write was applied' }, class: 'success', rule: 'success' };
  assert.match(verdictDisagrees({ ...verdict, action: 'succeed', class: 'success', 'delay-ms': 0n, 'rule-index': 1 }, succeeded, rules) ?? '', /has-note false/);
  assert.equal(verdictDisagrees({ ...verdict, action: 'succeed', class: 'success', 'delay-ms': 0n, 'rule-index': 1, 'has-note': true }, succeeded, rules), undefined);
});
