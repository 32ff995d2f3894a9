"""The exam client's pieces (agent_retry_policy.exam): the status check built from an
exam's spec, and that a tool error's upstream status reaches the policy. The client end to end is
run by the judge (`make judge-python`)."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from agent_retry_policy import PolicyComponent
from agent_retry_policy.exam import status_check_from_spec
from agent_retry_policy.mcp_client import StatusCheckRequest, tool_error_outcome

SPEC = {"tool": "list_notes", "arguments": ["order_id"], "list": "notes", "match": ["order_id", "text"]}


class StubSession:
    """Answers every call with `answer` (or raises it) and records the calls."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **_options: Any) -> CallToolResult:
        self.calls.append((name, dict(arguments or {})))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def check(answer: Any, arguments: dict[str, Any]) -> tuple[str, StubSession]:
    session = StubSession(answer)
    request = StatusCheckRequest(session, "record_note", arguments, None, 1)  # type: ignore[arg-type]
    return asyncio.run(status_check_from_spec(SPEC)(request)), session


def listing(*items: Any) -> CallToolResult:
    return CallToolResult(content=[], structured_content={"notes": list(items)})


CALL = {"order_id": "J-5", "text": "customer called", "idempotency_key": "ar1-x"}


def test_the_read_gets_only_the_named_arguments_and_a_matching_item_is_found() -> None:
    found, session = check(listing({"order_id": "J-5", "text": "other"}, {"order_id": "J-5", "text": "customer called"}), CALL)
    assert found == "found"
    assert session.calls == [("list_notes", {"order_id": "J-5"})]


def test_no_item_matching_every_field_is_absent() -> None:
    assert check(listing({"order_id": "J-5", "text": "other"}), CALL)[0] == "absent"
    assert check(listing(), CALL)[0] == "absent"
    assert check(CallToolResult(content=[], structured_content={}), CALL)[0] == "absent"


def test_a_failed_read_is_unknown() -> None:
    assert check(MCPError(-32603, "down"), CALL)[0] == "unknown"
    failed = CallToolResult(content=[TextContent(type="text", text="down")], is_error=True)
    assert check(failed, CALL)[0] == "unknown"


def test_the_demo_servers_upstream_status_is_read_by_the_policy_not_the_client() -> None:
    # The demo server reports an upstream failure in structuredContent.error.status;
    # the client passes the structured content on and the policy reads the status.
    policy = PolicyComponent.load().instantiate().load_policy({})
    refused = CallToolResult(
        content=[TextContent(type="text", text="refunds above 5000 rupees need a person")],
        structured_content={"error": {"status": 403, "message": "refunds above 5000 rupees need a person"}},
        is_error=True,
    )
    outcome = tool_error_outcome(refused)
    assert outcome["kind"] == {"tool-error": None}
    classification = policy.classify(outcome, 0)
    assert (classification["class"], classification["rule"]) == ("permission", "tool-error:status")
    assert "403" in classification["reason"]
