#!/usr/bin/env node
// Writes the registry metadata of a WebAssembly component into its custom
// sections, in the layout of wasm-tools' `wasm-metadata` crate (what
// `wasm-tools metadata add --name ... --version ...` writes and what `wkg`,
// `wasm-tools metadata show` and OCI registries read):
//   component-name  subsection 0: the component's name (`wkg publish` reads the
//                   package name from it: namespace:name); other subsections kept
//   version, licenses (SPDX), source, homepage, revision, description: UTF-8 text
// Sections of these names already present are replaced, so running it twice
// gives the same bytes. No dependencies (jco's `metadata-add` writes only the
// producers section).
//
//   node tests/dist/add-metadata.mjs IN.wasm OUT.wasm --name agent-retry:policy --version 0.4.0 \
//        --licenses Apache-2.0 --source URL [--homepage URL] [--revision SHA] [--description TEXT]
import { readFileSync, writeFileSync } from 'node:fs';

const FIELDS = ['version', 'licenses', 'source', 'homepage', 'revision', 'description', 'authors'];
const [input, output, ...rest] = process.argv.slice(2);
if (!input || !output) {
  console.error('usage: add-metadata.mjs IN.wasm OUT.wasm --name NS:NAME --version X.Y.Z --licenses SPDX --source URL ...');
  process.exit(2);
}
const options = {};
for (let i = 0; i < rest.length; i += 2) {
  if (!rest[i].startsWith('--') || rest[i + 1] === undefined) { console.error(`bad option ${rest[i]}`); process.exit(2); }
  options[rest[i].slice(2)] = rest[i + 1];
}
for (const key of Object.keys(options)) {
  if (key !== 'name' && !FIELDS.includes(key)) { console.error(`unknown field --${key}`); process.exit(2); }
}

const bytes = readFileSync(input);
const COMPONENT_HEADER = Buffer.from([0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]);
if (!bytes.subarray(0, 8).equals(COMPONENT_HEADER)) {
  console.error(`${input} is not a WebAssembly component (layer 1, version 0x0d)`);
  process.exit(1);
}

function readU32(buf, at) {
  let value = 0, shift = 0, pos = at;
  for (;;) {
    const byte = buf[pos++];
    value += (byte & 0x7f) * 2 ** shift;
    if (!(byte & 0x80)) return [value, pos];
    shift += 7;
  }
}
function u32(n) {
  const out = [];
  do { let b = n & 0x7f; n = Math.floor(n / 128); if (n) b |= 0x80; out.push(b); } while (n);
  return Buffer.from(out);
}
const str = (s) => { const b = Buffer.from(s, 'utf8'); return Buffer.concat([u32(b.length), b]); };
const custom = (name, payload) => { const body = Buffer.concat([str(name), payload]); return Buffer.concat([Buffer.from([0]), u32(body.length), body]); };

const replaced = new Set(FIELDS.filter((f) => options[f] !== undefined));
const kept = [COMPONENT_HEADER];
// The component's name is subsection 0 of `component-name`; the section's other
// subsections (names of the component's items) are kept as they are.
let otherNames = [];
for (let pos = 8; pos < bytes.length;) {
  const start = pos;
  const id = bytes[pos++];
  const [size, body] = readU32(bytes, pos);
  const end = body + size;
  if (end > bytes.length) { console.error(`${input}: a section runs past the end`); process.exit(1); }
  let drop = false;
  if (id === 0) {
    const [length, at] = readU32(bytes, body);
    const name = bytes.subarray(at, at + length).toString('utf8');
    drop = replaced.has(name);
    if (name === 'component-name' && options.name) {
      drop = true;
      for (let sub = at + length; sub < end;) {
        const subId = bytes[sub];
        const [subSize, subBody] = readU32(bytes, sub + 1);
        if (subId !== 0) otherNames.push(bytes.subarray(sub, subBody + subSize));
        sub = subBody + subSize;
      }
    }
  }
  if (!drop) kept.push(bytes.subarray(start, end));
  pos = end;
}
if (options.name) {
  const name = str(options.name);
  kept.push(custom('component-name', Buffer.concat([Buffer.from([0]), u32(name.length), name, ...otherNames])));
}
for (const field of FIELDS) {
  if (options[field] !== undefined) kept.push(custom(field, Buffer.from(options[field], 'utf8')));
}
const result = Buffer.concat(kept);
writeFileSync(output, result);
console.log(`${output}: ${result.length} bytes (${result.length - bytes.length >= 0 ? '+' : ''}${result.length - bytes.length}), ` +
  Object.entries(options).map(([k, v]) => `${k}=${v}`).join(', '));
