// Every conformance vector (tests/vectors/*.json) through the component in Node
// (jco), with the canonical JSON mapping and step semantics of
// tests/vectors/README.md. Each case runs twice on fresh instances and must give
// byte-identical outputs.
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import { PolicyComponent } from '../src/component.js';
import { canonicalText, defaultVectorDir, loadVectorFiles, runAll, runCase } from '../src/conformance.js';

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
