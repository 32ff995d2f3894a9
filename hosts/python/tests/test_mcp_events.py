"""The MCP wrapper's events against the demo server (docs/events.md): hooks,
metrics whose attempts equal the run report's, status-check and escalation
events, span trees with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from demo_server import Desk, http, timeout_after_apply
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_mcp_e2e import NOTE, new_caller, run_with_session, text_of

from agent_retry_policy import Escalated
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.mcp_client import StatusCheckRequest
from agent_retry_policy.metrics import RetryMetrics


def lines_of(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    # The attempt lines on the wrapper's logger, the other events on its child `events`.
    return logged(caplog, MCP_LOGGER, children=True)


def test_a_run_of_retries_a_status_check_and_an_escalation_counts_what_the_report_counts(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve(
        {"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")},
        {"tool": "lookup_order", "call": 2, "fault": http(429, "slow down", (("Retry-After", "0"),))},
        {"tool": "record_note", "call": 1, "fault": timeout_after_apply(1000)},
        {"tool": "issue_refund", "call": 1, "fault": http(403, "forbidden")},
    )
    seen: list[tuple[str, Any]] = []
    hooks = Hooks(
        on_wait=lambda e: seen.append(("wait", (e.tool, e.why))),
        on_retry=lambda e: seen.append(("retry", (e.tool, e.attempt, e.decision["class"]))),
        on_status_check=lambda e: seen.append(("status", (e.tool, e.check_tool, e.result))),
        on_escalate=lambda e: seen.append(("escalate", (e.tool, e.reason))),
    )
    metrics = RetryMetrics()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def note_listed(request: StatusCheckRequest) -> Any:
        await asyncio.sleep(0.8)  # let the slow first attempt finish on the server
        listed = await request.session.call_tool("list_notes", {"order_id": request.arguments["order_id"]})
        return "found" if any(n["text"] == request.arguments["text"] for n in json.loads(text_of(listed))["notes"]) else "absent"

    async def body(session: ClientSession) -> Any:
        caller = new_caller(
            session, attempt_timeout_s=0.3, status_check=note_listed, hooks=hooks, metrics=metrics, tracer_provider=tracer_provider
        )
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        assert not (await caller.call_tool("record_note", {"order_id": "A1", "text": NOTE})).is_error
        with pytest.raises(Escalated) as escalated:
            await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 100})
        return caller.run.report(), escalated.value

    report, escalated = run_with_session(desk, body)
    assert escalated.reason == "permission-denied"
    # The counts agree with the run report (the tools/list pseudo-call's attempt included).
    assert metrics.attempts == report["attempts"]
    snapshot = metrics.snapshot()
    assert snapshot["agent_retry_status_checks_total"] == [{"labels": {"result": "found"}, "value": 1}]
    assert snapshot["agent_retry_escalations_total"] == [{"labels": {"reason": "permission-denied"}, "value": 1}]
    assert sum(s["count"] for s in snapshot["agent_retry_wait_seconds"]) == report["waits"]
    assert ("retry", ("lookup_order", 1, "transient")) in seen and ("retry", ("lookup_order", 2, "throttled")) in seen
    assert ("status", ("record_note", "note_listed", "found")) in seen
    assert seen[-1] == ("escalate", ("issue_refund", "permission-denied"))
    assert [kind for kind, _ in seen].count("wait") == report["waits"]
    # The log: the attempt lines as before, and the new events beside them.
    events = [line["event"] for line in lines_of(caplog)]
    for name in ("agent_retry.attempt", "agent_retry.wait", "agent_retry.status_check", "agent_retry.escalation"):
        assert name in events
    # The spans: one per call, one client span per tools/call attempt under it.
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name.startswith("execute_tool ")]
    assert [s.name for s in calls] == ["execute_tool lookup_order", "execute_tool record_note", "execute_tool issue_refund"]
    assert [dict(s.attributes or {})["agent_retry.action"] for s in calls] == ["succeed", "succeed", "escalate"]
    assert [dict(s.attributes or {})["agent_retry.attempts"] for s in calls] == [3, 1, 1]
    lookups = [s for s in spans if s.name == "tools/call lookup_order"]
    assert len(lookups) == 3 and all(s.parent is not None and s.parent.span_id == calls[0].context.span_id for s in lookups)
    assert [e.name for e in calls[1].events] == ["agent_retry.status_check"]


def test_a_task_polled_to_completion_emits_its_polls_and_counts_one_attempt(
    demo: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    from test_tasks_and_continuations import CONFIG, FLAGS, REFUND

    from agent_retry_policy import EmbeddedAccounts, McpConnection, PolicyComponent, SplitMix64
    from agent_retry_policy.mcp_client import RetryingToolCaller

    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--task-work-ms", "600", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(CONFIG).start_run("tasks-events")
    metrics, waits = RetryMetrics(), []

    async def go() -> Any:
        async with McpConnection.http(server.url) as connection:
            caller = RetryingToolCaller(connection, run, entropy=SplitMix64(1), metrics=metrics, hooks=Hooks(on_wait=waits.append))
            return await caller.call_tool("issue_refund", dict(REFUND))

    assert not asyncio.run(go()).is_error
    lines = lines_of(caplog)
    polls = [line for line in lines if line["event"] == "agent_retry.task_poll"]
    # The task the call answered with is a status read too (as in every host), then one per poll.
    assert len(polls) == run.report()["polls"] + 1 >= 3
    assert [p["status"] for p in polls][-1] == "completed" and set(p["status"] for p in polls[:-1]) == {"working"}
    assert len({p["task_id"] for p in polls}) == 1 and all(p["tool"] == "issue_refund" and p["attempt"] == 1 for p in polls)
    refund = [line["event"] for line in lines if line["tool"] == "issue_refund"]
    assert refund[:2] == ["agent_retry.task_poll", "agent_retry.attempt"], "the task's status, then the attempt line that reports it"
    poll_waits = [w for w in waits if w.why == "poll"]
    assert len(poll_waits) == run.report()["polls"]
    # A task's polls are not attempts: the counts still equal the report's.
    assert metrics.attempts == run.report()["attempts"]
    assert metrics.snapshot()["agent_retry_waits_total"] == [{"labels": {"why": "poll"}, "value": len(poll_waits)}]
