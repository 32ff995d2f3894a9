// The two majors of the MCP TypeScript SDK the wrapper drives, behind one
// interface: v1 (`@modelcontextprotocol/sdk` ^1.32, revisions up to 2025-11-25)
// and v2 (`@modelcontextprotocol/client` ^2.4, which negotiates: `server/discover`
// for 2026-07-28, else the `initialize` handshake). Both are optional peer
// dependencies, so neither is imported statically: each is loaded on first use.
import { createRequire } from 'node:module';

import type { Client as ClientV1, ClientOptions as ClientOptionsV1 } from '@modelcontextprotocol/sdk/client/index.js';
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js';
import type { Client as ClientV2, ClientOptions as ClientOptionsV2 } from '@modelcontextprotocol/client';

import { ConnectionConfigError } from '../errors.js';
import type { FetchLike } from './capture.js';

/** Which SDK major: `v1` is `@modelcontextprotocol/sdk`, `v2` is `@modelcontextprotocol/client`. */
export type McpSdkName = 'v1' | 'v2';

/** A client of either SDK major. */
export type McpClient = ClientV1 | ClientV2;

/** A `Client`'s options in either SDK major (for v2, `versionNegotiation`
 *  defaults to `{ mode: 'auto' }` here, not to the SDK's `'legacy'`). */
export type McpClientOptions = ClientOptionsV1 | ClientOptionsV2;

/** The SDK packages, by major. */
export const SDK_PACKAGES: Readonly<Record<McpSdkName, string>> = { v1: '@modelcontextprotocol/sdk', v2: '@modelcontextprotocol/client' };

/** The first revision without the `initialize` handshake. */
export const MODERN_REVISION = '2026-07-28';

/** The MCP Tasks extension (SEP-2663), declared under `capabilities.extensions`. */
export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';

/** A server request a handler of the application answers (elicitation, sampling, roots). */
export type InputHandler = (request: { jsonrpc: '2.0'; id: string; method: string; params?: Record<string, unknown> }, context: unknown) =>
  Promise<unknown>;

/** What an SDK's error says happened, where it says anything the wrapper reads. */
export type SdkFailure =
  | { kind: 'timeout'; message: string }
  | { kind: 'closed'; message: string }
  | { kind: 'not-connected'; message: string }
  | { kind: 'json-rpc'; code: number; message: string; data?: unknown }
  | { kind: 'http'; status: number; message: string };

export interface SendOptions {
  /** How long the request may go without an answer (with `resetTimeoutOnProgress`: or a progress notification). */
  timeout?: number;
  signal?: AbortSignal;
  /** The longest the request may take in all, progress or not. */
  maxTotalTimeout?: number;
  /** Whether each progress notification for the request starts `timeout` again. */
  resetTimeoutOnProgress?: boolean;
  /** Called with each `notifications/progress` for the request (setting it sends a progress token). */
  onprogress?: (progress: { progress: number; total?: number; message?: string }) => void;
}

export interface HttpTransportOptions {
  fetch?: FetchLike;
  requestInit?: RequestInit;
  reconnectionOptions?: unknown;
}

/** What the wrapper needs of one SDK major. */
export interface McpSdk {
  readonly name: McpSdkName;
  readonly packageName: string;
  /** The revisions its client can speak, newest first. */
  readonly revisions: readonly string[];
  newClient(clientInfo: { name: string; version: string }, options: McpClientOptions | undefined): McpClient;
  httpTransport(url: URL, options: HttpTransportOptions): unknown;
  stdioTransport(parameters: object): unknown;
  connect(client: McpClient, transport: unknown, options: SendOptions): Promise<void>;
  /** `meta`: the request's `params._meta` (W3C trace context); the SDK adds its progress token to it. */
  callTool(client: McpClient, name: string, args: Record<string, unknown>, options: SendOptions, meta?: Record<string, string>): Promise<CallToolResult>;
  /** One page of `tools/list` (v2: the first call walks every page, the SDK's aggregate, and gives no cursor;
   *  always sent, even to a server that does not advertise tools, whom v2 would answer with an empty list). */
  listTools(client: McpClient, cursor: string | undefined, options: SendOptions): Promise<{ tools: Tool[]; nextCursor?: string }>;
  /** What the SDK's error says; `answered`: a JSON-RPC response to the
   *  request arrived (`AttemptCapture.answered`), so the error is the server's. */
  readError(error: unknown, answered: boolean): SdkFailure | undefined;
  isHttpTransport(transport: unknown): boolean;
  isStdioTransport(transport: unknown): boolean;
  /** The revision the connection speaks (v1 over stdio: not known). */
  protocolVersion(client: McpClient): string | undefined;
  /** Whether the wrapper declares the Tasks extension with this SDK and polls
   *  the tasks it answers (v2; v1 speaks only 2025's experimental tasks). */
  readonly tasks: boolean;
  /** A request the SDK has no method for (`tasks/get`, `tasks/update`,
   *  `tasks/cancel`), its result unchecked (the wrapper reads it raw). */
  request(client: McpClient, method: string, params: Record<string, unknown>, options: SendOptions): Promise<unknown>;
  /** The handler the application registered on the client for a server
   *  request (`elicitation/create`, `sampling/createMessage`, `roots/list`), if any. */
  inputHandler(client: McpClient, method: string): InputHandler | undefined;
  /** Whether the error is the SDK's for an `input_required` answer it did not
   *  fulfil: no handler for one of its requests, auto-fulfilment off, or its rounds spent. */
  inputUnanswered(error: unknown): boolean;
}

/** A Standard Schema that takes any value: the result is read raw. */
const ANY_RESULT = { '~standard': { version: 1, vendor: 'agent-retry', validate: (value: unknown) => ({ value }) } } as const;

const require = createRequire(import.meta.url);

/** Whether the SDK major can be loaded from here (resolution only, nothing is run). */
export function sdkInstalled(name: McpSdkName): boolean {
  try {
    require.resolve(name === 'v1' ? '@modelcontextprotocol/sdk/client/index.js' : '@modelcontextprotocol/client');
    return true;
  } catch (e) {
    return (e as { code?: unknown }).code !== 'MODULE_NOT_FOUND'; // found but not resolvable this way: the import will tell
  }
}

/** The SDK major to use: the one named, else v2 if installed (it reaches 2026-07-28 servers), else v1. */
export function chooseSdk(requested: unknown): McpSdkName {
  if (requested !== undefined && requested !== 'v1' && requested !== 'v2') {
    throw new ConnectionConfigError('sdk', `the sdk option must be 'v1' (${SDK_PACKAGES.v1}) or 'v2' (${SDK_PACKAGES.v2}), not ${JSON.stringify(requested)}`);
  }
  if (requested !== undefined) {
    if (!sdkInstalled(requested)) {
      throw new ConnectionConfigError('sdk', `sdk '${requested}' was asked for, but ${SDK_PACKAGES[requested]} is not installed: npm install ${SDK_PACKAGES[requested]}@${requested === 'v1' ? '^1.32.2' : '^2.4.0'}`);
    }
    return requested;
  }
  if (sdkInstalled('v2')) return 'v2';
  if (sdkInstalled('v1')) return 'v1';
  throw new ConnectionConfigError('sdk', `the MCP wrapper needs an MCP SDK, and neither is installed: npm install ${SDK_PACKAGES.v2}@^2.4.0 `
    + `(2026-07-28 and 2025-11-25) or ${SDK_PACKAGES.v1}@^1.32.2 (up to 2025-11-25)`);
}

/** The SDK major a client was made by (v2's has `getProtocolEra`). */
export const sdkOfClient = (client: McpClient): McpSdkName =>
  typeof (client as { getProtocolEra?: unknown }).getProtocolEra === 'function' ? 'v2' : 'v1';

async function loadV1(): Promise<McpSdk> {
  const [client, stdio, http, types] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'), import('@modelcontextprotocol/sdk/client/stdio.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'), import('@modelcontextprotocol/sdk/types.js'),
  ]);
  const v1 = (c: McpClient) => c as ClientV1;
  return {
    name: 'v1',
    packageName: SDK_PACKAGES.v1,
    revisions: types.SUPPORTED_PROTOCOL_VERSIONS,
    newClient: (info, options) => new client.Client(info, options as ClientOptionsV1 | undefined),
    httpTransport: (url, options) => new http.StreamableHTTPClientTransport(url, options as never),
    stdioTransport: (parameters) => new stdio.StdioClientTransport(parameters as never),
    connect: (c, transport, { signal, timeout }) => v1(c).connect(transport as never, { signal, timeout }),
    callTool: (c, name, args, options, meta) =>
      v1(c).callTool({ name, arguments: args, ...(meta ? { _meta: meta } : {}) }, undefined, options) as Promise<CallToolResult>,
    listTools: (c, cursor, options) => v1(c).listTools(cursor ? { cursor } : undefined, options),
    readError(error, answered) {
      if (error instanceof types.McpError) {
        // The SDK's own codes for a request it gave up on, no answer having
        // come; a server's own -32000 / -32001 (an answer arrived) is its
        // JSON-RPC error, as v2 reports it.
        if (!answered && error.code === types.ErrorCode.RequestTimeout) return { kind: 'timeout', message: error.message };
        if (!answered && error.code === types.ErrorCode.ConnectionClosed) return { kind: 'closed', message: error.message };
        const prefix = `MCP error ${error.code}: `; // the SDK's, not the server's
        const message = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
        return { kind: 'json-rpc', code: error.code, message, data: error.data };
      }
      if (error instanceof http.StreamableHTTPError && error.code !== undefined && error.code >= 100) {
        return { kind: 'http', status: error.code, message: error.message };
      }
      if (error instanceof Error && error.message === 'Not connected') return { kind: 'not-connected', message: error.message };
      return undefined;
    },
    isHttpTransport: (t) => t instanceof http.StreamableHTTPClientTransport || (t as object | undefined)?.constructor?.name === 'SSEClientTransport',
    isStdioTransport: (t) => t instanceof stdio.StdioClientTransport,
    protocolVersion: (c) => {
      const transport = v1(c).transport as { protocolVersion?: unknown } | undefined;
      return typeof transport?.protocolVersion === 'string' ? transport.protocolVersion : undefined;
    },
    tasks: false,
    request: () => Promise.reject(new ConnectionConfigError('sdk', `${SDK_PACKAGES.v1} speaks only the 2025 experimental tasks: use sdk v2 for the Tasks extension`)),
    inputHandler: () => undefined,
    inputUnanswered: () => false,
  };
}

async function loadV2(): Promise<McpSdk> {
  const [client, stdio] = await Promise.all([import('@modelcontextprotocol/client'), import('@modelcontextprotocol/client/stdio')]);
  if (typeof client.Client.prototype.getProtocolEra !== 'function') {
    throw new ConnectionConfigError('sdk', `${SDK_PACKAGES.v2} is older than 2.4, which the wrapper needs (version negotiation): npm install ${SDK_PACKAGES.v2}@^2.4.0`);
  }
  const v2 = (c: McpClient) => c as ClientV2;
  const { SdkError, SdkErrorCode, SdkHttpError, ProtocolError } = client;
  return {
    name: 'v2',
    packageName: SDK_PACKAGES.v2,
    revisions: [MODERN_REVISION, ...client.SUPPORTED_PROTOCOL_VERSIONS],
    // The SDK's default is the 2025 handshake only; 'auto' probes with
    // server/discover and falls back to initialize. The caller's choice wins.
    // The wrapper polls the tasks a server answers with: it declares the extension.
    newClient: (info, options) => {
      const given = options as ClientOptionsV2 | undefined;
      const capabilities = { ...given?.capabilities, extensions: { ...given?.capabilities?.extensions, [TASKS_EXTENSION]: {} } };
      return new client.Client(info, { versionNegotiation: { mode: 'auto' }, ...given, capabilities });
    },
    httpTransport: (url, options) => new client.StreamableHTTPClientTransport(url, options as never),
    stdioTransport: (parameters) => new stdio.StdioClientTransport(parameters as never),
    connect: (c, transport, { signal, timeout }) => v2(c).connect(transport as never, { signal, timeout }),
    callTool: (c, name, args, options, meta) => v2(c).callTool({ name, arguments: args, ...(meta ? { _meta: meta } : {}) }, options) as Promise<CallToolResult>,
    listTools: async (c, cursor, options) => {
      const client = v2(c);
      // A server that does not advertise `capabilities.tools` gets an empty list
      // from the SDK, nothing sent (and the wrapper would then send no key): the
      // wrapper always really lists, here a page at a time through the raw request.
      if (!client.getServerCapabilities()?.tools) {
        return (await client.request({ method: 'tools/list', ...(cursor ? { params: { cursor } } : {}) }, options)) as { tools: Tool[]; nextCursor?: string };
      }
      return (await client.listTools(cursor ? { cursor } : undefined, options)) as { tools: Tool[]; nextCursor?: string };
    },
    readError(error) {
      if (error instanceof ProtocolError) return { kind: 'json-rpc', code: error.code, message: error.message, data: error.data };
      if (error instanceof SdkHttpError) return { kind: 'http', status: error.status, message: error.message };
      if (error instanceof SdkError) {
        if (error.code === SdkErrorCode.RequestTimeout) return { kind: 'timeout', message: error.message };
        if (error.code === SdkErrorCode.ConnectionClosed) return { kind: 'closed', message: error.message };
        if (error.code === SdkErrorCode.NotConnected) return { kind: 'not-connected', message: error.message };
      }
      return undefined;
    },
    isHttpTransport: (t) => t instanceof client.StreamableHTTPClientTransport || t instanceof client.SSEClientTransport,
    isStdioTransport: (t) => t instanceof stdio.StdioClientTransport,
    protocolVersion: (c) => v2(c).getNegotiatedProtocolVersion(),
    tasks: true,
    request: (c, method, params, options) => v2(c).request({ method, params } as never, ANY_RESULT as never, options as never),
    // The SDK keeps the handlers the application registered (`setRequestHandler`); it has no public getter.
    inputHandler: (c, method) => (c as unknown as { _getRequestHandler?: (m: string) => InputHandler | undefined })._getRequestHandler?.(method),
    inputUnanswered: (error) => error instanceof SdkError && (error.code === SdkErrorCode.CapabilityNotSupported
      || error.code === SdkErrorCode.InputRequiredRoundsExceeded || error.code === SdkErrorCode.UnsupportedResultType),
  };
}

const loading = new Map<McpSdkName, Promise<McpSdk>>();

/** The SDK major's adapter, loaded once per process. A missing package is a `ConnectionConfigError`. */
export function loadSdk(name: McpSdkName): Promise<McpSdk> {
  let sdk = loading.get(name);
  if (!sdk) {
    sdk = (name === 'v1' ? loadV1() : loadV2()).catch((e: unknown) => {
      loading.delete(name);
      if (e instanceof ConnectionConfigError) throw e;
      const missing = (e as { code?: unknown }).code === 'ERR_MODULE_NOT_FOUND';
      throw new ConnectionConfigError('sdk', missing
        ? `${SDK_PACKAGES[name]} is not installed: npm install ${SDK_PACKAGES[name]}@${name === 'v1' ? '^1.32.2' : '^2.4.0'}`
        : `${SDK_PACKAGES[name]} could not be loaded: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    });
    loading.set(name, sdk);
  }
  return sdk;
}
