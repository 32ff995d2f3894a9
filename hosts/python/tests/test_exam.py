"""The exam client's pieces (agent_retry.exam): the status check built from an
exam's spec, and the upstream status of a tool error. The client end to end is
run by the judge (`make judge-python`)."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from agent_retry.exam import status_check_from_spec, upstream_status
from agent_retry.mcp_client import StatusCheckRequest

SPEC = {"tool": "list_notes", "arguments": ["order_id"], "list": "notes", "match": ["order_id", "text"]}


class StubSession:
    """Answers every call with `answer` (or raises it) and records the calls."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: Optional[dict[str, Any]] = None) -> CallToolResult:
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


def test_upstream_status_is_read_from_structured_content() -> None:
    error = CallToolResult(content=[], structured_content={"error": {"status": 403, "message": "no"}}, is_error=True)
    assert upstream_status(error) == 403
    assert upstream_status(CallToolResult(content=[], is_error=True)) is None
    assert upstream_status(CallToolResult(content=[], structured_content={"error": {"status": "403"}}, is_error=True)) is None
