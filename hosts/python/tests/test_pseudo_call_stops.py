"""A stop (a cancellation, a call's or run's limit) while the MCP wrapper
lists the tools (the `tools/list` pseudo-call) abandons the pseudo-call in the
run and writes its stop line, as a tool call's stop does: the metrics count
what the run report counts, and nothing is left open."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from log_lines import MCP_LOGGER, logged
from mcp.types import ListToolsResult

from agent_retry_policy import PolicyComponent
from agent_retry_policy.errors import CallCancelled, CallTimedOut
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.metrics import RetryMetrics


class SlowListing:
    """Enough of `ClientSession`: a `tools/list` that does not answer in time."""

    def __init__(self) -> None:
        self.listing = asyncio.Event()

    async def list_tools(self, params: Any = None) -> ListToolsResult:
        self.listing.set()
        await asyncio.sleep(30)
        return ListToolsResult(tools=[])

    async def call_tool(self, name: str, arguments: dict[str, Any], **_options: Any) -> Any:
        raise AssertionError("nothing is sent before the tools are listed")


def caller_of(session: SlowListing, metrics: RetryMetrics, **options: Any) -> RetryingToolCaller:
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("LISTING")
    return RetryingToolCaller(session, run, metrics=metrics, **options)  # type: ignore[arg-type]


def stop_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    return [(line["tool"], line["attempt"], line["outcome"]) for line in logged(caplog, MCP_LOGGER, "agent_retry.attempt")]


def test_list_tools_cancelled_is_call_cancelled_with_its_stop_line(caplog: pytest.LogCaptureFixture) -> None:
    session, metrics = SlowListing(), RetryMetrics()
    caller = caller_of(session, metrics)

    async def go() -> None:
        listing = asyncio.ensure_future(caller.list_tools())
        await session.listing.wait()
        listing.cancel()
        await listing

    with caplog.at_level(logging.INFO, logger=MCP_LOGGER), pytest.raises(CallCancelled) as cancelled:
        asyncio.run(go())
    assert cancelled.value.tool == "tools/list"
    assert stop_lines(caplog) == [("tools/list", 1, "cancelled")]
    reason = "the call was cancelled while attempt 1 was in flight (1 sent); it is not a write"
    assert logged(caplog, MCP_LOGGER, "agent_retry.attempt")[0]["reason"] == reason
    assert str(cancelled.value) == f"tools/list: {reason}"
    report = caller.run.report()
    assert report["abandoned-calls"] == 1 and metrics.attempts == report["attempts"] == 1


def test_a_call_limit_passing_while_the_tools_are_listed_abandons_the_listing(caplog: pytest.LogCaptureFixture) -> None:
    session, metrics = SlowListing(), RetryMetrics()
    caller = caller_of(session, metrics, call_timeout_s=0.2)
    with caplog.at_level(logging.INFO, logger=MCP_LOGGER), pytest.raises(CallTimedOut) as timed_out:
        asyncio.run(caller.call_tool("record_note", {"text": "hi"}))
    # The listing's stop, then the call's it served (never begun: attempt 0, nothing of it sent).
    assert stop_lines(caplog) == [("tools/list", 1, "call-timeout"), ("record_note", 0, "call-timeout")]
    assert timed_out.value.call_id is None and not timed_out.value.may_have_applied
    listing, call = (line["reason"] for line in logged(caplog, MCP_LOGGER, "agent_retry.attempt"))
    assert listing == "the call's limit of 200 ms passed while attempt 1 was in flight (1 sent); it is not a write"
    reason = "the call's limit of 200 ms passed while its tools/list ran, before the call was sent (0 sent); nothing of it was sent"
    assert call == reason
    assert str(timed_out.value) == timed_out.value.stopped.message == f"record_note: {reason}"
    report = caller.run.report()
    assert report["abandoned-calls"] == 1 and metrics.attempts == report["attempts"] == 1
