// The signed publication (issue 24, row 2): tests/vectors/fleet/manifests.json,
// the Rust and Python hosts' too. `signPublication` writes the same manifest as
// they do (Ed25519 is deterministic), and `verifyPublication` accepts the good
// cases and refuses each refusal with the same words.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { ManifestError, checkCovers, parseManifest, signPublication, statement, verifyPublication } from '../src/manifest.js';

interface Parts { description: string; wasm: string; config: string; vectors: string | null; revision: number | null }
interface Doc {
  description: string;
  test_only_seed: string;
  public_key: string;
  manifest_at: string;
  cases: Array<Parts & { statement: string; manifest: string }>;
  refusals: Array<Parts & { manifest: string | null; legacy_signature_at: string | null; error: string[] }>;
}

const here = dirname(fileURLToPath(import.meta.url));
const doc = JSON.parse(readFileSync(join(here, '../../../../tests/vectors/fleet/manifests.json'), 'utf8')) as Doc;
const seed = Uint8Array.from(Buffer.from(doc.test_only_seed, 'hex'));
const publicKey = Uint8Array.from(Buffer.from(doc.public_key, 'hex'));
const read = (parts: Parts) => ({ wasm: Buffer.from(parts.wasm, 'hex'), config: parts.config, vectors: parts.vectors, revision: parts.revision });

test('manifests.json: every case signs to its manifest and verifies', () => {
  assert.ok(doc.cases.length >= 5 && doc.refusals.length >= 20);
  assert.match(doc.description, /TEST-ONLY/);
  for (const c of doc.cases) {
    const parts = read(c);
    assert.equal(statement(parts.wasm, parts.config, parts.vectors, parts.revision), c.statement, c.description);
    const manifest = signPublication(seed, parts.wasm, parts.config, parts.vectors, parts.revision);
    assert.equal(manifest, c.manifest, c.description);
    verifyPublication(publicKey, manifest, doc.manifest_at, parts);
  }
});

test('manifests.json: every refusal is refused with its words', () => {
  for (const c of doc.refusals) {
    assert.throws(() => verifyPublication(publicKey, c.manifest, doc.manifest_at, read(c), c.legacy_signature_at ?? undefined), (e: unknown) => {
      assert.ok(e instanceof ManifestError, `${c.description}: ${String(e)}`);
      for (const word of c.error) assert.ok(e.message.includes(word), `${c.description}: ${e.message} lacks ${word}`);
      return true;
    });
  }
});

test('publishing checks that the manifest covers the parts; signing checks its inputs', () => {
  const wasm = Buffer.from('wasm');
  const parsed = parseManifest(signPublication(new Uint8Array(32), wasm, '{}', null, 5), 'm');
  assert.equal(parsed.revision, 5);
  checkCovers(parsed, 'm', wasm, '{}', null);
  assert.throws(() => checkCovers(parsed, 'm', wasm, '{"max-attempts-per-call": 100}', null), /config-sha256 .* changed after signing/);
  assert.throws(() => signPublication(new Uint8Array(32), wasm, '{}', null, 0), RangeError);
  assert.throws(() => signPublication(new Uint8Array(31), wasm, '{}'), /32 bytes/);
});
