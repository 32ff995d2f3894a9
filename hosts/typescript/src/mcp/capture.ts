// The capturing fetch and the watching of answer bodies: what the HTTP layer saw
// for one attempt (`AttemptCapture`) of the MCP wrapper (`../mcp.ts`, whose module
// comment says what the SDK hides and why the wrapper captures it).
import { AsyncLocalStorage } from 'node:async_hooks';

import type * as Wit from '../../generated/interfaces/agent-retry-policy-types.js';

/** How much of a failed response's body is kept (the policy keeps at most `max-message-chars`). */
const MAX_CAPTURED_BODY = 64 * 1024;

/** What the HTTP layer saw for one attempt. */
export interface AttemptCapture {
  status?: number;
  headers: Array<[string, string]>;
  body: string;
  transportError?: Wit.TransportError;
  transportDetail?: string;
  /** A request of the attempt went through a capturing fetch (the transport captures). */
  fetched?: boolean;
  /** The failed request carried `Mcp-Session-Id` and the answer says the server does not know it. */
  sessionLost?: boolean;
  /** JSON-RPC ids of the attempt's requests whose response has not been read yet (JSON-stringified). */
  pendingIds?: Set<string>;
  /** The answer stream carried an SSE event id: the SDK resumes it (GET with Last-Event-ID) when it ends cleanly. */
  resumable?: boolean;
  /** Set by the wrapper: ends the attempt at once (its answer stream was cut). */
  abort?: () => void;
  /** The attempt is over: later requests (a cancellation notice, a stream resumed late) do not write here. */
  closed?: boolean;
  /** How the v2 SDK's `server/discover` probe failed, kept apart: a 4xx there
   *  (other than 401, 403, 408, 429: `isProbeFailureStatus`) is how a 2025
   *  server says "use initialize", and the SDK goes on with it. It is the
   *  attempt's failure only if the connect then fails with nothing sent after it
   *  (`adoptProbeFailure`). */
  probe?: ProbeFailure;
}

/** What the HTTP layer saw of a failed `server/discover` probe. */
export type ProbeFailure = Pick<AttemptCapture, 'status' | 'headers' | 'body' | 'transportError' | 'transportDetail'>;

/** Whether an HTTP status answering the `server/discover` probe is the connect
 *  attempt's failure (the rule of all three hosts): 401, 403, 408, 429 or any
 *  5xx. Any other 4xx (400, 404, 405, 413, ...) is a 2025 server's refusal of
 *  the probe: the handshake follows. */
export const isProbeFailureStatus = (status: number): boolean =>
  status === 401 || status === 403 || status === 408 || status === 429 || status >= 500;

/** What the capturing fetch throws for a `server/discover` probe answered with
 *  a status that is the attempt's failure (`isProbeFailureStatus`): a rejected
 *  fetch, which the v2 SDK reads as a failed probe (`ERA_NEGOTIATION_FAILED`),
 *  never as a legacy server's refusal (it would read a 408 or a 429 so, and
 *  fall back to `initialize`). The attempt's capture holds the status, headers
 *  and body. */
export class ProbeAnswerFailed extends Error {
  override readonly name = 'ProbeAnswerFailed';
  constructor(readonly status: number, readonly body: string) {
    super(`the server answered the server/discover probe with HTTP ${status}${body ? `: ${body.slice(0, 200)}` : ''}`);
  }
}

/** The probe's failure as the attempt's, when the connect failed with nothing sent after the probe. */
export function adoptProbeFailure(capture: AttemptCapture): void {
  if (!capture.probe || !hasFailure(capture.probe) || hasFailure(capture)) return;
  Object.assign(capture, capture.probe);
  capture.probe = undefined;
}

/** The capture of the attempt in progress (it follows the SDK's request into its fetch). */
export const currentAttempt = new AsyncLocalStorage<AttemptCapture>();

export type FetchLike = (url: string | URL, init?: RequestInit) => Promise<Response>;

function errorCode(error: unknown): string | undefined {
  // undici reports the socket's error code on `cause` (sometimes inside an AggregateError).
  let cause: unknown = error;
  for (let depth = 0; depth < 5 && cause; depth++) {
    const code = (cause as { code?: unknown }).code;
    // SDK v2's SdkError has a code of its own (ERA_NEGOTIATION_FAILED): the socket's is on its cause.
    const sdkError = /^Sdk/.test(String((cause as { name?: unknown }).name));
    if (typeof code === 'string' && !sdkError) return code;
    const nested = (cause as { errors?: unknown[] }).errors;
    if (Array.isArray(nested) && nested.length) cause = nested[0];
    else cause = (cause as { cause?: unknown }).cause;
  }
  return undefined;
}

/** A network error from `fetch` as the contract's transport error. */
export function classifyNetworkError(error: unknown): Wit.TransportError {
  switch (errorCode(error)) {
    case 'ECONNREFUSED': case 'UND_ERR_CONNECT_TIMEOUT': case 'EHOSTUNREACH': case 'ENETUNREACH':
      return 'connection-refused'; // the request never reached the server
    case 'ECONNRESET': case 'EPIPE': case 'UND_ERR_SOCKET':
      return 'connection-reset';
    case 'UND_ERR_HEADERS_TIMEOUT': case 'UND_ERR_BODY_TIMEOUT': case 'ETIMEDOUT':
      return 'timeout';
    case 'UND_ERR_CLOSED':
      return 'stream-closed';
    default:
      return 'other'; // DNS, TLS, ...: not a blip, so the policy escalates
  }
}

export const describeError = (e: unknown): string => {
  let message = e instanceof Error ? e.message : String(e);
  // undici's "fetch failed" says nothing: its cause does (e.g. "unable to verify the first certificate").
  const cause = (e as { cause?: unknown } | undefined)?.cause;
  if (message === 'fetch failed' && cause instanceof Error && cause.message) message = `fetch failed: ${cause.message}`;
  const code = errorCode(e);
  return code && !message.includes(code) ? `${message} (${code})` : message;
};

const isAbortError = (e: unknown): boolean => (e as { name?: unknown } | undefined)?.name === 'AbortError';

/** Whether an HTTP answer to a request that carried `Mcp-Session-Id` means the
 *  server does not know the session: a 404 (streamable HTTP's rule), unless its
 *  body is a JSON-RPC "method not found" (-32601, which rmcp answers with 404:
 *  the server ran the request), or a 400 whose body says the session id is not
 *  valid (the TypeScript SDK's servers: "Bad Request: No valid session ID provided"). */
export function isUnknownSession(status: number, body: string): boolean {
  if (status === 404) return !/"code"\s*:\s*-32601\b/.test(body);
  if (status === 400) return /no valid session|invalid session|session (id )?(is )?(not valid|invalid|not found|unknown|expired)|unknown session/i.test(body);
  return false;
}

function headerOf(headers: HeadersInit | undefined, name: string): string | undefined {
  if (!headers) return undefined;
  if (headers instanceof Headers) return headers.get(name) ?? undefined;
  const entries = Array.isArray(headers) ? headers : Object.entries(headers);
  const found = entries.find(([key]) => key.toLowerCase() === name);
  return found ? String(found[1]) : undefined;
}

interface RpcMessage { id?: unknown; method?: unknown; result?: unknown; error?: unknown }

/** The JSON-RPC messages of a POST's body (none if it is not JSON text). */
function rpcMessages(body: unknown): RpcMessage[] {
  if (typeof body !== 'string') return [];
  try {
    const value: unknown = JSON.parse(body);
    const all = Array.isArray(value) ? value : [value];
    return all.filter((m): m is RpcMessage => typeof m === 'object' && m !== null);
  } catch {
    return [];
  }
}

export const hasFailure = (capture: ProbeFailure) => capture.status !== undefined || capture.transportError !== undefined;

/** The attempt's answer stream was cut before its response: `stream-closed`, and the attempt ends now. */
function cutAnswer(capture: AttemptCapture, detail: string): void {
  if (capture.closed || hasFailure(capture)) return;
  capture.transportError = 'stream-closed';
  capture.transportDetail = detail;
  capture.abort?.();
}

/** The response with its body passed through a watcher that sees the JSON-RPC
 *  responses go by (SSE) and the body's end: an answer that ends, or errors,
 *  before the response of every request the POST carried is `stream-closed`. A
 *  JSON body that ends without an error is whole (HTTP's framing); an SSE
 *  stream that ends cleanly after an event id is resumed by the SDK (a GET with
 *  Last-Event-ID, watched the same way). */
function watchAnswer(response: Response, capture: AttemptCapture, what: string): Response {
  const source = response.body;
  if (!source) return response;
  const sse = (response.headers.get('content-type') ?? '').toLowerCase().includes('text/event-stream');
  const pending = capture.pendingIds ?? new Set<string>();
  const reader = source.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  const onEvent = (event: string) => {
    const data: string[] = [];
    for (const line of event.split(/\r\n|\n|\r/)) {
      if (line.startsWith('id:')) {
        if (line.slice(3).trim() !== '') capture.resumable = true;
      } else if (line.startsWith('data:')) {
        data.push(line.slice(5).replace(/^ /, ''));
      } else if (line === 'data') {
        data.push('');
      }
    }
    if (!data.length) return;
    for (const message of rpcMessages(data.join('\n'))) {
      if ('id' in message && !('method' in message) && ('result' in message || 'error' in message)) pending.delete(JSON.stringify(message.id));
    }
  };
  const scan = (chunk: Uint8Array) => {
    buffer += decoder.decode(chunk, { stream: true });
    for (let boundary = /\r\n\r\n|\n\n|\r\r/.exec(buffer); boundary; boundary = /\r\n\r\n|\n\n|\r\r/.exec(buffer)) {
      onEvent(buffer.slice(0, boundary.index));
      buffer = buffer.slice(boundary.index + boundary[0].length);
    }
  };
  const ended = (error?: unknown) => {
    if (capture.closed || (error !== undefined && isAbortError(error))) return; // over, or the transport closed it
    if (!sse) {
      if (error === undefined) return;
    } else {
      if (pending.size === 0) return; // every response came
      if (error === undefined && capture.resumable) return; // the SDK resumes it
    }
    const kind = sse ? 'SSE' : 'JSON';
    cutAnswer(capture, `the ${kind} answer to ${what} ended before its JSON-RPC response${error === undefined ? '' : `: ${describeError(error)}`}`);
  };
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e) {
        ended(e);
        controller.error(e);
        return;
      }
      if (chunk.done) {
        ended();
        controller.close();
        return;
      }
      if (sse) scan(chunk.value);
      controller.enqueue(chunk.value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
}

/** What a capturing fetch tells its owner (an `McpConnection`). */
export interface CapturingFetchHooks {
  /** A request that carried this `Mcp-Session-Id` (a POST or the GET stream)
   *  was answered "unknown session" (`isUnknownSession`). */
  onSessionLost?: (sessionId: string, detail: string) => void;
}

/** A `fetch` for `StreamableHTTPClientTransport`'s `fetch` option that lets the
 *  wrapper see failed POSTs, cut answer streams and lost sessions. Requests
 *  outside a wrapped call pass through untouched (but a lost session is still
 *  reported to `hooks`). `McpConnection.http` installs one itself. */
export function createCapturingFetch(inner: FetchLike = fetch, hooks: CapturingFetchHooks = {}): FetchLike {
  return async (url, init) => {
    const method = (init?.method ?? 'GET').toUpperCase();
    const sessionId = headerOf(init?.headers, 'mcp-session-id');
    const live = currentAttempt.getStore();
    const capture = live && !live.closed ? live : undefined;
    const messages = method === 'POST' ? rpcMessages(init?.body) : [];
    const requestIds = messages.filter((m) => m.id !== undefined && typeof m.method === 'string').map((m) => JSON.stringify(m.id));
    const cancelling = messages.length > 0 && messages.every((m) => m.method === 'notifications/cancelled');
    const probing = messages.some((m) => m.method === 'server/discover');
    // What writes to the attempt's capture: its POSTs (not the notice that
    // cancels one), and the SDK's resumption of its answer stream.
    const resuming = method === 'GET' && !!capture?.pendingIds?.size && headerOf(init?.headers, 'last-event-id') !== undefined;
    const records = capture !== undefined && ((method === 'POST' && !cancelling) || resuming);
    if (capture) capture.fetched = true;
    // A request after the probe (the SDK's fallback, or the era's first call): the probe's answer was not a failure.
    if (records && !probing) capture.probe = undefined;
    // The probe's failure is written apart (`AttemptCapture.probe`).
    const into: ProbeFailure | undefined = !records ? undefined : probing ? (capture.probe = { headers: [], body: '' }) : capture;
    const what = resuming ? 'the resumed answer stream' : messages.length ? String(messages[0].method ?? 'a response') : method;
    let response: Response;
    try {
      response = await inner(url, init);
    } catch (e) {
      if (into && !hasFailure(into) && !isAbortError(e)) {
        if (resuming) {
          cutAnswer(capture, `the answer stream could not be resumed: ${describeError(e)}`);
        } else {
          into.transportError = classifyNetworkError(e);
          into.transportDetail = describeError(e);
        }
      }
      throw e;
    }
    if (!response.ok) {
      const body = (await response.clone().text().catch(() => '')).slice(0, MAX_CAPTURED_BODY);
      if (probing && method === 'POST' && isProbeFailureStatus(response.status)) {
        // Not a legacy server's refusal: the attempt's failure, with what the
        // server said (a Retry-After for the policy), and the probe fails.
        if (records) {
          capture.probe = undefined;
          if (!hasFailure(capture)) {
            capture.status = response.status;
            response.headers.forEach((value, name) => capture.headers.push([name, value]));
            capture.body = body;
          }
        }
        await response.body?.cancel().catch(() => undefined);
        throw new ProbeAnswerFailed(response.status, body);
      }
      const lost = sessionId !== undefined && isUnknownSession(response.status, body);
      if (lost) hooks.onSessionLost?.(sessionId, `HTTP ${response.status} to ${what}: ${body.slice(0, 200)}`);
      if (into && !hasFailure(into)) {
        if (resuming) {
          cutAnswer(capture, `the answer stream could not be resumed: HTTP ${response.status} ${body.slice(0, 200)}`);
        } else {
          into.status = response.status;
          response.headers.forEach((value, name) => into.headers.push([name, value]));
          into.body = body;
          if (into === capture) capture.sessionLost = lost;
        }
      }
      return response;
    }
    if (records && response.status !== 202 && (requestIds.length || resuming)) {
      if (!resuming) capture.pendingIds = new Set(requestIds);
      return watchAnswer(response, capture, what);
    }
    return response;
  };
}
