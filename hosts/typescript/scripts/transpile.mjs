// Transpiles the policy component into generated/ with jco (`--instantiation async`,
// so the host supplies the component's imports itself) and records which .wasm it
// came from, so that the runtime can tell a stale transpilation from a fresh one.
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

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repoWasm = resolve(packageRoot, '../../target/wasm32-wasip2/wasm-release/agent_retry_policy.wasm');
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
const sha256 = createHash('sha256').update(readFileSync(source)).digest('hex');
writeFileSync(join(out, 'source.json'), JSON.stringify({ wasm: source, sha256, jco: jcoVersion }, null, 2) + '\n');
console.log(`transpiled ${source} with jco ${jcoVersion} into ${out}`);
