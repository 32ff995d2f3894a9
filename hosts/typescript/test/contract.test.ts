// The host refuses a component of another major contract version, naming both:
// the rule on export names, the reading of a component's export names, and a
// real component whose contract was rewritten to @1.0.0.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { componentWit, parse, print } from '@bytecodealliance/jco';

import { PolicyComponent, locateComponent } from '../src/component.js';
import { CONTRACT_VERSION, checkContractVersion, compatibilityKey, componentExportNames, contractVersionOf } from '../src/contract.js';
import { ComponentLoadError, ContractVersionMismatch } from '../src/errors.js';

const policyAt = (version: string) => [`agent-retry:policy/policy@${version}`];

function refused(names: string[], component: string, host = CONTRACT_VERSION) {
  assert.throws(() => checkContractVersion(names, 'the component', host), (e: unknown) => {
    assert.ok(e instanceof ContractVersionMismatch, String(e));
    assert.ok(e instanceof ComponentLoadError);
    assert.equal(e.componentVersion, component);
    assert.equal(e.hostVersion, host);
    assert.ok(e.message.includes(`the component speaks agent-retry:policy@${component} but this host speaks @${host}`), e.message);
    return true;
  });
}

test('this host speaks the contract in wit/', () => {
  const wit = readFileSync(resolve(fileURLToPath(import.meta.url), '../../../../../wit/policy.wit'), 'utf8');
  assert.match(wit, new RegExp(`^package agent-retry:policy@${CONTRACT_VERSION.replace(/\./g, '\\.')};`, 'm'));
});

test('semver compatibility: the major, or 0.minor for 0.x', () => {
  assert.equal(compatibilityKey('1.4.2'), '1');
  assert.equal(compatibilityKey('0.2.7'), '0.2');
  assert.equal(compatibilityKey('0.0.3'), '0.0.3');
  assert.equal(compatibilityKey('2.0.0-rc.1'), '2');
  assert.throws(() => compatibilityKey('0.2'), ComponentLoadError);
});

test('a component of the same major contract version is accepted', () => {
  assert.equal(checkContractVersion(policyAt('0.9.0')), '0.9.0');
  assert.equal(checkContractVersion(['wasi:cli/run@0.2.6', ...policyAt('0.9.9')]), '0.9.9'); // a later patch of 0.9
  assert.equal(checkContractVersion(policyAt('1.9.3'), 'the component', '1.2.0'), '1.9.3');
});

test('a component of another major contract version is refused with both versions', () => {
  refused(policyAt('1.0.0'), '1.0.0');
  refused(policyAt('0.1.0'), '0.1.0'); // for 0.x the minor is the major
  refused(policyAt('0.2.0'), '0.2.0');
  refused(policyAt('0.3.0'), '0.3.0');
  refused(policyAt('0.4.0'), '0.4.0');
  refused(policyAt('0.5.0'), '0.5.0');
  refused(policyAt('0.6.0'), '0.6.0');
  refused(policyAt('0.6.9'), '0.6.9');
  refused(policyAt('0.7.0'), '0.7.0');
  refused(policyAt('0.7.9'), '0.7.9');
  refused(policyAt('0.8.0'), '0.8.0'); // the previous contract
  refused(policyAt('0.8.9'), '0.8.9');
  refused(policyAt('0.10.0'), '0.10.0'); // the next
  refused(policyAt('2.0.0'), '2.0.0', '1.0.0');
  refused(policyAt('0.0.2'), '0.0.2', '0.0.1');
  refused(policyAt('banana'), 'banana');
});

test('a component without the policy interface, or without a version, is refused', () => {
  assert.equal(contractVersionOf(['agent-retry:policy/policy']), null);
  assert.equal(contractVersionOf(['agent-retry:policy/policyx@1.0.0']), undefined);
  assert.throws(() => checkContractVersion(['agent-retry:policy/policy']),
    (e: unknown) => e instanceof ContractVersionMismatch && /unversioned .* this host speaks @0\.9\.0/.test(e.message));
  assert.throws(() => checkContractVersion(['wasi:cli/run@0.2.6']),
    (e: unknown) => e instanceof ComponentLoadError && !(e instanceof ContractVersionMismatch) && /not an agent-retry policy component/.test(e.message));
});

test("a component's export names are read from its binary", async () => {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed for this test (make wasm)');
  const bytes = readFileSync(wasm);
  assert.deepEqual(componentExportNames(bytes), policyAt(CONTRACT_VERSION));
  // The same as wasm-tools reads (jco's bindings of it).
  const exported = [...(await componentWit(bytes)).matchAll(/^\s*export ([^\s;]+);/gm)].map((m) => m[1]);
  assert.deepEqual(exported, componentExportNames(bytes));
  assert.throws(() => componentExportNames(Buffer.from('not wasm at all')), ComponentLoadError);
  assert.throws(() => componentExportNames(Buffer.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0])), /core WebAssembly module/);
});

test('a real component of contract @1.0.0 is refused at load, naming both versions', async () => {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed for this test (make wasm)');
  // The same component with every agent-retry:policy interface renamed to @1.0.0
  // (wasm-tools print, rename, parse), so only the contract version differs.
  const wat = await print(readFileSync(wasm));
  const renamed = wat.replace(/(agent-retry:policy\/[a-z-]+)@0\.9\.0/g, '$1@1.0.0');
  assert.notEqual(renamed, wat);
  const other = await parse(renamed);
  assert.match(await componentWit(other), /export agent-retry:policy\/policy@1\.0\.0;/); // a well-formed component
  const path = join(mkdtempSync(join(tmpdir(), 'contract-1.0.0-')), 'agent_retry_policy.wasm');
  writeFileSync(path, other);
  await assert.rejects(PolicyComponent.load({ wasmPath: path }), (e: unknown) => {
    assert.ok(e instanceof ContractVersionMismatch, String(e));
    assert.equal(e.componentVersion, '1.0.0');
    assert.equal(e.hostVersion, '0.9.0');
    assert.match(e.message, /speaks agent-retry:policy@1\.0\.0 but this host speaks @0\.9\.0/);
    assert.ok(e.message.includes(path));
    return true;
  });
  // The genuine component still loads.
  assert.ok(await PolicyComponent.load({ wasmPath: wasm }));
});

// 0.8.0 is the contract before this one (0.9.0 added the snapshot and resume of
// an escalated run); 0.7.0 the one before it; 0.10.0 the next.
for (const other of ['0.7.0', '0.8.0', '0.10.0']) {
  test(`a real component of the contract @${other} (an earlier, the next) is refused at load, naming both versions`, async () => {
    const wasm = locateComponent();
    assert.ok(wasm, 'the repository build is needed for this test (make wasm)');
    // The same component with its interfaces renamed: a component of another
    // 0.x minor is refused on its version alone, before anything of it is transpiled.
    const wat = await print(readFileSync(wasm));
    const renamed = await parse(wat.replace(/(agent-retry:policy\/[a-z-]+)@0\.9\.0/g, `$1@${other}`));
    assert.ok((await componentWit(renamed)).includes(`export agent-retry:policy/policy@${other};`));
    const path = join(mkdtempSync(join(tmpdir(), `contract-${other}-`)), 'agent_retry_policy.wasm');
    writeFileSync(path, renamed);
    await assert.rejects(PolicyComponent.load({ wasmPath: path }), (e: unknown) => {
      assert.ok(e instanceof ContractVersionMismatch, String(e));
      assert.equal(e.componentVersion, other);
      assert.equal(e.hostVersion, '0.9.0');
      assert.ok(e.message.includes(`speaks agent-retry:policy@${other} but this host speaks @0.9.0`), e.message);
      return true;
    });
  });
}

test('a transpilation of another contract version is refused too', async () => {
  const generated = resolve(fileURLToPath(import.meta.url), '../../generated');
  const dir = mkdtempSync(join(tmpdir(), 'generated-'));
  cpSync(generated, dir, { recursive: true });
  const source = JSON.parse(readFileSync(join(dir, 'source.json'), 'utf8'));
  writeFileSync(join(dir, 'source.json'), JSON.stringify({ ...source, exports: policyAt('0.1.0') }));
  await assert.rejects(PolicyComponent.load({ generatedDir: dir }),
    (e: unknown) => e instanceof ContractVersionMismatch && /@0\.1\.0 but this host speaks @0\.9\.0/.test(e.message));
  const { exports: _, ...older } = source;
  writeFileSync(join(dir, 'source.json'), JSON.stringify(older));
  await assert.rejects(PolicyComponent.load({ generatedDir: dir }),
    (e: unknown) => e instanceof ComponentLoadError && /npm run transpile/.test(e.message));
});
