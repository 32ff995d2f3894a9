// A refund-desk agent's three tool calls through agent-retry-policy (from the npm tarball).
//   node agent.mjs http://127.0.0.1:PORT/mcp
// The demo server fails the first lookup and the first refund with a 503: both are
// retried (the refund with the same idempotency key); a refund above the approval
// limit is answered 403 and escalates. Prints one JSON line.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Escalated, PolicyComponent } from 'agent-retry-policy';
import { RetryingToolCaller, createCapturingFetch } from 'agent-retry-policy/mcp';

const instance = await (await PolicyComponent.load()).instantiate();   // the component the package carries
const run = instance.loadPolicy({}).startRun('CASE-7001');
const client = new Client({ name: 'refund-desk', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2]), { fetch: createCapturingFetch() }));
const caller = new RetryingToolCaller(client, run);
const order = await caller.callTool('lookup_order', { order_id: 'ORD-1' });
const refund = await caller.callTool('issue_refund', { order_id: 'ORD-1', amount_paise: 50_000 });
let escalated = null;
try {
  await caller.callTool('issue_refund', { order_id: 'ORD-2', amount_paise: 900_000 });
} catch (e) {
  if (!(e instanceof Escalated)) throw e;
  escalated = e.reason;
}
await client.close();
const report = JSON.parse(JSON.stringify(run.report()));   // JSON-safe: u64 fields as numbers
console.log(JSON.stringify({ host: 'node', order: order.structuredContent.status, refunded: !refund.isError,
  escalated, retries: report.retries, attempts: report.attempts }));
