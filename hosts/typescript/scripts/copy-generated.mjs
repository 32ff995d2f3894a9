// The compiled code loads jco's output from dist/generated (next to dist/src),
// and the live-update gate its invariants from dist/gate.json (a copy of the
// repository's tests/vectors/gate.json, shipped in the package like the wasm).
import { copyFileSync, cpSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
if (!existsSync(join(root, 'generated'))) {
  console.error('generated/ is missing: run `npm run transpile` first');
  process.exit(1);
}
cpSync(join(root, 'generated'), join(root, 'dist/generated'), { recursive: true });
const gate = resolve(root, '../../tests/vectors/gate.json');
if (!existsSync(gate)) {
  console.error(`${gate} is missing: the live-update gate needs it`);
  process.exit(1);
}
copyFileSync(gate, join(root, 'dist/gate.json'));
