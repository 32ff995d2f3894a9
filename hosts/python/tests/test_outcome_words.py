"""One outcome vocabulary (docs/events.md): the same failure seen by the MCP
wrapper (the demo server) and by `call_with_policy` (a local HTTP server, an
httpx client) gives an attempt event with the same `outcome`, `class` and
`rule`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from demo_server import Desk, http
from faulty_http import Answer, FaultyServer, closed_port_url
from mcp import ClientSession
from test_mcp_e2e import CONFIG, new_caller, run_with_session

from agent_retry_policy import EmbeddedAccounts, Escalated, PolicyComponent, SplitMix64
from agent_retry_policy.any_call import call_with_policy
from agent_retry_policy.events import AttemptEvent
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.testing import FakeClock


def seen_by(retries: list[AttemptEvent]) -> list[tuple[str, str | None, str | None]]:
    return [(event.outcome, event.klass, event.rule) for event in retries]


def helper_retries(url: str) -> list[AttemptEvent]:
    """The retry events of one `call_with_policy` GET of `url` (3 attempts at most)."""
    retries: list[AttemptEvent] = []
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7)).load_policy(CONFIG).start_run("WORDS")

    async def get(_attempt: Any) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return (await client.get(url, timeout=5)).raise_for_status()

    async def call() -> None:
        hooks = Hooks(on_retry=retries.append)
        try:
            await call_with_policy(run, "lookup_order", get, hints={"read-only": True}, hooks=hooks, clock=FakeClock(1))
        except Escalated:
            pass

    asyncio.run(call())
    return retries


def test_a_503_is_the_same_outcome_over_mcp_and_through_the_any_call_helper(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})
    over_mcp: list[AttemptEvent] = []

    async def body(session: ClientSession) -> None:
        caller = new_caller(session, hooks=Hooks(on_retry=over_mcp.append))
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error

    run_with_session(desk, body)
    server = FaultyServer(Answer(503, body="upstream unavailable"), Answer(200, body='{"order_id": "A1"}'))
    try:
        through_helper = helper_retries(server.url)
    finally:
        server.close()
    assert seen_by(over_mcp) == seen_by(through_helper) == [("http 503", "transient", "http-status")]


def test_a_refused_connection_is_the_same_outcome_over_mcp_and_through_the_any_call_helper(serve: Callable[..., Desk]) -> None:
    desk = serve()
    over_mcp: list[AttemptEvent] = []

    async def body(session: ClientSession) -> None:
        caller = new_caller(session, hooks=Hooks(on_retry=over_mcp.append))
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        assert desk.server is not None
        desk.server.close()  # nothing listens on its port now
        with pytest.raises(Escalated):
            await caller.call_tool("lookup_order", {"order_id": "A2"})

    run_with_session(desk, body)
    through_helper = helper_retries(closed_port_url())
    assert over_mcp and through_helper
    assert set(seen_by(over_mcp)) == set(seen_by(through_helper)) == {("transport connection-refused", "transient", "transport")}
