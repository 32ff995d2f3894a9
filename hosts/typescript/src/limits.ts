// What the host passes to the policy, bounded before it crosses the boundary
// (contracts 0.3.0 and 0.4.0; the numbers of the Rust host's hosts/rust/src/limits.rs).
// Lowering a value into the guest costs its size in the guest's memory and in
// copying, so a 40 MB tool error or 5,800 headers are cut here, not in the guest.
// Sizes are UTF-8 bytes, as the guest sees them.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';

/** The most bytes of a failure's body (or tool-error text, or empty-result detail) passed. */
export const MAX_BODY_BYTES = 65_536;
/** The most bytes of structured content passed; longer is dropped (cut JSON is not JSON). */
export const MAX_STRUCTURED_BYTES = 65_536;
/** The most headers passed (the policy reads 64 and names the rest). */
export const MAX_HEADERS = 128;
/** The most bytes of one header name or value passed (the policy parses up to 1,024). */
export const MAX_HEADER_VALUE_BYTES = 4_096;
/** The longest run id, action id, tool name or idempotency key. */
export const MAX_ID_BYTES = 256;
/** The longest configuration text. */
export const MAX_CONFIG_BYTES = 1 << 20;

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

/** The failure as the host passes it: the same object when it is within every limit. */
export function boundedFailure(failure: Wit.Failure): Wit.Failure {
  const headers = failure.headers;
  const structured = failure.structuredContent;
  const within = !exceedsUtf8(failure.body, MAX_BODY_BYTES)
    && (structured === undefined || !exceedsUtf8(structured, MAX_STRUCTURED_BYTES))
    && headers.length <= MAX_HEADERS
    && headers.every(([name, value]) => !exceedsUtf8(name, MAX_HEADER_VALUE_BYTES) && !exceedsUtf8(value, MAX_HEADER_VALUE_BYTES));
  if (within) return failure;
  return {
    kind: failure.kind,
    headers: headers.slice(0, MAX_HEADERS).map(([name, value]) => [cutUtf8(name, MAX_HEADER_VALUE_BYTES), cutUtf8(value, MAX_HEADER_VALUE_BYTES)]),
    body: cutUtf8(failure.body, MAX_BODY_BYTES),
    structuredContent: structured !== undefined && !exceedsUtf8(structured, MAX_STRUCTURED_BYTES) ? structured : undefined,
  };
}

/** The outcome as the host passes it: the same object when it is within every limit. */
export function boundedOutcome(outcome: Wit.Outcome): Wit.Outcome {
  if (outcome.tag === 'failure') {
    const failure = boundedFailure(outcome.val);
    return failure === outcome.val ? outcome : { tag: 'failure', val: failure };
  }
  if (outcome.tag === 'empty-result' && exceedsUtf8(outcome.val, MAX_BODY_BYTES)) {
    return { tag: 'empty-result', val: cutUtf8(outcome.val, MAX_BODY_BYTES) };
  }
  return outcome;
}

const LINE_BREAK = /[\r\n]/g;

/** One header name or value for a `name: value` line: `\r` and `\n` become spaces
 *  (they would end the line; the guest splits lines at `\n`). */
function oneLine(text: string): string {
  return text.indexOf('\n') < 0 && text.indexOf('\r') < 0 ? text : text.replace(LINE_BREAK, ' ');
}

/** The headers as `record-failure` takes them (contract 0.4.0): each header a
 *  `name: value` line, the lines joined with `\n`, after the limits of a
 *  failure's headers (at most `MAX_HEADERS`, each name and value cut to
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
