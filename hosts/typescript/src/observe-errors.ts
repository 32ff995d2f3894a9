// The built-in mappings of `withPolicy`: a failed `fetch` (a `Response` that is
// not ok, or what `fetch` rejected with) and the errors of the `openai` and
// `@anthropic-ai/sdk` clients, as the contract's observation. They only
// translate: the status, the headers as received, the body text (bounded by
// src/limits.ts), the transport fault and how far the request got. What any of
// it means is the policy's to say.
import type * as Wit from '../generated/interfaces/agent-retry-policy-types.js';
import { ObservedFailure } from './errors.js';
import { MAX_BODY_BYTES, cutUtf8, joinedHeaders } from './limits.js';
import { classifyNetworkError, deliveryOfNetworkError, describeError } from './mcp/capture.js';

/** Translates an error into an observation, or undefined when it does not know it. */
export type ObserveError = (error: unknown) => Wit.Observation | undefined | Promise<Wit.Observation | undefined>;

const failure = (kind: Wit.FailureKind, headers: string, body: string, delivery: Wit.Delivery): Wit.Observation =>
  ({ kind, headers, body: cutUtf8(body, MAX_BODY_BYTES), structuredContent: undefined, sessionIdSent: false, delivery });

/** The header pairs of a `Headers` (or anything with `forEach(value, name)`), in its order. */
function headerPairs(headers: unknown): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  const h = headers as { forEach?: (f: (value: string, name: string) => void) => void } | undefined;
  if (h && typeof h.forEach === 'function') {
    h.forEach((value, name) => {
      pairs.push([String(name), String(value)]);
    });
  } else if (h && typeof h === 'object') {
    for (const [name, value] of Object.entries(h)) if (value !== undefined) pairs.push([name, String(value)]);
  }
  return pairs;
}

/** At most `MAX_BODY_BYTES` of a body's text: the rest is not read (a huge
 *  answer costs no more than the limit). */
async function boundedText(response: Response): Promise<string> {
  const body = response.body;
  if (body === null) return '';
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    // One byte over the limit tells a cut body from a whole one; cutUtf8 cuts at a character.
    while (size <= MAX_BODY_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.byteLength;
    }
  } catch {
    // a body cut while read: what arrived is the body
  } finally {
    reader.cancel().catch(() => undefined);
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  return cutUtf8(new TextDecoder().decode(bytes), MAX_BODY_BYTES);
}

/** A `Response` that is not ok, as observed: `http-status`, its headers as
 *  received, its body text (bounded). Reads (and so uses up) the body. */
export async function observeResponse(response: Response): Promise<Wit.Observation> {
  return failure({ tag: 'http-status', val: response.status }, joinedHeaders(headerPairs(response.headers)), await boundedText(response), 'answer-started');
}

/** The names of an object's classes, from its own up. */
function classNames(value: unknown): string[] {
  const names: string[] = [];
  let proto = value !== null && typeof value === 'object' ? Object.getPrototypeOf(value) : null;
  while (proto !== null && proto !== Object.prototype && names.length < 16) {
    const name = (proto as { constructor?: { name?: unknown } }).constructor?.name;
    if (typeof name === 'string') names.push(name);
    proto = Object.getPrototypeOf(proto);
  }
  return names;
}

const isNamed = (error: unknown, name: string): boolean => (error as { name?: unknown } | undefined)?.name === name;

/** A network error of `fetch` (undici's `TypeError: fetch failed` and its cause), or undefined. */
function observeFetchError(error: unknown): Wit.Observation | undefined {
  if (!(error instanceof TypeError) || error.message !== 'fetch failed') return undefined;
  const code = socketCode(error);
  // A socket the other side closed under the request (undici's UND_ERR_SOCKET, "other side closed").
  if (code === 'UND_ERR_SOCKET') return failure({ tag: 'transport', val: 'stream-closed' }, '', describeError(error), 'sent');
  return failure({ tag: 'transport', val: classifyNetworkError(error) }, '', describeError(error), deliveryOfNetworkError(error));
}

/** The first `code` along an error's causes. */
function socketCode(error: unknown): string | undefined {
  let e: unknown = error;
  for (let depth = 0; depth < 8 && e !== null && typeof e === 'object'; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    e = (e as { cause?: unknown }).cause ?? (e instanceof AggregateError ? e.errors[0] : undefined);
  }
  return undefined;
}

/** An error of the `openai` or `@anthropic-ai/sdk` client (by its class: the
 *  packages are optional, and both name them alike), or undefined. */
function observeSdkError(error: unknown): Wit.Observation | undefined {
  const names = classNames(error);
  if (!names.includes('APIError')) return undefined;
  // The caller's own abort is not a failure of the call.
  if (names.includes('APIUserAbortError')) return undefined;
  if (names.includes('APIConnectionTimeoutError')) return failure({ tag: 'transport', val: 'timeout' }, '', describeError(error), 'unknown');
  if (names.includes('APIConnectionError')) {
    const cause = (error as { cause?: unknown }).cause;
    const underneath = cause === undefined ? undefined : observeFetchError(cause) ?? observeAbort(cause);
    return underneath ?? failure({ tag: 'transport', val: 'other' }, '', describeError(error), 'unknown');
  }
  const e = error as { status?: unknown; headers?: unknown; error?: unknown; message?: unknown };
  if (typeof e.status !== 'number' || !Number.isInteger(e.status) || e.status < 0 || e.status > 0xffff) return undefined;
  // The SDKs keep the parsed JSON body (`error`), or its text in the message after the status.
  let body: string;
  if (e.error !== undefined && e.error !== null) {
    try {
      body = typeof e.error === 'string' ? e.error : JSON.stringify(e.error);
    } catch {
      body = String(e.error);
    }
  } else {
    const message = typeof e.message === 'string' ? e.message : '';
    const prefix = `${e.status} `;
    body = message === `${e.status} status code (no body)` ? '' : message.startsWith(prefix) ? message.slice(prefix.length) : message;
  }
  return failure({ tag: 'http-status', val: e.status }, joinedHeaders(headerPairs(e.headers)), body, 'answer-started');
}

/** An `AbortError` or `TimeoutError` (e.g. `AbortSignal.timeout`), as a transport timeout. */
function observeAbort(error: unknown): Wit.Observation | undefined {
  if (!isNamed(error, 'TimeoutError') && !isNamed(error, 'AbortError')) return undefined;
  return failure({ tag: 'transport', val: 'timeout' }, '', describeError(error), 'unknown');
}

/** The built-in mapping: an `ObservedFailure`'s observation; a `Response` thrown
 *  as it is; `fetch`'s network errors; an `AbortError` / `TimeoutError`; the
 *  `openai` and `@anthropic-ai/sdk` errors. Undefined for anything else: an
 *  error nobody maps is a bug in the caller's code. */
export function observeError(error: unknown): Wit.Observation | undefined | Promise<Wit.Observation> {
  if (error instanceof ObservedFailure) return error.observation;
  if (typeof Response !== 'undefined' && error instanceof Response) return error.ok ? undefined : observeResponse(error);
  return observeFetchError(error) ?? observeSdkError(error) ?? observeAbort(error);
}
