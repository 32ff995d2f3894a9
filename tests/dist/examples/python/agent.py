"""A refund-desk agent's three tool calls through agent-retry-policy (from the wheel).

    python agent.py http://127.0.0.1:PORT/mcp
The demo server fails the first lookup and the first refund with a 503: both are
retried (the refund with the same idempotency key); a refund above the approval
limit is a task that asks a person: with no handler, it escalates input-required. Prints one JSON line.
"""
import asyncio, json, sys

from agent_retry_policy import Escalated, PolicyComponent
from agent_retry_policy.mcp_client import McpConnection, RetryingToolCaller


async def main(url: str) -> None:
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("CASE-7001")  # the bundled .wasm
    # The wrapper's connection: statuses and headers captured, a lost session set up again.
    async with McpConnection.http(url) as connection:
        caller = RetryingToolCaller(connection, run)
        order = await caller.call_tool("lookup_order", {"order_id": "ORD-1"})
        refund = await caller.call_tool("issue_refund", {"order_id": "ORD-1", "amount_paise": 50_000})
        try:
            await caller.call_tool("issue_refund", {"order_id": "ORD-2", "amount_paise": 900_000})
            escalated = None
        except Escalated as e:
            escalated = e.reason
    report = run.report()
    print(json.dumps({"host": "python", "order": order.structured_content["status"], "refunded": not refund.is_error,
                      "escalated": escalated, "retries": report["retries"], "attempts": report["attempts"]}))


asyncio.run(main(sys.argv[1]))
