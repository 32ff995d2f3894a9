// The MCP connection the wrapper establishes and establishes again (`McpConnection`):
// streamable HTTP with the capturing fetch (`./capture.ts`), or stdio with the server
// started (again) by the wrapper; through either SDK major (`./sdk.ts`).
import type { Stream } from 'node:stream';

import { AgentRetryError, ConnectionConfigError } from '../errors.js';
import { MAX_TIMER_MS } from '../timers.js';
import { createCapturingFetch, watchAnswers, type FetchLike } from './capture.js';
import {
  chooseSdk, loadSdk, type McpClient, type McpClientOptions, type McpSdk, type McpSdkName,
} from './sdk.js';

/** The client's name and version as sent to the server (`Implementation`). */
export interface McpClientInfo {
  name: string;
  version: string;
  [field: string]: unknown;
}

/** The SDK's reconnection of the GET stream (the same in both majors). */
export interface McpReconnectionOptions {
  initialReconnectionDelay: number;
  maxReconnectionDelay: number;
  reconnectionDelayGrowFactor: number;
  maxRetries: number;
}

interface McpCommonOptions {
  /** Which SDK major drives the connection: `'v2'` (`@modelcontextprotocol/client`
   *  ^2.4: 2026-07-28, else the 2025 handshake) or `'v1'` (`@modelcontextprotocol/sdk`
   *  ^1.32: up to 2025-11-25). Default: v2 if it is installed, else v1. */
  sdk?: McpSdkName;
  clientInfo?: McpClientInfo;
  /** The SDK `Client`'s options. With v2, `versionNegotiation` defaults to
   *  `{ mode: 'auto' }`; pass `{ mode: 'legacy' }` or `{ mode: { pin: '2026-07-28' } }` to choose.
   *  With v2 the wrapper adds the Tasks extension (`io.modelcontextprotocol/tasks`)
   *  to `capabilities.extensions`: it polls the tasks a server answers with. */
  clientOptions?: McpClientOptions;
  /** Called with each new `Client` before it connects (every connection is a
   *  new one): register the handlers of the input a server may ask for, as the
   *  SDK takes them (`client.setRequestHandler('elicitation/create', ...)`,
   *  `sampling/createMessage`, `roots/list`, with their capabilities declared
   *  in `clientOptions`). The SDK answers an `input_required` with them (the
   *  same attempt); a task's input requests are answered with them too
   *  (`tasks/update`). Without a handler, the input is the policy's: `input-required`. */
  onClient?: (client: McpClient) => void;
}

/** Options of `McpConnection.http`. */
export interface McpHttpOptions extends McpCommonOptions {
  /** The `fetch` the wrapper's capturing fetch wraps (default: the global one);
   *  e.g. one with an undici `Agent` that trusts a private CA (README). */
  fetch?: FetchLike;
  /** Passed to the transport (headers, e.g. an Authorization). */
  requestInit?: RequestInit;
  /** The SDK's reconnection of the GET stream (default: the SDK's). */
  reconnectionOptions?: McpReconnectionOptions;
}

/** Options of `McpConnection.stdio`: the SDK's `StdioServerParameters`
 *  (`command`, `args`, `env`, `cwd`, `stderr`). */
export interface McpStdioOptions extends McpCommonOptions {
  command: string;
  args?: string[];
  env?: Record<string, string>;
  cwd?: string;
  stderr?: 'pipe' | 'ignore' | 'inherit' | 'overlapped' | Stream | number;
}

/** How long `close()` waits for a connect still under way (e.g. an abandoned v2
 *  probe that does not heed its abort signal) before it closes that connect's
 *  transport and goes on. */
const CLOSE_CONNECT_WAIT_MS = 500;

const DEFAULT_CLIENT_INFO: McpClientInfo = { name: 'agent-retry-policy', version: '0.9.0' };

/** An MCP connection the wrapper can establish and establish again: over
 *  streamable HTTP (a fresh `Client` and transport with the capturing fetch,
 *  connected again) or over stdio (the server started again). A
 *  `RetryingToolCaller` built on one connects it through the policy (the
 *  `initialize` pseudo-call) on its first call, and again when the policy's verdict says `reconnect` (or its transport closed);
 *  `connect()` can also be called directly. One caller per connection. */
export class McpConnection {
  private current?: McpClient;
  private connecting?: Promise<McpClient>;
  /** The transport of the connect under way (closed by `close()` if the connect outlasts its wait). */
  private opening?: unknown;
  private lostBecause?: string;
  private closed = false;
  private readonly closing = new Set<Promise<void>>();
  private established = 0;
  private readonly capturingFetch?: FetchLike;
  private adapter?: McpSdk;
  /** The SDK major that drives this connection (the `sdk` option, else what is installed). */
  readonly sdk: McpSdkName;

  private constructor(
    readonly kind: 'http' | 'stdio',
    private readonly http?: { url: URL; given: string; options: McpHttpOptions },
    private readonly stdioOptions?: McpStdioOptions,
  ) {
    this.sdk = chooseSdk((http?.options ?? stdioOptions)?.sdk);
    // It captures what each attempt saw; what that means (a lost session too) is the policy's to say.
    if (http) this.capturingFetch = createCapturingFetch(http.options.fetch ?? fetch);
  }

  /** A streamable-HTTP connection to `url` (e.g. `http://127.0.0.1:8080/mcp`),
   *  always with the capturing fetch. Another scheme than http: or https: is
   *  a `ConnectionConfigError` (option `url`), thrown here. */
  static http(url: string | URL, options: McpHttpOptions = {}): McpConnection {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch (e) {
      throw new ConnectionConfigError('url', `McpConnection.http needs an absolute http:// or https:// URL, not ${JSON.stringify(String(url))}`, { cause: e });
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      // Streamable HTTP runs over HTTP only: no retry makes another scheme work.
      throw new ConnectionConfigError('url', `McpConnection.http serves http:// and https:// URLs only, not the scheme '${
        parsed.protocol.slice(0, -1)}' (${parsed.href}): streamable HTTP runs over HTTP`);
    }
    return new McpConnection('http', { url: parsed, given: String(url), options });
  }

  /** A stdio connection: `command` with `args` is started on connect, and started again after it exits. */
  static stdio(options: McpStdioOptions): McpConnection {
    if (typeof options?.command !== 'string' || options.command === '') throw new TypeError('McpConnection.stdio needs a command');
    return new McpConnection('stdio', undefined, { ...options, args: [...(options.args ?? [])] });
  }

  /** The server as the circuit breakers are told it (contract 0.8.0), the
   *  same in every host: over HTTP its URL, over stdio `stdio:` and the command
   *  and its arguments joined by single spaces. The policy keeps a URL without
   *  its credentials, default port, query and fragment (scheme and host in
   *  lower case), and at most 256 bytes of any name. */
  get serverName(): string {
    // As given, not as WHATWG serialises it: the policy normalises it alike in every host.
    if (this.http) return this.http.given;
    const stdio = this.stdioOptions as McpStdioOptions;
    return `stdio:${[stdio.command, ...(stdio.args ?? [])].join(' ')}`;
  }

  /** The connected client (undefined before the first connect, after close). */
  get client(): McpClient | undefined {
    return this.current;
  }

  /** The revision the connected client speaks (e.g. `2026-07-28`, `2025-11-25`;
   *  undefined before a connect, and with v1 over stdio). */
  get protocolVersion(): string | undefined {
    return this.current && this.adapter ? this.adapter.protocolVersion(this.current) : undefined;
  }

  /** Why the connection is lost, if it is (the next attempt connects again first). */
  get lost(): string | undefined {
    return this.current ? this.lostBecause : (this.lostBecause ?? 'not connected');
  }

  /** How many times it connected. */
  get connections(): number {
    return this.established;
  }

  /** The SDK's adapter (loaded on first use; a missing package is a `ConnectionConfigError`).
   *  @internal */
  async loadSdk(): Promise<McpSdk> {
    this.adapter ??= await loadSdk(this.sdk);
    return this.adapter;
  }

  /** Marks the connection lost: the wrapper connects again before its next
   *  request. It does so when the policy's verdict says `reconnect`, or when its
   *  own transport or pipe closed. */
  markLost(reason: string): void {
    if (this.lostBecause === undefined) this.lostBecause = reason;
  }

  /** Connects (again): a fresh `Client` and transport, the process started
   *  over stdio, the handshake done (v2: `server/discover`, else `initialize`;
   *  v1: `initialize`). Throws what the SDK throws; the previous client, if any,
   *  is closed. */
  connect(options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<McpClient> {
    if (this.closed) return Promise.reject(new AgentRetryError('this McpConnection is closed'));
    this.connecting ??= this.open(options).finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  private async open(options: { signal?: AbortSignal; timeoutMs?: number }): Promise<McpClient> {
    const sdk = await this.loadSdk();
    const previous = this.current;
    this.current = undefined;
    if (previous) this.retire(previous);
    const clientInfo = this.http?.options.clientInfo ?? this.stdioOptions?.clientInfo ?? DEFAULT_CLIENT_INFO;
    const client = sdk.newClient(clientInfo, this.http?.options.clientOptions ?? this.stdioOptions?.clientOptions);
    (this.http?.options.onClient ?? this.stdioOptions?.onClient)?.(client);
    let transport: unknown;
    if (this.http) {
      transport = sdk.httpTransport(this.http.url, {
        fetch: this.capturingFetch, requestInit: this.http.options.requestInit, reconnectionOptions: this.http.options.reconnectionOptions,
      });
    } else {
      const { clientInfo: _info, clientOptions: _options, sdk: _sdk, onClient: _onClient, ...server } = this.stdioOptions as McpStdioOptions;
      transport = sdk.stdioTransport(server);
    }
    watchAnswers(transport); // before connecting: the handshake's answers are seen too
    this.opening = transport;
    let ready = false;
    client.onclose = () => {
      if (ready && this.current === client) {
        this.markLost(this.kind === 'stdio' ? 'the server process exited (its stdio pipe closed)' : 'the transport closed');
      }
    };
    try {
      // The SDK sets a timer of it: past 2^31 - 1 ms one would fire at once.
      const timeout = options.timeoutMs === undefined ? undefined : Math.min(options.timeoutMs, MAX_TIMER_MS);
      await sdk.connect(client, transport, { signal: options.signal, timeout });
    } catch (e) {
      this.retire(client);
      throw e;
    } finally {
      if (this.opening === transport) this.opening = undefined;
    }
    if (this.closed) {
      this.retire(client);
      throw new AgentRetryError('this McpConnection was closed while it connected');
    }
    ready = true;
    this.current = client;
    this.lostBecause = undefined;
    this.established += 1;
    return client;
  }

  /** Closes a client in the background (a stdio server is given 2 s to exit on EOF, then killed). */
  private retire(client: McpClient): void {
    const done: Promise<void> = client.close().catch(() => undefined).finally(() => this.closing.delete(done));
    this.closing.add(done);
  }

  /** Closes the client (ends the server process over stdio). */
  async close(): Promise<void> {
    this.closed = true;
    const connecting = this.connecting;
    if (connecting) {
      // A connect under way is waited for a short while only: one that was given
      // up on (its attempt stopped) may still be in a probe that does not heed
      // its abort signal. Its transport is closed, and when the connect ends
      // anyway, its client is closed (`open` sees `closed`).
      let timer: ReturnType<typeof setTimeout> | undefined;
      const ended = await Promise.race([
        connecting.then(() => true, () => true),
        new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), CLOSE_CONNECT_WAIT_MS); }),
      ]);
      clearTimeout(timer);
      const transport = this.opening as { close?: () => Promise<void> } | undefined;
      if (!ended && transport && typeof transport.close === 'function') {
        this.opening = undefined;
        let closing: Promise<void>;
        try {
          closing = Promise.resolve(transport.close()).catch(() => undefined);
        } catch {
          closing = Promise.resolve();
        }
        const done: Promise<void> = closing.finally(() => this.closing.delete(done));
        this.closing.add(done);
      }
    }
    const client = this.current;
    this.current = undefined;
    if (client) this.retire(client);
    await Promise.all([...this.closing]);
  }
}
