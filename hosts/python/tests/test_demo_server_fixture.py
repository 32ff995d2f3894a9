"""The demo server's fault script as a pytest fixture (issue 25):
`agent_retry_policy.testing.demo_server` and the plugin's
`agent_retry_demo_server` with its `agent_retry_faults` mark."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from demo_server import AGENT_RETRY

from agent_retry_policy import EmbeddedAccounts, McpConnection, PolicyComponent, RetryingToolCaller, SplitMix64
from agent_retry_policy.testing import demo_binary, demo_server

A_503_THEN_SUCCESS = {"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503}}


def lookup_attempts(url: str) -> list[tuple[int, str]]:
    """Calls lookup_order once through the wrapper: (attempt, action) of each of its verdicts."""
    verdicts: list[tuple[int, str]] = []

    def seen(tool: str, attempt: int, verdict: Any) -> None:
        if tool == "lookup_order":
            verdicts.append((attempt, verdict.action))

    async def call() -> None:
        run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy({"base-delay-ms": 10}).start_run("FIXTURE")
        async with McpConnection.http(url) as connection:
            caller = RetryingToolCaller(connection, run, entropy=SplitMix64(3), on_verdict=seen)
            result = await caller.call_tool("lookup_order", {"order_id": "A1"})
            assert not result.is_error, result

    asyncio.run(call())
    return verdicts


@pytest.mark.agent_retry_faults(A_503_THEN_SUCCESS)
def test_the_fixture_serves_the_marks_fault_script(agent_retry_demo_server: str) -> None:
    assert agent_retry_demo_server.startswith("http://127.0.0.1:") and agent_retry_demo_server.endswith("/mcp")
    assert lookup_attempts(agent_retry_demo_server) == [(1, "retry"), (2, "succeed")]


def test_the_fixture_without_a_mark_serves_no_faults(agent_retry_demo_server: str) -> None:
    assert lookup_attempts(agent_retry_demo_server) == [(1, "succeed")]


def test_the_context_manager_takes_a_fault_file_and_stops_the_server(tmp_path: Path) -> None:
    script = tmp_path / "faults.json"
    script.write_text(json.dumps([A_503_THEN_SUCCESS]))
    with demo_server(script, binary=AGENT_RETRY) as url:
        assert lookup_attempts(url) == [(1, "retry"), (2, "succeed")]
    with pytest.raises(OSError):  # stopped: nothing listens there now
        asyncio.run(asyncio.open_connection("127.0.0.1", int(url.split(":")[2].split("/")[0])))


def test_a_missing_binary_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="/nowhere/agent-retry"):
        demo_binary("/nowhere/agent-retry")
    with pytest.raises(FileNotFoundError), demo_server(A_503_THEN_SUCCESS, binary="/nowhere/agent-retry"):
        pass
