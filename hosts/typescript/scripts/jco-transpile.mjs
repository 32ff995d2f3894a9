// jco's transpilation of a policy component, as this package runs it: shared by
// scripts/transpile.mjs (build time, generated/) and the runtime loader
// (src/component.ts: a .wasm other than the one the package carries, transpiled
// into a cache directory). One place for the options and for the sandbox's two
// edits of jco's glue, so the two paths cannot drift apart.
//
// Needs @bytecodealliance/jco 1.12.x (a dev dependency of this package, an
// optional peer dependency of the installed one).
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

/** The jco release line this package's glue edits are written for. */
export const JCO_VERSION = '1.12.0';
/** jco's options: `transpile --instantiation async --name agent_retry_policy`. */
export const TRANSPILE_OPTIONS = Object.freeze({ name: 'agent_retry_policy', instantiation: 'async' });
/** The glue module jco writes. */
export const GLUE_FILE = 'agent_retry_policy.js';
/** What the first edit makes of jco's decoder (the loader checks the glue has it). */
export const STRICT_DECODER = "new TextDecoder('utf-8', { fatal: true })";
/** Names this version of the edits (recorded in source.json; a cached
 *  transpilation made with other edits is made again). */
export const GLUE_EDITS_VERSION = 1;
/** The sandbox's edits of jco's glue: strings from the guest are decoded
 *  strictly, so invalid UTF-8 is an error (jco's decoder would replace it
 *  silently); and a resource the garbage collector drops cannot throw out of a
 *  FinalizationRegistry callback (which would end the process) when its instance
 *  has trapped. */
export const GLUE_EDITS = Object.freeze([
  ['const utf8Decoder = new TextDecoder();', `const utf8Decoder = ${STRICT_DECODER};`],
  ['return new FinalizationRegistry(unregister);',
    'return new FinalizationRegistry((handle) => { try { unregister(handle); } catch { /* the instance failed */ } });'],
]);

/** The install command for jco, for messages. */
export const JCO_INSTALL = `npm install @bytecodealliance/jco@${JCO_VERSION}`;

/** jco's glue with the sandbox's edits; throws if jco's output has changed. */
export function editGlue(glue, where = GLUE_FILE) {
  let patched = glue;
  for (const [from, to] of GLUE_EDITS) {
    if (!patched.includes(from)) {
      throw new Error(`jco's glue has changed: "${from}" not found in ${where}; this package is written for jco ${JCO_VERSION}`);
    }
    patched = patched.replace(from, to);
  }
  return patched;
}

/** Where jco is installed, resolved from `from` (a file path or URL: where
 *  this package is installed), without loading it: `{ entry, root, version }`.
 *  Throws an Error saying what to install if it is missing or of another
 *  release line. */
export function findJco(from) {
  let entry;
  try {
    entry = createRequire(from).resolve('@bytecodealliance/jco');
  } catch {
    throw new Error(`@bytecodealliance/jco is not installed: \`${JCO_INSTALL}\``);
  }
  const root = resolve(dirname(entry), '..');
  const version = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version;
  if (!sameLine(version)) {
    throw new Error(`@bytecodealliance/jco ${version} is installed, but this package's glue edits are written for ` +
      `${JCO_VERSION}: \`${JCO_INSTALL}\``);
  }
  return { entry, root, version };
}

/** Whether a jco version is of the release line the edits are written for (1.12.x). */
export function sameLine(version) {
  return typeof version === 'string' && version.startsWith(JCO_VERSION.replace(/\d+$/, ''));
}

/** jco's JavaScript API (`{ api, version, root }`), resolved as `findJco` does. */
export async function loadJco(from) {
  const found = findJco(from);
  const api = await import(pathToFileURL(found.entry).href);
  return { api, version: found.version, root: found.root };
}

/** The interfaces a component's world exports and imports (from jco's reading of its WIT). */
export async function worldOf(jco, bytes) {
  const wit = await jco.api.componentWit(bytes);
  const names = (word) => [...wit.matchAll(new RegExp(`^\\s*${word}\\s+([^\\s;:]+(?::[^\\s;]+)?)\\s*;`, 'gm'))].map((m) => m[1]);
  return { exports: names('export'), imports: names('import') };
}

/** Transpiles `bytes` with jco's API and applies the glue edits. Returns the
 *  files (relative name -> bytes) and the record for source.json
 *  (`{ wasm, sha256, jco, glueEdits, exports, imports }`). */
export async function transpileComponent(jco, bytes, wasmName) {
  const { files } = await jco.api.transpile(bytes, { ...TRANSPILE_OPTIONS });
  const out = { ...files };
  if (!(GLUE_FILE in out)) throw new Error(`jco wrote no ${GLUE_FILE}; this package is written for jco ${JCO_VERSION}`);
  out[GLUE_FILE] = new TextEncoder().encode(editGlue(new TextDecoder().decode(out[GLUE_FILE])));
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  const source = { wasm: wasmName, sha256, jco: jco.version, glueEdits: GLUE_EDITS_VERSION, ...(await worldOf(jco, bytes)) };
  return { files: out, source };
}

/** `transpileComponent` on a worker thread, so that jco's work (its own wasm,
 *  a few hundred ms of CPU for this component) does not hold up the caller's
 *  event loop. jco is resolved from `from`, as `findJco` does. */
export function transpileInWorker(from, bytes, wasmName) {
  return new Promise((resolvePromise, reject) => {
    // The process's flags, but not --input-type (a host started with `-e` has it, and a worker refuses it).
    const execArgv = process.execArgv.filter((flag) => !flag.startsWith('--input-type'));
    const worker = new Worker(new URL(import.meta.url), { execArgv, workerData: { agentRetryTranspile: true, from, bytes, wasmName } });
    let settled = false;
    worker.once('message', (message) => {
      settled = true;
      if (message.ok) resolvePromise(message.result);
      else reject(new Error(message.message));
      void worker.terminate();
    });
    worker.once('error', (e) => {
      if (!settled) reject(e);
      settled = true;
    });
    worker.once('exit', (code) => {
      if (!settled) reject(new Error(`the transpiling worker exited with code ${code}`));
      settled = true;
    });
  });
}

if (!isMainThread && workerData?.agentRetryTranspile) {
  try {
    const jco = await loadJco(workerData.from);
    const result = await transpileComponent(jco, workerData.bytes, workerData.wasmName);
    parentPort.postMessage({ ok: true, result });
  } catch (e) {
    parentPort.postMessage({ ok: false, message: String(e?.message ?? e) });
  }
}
