// A refund-desk agent's three tool calls through agent-retry-policy (from the npm tarball).
//   node agent.mjs http://127.0.0.1:PORT/mcp
// The demo server fails the first lookup and the first refund with a 503: both are
// retried (the refund with the same idempotency key); a refund above the approval
// limit is a task that asks a person: with no handler, it escalates input-required. Prints one JSON line.
import { Escalated, PolicyComponent } from 'agent-retry-policy';
import { McpConnection, RetryingToolCaller } from 'agent-retry-policy/mcp';

const instance = await (await PolicyComponent.load()).instantiate();   // the component the package carries
const run = instance.loadPolicy({}).startRun('CASE-7001');
// The wrapper's connection: statuses and headers captured, a lost session set up again.
const connection = McpConnection.http(process.argv[2]);
const caller = new RetryingToolCaller(connection, run);
const order = await caller.callTool('lookup_order', { order_id: 'ORD-1' });
const refund = await caller.callTool('issue_refund', { order_id: 'ORD-1', amount_paise: 50_000 });
let escalated = null;
try {
  await caller.callTool('issue_refund', { order_id: 'ORD-2', amount_paise: 900_000 });
} catch (e) {
  if (!(e instanceof Escalated)) throw e;
  escalated = e.reason;
}
await connection.close();
const report = JSON.parse(JSON.stringify(run.report()));   // JSON-safe: u64 fields as numbers
console.log(JSON.stringify({ host: 'node', order: order.structuredContent.status, refunded: !refund.isError,
  escalated, retries: report.retries, attempts: report.attempts }));
