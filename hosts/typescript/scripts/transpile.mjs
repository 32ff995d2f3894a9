// Transpiles the policy component into generated/ with jco (`--instantiation async`,
// so the host supplies the component's imports itself) and records which .wasm it
// came from and what it exports, so that the runtime can tell a stale
// transpilation from a fresh one and check the contract version the code speaks.
//
//   node scripts/transpile.mjs [path/to/agent_retry_policy.wasm]
//
// The .wasm: the argument, else $AGENT_RETRY_WASM, else the repository's build
// output (`make wasm`).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { componentWit } from '@bytecodealliance/jco';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repoWasm = resolve(packageRoot, '../../target/component/agent_retry_policy.wasm');
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
const out = join(packageRoot, 'generated');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const jco = join(packageRoot, 'node_modules/@bytecodealliance/jco/src/jco.js');
execFileSync(process.execPath, [jco, 'transpile', source, '-o', out, '--instantiation', 'async',
  '--name', 'agent_retry_policy', '--quiet'], { stdio: 'inherit' });
const jcoVersion = JSON.parse(readFileSync(join(packageRoot, 'node_modules/@bytecodealliance/jco/package.json'), 'utf8')).version;
const bytes = readFileSync(source);
const sha256 = createHash('sha256').update(bytes).digest('hex');
// The component's exports (`agent-retry:policy/policy@X.Y.Z`), from its world.
const exports = [...(await componentWit(bytes)).matchAll(/^\s*export\s+([^\s;:]+(?::[^\s;]+)?)\s*;/gm)].map((m) => m[1]);
writeFileSync(join(out, 'source.json'), JSON.stringify({ wasm: source, sha256, jco: jcoVersion, exports }, null, 2) + '\n');
console.log(`transpiled ${source} with jco ${jcoVersion} into ${out}`);
