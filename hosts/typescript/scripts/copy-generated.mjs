// The compiled code loads jco's output from dist/generated (next to dist/src).
import { cpSync, existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
if (!existsSync(join(root, 'generated'))) {
  console.error('generated/ is missing: run `npm run transpile` first');
  process.exit(1);
}
cpSync(join(root, 'generated'), join(root, 'dist/generated'), { recursive: true });
