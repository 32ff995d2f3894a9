// A real MCP server over streamable HTTP (the TS SDK's McpServer and
// StreamableHTTPServerTransport behind node:http) with scripted faults, for the
// end-to-end tests. The same order desk as the Python host's test server:
// lookup_order (read), issue_refund (a write that applies each idempotency key
// once), issue_refund_unkeyed (a write with no key), list_refunds (the status
// check's read), validate_amount (isError), search_orders (empty) and
// delete_asset (a delete); and tools that relay an upstream API's answer:
// summarize_ticket (a read that calls a model provider), post_comment (a keyed
// write to a code host) and reserve_stock (a keyed write that refuses more than
// the 200 items in stock with an `isError` result, as a tool does).
//
// Scripted faults for `tools/call` POSTs: an HTTP status with headers and body
// (503, 429 + Retry-After, 400, 403) answered before the tool runs, a slow
// response (the tool runs, the answer comes after the client gave up), or an
// upstream failure that a relaying tool reports as its result: `isError: true`
// with the upstream's words as text and/or its error object as
// `structuredContent`, answered by the MCP server with HTTP 200 and no status or
// header of the upstream's; or a JSON-RPC error object with `data`.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

export interface HttpFault { kind: 'http'; status: number; headers?: Record<string, string>; body?: string }
export interface SlowResponse { kind: 'slow'; ms: number }
/** An upstream failure a relaying tool returns as an `isError` result. */
export interface RelayedToolError { kind: 'tool-error'; text?: string; structured?: Record<string, unknown> }
/** A JSON-RPC error object answered (HTTP 200) instead of the tool's result. */
export interface JsonRpcErrorFault { kind: 'json-rpc-error'; code: number; message: string; data?: unknown }
export type Fault = HttpFault | SlowResponse | RelayedToolError | JsonRpcErrorFault;

export interface Refund { orderId: string; amount: number; idempotencyKey?: string }
export interface ToolPost { tool: string; at: number; key?: string }

/** Items in stock for reserve_stock. */
export const STOCK = 200;

export class ServerState {
  readonly faults = new Map<string, Fault[]>();
  readonly ledger: Refund[] = [];
  readonly comments: string[] = [];
  readonly reservations: Array<{ sku: string; quantity: number }> = [];
  readonly posts: ToolPost[] = [];

  /** The next calls of `tool` get these faults, in order; later calls run normally. */
  script(tool: string, ...faults: Fault[]): void {
    this.faults.set(tool, [...(this.faults.get(tool) ?? []), ...faults]);
  }
  nextFault(tool: string): Fault | undefined {
    return this.faults.get(tool)?.shift();
  }
  postsOf(tool: string): ToolPost[] {
    return this.posts.filter((p) => p.tool === tool);
  }
}

const text = (value: string) => ({ content: [{ type: 'text' as const, text: value }] });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function buildServer(state: ServerState, slowMs: number, relayed?: RelayedToolError): McpServer {
  const server = new McpServer({ name: 'order-desk', version: '1.0.0' });
  // What a relaying tool returns when its upstream call failed: the upstream's
  // words, not its status line or headers.
  const upstreamFailed = (failure: RelayedToolError) => ({
    content: failure.text === undefined ? [] : [{ type: 'text' as const, text: failure.text }],
    ...(failure.structured ? { structuredContent: failure.structured } : {}),
    isError: true,
  });
  // A slow response: the tool does its work, then answers late.
  const late = async <T>(value: T): Promise<T> => {
    if (slowMs) await sleep(slowMs);
    return value;
  };
  server.registerTool('lookup_order', { inputSchema: { order_id: z.string() }, annotations: { readOnlyHint: true } },
    async ({ order_id }) => late(text(JSON.stringify({ order_id, status: 'delivered', total: 4999 }))));
  server.registerTool('issue_refund', {
    inputSchema: { order_id: z.string(), amount: z.number().int(), idempotency_key: z.string().optional() },
    annotations: { readOnlyHint: false, destructiveHint: false },
  }, async ({ order_id, amount, idempotency_key }) => {
    if (idempotency_key && state.ledger.some((r) => r.idempotencyKey === idempotency_key)) {
      return late(text(`refund for ${order_id} already applied (key ${idempotency_key})`));
    }
    state.ledger.push({ orderId: order_id, amount, idempotencyKey: idempotency_key });
    return late(text(`refunded ${amount} on ${order_id}`));
  });
  server.registerTool('issue_refund_unkeyed', {
    inputSchema: { order_id: z.string(), amount: z.number().int() },
    annotations: { readOnlyHint: false, destructiveHint: false },
  }, async ({ order_id, amount }) => {
    state.ledger.push({ orderId: order_id, amount });
    return late(text(`refunded ${amount} on ${order_id}`));
  });
  server.registerTool('list_refunds', { inputSchema: { order_id: z.string() }, annotations: { readOnlyHint: true } },
    async ({ order_id }) => late(text(JSON.stringify(state.ledger.filter((r) => r.orderId === order_id).map((r) => r.amount)))));
  server.registerTool('validate_amount', { inputSchema: { amount: z.number() }, annotations: { readOnlyHint: true } },
    async ({ amount }) => ({ ...text(`amount must be at most 5000 paise, got ${amount}`), isError: true }));
  server.registerTool('search_orders', { inputSchema: { query: z.string() }, annotations: { readOnlyHint: true } },
    async () => late({ content: [] }));
  server.registerTool('summarize_ticket', { inputSchema: { ticket_id: z.string() }, annotations: { readOnlyHint: true } },
    async ({ ticket_id }) => (relayed ? upstreamFailed(relayed) : text(`${ticket_id}: the customer asks for a refund of a late order`)));
  server.registerTool('post_comment', {
    inputSchema: { issue: z.number().int(), body: z.string(), idempotency_key: z.string().optional() },
    annotations: { readOnlyHint: false, destructiveHint: false },
  }, async ({ issue, body }) => {
    if (relayed) return upstreamFailed(relayed);
    state.comments.push(body);
    return text(`commented on #${issue}`);
  });
  server.registerTool('reserve_stock', {
    inputSchema: { sku: z.string(), quantity: z.number().int(), idempotency_key: z.string().optional() },
    annotations: { readOnlyHint: false, destructiveHint: false },
  }, async ({ sku, quantity }) => {
    if (quantity > STOCK) return { ...text(`Cannot reserve ${quantity} items: only ${STOCK} left in stock`), isError: true };
    state.reservations.push({ sku, quantity });
    return text(`reserved ${quantity} of ${sku}`);
  });
  server.registerTool('delete_asset', { inputSchema: { asset_id: z.string() }, annotations: { destructiveHint: true, idempotentHint: true } },
    async ({ asset_id }) => late(text(`deleted ${asset_id}`)));
  return server;
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

async function handle(state: ServerState, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.method !== 'POST') {
    res.writeHead(405, { allow: 'POST' }).end(); // stateless: no GET stream, no session to DELETE
    return;
  }
  const raw = await readBody(req);
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch {
    res.writeHead(400).end('not JSON');
    return;
  }
  let fault: Fault | undefined;
  const message = body as { id?: unknown; method?: string; params?: { name?: string; arguments?: { idempotency_key?: string } } };
  if (message.method === 'tools/call') {
    const tool = message.params?.name ?? '';
    state.posts.push({ tool, at: performance.now(), key: message.params?.arguments?.idempotency_key });
    fault = state.nextFault(tool);
  }
  if (fault?.kind === 'http') {
    res.writeHead(fault.status, { 'content-type': 'text/plain; charset=utf-8', ...fault.headers }).end(fault.body ?? '');
    return;
  }
  if (fault?.kind === 'json-rpc-error') {
    const error = { code: fault.code, message: fault.message, ...(fault.data === undefined ? {} : { data: fault.data }) };
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: message.id, error }));
    return;
  }
  // Stateless: a server and transport per request, answers as JSON.
  const server = buildServer(state, fault?.kind === 'slow' ? fault.ms : 0, fault?.kind === 'tool-error' ? fault : undefined);
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => {
    void transport.close();
    void server.close();
  });
  await server.connect(transport);
  await transport.handleRequest(req, res, body);
}

export class RunningServer {
  readonly state = new ServerState();
  private server?: Server;
  url = '';

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      handle(this.state, req, res).catch((e: unknown) => {
        if (!res.headersSent) res.writeHead(500).end(String(e));
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/mcp`;
    return this;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
