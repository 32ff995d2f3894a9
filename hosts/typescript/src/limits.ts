// What the host passes to the policy, bounded before it crosses the boundary
// (contract 0.7.0; the numbers of the Rust host's hosts/rust/src/limits.rs, mirrored
// into limits-generated.ts by tests/contract/make_mirrors.py).
// Lowering a value into the guest costs its size in the guest's memory and in
// copying, so a 40 MB tool error or 5,800 headers are cut here, not in the guest.
// Sizes are UTF-8 bytes, as the guest sees them.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';

// The numbers come from the Rust host's limits.rs, through the generated mirror.
import {
  MAX_BODY_BYTES, MAX_CONFIG_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES, MAX_ID_BYTES, MAX_LIFTED_TEXT_BYTES, MAX_SERVER_BYTES,
  MAX_STRUCTURED_BYTES,
} from './limits-generated.js';

export {
  MAX_BODY_BYTES, MAX_CONFIG_BYTES, MAX_HEADERS, MAX_HEADER_VALUE_BYTES, MAX_ID_BYTES, MAX_LIFTED_TEXT_BYTES, MAX_SERVER_BYTES, MAX_STRUCTURED_BYTES,
};

const encoder = new TextEncoder();
let scratch = new Uint8Array(MAX_BODY_BYTES);

/** The UTF-8 length of `text` (a lone surrogate counts as U+FFFD, 3 bytes, as jco encodes it). */
export function utf8Length(text: string): number {
  return Buffer.byteLength(text, 'utf8');
}

/** Whether `text` is longer than `max` UTF-8 bytes. A code unit is 1 to 3
 *  bytes, so only a text between max/3 and max code units is counted. */
export function exceedsUtf8(text: string, max: number): boolean {
  if (text.length > max) return true;
  if (text.length * 3 <= max) return false;
  return utf8Length(text) > max;
}

/** `text` cut to at most `max` UTF-8 bytes, at a character boundary. */
export function cutUtf8(text: string, max: number): string {
  if (text.length <= max / 3) return text; // at most 3 bytes a code unit: within
  // A prefix of max bytes has at most max code units; the one after them never
  // fits, so a surrogate pair split there is not written as U+FFFD.
  if (text.length > max) text = text.slice(0, max + 1);
  if (scratch.length < max) scratch = new Uint8Array(max);
  // encodeInto writes whole characters only: `read` ends at a character boundary.
  const { read } = encoder.encodeInto(text, scratch.subarray(0, max));
  return read === text.length ? text : text.slice(0, read);
}

/** A text lifted from the policy (a reason, a message, a note) as the host
 *  logs or returns it: at most `MAX_LIFTED_TEXT_BYTES`, cut at a character
 *  boundary and marked ` … [cut: N bytes]` (N: the bytes removed), so a policy
 *  cannot fill a log or a model's context. */
export function cutLiftedText(text: string): string {
  if (!exceedsUtf8(text, MAX_LIFTED_TEXT_BYTES)) return text;
  const kept = cutUtf8(text, MAX_LIFTED_TEXT_BYTES);
  return `${kept} … [cut: ${utf8Length(text) - utf8Length(kept)} bytes]`;
}

/** The observation as the host passes it: the same object when it is within
 *  every limit (body, structured content, header lines and their length). */
export function boundedObservation(observation: Wit.Observation): Wit.Observation {
  const structured = observation.structuredContent;
  const headers = observation.headers;
  const boundedHeaders = boundedHeaderText(headers);
  const headersWithin = boundedHeaders === headers;
  const within = !exceedsUtf8(observation.body, MAX_BODY_BYTES)
    && (structured === undefined || !exceedsUtf8(structured, MAX_STRUCTURED_BYTES))
    && headersWithin;
  if (within) return observation;
  return {
    ...observation,
    headers: boundedHeaders,
    body: cutUtf8(observation.body, MAX_BODY_BYTES),
    structuredContent: structured !== undefined && !exceedsUtf8(structured, MAX_STRUCTURED_BYTES) ? structured : undefined,
  };
}

/** Header text (`name: value` lines) within the limits: at most `MAX_HEADERS`
 *  lines, each name and value cut to `MAX_HEADER_VALUE_BYTES`. */
export function boundedHeaderText(text: string): string {
  if (text === '') return text;
  const lines = text.split('\n');
  let changed = lines.length > MAX_HEADERS;
  const kept = lines.slice(0, MAX_HEADERS).map((line) => {
    const colon = line.indexOf(':');
    const [name, value] = colon < 0 ? [line, undefined] : [line.slice(0, colon), line.slice(colon + 1)];
    const cutName = cutUtf8(name, MAX_HEADER_VALUE_BYTES);
    // The value's leading space is not counted against its limit.
    const cutValue = value === undefined ? undefined : cutUtf8(value, MAX_HEADER_VALUE_BYTES + 1);
    if (cutName !== name || cutValue !== value) changed = true;
    return cutValue === undefined ? cutName : `${cutName}:${cutValue}`;
  });
  return changed ? kept.join('\n') : text;
}

/** An empty result's detail as the host passes it (cut to `MAX_BODY_BYTES`). */
export function boundedDetail(detail: string): string {
  return exceedsUtf8(detail, MAX_BODY_BYTES) ? cutUtf8(detail, MAX_BODY_BYTES) : detail;
}

/** A task report as the host passes it: its message (a status message, or the
 *  server's questions) cut to `MAX_BODY_BYTES`, as the Rust host cuts it. */
export function boundedTaskReport(task: Wit.TaskReport): Wit.TaskReport {
  return exceedsUtf8(task.message, MAX_BODY_BYTES) ? { ...task, message: cutUtf8(task.message, MAX_BODY_BYTES) } : task;
}

const LINE_BREAK = /[\r\n]/g;

/** One header name or value for a `name: value` line: `\r` and `\n` become spaces
 *  (they would end the line; the guest splits lines at `\n`). */
function oneLine(text: string): string {
  return text.indexOf('\n') < 0 && text.indexOf('\r') < 0 ? text : text.replace(LINE_BREAK, ' ');
}

/** Header pairs as an observation's `headers` (contract 0.7.0): each header a
 *  `name: value` line, the lines joined with `\n`, after the limits of
 *  headers (at most `MAX_HEADERS`, each name and value cut to
 *  `MAX_HEADER_VALUE_BYTES`); a `\r` or `\n` in a name or value becomes a space. */
export function joinedHeaders(headers: ReadonlyArray<readonly [string, string]>): string {
  const count = headers.length < MAX_HEADERS ? headers.length : MAX_HEADERS;
  if (count === 0) return '';
  let text = '';
  for (let i = 0; i < count; i++) {
    const header = headers[i];
    const line = `${oneLine(cutUtf8(header[0], MAX_HEADER_VALUE_BYTES))}: ${oneLine(cutUtf8(header[1], MAX_HEADER_VALUE_BYTES))}`;
    text = i === 0 ? line : `${text}\n${line}`;
  }
  return text;
}

/** `[input, sizeBytes, limitBytes]` if `value` is longer than `max` UTF-8 bytes. */
export function overLimit(input: string, value: string, max = MAX_ID_BYTES): [string, number, number] | undefined {
  return exceedsUtf8(value, max) ? [input, utf8Length(value), max] : undefined;
}
