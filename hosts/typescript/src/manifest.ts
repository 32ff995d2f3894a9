// The signed manifest: one Ed25519 signature over the whole publication (the
// `.wasm`'s digest, the configuration's, the vectors' and the revision), so
// that nothing of a publication can be changed, removed or added after
// signing. The Rust (`manifest.rs`) and Python (`manifest.py`) hosts write and
// check the same text, replayed from tests/vectors/fleet/manifests.json.
//
// Six lines, each ending "\n":
//
//   agent-retry publication 1
//   wasm-sha256 <64 lowercase hex>
//   config-sha256 <64 lowercase hex>
//   vectors-sha256 <64 lowercase hex, or none>
//   revision <decimal revision, or none (files)>
//   signature <128 lowercase hex: Ed25519 over the first five lines' bytes>
//
// The first five lines are the *statement*. A host builds the statement of
// what it actually read and compares it line by line with the manifest's: the
// first line that differs is named. Then the signature must verify.
import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';

import { AgentRetryError } from './errors.js';
import { MAX_REVISION } from './fleet-scripts.js';

export const MANIFEST_HEADER = 'agent-retry publication 1';
export const MAX_MANIFEST_BYTES = 4096;
/** DER prefix of an Ed25519 PKCS#8 private key; the raw 32-byte seed follows. */
const ED25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
/** DER prefix of an Ed25519 SubjectPublicKeyInfo; the raw 32-byte key follows. */
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/** Why a publication's manifest is refused: `kind` is 'unsigned', 'malformed',
 *  'mismatch' (what was read is not what was signed), 'signature' (does not
 *  verify under the key) or 'key' (the configured key is not valid). */
export class ManifestError extends AgentRetryError {
  constructor(readonly kind: 'unsigned' | 'malformed' | 'mismatch' | 'signature' | 'key', message: string) {
    super(message);
  }
}

/** Bytes, or a text taken as its UTF-8 bytes. */
export type Bytes = Uint8Array | string;
const bytesOf = (value: Bytes): Buffer => (typeof value === 'string' ? Buffer.from(value, 'utf8') : Buffer.from(value));
const sha256Hex = (bytes: Bytes): string => createHash('sha256').update(bytesOf(bytes)).digest('hex');

function checkRevision(revision: number | null | undefined): void {
  if (revision !== null && revision !== undefined && !(Number.isSafeInteger(revision) && revision >= 1 && revision <= MAX_REVISION)) {
    throw new RangeError(`a revision is an integer from 1 to ${MAX_REVISION} (or null for files), got ${String(revision)}`);
  }
}

/** The statement of a publication (the manifest's first five lines) from what
 *  was read: the vectors' text and the fleet's revision, or null for either. */
export function statement(wasm: Uint8Array, config: Bytes, vectors: Bytes | null | undefined, revision: number | null | undefined): string {
  return (
    `${MANIFEST_HEADER}\n` +
    `wasm-sha256 ${sha256Hex(wasm)}\n` +
    `config-sha256 ${sha256Hex(config)}\n` +
    `vectors-sha256 ${vectors === null || vectors === undefined ? 'none' : sha256Hex(vectors)}\n` +
    `revision ${revision === null || revision === undefined ? 'none' : String(revision)}\n`
  );
}

/** Signs a publication with the 32-byte Ed25519 seed; returns the manifest.
 *  `revision`: the fleet revision it is published under (1 to MAX_REVISION),
 *  or null for files. Throws RangeError for a seed that is not 32 bytes or a
 *  revision out of range. */
export function signPublication(
  secretKey: Uint8Array, wasm: Uint8Array, config: Bytes, vectors: Bytes | null = null, revision: number | null = null,
): string {
  if (!(secretKey instanceof Uint8Array) || secretKey.length !== 32) {
    throw new RangeError(`an Ed25519 seed is 32 bytes, got ${secretKey instanceof Uint8Array ? secretKey.length : typeof secretKey}`);
  }
  checkRevision(revision);
  const text = statement(wasm, config, vectors, revision);
  const key = createPrivateKey({ key: Buffer.concat([ED25519_PKCS8_PREFIX, secretKey]), format: 'der', type: 'pkcs8' });
  return `${text}signature ${sign(null, Buffer.from(text, 'utf8'), key).toString('hex')}\n`;
}

/** A manifest in the format, read. */
export interface Manifest {
  /** The statement's lines, without their newlines. */
  readonly lines: readonly string[];
  /** The revision line, null for `none`. */
  readonly revision: number | null;
  readonly signature: Buffer;
}

const HEX64 = /^[0-9a-f]{64}$/;
const HEX128 = /^[0-9a-f]{128}$/;
const revisionOk = (value: string): boolean =>
  value === 'none' || (value.length <= 16 && /^[1-9][0-9]*$/.test(value) && Number(value) <= MAX_REVISION);

/** Reads a manifest; throws `ManifestError` ('malformed') naming what is
 *  wrong: size, lines, first line, a field that is not lowercase hex or a revision. */
export function parseManifest(data: Bytes, at: string): Manifest {
  const raw = bytesOf(data);
  const malformed = (why: string) => new ManifestError('malformed', `the signed manifest at ${at} is malformed: ${why}`);
  if (raw.length > MAX_MANIFEST_BYTES) throw malformed(`it is ${raw.length} bytes, more than ${MAX_MANIFEST_BYTES}`);
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(raw);
  } catch {
    throw malformed('it is not UTF-8 text');
  }
  if (!text.endsWith('\n')) throw malformed('its last line does not end with a newline');
  const lines = text.slice(0, -1).split('\n');
  if (lines.length !== 6) throw malformed(`it has ${lines.length} lines, not 6`);
  if (lines[0] !== MANIFEST_HEADER) throw malformed(`its first line is ${JSON.stringify(lines[0].slice(0, 80))}, not "${MANIFEST_HEADER}"`);
  const field = (i: number, name: string, what: string, ok: (value: string) => boolean): string => {
    const line = lines[i];
    if (line.startsWith(`${name} `) && ok(line.slice(name.length + 1))) return line.slice(name.length + 1);
    throw malformed(`line ${i + 1} is ${JSON.stringify(line.slice(0, 80))}, not "${name} ${what}"`);
  };
  field(1, 'wasm-sha256', '<64 lowercase hex digits>', (v) => HEX64.test(v));
  field(2, 'config-sha256', '<64 lowercase hex digits>', (v) => HEX64.test(v));
  field(3, 'vectors-sha256', '<64 lowercase hex digits, or none>', (v) => v === 'none' || HEX64.test(v));
  const revision = field(4, 'revision', `<decimal digits from 1 to ${MAX_REVISION}, or none>`, revisionOk);
  const signature = field(5, 'signature', '<128 lowercase hex digits>', (v) => HEX128.test(v));
  return Object.freeze({
    lines: Object.freeze(lines.slice(0, 5)),
    revision: revision === 'none' ? null : Number(revision),
    signature: Buffer.from(signature, 'hex'),
  });
}

/** The first line of `read` (a statement) that differs from the manifest's, in words. */
function firstDifference(manifest: Manifest, read: string): string | undefined {
  const actualLines = read.split('\n');
  for (let i = 0; i < manifest.lines.length; i += 1) {
    const signed = manifest.lines[i];
    const actual = actualLines[i];
    if (signed === actual) continue;
    const space = signed.indexOf(' ');
    const name = signed.slice(0, space);
    const signedValue = signed.slice(space + 1);
    const actualValue = actual.slice(actual.indexOf(' ') + 1);
    if (name === 'wasm-sha256') return `wasm-sha256 ${signedValue} but the .wasm read has ${actualValue}: changed after signing`;
    if (name === 'config-sha256') return `config-sha256 ${signedValue} but the configuration read has ${actualValue}: changed after signing`;
    if (name === 'vectors-sha256' && actualValue === 'none') return `vectors-sha256 ${signedValue} but no vectors were published: removed after signing`;
    if (name === 'vectors-sha256' && signedValue === 'none') return `vectors-sha256 none but vectors ${actualValue} were published: added after signing`;
    if (name === 'vectors-sha256') return `vectors-sha256 ${signedValue} but the vectors read have ${actualValue}: changed after signing`;
    return `revision ${signedValue} but the publication read is revision ${actualValue}: not the revision it was signed for`;
  }
  return undefined;
}

/** What was read of a publication, to check against its manifest. */
export interface PublicationRead {
  readonly wasm: Uint8Array;
  readonly config: Bytes;
  readonly vectors: Bytes | null | undefined;
  /** The fleet's revision it was read under; null for files. */
  readonly revision: number | null | undefined;
}

/** Checks a publication against its manifest under the 32-byte `publicKey`
 *  (or its KeyObject); throws `ManifestError` when there is none
 *  (`legacySignatureAt`: where a signature over the .wasm alone was found, if
 *  one was), when it is malformed, when what was read differs from what was
 *  signed (the first differing line named), or when the signature does not verify. */
export function verifyPublication(
  publicKey: Uint8Array | KeyObject, manifest: Bytes | null | undefined, at: string, read: PublicationRead, legacySignatureAt?: string,
): void {
  if (manifest === null || manifest === undefined) {
    throw new ManifestError(
      'unsigned',
      `unsigned: no signed manifest at ${at}` +
        (legacySignatureAt === undefined
          ? ''
          : `; the signature at ${legacySignatureAt} is over the .wasm alone, and a signature over the .wasm alone (before 0.7) is not accepted: ` +
            'sign the whole publication (agent-retry sign)'),
    );
  }
  const parsed = parseManifest(manifest, at);
  const why = firstDifference(parsed, statement(read.wasm, read.config, read.vectors, read.revision));
  if (why !== undefined) throw new ManifestError('mismatch', `the signed manifest at ${at} covers ${why}`);
  let key: KeyObject;
  try {
    key = publicKey instanceof Uint8Array ? createPublicKey({ key: Buffer.concat([ED25519_SPKI_PREFIX, publicKey]), format: 'der', type: 'spki' }) : publicKey;
  } catch (e) {
    throw new ManifestError('key', `the configured public key is not valid: ${(e as Error).message}`);
  }
  if (!verify(null, Buffer.from(parsed.lines.map((line) => `${line}\n`).join(''), 'utf8'), key, parsed.signature)) {
    throw new ManifestError('signature', `the signed manifest at ${at} does not verify under the configured key: signed with another key, or edited after signing`);
  }
}

/** Throws (`ManifestError`, 'mismatch'), before anything is written, when the
 *  manifest does not cover these parts: what publishing checks. */
export function checkCovers(manifest: Manifest, at: string, wasm: Uint8Array, config: Bytes, vectors: Bytes | null | undefined): void {
  const why = firstDifference(manifest, statement(wasm, config, vectors, manifest.revision));
  if (why !== undefined) throw new ManifestError('mismatch', `the signed manifest at ${at} covers ${why}`);
}
