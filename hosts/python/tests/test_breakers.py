"""Circuit breakers through the wrappers (contract 0.8.0): against the demo
MCP server failing every `lookup_order` with a 503, the breaker opens after
two failures and the next call is not sent: the model gets an `isError`
result saying so; `agent_retry.breaker` events (log line, hook, metrics, span
event) say it opened. The any-call helper the same with `server` set, and no
breaker without it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from demo_server import Desk, http
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_mcp_e2e import run_with_session, text_of

from agent_retry_policy import (
    BreakerEvent,
    EmbeddedAccounts,
    Escalated,
    Hooks,
    McpConnection,
    ObservedFailure,
    PolicyComponent,
    ReplanNeeded,
    RetryMetrics,
    SessionLost,
    SplitMix64,
    types,
)
from agent_retry_policy.any_call import Attempt, call_with_policy
from agent_retry_policy.events import CallScope
from agent_retry_policy.mcp_client import RetryingToolCaller, server_name_of
from agent_retry_policy.testing import FakeClock

BREAKERS = {"circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60_000}, "base-delay-ms": 20, "max-delay-ms": 200}
START = 1_764_460_800_000
TIMEOUT_S = 60


def breaker_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, Any]]:
    return logged(caplog, logger, "agent_retry.breaker", children=True)


def test_the_mcp_wrapper_stops_sending_once_the_breaker_opens(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "fault": http(503, "upstream unavailable")})  # every call
    seen: list[BreakerEvent] = []
    replans: list[Any] = []
    metrics = RetryMetrics()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def body(session: ClientSession) -> tuple[Any, Any, Any]:
        tools = (await session.list_tools()).tools
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        run = instance.load_policy(BREAKERS).start_run("CASE-BREAKER")
        caller = RetryingToolCaller(
            session,
            run,
            tools=tools,
            entropy=SplitMix64(3),
            server_name="demo-desk",
            hooks=Hooks(on_breaker=seen.append, on_replan=replans.append),
            metrics=metrics,
            tracer_provider=tracer_provider,
        )
        first = await asyncio.wait_for(caller.call_tool("lookup_order", {"order_id": "A1"}), TIMEOUT_S)
        sent_before = len(desk.posts_of("lookup_order"))
        second = await asyncio.wait_for(caller.call_tool("lookup_order", {"order_id": "A2"}), TIMEOUT_S)
        # The guard took the call refused before it was sent: no invariant broken, the run goes on.
        assert caller.guard.violation is None
        return first, (sent_before, second), run.report()

    first, (sent_before, second), report = run_with_session(desk, body)
    # Two attempts of the first call were sent (the second failure opened the breaker); the second call was not sent.
    assert sent_before == 2
    assert len(desk.posts_of("lookup_order")) == 2
    assert first.is_error and "circuit breaker open" in text_of(first)
    assert second.is_error
    assert "was not called" in text_of(second) and "circuit breaker open" in text_of(second)
    assert "demo-desk" in text_of(second)
    assert report["attempts"] == 2  # the call refused before it was sent spent no attempt

    lines = breaker_lines(caplog, MCP_LOGGER)
    assert [(line["server"], line["scope"], line["from"], line["to"]) for line in lines] == [
        ("demo-desk", "server", "closed", "open"),
        ("demo-desk", "tool", "closed", "open"),
    ]
    for line in lines:
        assert list(line)[:8] == ["event", "ts", "run", "policy", "step", "call", "tool", "server"]
        assert list(line)[8:] == ["scope", "from", "to", "until_ms", "why"]
        assert (line["run"], line["step"], line["call"], line["tool"]) == ("CASE-BREAKER", 1, 1, "lookup_order")
        assert isinstance(line["until_ms"], int) and "2 failures in a row" in line["why"]
    assert [(e.server, e.breaker_scope, e.from_state, e.to_state) for e in seen] == [
        ("demo-desk", "server", "closed", "open"),
        ("demo-desk", "tool", "closed", "open"),
    ]

    # The refused call: its attempt line (attempt 0, not sent, replan, circuit-open), then its replan line.
    refused = [line for line in logged(caplog, MCP_LOGGER, children=True) if line.get("step") == 2]
    assert [(line["event"], line["attempt"]) for line in refused] == [("agent_retry.attempt", 0), ("agent_retry.replan", 0)]
    attempt, replan = refused
    assert (attempt["outcome"], attempt["class"], attempt["action"], attempt["rule"], attempt["call"]) == (
        "not sent",
        None,
        "replan",
        "circuit-open",
        2,
    )
    assert replan["rule"] == "circuit-open" and replan["message"] == text_of(second)
    assert [event.attempt for event in replans] == [2, 0]

    snapshot = metrics.snapshot()
    assert snapshot["agent_retry_breaker_changes_total"] == [
        {"labels": {"scope": "server", "to": "open"}, "value": 1},
        {"labels": {"scope": "tool", "to": "open"}, "value": 1},
    ]
    assert metrics.attempts == report["attempts"] == 2
    assert snapshot["agent_retry_replans_total"] == [{"labels": {}, "value": 2}]
    assert 'agent_retry_breaker_changes_total{scope="server",to="open"} 1' in metrics.to_prometheus()

    calls = [span for span in exporter.get_finished_spans() if span.name == "execute_tool lookup_order"]
    assert len(calls) == 2
    events = [event for event in calls[0].events if event.name == "agent_retry.breaker"]
    assert [(e.attributes["agent_retry.scope"], e.attributes["agent_retry.from"], e.attributes["agent_retry.to"]) for e in events] == [
        ("server", "closed", "open"),
        ("tool", "closed", "open"),
    ]
    assert all(e.attributes["agent_retry.server"] == "demo-desk" for e in events)
    assert calls[1].attributes["agent_retry.action"] == "replan" and calls[1].attributes["agent_retry.attempts"] == 0


def test_the_server_is_told_as_its_url_or_the_stdio_command_line_and_the_policy_normalises_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    named = server_name_of
    assert named(McpConnection.http("https://User:pw@MCP.Example.com:443/a/b?x=1")) == "https://User:pw@MCP.Example.com:443/a/b?x=1"
    assert named(McpConnection.stdio("python", ["-m", "server", "--port", "1"])) == "stdio:python -m server --port 1"
    assert named(None) is None
    # The policy keeps the URL without its user information, default port and
    # query: the token reaches neither the breaker's event nor the model.
    caplog.set_level(logging.INFO, logger="agent_retry_policy")
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(BREAKERS).start_run("r")
    start = run.begin_call("lookup_order", None, {"read-only": True}, START, server="HTTPS://agent:pw@MCP.Example.com:443/mcp?token=secret")
    assert start.admitted
    changes = []
    for attempt in (1, 2):
        run.record_failure(start.call_id, attempt, {"kind": {"http-status": 503}, "delivery": "sent"}, None, START, 0)
        changes += run.take_breaker_changes()
    assert changes and all(c["server"] == "https://mcp.example.com/mcp" for c in changes), changes
    refused = run.begin_call("lookup_order", None, None, START, server="https://mcp.example.com/mcp")
    assert refused.replan and "secret" not in str(run.last_decision(refused.call_id))


def test_the_mcp_wrapper_names_its_server_and_a_bare_session_none(serve: Callable[..., Desk]) -> None:
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(BREAKERS).start_run("r")
    connection = McpConnection.http("http://127.0.0.1:9/mcp?k=v")
    assert RetryingToolCaller(connection, run).server_name == "http://127.0.0.1:9/mcp?k=v"  # the policy drops the query
    assert RetryingToolCaller(connection, run, server_name="orders").server_name == "orders"
    assert RetryingToolCaller(object(), run).server_name is None  # type: ignore[arg-type]  # a bare session
    with pytest.raises(ValueError, match="4096"):
        RetryingToolCaller(connection, run, server_name="s" * 4097)
    with pytest.raises(TypeError):
        RetryingToolCaller(connection, run, server_name="")


def test_the_mcp_wrapper_over_a_connection_opens_the_breaker_of_its_url(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "fault": http(503, "upstream unavailable")})

    async def main() -> tuple[Any, Any, SessionLost]:
        accounts = EmbeddedAccounts()
        instance = PolicyComponent.load().instantiate(accounts=accounts, entropy=SplitMix64(7))
        run = instance.load_policy(BREAKERS).start_run("CASE-URL")
        async with McpConnection.http(desk.url + "?session=abc") as connection:
            caller = RetryingToolCaller(connection, run, entropy=SplitMix64(3))
            first = await asyncio.wait_for(caller.call_tool("lookup_order", {"order_id": "A1"}), TIMEOUT_S)
            second = await asyncio.wait_for(caller.call_tool("lookup_order", {"order_id": "A2"}), TIMEOUT_S)
        # Another worker on the same store: its connection's `initialize` pseudo-call is refused by the open
        # breaker of the server, as a replan of a pseudo-call is: SessionLost, nothing sent.
        other = PolicyComponent.load().instantiate(accounts=accounts).load_policy(BREAKERS).start_run("CASE-URL-2")
        async with McpConnection.http(desk.url) as connection:
            late = RetryingToolCaller(connection, other, entropy=SplitMix64(3))
            with pytest.raises(SessionLost) as lost:
                await asyncio.wait_for(late.call_tool("lookup_order", {"order_id": "A3"}), TIMEOUT_S)
            assert connection.session is None  # never connected
        return first, second, lost.value

    first, second, lost = asyncio.run(main())
    assert first.is_error and second.is_error and "circuit breaker open" in text_of(second)
    assert "initialize" in str(lost) and "circuit breaker open" in str(lost)
    lines = breaker_lines(caplog, MCP_LOGGER)
    assert {line["server"] for line in lines} == {desk.url}
    assert [(line["scope"], line["to"]) for line in lines] == [("server", "open"), ("tool", "open")]


class Unavailable(Exception):
    """What a client library raises for a 503."""


def _unavailable(calls: list[int]) -> Callable[[Attempt], Any]:
    async def fn(attempt: Attempt) -> Any:
        calls.append(attempt.number)
        raise ObservedFailure(types.http_failure(503, [("content-type", "text/plain")], "upstream unavailable"))

    return fn


def test_the_any_call_helper_with_a_server_stops_calling_once_the_breaker_opens(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.calls")
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy({**BREAKERS, "tools": {"quote": {"effect": "read"}}}).start_run("ANY-BREAKER")
    calls: list[int] = []
    seen: list[BreakerEvent] = []
    metrics = RetryMetrics()
    clock = FakeClock(START)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])

    async def call() -> Any:
        return await asyncio.wait_for(
            call_with_policy(
                run,
                "quote",
                _unavailable(calls),
                server="https://quotes.example/api",
                clock=clock,
                entropy=SplitMix64(1),
                hooks=Hooks(on_breaker=seen.append),
                metrics=metrics,
                meter_provider=meter_provider,
            ),
            TIMEOUT_S,
        )

    with pytest.raises(ReplanNeeded) as first:
        asyncio.run(call())
    assert calls == [1, 2]
    assert "circuit breaker open" in first.value.message
    with pytest.raises(ReplanNeeded) as second:
        asyncio.run(call())
    assert calls == [1, 2]  # not called again
    assert second.value.rule == "circuit-open" and second.value.tool == "quote"
    assert "was not called" in second.value.message and "circuit breaker open" in second.value.message
    assert [(e.server, e.breaker_scope, e.from_state, e.to_state) for e in seen] == [
        ("https://quotes.example/api", "server", "closed", "open"),
        ("https://quotes.example/api", "tool", "closed", "open"),
    ]
    lines = breaker_lines(caplog, "agent_retry_policy.calls")
    assert [(line["tool"], line["scope"], line["from"], line["to"]) for line in lines] == [
        ("quote", "server", "closed", "open"),
        ("quote", "tool", "closed", "open"),
    ]
    refused = [line for line in logged(caplog, "agent_retry_policy.calls") if line.get("step") == 2]
    assert [(line["event"], line["attempt"], line.get("action"), line["rule"]) for line in refused] == [
        ("agent_retry.attempt", 0, "replan", "circuit-open"),
        ("agent_retry.replan", 0, None, "circuit-open"),
    ]
    assert metrics.snapshot()["agent_retry_breaker_changes_total"] == [
        {"labels": {"scope": "server", "to": "open"}, "value": 1},
        {"labels": {"scope": "tool", "to": "open"}, "value": 1},
    ]
    data = reader.get_metrics_data()
    points = [
        (dict(point.attributes), point.value)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "agent_retry.breaker.changes"
        for point in metric.data.data_points
    ]
    assert sorted(points, key=str) == [({"scope": "server", "to": "open"}, 1), ({"scope": "tool", "to": "open"}, 1)]


def test_the_any_call_helper_without_a_server_has_no_breaker(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.calls")
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    policy = instance.load_policy({**BREAKERS, "max-attempts-per-call": 3, "tools": {"quote": {"effect": "read"}}})
    calls: list[int] = []
    clock = FakeClock(START)
    for n in range(1, 4):  # runs sharing one store: with a server, the first call's failures would open its breaker
        run = policy.start_run(f"ANY-NO-BREAKER-{n}")
        with pytest.raises(Escalated) as raised:
            asyncio.run(asyncio.wait_for(call_with_policy(run, "quote", _unavailable(calls), clock=clock), TIMEOUT_S))
        assert raised.value.reason == "call-attempts-spent"
        assert len(calls) == 3 * n  # every call is made, each attempt sent
    assert breaker_lines(caplog, "agent_retry_policy.calls") == []


def test_a_breaker_event_line_and_its_prometheus_counter() -> None:
    event = BreakerEvent(CallScope("R", "p", 3, 7, "t"), "srv", "tool", "half-open", "closed", None, "the probe succeeded")
    assert event.to_log(None) == {
        "event": "agent_retry.breaker",
        "run": "R",
        "policy": "p",
        "step": 3,
        "call": 7,
        "tool": "t",
        "server": "srv",
        "scope": "tool",
        "from": "half-open",
        "to": "closed",
        "until_ms": None,
        "why": "the probe succeeded",
    }
    metrics = RetryMetrics()
    metrics.record(event)
    text = metrics.to_prometheus()
    assert "# TYPE agent_retry_breaker_changes_total counter" in text
    assert 'agent_retry_breaker_changes_total{scope="tool",to="closed"} 1' in text
