// The MCP connection the wrapper establishes and establishes again (`McpConnection`):
// streamable HTTP with the capturing fetch (`./capture.ts`), or stdio with the server
// started (again) by the wrapper.
import { Client, type ClientOptions } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, type StdioServerParameters } from '@modelcontextprotocol/sdk/client/stdio.js';
import {
  StreamableHTTPClientTransport, type StreamableHTTPReconnectionOptions,
} from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Implementation } from '@modelcontextprotocol/sdk/types.js';

import { AgentRetryError } from '../errors.js';
import { createCapturingFetch, type FetchLike } from './capture.js';

/** Options of `McpConnection.http`. */
export interface McpHttpOptions {
  /** The `fetch` the wrapper's capturing fetch wraps (default: the global one). */
  fetch?: FetchLike;
  /** Passed to the transport (headers, e.g. an Authorization). */
  requestInit?: RequestInit;
  /** The SDK's reconnection of the GET stream (default: the SDK's). */
  reconnectionOptions?: StreamableHTTPReconnectionOptions;
  clientInfo?: Implementation;
  clientOptions?: ClientOptions;
}

/** Options of `McpConnection.stdio`: the SDK's `StdioServerParameters`
 *  (`command`, `args`, `env`, `cwd`, `stderr`). */
export interface McpStdioOptions extends StdioServerParameters {
  clientInfo?: Implementation;
  clientOptions?: ClientOptions;
}

const DEFAULT_CLIENT_INFO: Implementation = { name: 'agent-retry-policy', version: '0.4.0' };

/** An MCP connection the wrapper can establish and establish again: over
 *  streamable HTTP (a fresh `Client` and transport with the capturing fetch,
 *  re-`initialize`d) or over stdio (the server started again). A
 *  `RetryingToolCaller` built on one connects it through the policy (the
 *  `initialize` pseudo-call) on its first call, and again after a lost session;
 *  `connect()` can also be called directly. One caller per connection. */
export class McpConnection {
  private current?: Client;
  private connecting?: Promise<Client>;
  private lostBecause?: string;
  private closed = false;
  private readonly closing = new Set<Promise<void>>();
  private established = 0;
  private readonly capturingFetch?: FetchLike;

  private constructor(
    readonly kind: 'http' | 'stdio',
    private readonly http?: { url: URL; options: McpHttpOptions },
    private readonly stdioOptions?: McpStdioOptions,
  ) {
    if (http) {
      this.capturingFetch = createCapturingFetch(http.options.fetch ?? fetch, {
        onSessionLost: (sessionId, detail) => {
          // Only the session in use: an old client's late request does not count.
          if ((this.current?.transport as StreamableHTTPClientTransport | undefined)?.sessionId === sessionId) {
            this.markLost(`the server no longer knows the session (${detail})`);
          }
        },
      });
    }
  }

  /** A streamable-HTTP connection to `url` (e.g. `http://127.0.0.1:8080/mcp`), always with the capturing fetch. */
  static http(url: string | URL, options: McpHttpOptions = {}): McpConnection {
    return new McpConnection('http', { url: new URL(url), options });
  }

  /** A stdio connection: `command` with `args` is started on connect, and started again after it exits. */
  static stdio(options: McpStdioOptions): McpConnection {
    if (typeof options?.command !== 'string' || options.command === '') throw new TypeError('McpConnection.stdio needs a command');
    return new McpConnection('stdio', undefined, { ...options, args: [...(options.args ?? [])] });
  }

  /** The connected client (undefined before the first connect, after close). */
  get client(): Client | undefined {
    return this.current;
  }

  /** Why the connection is lost, if it is (the next attempt connects again first). */
  get lost(): string | undefined {
    return this.current ? this.lostBecause : (this.lostBecause ?? 'not connected');
  }

  /** How many times it connected. */
  get connections(): number {
    return this.established;
  }

  /** Marks the connection lost: the wrapper connects again before its next request. */
  markLost(reason: string): void {
    if (this.lostBecause === undefined) this.lostBecause = reason;
  }

  /** Connects (again): a fresh `Client` and transport, the process started
   *  over stdio, `initialize` sent. Throws what the SDK throws; the previous
   *  client, if any, is closed. */
  connect(options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<Client> {
    if (this.closed) return Promise.reject(new AgentRetryError('this McpConnection is closed'));
    this.connecting ??= this.open(options).finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  private async open(options: { signal?: AbortSignal; timeoutMs?: number }): Promise<Client> {
    const previous = this.current;
    this.current = undefined;
    if (previous) this.retire(previous);
    const clientInfo = this.http?.options.clientInfo ?? this.stdioOptions?.clientInfo ?? DEFAULT_CLIENT_INFO;
    const client = new Client(clientInfo, this.http?.options.clientOptions ?? this.stdioOptions?.clientOptions);
    let transport: StreamableHTTPClientTransport | StdioClientTransport;
    if (this.http) {
      transport = new StreamableHTTPClientTransport(this.http.url, {
        fetch: this.capturingFetch, requestInit: this.http.options.requestInit, reconnectionOptions: this.http.options.reconnectionOptions,
      });
    } else {
      const { clientInfo: _info, clientOptions: _options, ...server } = this.stdioOptions as McpStdioOptions;
      transport = new StdioClientTransport(server);
    }
    let ready = false;
    client.onclose = () => {
      if (ready && this.current === client) {
        this.markLost(this.kind === 'stdio' ? 'the server process exited (its stdio pipe closed)' : 'the transport closed');
      }
    };
    try {
      await client.connect(transport, { signal: options.signal, timeout: options.timeoutMs });
    } catch (e) {
      this.retire(client);
      throw e;
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
  private retire(client: Client): void {
    const done: Promise<void> = client.close().catch(() => undefined).finally(() => this.closing.delete(done));
    this.closing.add(done);
  }

  /** Closes the client (ends the server process over stdio). */
  async close(): Promise<void> {
    this.closed = true;
    await this.connecting?.catch(() => undefined);
    const client = this.current;
    this.current = undefined;
    if (client) this.retire(client);
    await Promise.all([...this.closing]);
  }
}
