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
// installed package uses it as `PolicyComponent.load({ generatedDir: outDir })`
// (or loads the .wasm itself with `PolicyComponent.load({ wasmPath })`, which
// transpiles at run time into a cache); it needs @bytecodealliance/jco (1.12.0,
// the version this package is built with) installed beside it.
//
// The transpilation itself (jco's options and the sandbox's edits of its glue) is
// scripts/jco-transpile.mjs, which the runtime loader uses too.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { loadJco, transpileComponent } from './jco-transpile.mjs';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repoWasm = resolve(packageRoot, '../../target/component/agent_retry_policy.wasm');
let jco;
try {
  jco = await loadJco(import.meta.url);
} catch (e) {
  console.error(e.message);
  process.exit(1);
}
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
let transpiled;
try {
  transpiled = await transpileComponent(jco, readFileSync(source), source);
} catch (e) {
  console.error(`${source}: ${e.message}`);
  process.exit(1);
}
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
for (const [name, data] of Object.entries(transpiled.files)) {
  mkdirSync(dirname(join(out, name)), { recursive: true });
  writeFileSync(join(out, name), data);
}
writeFileSync(join(out, 'source.json'), JSON.stringify(transpiled.source, null, 2) + '\n');
console.log(`transpiled ${source} with jco ${jco.version} into ${out}`);
