// Loading a .wasm at run time (no `npm run transpile && npm run build`): jco's
// API transpiles it on a worker thread into a cache keyed by its SHA-256, with
// the same options and glue edits as scripts/transpile.mjs (one shared module);
// a cached transpilation is reused; two processes racing on one cache are safe;
// the contract and import checks come before jco runs.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import { PolicyComponent, defaultCacheDir, locateComponent } from '../src/component.js';
import { ComponentImportRefused, ComponentLoadError, ContractVersionMismatch } from '../src/errors.js';
import type { Observation } from '../src/index.js';

const here = fileURLToPath(import.meta.url);
const packageRoot = resolve(here, '../../..');
const fixtures = resolve(packageRoot, '../../target/hostile');
const FAILURE: Observation = { kind: { tag: 'http-status', val: 503 }, headers: 'Retry-After: 2', body: '', sessionIdSent: false, delivery: 'answer-started' };

/** Another build of the real component (a custom section appended): another digest, the same policy. */
function otherBuild(tag: string): string {
  const wasm = locateComponent();
  assert.ok(wasm, 'the repository build is needed (make wasm)');
  const dir = mkdtempSync(join(tmpdir(), 'runtime-load-'));
  const path = join(dir, 'policy.wasm');
  const name = Buffer.from('agent-retry-test');
  const body = Buffer.concat([Buffer.from([name.length]), name, Buffer.from(`${tag}-${process.pid}-${Date.now()}`)]);
  writeFileSync(path, Buffer.concat([readFileSync(wasm), Buffer.from([0, body.length]), body]));
  return path;
}

const shared = () => import(pathToFileURL(join(packageRoot, 'scripts/jco-transpile.mjs')).href);

test('a .wasm is transpiled at run time once, then loaded from the cache', async () => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-cache-'));
  const wasm = otherBuild('cold');
  const bytes = readFileSync(wasm);
  let start = performance.now();
  const cold = await PolicyComponent.fromBytes(bytes, { source: wasm, cacheDir });
  const coldMs = performance.now() - start;
  start = performance.now();
  const cached = await PolicyComponent.fromBytes(bytes, { source: wasm, cacheDir });
  const cachedMs = performance.now() - start;
  console.log(`runtime load of a new .wasm: ${coldMs.toFixed(0)} ms cold (jco transpiles), ${cachedMs.toFixed(0)} ms from the cache`);
  assert.equal(cold.origin, 'transpiled');
  assert.equal(cached.origin, 'cache');
  assert.notEqual(cold, cached, 'fromBytes compiles each time');
  const entries = readdirSync(cacheDir);
  assert.deepEqual(entries, [cold.source.sha256], 'one directory, named by the SHA-256, no temporary left');
  const source = JSON.parse(readFileSync(join(cacheDir, entries[0], 'source.json'), 'utf8'));
  assert.equal(source.sha256, cold.source.sha256);
  assert.deepEqual(source.exports, ['agent-retry:policy/policy@0.9.0']);
  // The same glue edits as scripts/transpile.mjs: the cached glue equals the package's own, the
  // components differing only in a custom section jco does not carry over.
  const bundledGlue = readFileSync(join(packageRoot, 'generated/agent_retry_policy.js'), 'utf8');
  assert.equal(readFileSync(join(cacheDir, entries[0], 'agent_retry_policy.js'), 'utf8'), bundledGlue);
  for (const component of [cold, cached]) {
    assert.equal((await component.instantiate()).loadPolicy({}).classify(FAILURE, 0n).class, 'transient');
  }
  // load() memoizes per content: a second load of the same bytes is the same component.
  const a = await PolicyComponent.load({ wasmPath: wasm, cacheDir });
  assert.equal(a.origin, 'cache');
  assert.equal(await PolicyComponent.load({ wasmPath: wasm, cacheDir }), a);
});

test('the bundled component loads from generated/ without jco, whatever its path', async () => {
  const wasm = locateComponent();
  assert.ok(wasm);
  const copy = join(mkdtempSync(join(tmpdir(), 'bundled-')), 'renamed.wasm');
  copyFileSync(wasm, copy);
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-cache-'));
  const component = await PolicyComponent.fromBytes(readFileSync(copy), { cacheDir });
  assert.equal(component.origin, 'bundled');
  assert.deepEqual(readdirSync(cacheDir), [], 'nothing transpiled');
});

test('the contract and import checks come before jco: nothing is transpiled for a refused component', async () => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-cache-'));
  await assert.rejects(PolicyComponent.load({ wasmPath: join(fixtures, 'other-major.wasm'), cacheDir }),
    (e: unknown) => e instanceof ContractVersionMismatch && ['0.8.0', '0.10.0'].includes(e.componentVersion) &&
      /@0\.(8|10)\.0 but this host speaks @0\.9\.0/.test(e.message));
  await assert.rejects(PolicyComponent.load({ wasmPath: join(fixtures, 'extra-import-sockets.wasm'), cacheDir }),
    (e: unknown) => e instanceof ComponentImportRefused && e.importName === 'wasi:sockets/instance-network@0.2.6');
  await assert.rejects(PolicyComponent.load({ wasmPath: join(fixtures, 'wrong-world.wasm'), cacheDir }),
    (e: unknown) => e instanceof ComponentLoadError && /exports no agent-retry:policy\/policy/.test(e.message) && /acme:scheduler\/policy@/.test(e.message));
  await assert.rejects(PolicyComponent.fromBytes(Buffer.from('\0asm not really'), { cacheDir }), ComponentLoadError);
  assert.deepEqual(readdirSync(cacheDir), []);
});

test('two processes racing to transpile the same .wasm into one cache both load it', async () => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-cache-'));
  const wasm = otherBuild('race');
  const script = `import { PolicyComponent } from ${JSON.stringify(pathToFileURL(join(packageRoot, 'dist/src/component.js')).href)};
    const c = await PolicyComponent.load({ wasmPath: ${JSON.stringify(wasm)}, cacheDir: ${JSON.stringify(cacheDir)} });
    const i = await c.instantiate();
    console.log(c.origin, i.loadPolicy({}).startRun('r').runId);`;
  const run = () => promisify(execFile)(process.execPath, ['--input-type=module', '-e', script]);
  const results = await Promise.all([run(), run(), run()]);
  const origins = results.map((r) => r.stdout.trim());
  console.log(`three processes racing: ${origins.join(', ')}`);
  for (const line of origins) assert.match(line, /^(transpiled|cache) r$/);
  assert.deepEqual(readdirSync(cacheDir).filter((f) => !f.startsWith('.')).length, 1);
  assert.deepEqual(readdirSync(cacheDir).filter((f) => f.startsWith('.')), [], 'no temporary directory left');
});

test('a stale or foreign cache entry is not used', async () => {
  const cacheDir = mkdtempSync(join(tmpdir(), 'agent-retry-cache-'));
  const wasm = otherBuild('stale');
  const first = await PolicyComponent.load({ wasmPath: wasm, cacheDir });
  const entry = join(cacheDir, first.source.sha256);
  // Made with other glue edits: transpiled again.
  const source = JSON.parse(readFileSync(join(entry, 'source.json'), 'utf8'));
  writeFileSync(join(entry, 'source.json'), JSON.stringify({ ...source, glueEdits: 0 }));
  const again = await PolicyComponent.fromBytes(readFileSync(wasm), { cacheDir });
  assert.equal(again.origin, 'transpiled');
  assert.equal(JSON.parse(readFileSync(join(entry, 'source.json'), 'utf8')).glueEdits, source.glueEdits);
  // Lenient glue (another script's): refused at load.
  writeFileSync(join(entry, 'agent_retry_policy.js'), readFileSync(join(entry, 'agent_retry_policy.js'), 'utf8')
    .replace("new TextDecoder('utf-8', { fatal: true })", 'new TextDecoder()'));
  await assert.rejects(PolicyComponent.fromBytes(readFileSync(wasm), { cacheDir }), /decodes the guest's strings leniently/);
  // A cache others may write to is refused (its code would run here).
  if (typeof process.getuid === 'function') {
    chmodSync(cacheDir, 0o777);
    await assert.rejects(PolicyComponent.fromBytes(readFileSync(wasm), { cacheDir }),
      (e: unknown) => e instanceof ComponentLoadError && /mode 777/.test(e.message) && /cacheDir/.test(e.message));
  }
});

test('the default cache is $AGENT_RETRY_CACHE_DIR, else $XDG_CACHE_HOME, else the temporary directory', () => {
  const saved = { a: process.env.AGENT_RETRY_CACHE_DIR, x: process.env.XDG_CACHE_HOME };
  try {
    delete process.env.AGENT_RETRY_CACHE_DIR;
    process.env.XDG_CACHE_HOME = '/var/cache/me';
    assert.equal(defaultCacheDir(), '/var/cache/me/agent-retry-policy');
    delete process.env.XDG_CACHE_HOME;
    assert.ok(defaultCacheDir().startsWith(join(tmpdir(), 'agent-retry-policy')));
    process.env.AGENT_RETRY_CACHE_DIR = '/srv/cache';
    assert.equal(defaultCacheDir(), '/srv/cache');
  } finally {
    for (const [k, v] of [['AGENT_RETRY_CACHE_DIR', saved.a], ['XDG_CACHE_HOME', saved.x]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});

test('without jco, the error says what to install; another jco release line is refused too', async () => {
  const { findJco, JCO_INSTALL, editGlue } = await shared();
  const nowhere = join(mkdtempSync(join(tmpdir(), 'no-jco-')), 'x.js');
  assert.throws(() => findJco(nowhere), (e: unknown) => e instanceof Error &&
    /@bytecodealliance\/jco is not installed/.test(e.message) && e.message.includes(JCO_INSTALL));
  assert.match(JCO_INSTALL, /npm install @bytecodealliance\/jco@1\.12\.0/);
  // A fake jco 1.35.0 next to a script: refused, naming both versions.
  const root = mkdtempSync(join(tmpdir(), 'new-jco-'));
  const pkg = join(root, 'node_modules/@bytecodealliance/jco');
  const { mkdirSync } = await import('node:fs');
  mkdirSync(join(pkg, 'src'), { recursive: true });
  writeFileSync(join(pkg, 'package.json'), JSON.stringify({ name: '@bytecodealliance/jco', version: '1.35.0', main: 'src/api.js' }));
  writeFileSync(join(pkg, 'src/api.js'), '');
  assert.throws(() => findJco(join(root, 'x.js')), /jco 1\.35\.0 is installed, but .* written for 1\.12\.0/);
  // The glue edits fail loudly on glue they do not know.
  assert.throws(() => editGlue('export function instantiate() {}'), /jco's glue has changed/);
  assert.ok(existsSync(join(packageRoot, 'scripts/transpile.mjs')));
  assert.match(readFileSync(join(packageRoot, 'scripts/transpile.mjs'), 'utf8'), /from '\.\/jco-transpile\.mjs'/, 'one shared module');
});

// Issue 24: `PolicyComponent.load("/path.wasm")` from plain JavaScript (the
// path where the options belong) loaded the bundled component, silently.
test('load refuses a path given in place of its options, naming what to write', async () => {
  const load = PolicyComponent.load as unknown as (options: unknown) => Promise<PolicyComponent>;
  await assert.rejects(load('/tmp/some.wasm'), (e: Error) => e instanceof TypeError && e.message.includes('{ wasmPath: "/tmp/some.wasm" }'));
  await assert.rejects(load(null), TypeError);
});
