// The capturing fetch and the watching of answer bodies: what the HTTP layer saw
// for one attempt (`AttemptCapture`) of the MCP wrapper (`../mcp.ts`, whose module
// comment says what the SDK hides and why the wrapper captures it).
import { AsyncLocalStorage } from 'node:async_hooks';
import { subscribe } from 'node:diagnostics_channel';

import type * as Wit from '../../generated/interfaces/agent-retry-policy-types.js';

/** How much of a failed response's body is kept (the policy keeps at most `max-message-chars`). */
const MAX_CAPTURED_BODY = 64 * 1024;

/** What the HTTP layer saw for one attempt: raw facts, no reading of them (the
 *  policy decides what a status or a body means, a lost session included). */
export interface AttemptCapture {
  status?: number;
  /** The response's headers as received, in order. */
  headers: Array<[string, string]>;
  body: string;
  transportError?: Wit.TransportError;
  transportDetail?: string;
  /** How far the failed request got (with `transportError`). */
  delivery?: Wit.Delivery;
  /** A request of the attempt went through a capturing fetch (the transport captures). */
  fetched?: boolean;
  /** Whether the attempt's last request (the failed one, when it failed) carried `Mcp-Session-Id`. */
  sessionIdSent?: boolean;
  /** The response to one of the attempt's requests arrived (its status line and headers, at least). */
  answerStarted?: boolean;
  /** A JSON-RPC response (result or error) to one of the attempt's requests
   *  arrived through the transport (`watchAnswers`): what tells a server's
   *  error apart from the SDK's own for a request it gave up on. */
  answered?: boolean;
  /** The `result` of the last JSON-RPC response to one of the attempt's
   *  requests, as received: the v2 SDK turns a `resultType: "task"` answer
   *  into an error that drops the task, and an `input_required` it could not
   *  fulfil into one that drops the questions; the wrapper reads them here. */
  lastResult?: Record<string, unknown>;
  /** Set by the wrapper for a request whose raw answer it may report (a
   *  `tasks/get`): a JSON (not SSE) answer's body is then kept as received
   *  (`answerText`, at most 64 KiB, once it ended whole), for an answer the SDK cannot parse. */
  keepAnswerText?: boolean;
  answerText?: string;
  /** What the policy makes of an answer to the `server/discover` probe that is
   *  not a discovery result (`read-probe-answer`), set by the wrapper; without
   *  it the probe's answer is left to the SDK. */
  readProbeAnswer?: (httpStatus: number | undefined, jsonRpcCode: number | undefined) => Wit.ProbeAnswer;
  /** JSON-RPC ids of the attempt's requests whose response has not been read yet (JSON-stringified). */
  pendingIds?: Set<string>;
  /** The answer stream carried an SSE event id: the SDK resumes it (GET with Last-Event-ID) when it ends cleanly. */
  resumable?: boolean;
  /** Set by the wrapper: ends the attempt at once (its answer stream was cut). */
  abort?: () => void;
  /** The attempt is over: later requests (a cancellation notice, a stream resumed late) do not write here. */
  closed?: boolean;
  /** How the v2 SDK's `server/discover` probe failed, kept apart: an answer the
   *  policy reads as an `older-server` (`read-probe-answer`) is how a 2025
   *  server says "use initialize", and the SDK goes on with it. It is the
   *  attempt's failure only if the connect then fails with nothing sent after it
   *  (`adoptProbeFailure`). */
  probe?: ProbeFailure;
}

/** What the HTTP layer saw of a failed `server/discover` probe. */
export type ProbeFailure = Pick<AttemptCapture, 'status' | 'headers' | 'body' | 'transportError' | 'transportDetail' | 'delivery' | 'sessionIdSent'>;

/** The code of the JSON-RPC error an answer's body carries (a JSON object, or
 *  the `data:` lines of SSE events), if it carries one. */
export function jsonRpcErrorCode(body: string): number | undefined {
  const texts = /^\s*[[{]/.test(body) ? [body] : body.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5));
  for (const text of texts) {
    for (const message of rpcMessages(text)) {
      const code = (message.error as { code?: unknown } | undefined)?.code;
      if (typeof code === 'number' && Number.isInteger(code)) return code;
    }
  }
  return undefined;
}

/** What the capturing fetch throws for a `server/discover` probe whose answer
 *  the policy reads as the attempt's failure (`read-probe-answer`): a rejected
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

/** The transports whose messages are watched (`watchAnswers`). */
const watchedTransports = new WeakSet<object>();

type MessageHandler = (message: unknown, ...rest: unknown[]) => unknown;

/** Watches an SDK transport's messages for the answers to an attempt's
 *  requests: a request it sends inside an attempt (`currentAttempt`) is noted,
 *  and the JSON-RPC response to it, result or error, sets the attempt's
 *  `answered` before the SDK sees it. SDK v1 gives a server's -32000 / -32001
 *  error and its own ConnectionClosed / RequestTimeout (no answer) the same
 *  McpError: only whether an answer arrived tells them apart (HTTP and stdio
 *  alike). Installed once per transport, before it is connected. */
export function watchAnswers(transport: unknown): void {
  if (typeof transport !== 'object' || transport === null || watchedTransports.has(transport)) return;
  const watched = transport as { send?: unknown; onmessage?: unknown };
  const send = watched.send;
  if (typeof send !== 'function') return;
  watchedTransports.add(transport);
  const waiting = new Map<string, AttemptCapture>();
  watched.send = function (this: unknown, message: unknown, ...rest: unknown[]): unknown {
    const capture = currentAttempt.getStore();
    const request = message as RpcMessage | undefined;
    if (capture && !capture.closed && typeof request?.method === 'string' && request.id !== undefined && request.id !== null) {
      for (const [id, owner] of waiting) if (owner.closed) waiting.delete(id);
      waiting.set(JSON.stringify(request.id), capture);
    }
    return (send as MessageHandler).call(this, message, ...rest);
  };
  const note = (message: unknown) => {
    const response = message as RpcMessage | undefined;
    if (typeof response !== 'object' || response === null || 'method' in response || !('result' in response || 'error' in response)) return;
    const key = JSON.stringify(response.id);
    const owner = waiting.get(key);
    if (!owner) return;
    waiting.delete(key);
    if (owner.closed) return; // a late answer (the attempt is over) changes nothing
    owner.answered = true;
    const result = (response as { result?: unknown }).result;
    owner.lastResult = typeof result === 'object' && result !== null && !Array.isArray(result) ? result as Record<string, unknown> : undefined;
  };
  // The SDK sets `onmessage` when it connects (and chains what was there):
  // whatever it sets is called through `note` first.
  const noting = (handler: unknown): unknown => typeof handler !== 'function' ? handler
    : function (this: unknown, message: unknown, ...rest: unknown[]): unknown {
      note(message);
      return (handler as MessageHandler).call(this, message, ...rest);
    };
  let current = noting(watched.onmessage);
  Object.defineProperty(transport, 'onmessage', {
    configurable: true, enumerable: true, get: () => current, set: (handler: unknown) => { current = noting(handler); },
  });
}

/** The errors of an undici connect (TCP connect, TLS handshake), as undici
 *  publishes them: nothing of a request was written on that connection. */
const connectErrors = new WeakSet<object>();
subscribe('undici:client:connectError', (message) => {
  const error = (message as { error?: unknown } | undefined)?.error;
  if (typeof error === 'object' && error !== null) connectErrors.add(error);
});

/** The errors of the chain from a fetch error to the socket's (undici puts it
 *  on `cause`, sometimes inside an AggregateError). */
function errorChain(error: unknown): object[] {
  const chain: object[] = [];
  let cause: unknown = error;
  for (let depth = 0; depth < 5 && typeof cause === 'object' && cause !== null; depth++) {
    chain.push(cause);
    const nested = (cause as { errors?: unknown[] }).errors;
    cause = Array.isArray(nested) && nested.length ? nested[0] : (cause as { cause?: unknown }).cause;
  }
  return chain;
}

/** The socket's error of a fetch error: the first of the chain with a code of its own. */
function socketError(error: unknown): { code: string; syscall?: string } | undefined {
  for (const cause of errorChain(error)) {
    const { code, syscall } = cause as { code?: unknown; syscall?: unknown };
    // SDK v2's SdkError has a code of its own (ERA_NEGOTIATION_FAILED): the socket's is on its cause.
    const sdkError = /^Sdk/.test(String((cause as { name?: unknown }).name));
    if (typeof code === 'string' && !sdkError) return { code, syscall: typeof syscall === 'string' ? syscall : undefined };
  }
  return undefined;
}

// node's TLS errors carry their code (ERR_TLS_CERT_ALTNAME_INVALID, CERT_HAS_EXPIRED, ...) the same way.
function errorCode(error: unknown): string | undefined {
  return socketError(error)?.code;
}

/** Whether the error came while connecting, before any request was written:
 *  the socket's `connect` (or the name's lookup) failed, or undici reported it
 *  as its connect's error (TCP connect and TLS handshake). */
function whileConnecting(error: unknown): boolean {
  if (errorChain(error).some((cause) => connectErrors.has(cause))) return true;
  const socket = socketError(error);
  return socket !== undefined && (socket.syscall === 'connect' || socket.syscall === 'getaddrinfo' || socket.code === 'UND_ERR_CONNECT_TIMEOUT');
}

/** The certificate checks of the TLS handshake, as node and OpenSSL name them: a handshake's, whenever they come. */
const CERTIFICATE_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN', 'CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID', 'CERT_REVOKED', 'CERT_UNTRUSTED', 'CERT_REJECTED',
  'CERT_SIGNATURE_FAILURE', 'HOSTNAME_MISMATCH', 'ERR_TLS_CERT_ALTNAME_INVALID', 'ERR_TLS_HANDSHAKE_TIMEOUT',
]);

/** A network error from `fetch` as the contract's transport error: what the
 *  socket said, named (the policy decides what each means), and where: an
 *  unreachable host or a TLS error is `connection-refused` / `tls` only while
 *  connecting; on an established connection (`read EHOSTUNREACH`, a bad TLS
 *  record after the handshake) the connection dropped: `connection-reset`. */
export function classifyNetworkError(error: unknown): Wit.TransportError {
  const code = errorCode(error);
  if (code === undefined) return 'other';
  if (CERTIFICATE_CODES.has(code)) return 'tls';
  if (code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_') || code === 'EPROTO') return whileConnecting(error) ? 'tls' : 'connection-reset';
  switch (code) {
    case 'ENOTFOUND': case 'EAI_AGAIN': case 'EAI_NONAME': case 'EAI_FAIL': case 'EAI_NODATA':
      return 'name-resolution';
    case 'ECONNREFUSED': case 'UND_ERR_CONNECT_TIMEOUT':
      return 'connection-refused'; // the request never reached the server
    case 'EHOSTUNREACH': case 'ENETUNREACH': case 'EHOSTDOWN': case 'ENETDOWN':
      return whileConnecting(error) ? 'connection-refused' : 'connection-reset';
    case 'ECONNRESET': case 'EPIPE': case 'UND_ERR_SOCKET':
      return 'connection-reset';
    case 'ETIMEDOUT':
      return whileConnecting(error) ? 'connection-refused' : 'timeout'; // a connect that timed out, as UND_ERR_CONNECT_TIMEOUT
    case 'UND_ERR_HEADERS_TIMEOUT': case 'UND_ERR_BODY_TIMEOUT':
      return 'timeout';
    case 'UND_ERR_CLOSED':
      return 'stream-closed';
    default:
      return 'other';
  }
}

/** How far a request that `fetch` rejected got: nothing left the host when no
 *  connection was made (refused, unreachable while connecting, a name that
 *  does not resolve, a TLS handshake that failed); it was written when the
 *  connection dropped or timed out waiting for the answer; else the host
 *  cannot tell. */
export function deliveryOfNetworkError(error: unknown): Wit.Delivery {
  switch (classifyNetworkError(error)) {
    case 'connection-refused': case 'name-resolution': case 'tls':
      return 'not-sent';
    case 'connection-reset': case 'timeout':
      return 'sent';
    case 'stream-closed':
      return errorCode(error) === 'UND_ERR_CLOSED' ? 'not-sent' : 'unknown'; // undici refuses a request on a closed client before writing
    default:
      return 'unknown';
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
  capture.delivery = 'answer-started'; // the answer's status and headers came, then it was cut
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
  const keeper = capture.keepAnswerText && !sse ? new TextDecoder() : undefined;
  let kept = '';
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
        if (keeper) capture.answerText = kept;
        ended();
        controller.close();
        return;
      }
      if (sse) scan(chunk.value);
      if (keeper && kept.length < MAX_CAPTURED_BODY) kept = (kept + keeper.decode(chunk.value, { stream: true })).slice(0, MAX_CAPTURED_BODY);
      controller.enqueue(chunk.value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
}

/** A `fetch` for `StreamableHTTPClientTransport`'s `fetch` option that lets the
 *  wrapper see failed POSTs and cut answer streams as they came: the status,
 *  the headers and the body as received, whether the request carried an
 *  `Mcp-Session-Id`, and how far it got. It reads none of them (the policy
 *  decides what they mean). Requests outside a wrapped call pass through
 *  untouched. `McpConnection.http` installs one itself. */
export function createCapturingFetch(inner: FetchLike = fetch): FetchLike {
  return async (url, init) => {
    const method = (init?.method ?? 'GET').toUpperCase();
    const sessionIdSent = headerOf(init?.headers, 'mcp-session-id') !== undefined;
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
    if (records && !probing && !resuming) capture.sessionIdSent = sessionIdSent;
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
          into.delivery = deliveryOfNetworkError(e);
          into.sessionIdSent = sessionIdSent;
        }
      }
      throw e;
    }
    if (records && !probing) capture.answerStarted = true;
    if (!response.ok) {
      const body = (await response.clone().text().catch(() => '')).slice(0, MAX_CAPTURED_BODY);
      if (probing && method === 'POST' && capture?.readProbeAnswer
        && capture.readProbeAnswer(response.status, jsonRpcErrorCode(body)) === 'failure') {
        // Not an older server's refusal (the policy says so): the attempt's
        // failure, with what the server said (a Retry-After for the policy),
        // and the probe fails.
        if (records) {
          capture.probe = undefined;
          if (!hasFailure(capture)) {
            capture.status = response.status;
            response.headers.forEach((value, name) => capture.headers.push([name, value]));
            capture.body = body;
            capture.sessionIdSent = sessionIdSent;
          }
        }
        await response.body?.cancel().catch(() => undefined);
        throw new ProbeAnswerFailed(response.status, body);
      }
      if (into && !hasFailure(into)) {
        if (resuming) {
          cutAnswer(capture, `the answer stream could not be resumed: HTTP ${response.status} ${body.slice(0, 200)}`);
        } else {
          into.status = response.status;
          response.headers.forEach((value, name) => into.headers.push([name, value]));
          into.body = body;
          into.sessionIdSent = sessionIdSent;
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
