#!/usr/bin/env node
// Transpiles the policy component into generated/ with jco (`--instantiation async`,
// so the host supplies the component's imports itself) and records which .wasm it
// came from and what it exports, so that the runtime can tell a stale
// transpilation from a fresh one and check the contract version the code speaks.
//
//   node scripts/transpile.mjs [path/to/agent_retry_policy.wasm [out-dir]]
//   npx agent-retry-policy-transpile file.wasm out-dir     (from the installed package)
//
// The .wasm: the argument, else $AGENT_RETRY_WASM, else the repository's build
// output (`make wasm`). The output: out-dir, else the package's generated/. An
// installed package uses it as `PolicyComponent.load({ generatedDir: outDir })`;
// it needs @bytecodealliance/jco (1.12.0, the version this package is built with)
// installed beside it.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repoWasm = resolve(packageRoot, '../../target/component/agent_retry_policy.wasm');
let jcoApi;
try {
  jcoApi = createRequire(import.meta.url).resolve('@bytecodealliance/jco');
} catch {
  console.error('@bytecodealliance/jco is not installed: `npm install -D @bytecodealliance/jco@1.12.0`');
  process.exit(1);
}
const jcoRoot = resolve(dirname(jcoApi), '..');
const { componentWit } = await import(pathToFileURL(jcoApi).href);
const [source, how] = process.argv[2]
  ? [resolve(process.argv[2]), 'the argument']
  : process.env.AGENT_RETRY_WASM
    ? [resolve(process.env.AGENT_RETRY_WASM), '$AGENT_RETRY_WASM']
    : [repoWasm, "the repository's build output"];
if (!existsSync(source)) {
  console.error(`the agent-retry policy component was not found at ${source} (${how}). ` +
    'Build it with `make wasm` in the repository root, or set AGENT_RETRY_WASM.');
  process.exit(1);
}
const out = process.argv[3] ? resolve(process.argv[3]) : join(packageRoot, 'generated');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const jco = join(jcoRoot, 'src/jco.js');
execFileSync(process.execPath, [jco, 'transpile', source, '-o', out, '--instantiation', 'async',
  '--name', 'agent_retry_policy', '--quiet'], { stdio: 'inherit' });
// The sandbox's two edits of jco's glue (src/component.ts checks the first):
// strings from the guest are decoded strictly, so invalid UTF-8 is an error (jco's
// decoder would replace it silently); and a resource the garbage collector drops
// cannot throw out of a FinalizationRegistry callback (which would end the
// process) when its instance has trapped.
const gluePath = join(out, 'agent_retry_policy.js');
const glue = readFileSync(gluePath, 'utf8');
const edits = [
  ['const utf8Decoder = new TextDecoder();', "const utf8Decoder = new TextDecoder('utf-8', { fatal: true });"],
  ['return new FinalizationRegistry(unregister);', 'return new FinalizationRegistry((handle) => { try { unregister(handle); } catch { /* the instance failed */ } });'],
];
let patched = glue;
for (const [from, to] of edits) {
  if (!patched.includes(from)) {
    console.error(`jco's glue has changed: "${from}" not found in ${gluePath}; this script is written for jco 1.12.0`);
    process.exit(1);
  }
  patched = patched.replace(from, to);
}
writeFileSync(gluePath, patched);
const jcoVersion = JSON.parse(readFileSync(join(jcoRoot, 'package.json'), 'utf8')).version;
const bytes = readFileSync(source);
const sha256 = createHash('sha256').update(bytes).digest('hex');
// The component's exports (`agent-retry:policy/policy@X.Y.Z`), from its world.
const wit = await componentWit(bytes);
const exports = [...wit.matchAll(/^\s*export\s+([^\s;:]+(?::[^\s;]+)?)\s*;/gm)].map((m) => m[1]);
// And what it imports, so that a load without the .wasm can still refuse an import outside the contract.
const imports = [...wit.matchAll(/^\s*import\s+([^\s;:]+(?::[^\s;]+)?)\s*;/gm)].map((m) => m[1]);
writeFileSync(join(out, 'source.json'), JSON.stringify({ wasm: source, sha256, jco: jcoVersion, exports, imports }, null, 2) + '\n');
console.log(`transpiled ${source} with jco ${jcoVersion} into ${out}`);
