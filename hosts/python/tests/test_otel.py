"""OpenTelemetry (docs/events.md, "Traces"): the MCP wrapper's span tree, span
events and metric instruments with the SDK's in-memory exporters, the W3C
trace context in `tools/call`'s `params._meta`, the tools-without-hints
warning, the counts against the run report; and everything still working
when opentelemetry-api cannot be imported."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
from typing import Any

import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_retry_policy import Escalated, PolicyComponent
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.metrics import RetryMetrics

READ = ToolAnnotations(read_only_hint=True)


def result(text: str, *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


class ScriptedSession:
    """A ClientSession stand-in: `call_tool` answers from a script and records each request's `meta`."""

    def __init__(self, *answers: CallToolResult, tools: list[Tool] | None = None) -> None:
        self.answers = list(answers)
        self.metas: list[Any] = []
        self.tools = tools or []

    async def call_tool(self, name: str, arguments: Any = None, **options: Any) -> CallToolResult:
        self.metas.append(options.get("meta"))
        return self.answers.pop(0)

    async def list_tools(self, params: Any = None) -> Any:
        from mcp.types import ListToolsResult

        return ListToolsResult(tools=self.tools)


def providers() -> tuple[InMemorySpanExporter, TracerProvider, InMemoryMetricReader, MeterProvider]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return exporter, tracer_provider, reader, MeterProvider(metric_readers=[reader])


def new_run(config: Any = None) -> Any:
    return PolicyComponent.load().instantiate().load_policy(config or {"base-delay-ms": 1}).start_run("RUN-OTEL")


async def no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


def test_the_mcp_wrapper_traces_a_call_and_its_attempts_and_passes_trace_context() -> None:
    exporter, tracer_provider, reader, meter_provider = providers()
    session = ScriptedSession(result("upstream answered HTTP 503", error=True), result('{"order":"ORD-1"}'))
    run, metrics = new_run(), RetryMetrics()
    caller = RetryingToolCaller(
        session,  # type: ignore[arg-type]
        run,
        tools=[Tool(name="lookup", input_schema={"type": "object"}, annotations=READ)],
        sleep=no_sleep,
        metrics=metrics,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    answer = asyncio.run(caller.call_tool("lookup", {}))
    assert not answer.is_error
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["tools/call lookup", "tools/call lookup", "execute_tool lookup"]
    call = spans[-1]
    first, second = spans[0], spans[1]
    assert all(span.parent is not None and span.parent.span_id == call.context.span_id for span in (first, second))
    assert call.parent is None and call.kind.name == "INTERNAL" and first.kind.name == "CLIENT"
    assert dict(call.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "agent_retry.run": "RUN-OTEL",
        "agent_retry.policy": run.instance.policy_identity,
        "agent_retry.step": 1,
        "agent_retry.action": "succeed",
        "agent_retry.attempts": 2,
    }
    a1 = dict(first.attributes or {})
    assert (a1["mcp.method.name"], a1["gen_ai.tool.name"], a1["agent_retry.attempt"], a1["agent_retry.action"]) == (
        "tools/call",
        "lookup",
        1,
        "retry",
    )
    assert "http.request.resend_count" not in a1 and a1["error.type"] == "tool error" and first.status.status_code.name == "ERROR"
    a2 = dict(second.attributes or {})
    assert (a2["http.request.resend_count"], a2["agent_retry.class"], a2["agent_retry.action"]) == (1, "success", "succeed")
    assert second.status.status_code.name == "UNSET"
    assert [event.name for event in call.events] == ["agent_retry.wait"]
    assert dict(call.events[0].attributes or {})["agent_retry.why"] == "retry"
    # Each tools/call carried its own attempt span's trace context.
    for meta, span in zip(session.metas, (first, second), strict=True):
        trace_id, span_id = f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"
        assert meta["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    # The metric instruments, and the counts against the run report.
    data = reader.get_metrics_data()
    names = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert sum(p.value for p in names["agent_retry.attempts"].data.data_points) == run.report()["attempts"] == metrics.attempts == 2
    assert [p.count for p in names["agent_retry.wait.duration"].data.data_points] == [1]


def test_an_escalation_ends_the_call_span_with_its_reason() -> None:
    exporter, tracer_provider, _, meter_provider = providers()
    session = ScriptedSession(result("HTTP 403 forbidden", error=True))
    escalations: list[Any] = []
    caller = RetryingToolCaller(
        session,  # type: ignore[arg-type]
        new_run(),
        tools=[Tool(name="lookup", input_schema={"type": "object"}, annotations=READ)],
        sleep=no_sleep,
        hooks=Hooks(on_escalate=escalations.append),
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    with pytest.raises(Escalated) as escalated:
        asyncio.run(caller.call_tool("lookup", {}))
    call = exporter.get_finished_spans()[-1]
    assert call.name == "execute_tool lookup" and call.status.status_code.name == "ERROR"
    assert dict(call.attributes or {})["error.type"] == escalated.value.reason
    assert [e.name for e in call.events] == ["agent_retry.escalation"]
    assert [(e.reason, e.note) for e in escalations] == [(escalated.value.reason, escalated.value.note)]


def test_tools_without_annotations_are_warned_about_once_per_connection(caplog: pytest.LogCaptureFixture) -> None:
    tools = [Tool(name=f"tool_{i}", input_schema={"type": "object"}) for i in range(30)] + [
        Tool(name="lookup", input_schema={"type": "object"}, annotations=READ)
    ]
    session = ScriptedSession(result("ok"), result("ok"), tools=tools)
    with caplog.at_level(logging.WARNING, logger="agent_retry_policy.mcp.events"):
        for run_id in ("W-1", "W-2"):  # two runs, two callers, one connection
            run = PolicyComponent.load().instantiate().load_policy({}).start_run(run_id)
            caller = RetryingToolCaller(session, run, sleep=no_sleep)  # type: ignore[arg-type]
            asyncio.run(caller.call_tool("lookup", {}))
    warnings = [json.loads(r.getMessage()) for r in caplog.records if "tools_without_hints" in r.getMessage()]
    assert {r.name for r in caplog.records if "tools_without_hints" in r.getMessage()} == {"agent_retry_policy.mcp.events"}
    assert len(warnings) == 1
    warning = warnings[0]
    assert warning["count"] == 30 and len(warning["tools"]) == 20 and "lookup" not in warning["tools"]
    assert "docs/users.md#a-tool-without-annotations-is-an-unkeyed-write" in warning["reason"]


def test_without_opentelemetry_everything_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_retry_policy import otel
    from agent_retry_policy.any_call import call_with_policy

    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now fails
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    try:
        importlib.reload(otel)
        assert otel.AVAILABLE is False and otel.recorder() is None
        metrics = RetryMetrics()
        run = new_run({"tools": {"q": {"effect": "read"}}})
        answers = [ConnectionRefusedError(), "ok"]

        async def attempt(_a: Any) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        from agent_retry_policy.testing import FakeClock

        assert asyncio.run(call_with_policy(run, "q", attempt, clock=FakeClock(0), metrics=metrics)) == "ok"
        assert metrics.attempts == run.report()["attempts"] == 2
        session = ScriptedSession(result("ok"))
        caller = RetryingToolCaller(
            session,  # type: ignore[arg-type]
            new_run(),
            tools=[Tool(name="lookup", input_schema={"type": "object"}, annotations=READ)],
        )
        assert caller.telemetry.otel is None
        assert not asyncio.run(caller.call_tool("lookup", {})).is_error
        assert session.metas == [None]  # no trace context: `meta` not passed
    finally:
        monkeypatch.undo()
        importlib.reload(otel)
    assert otel.AVAILABLE is True


def test_a_failing_exporter_does_not_break_the_call(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(InMemorySpanExporter):
        def export(self, spans: Any) -> Any:
            raise RuntimeError("collector down")

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Broken()))
    session = ScriptedSession(result("upstream answered HTTP 503", error=True), result("ok"))
    caller = RetryingToolCaller(
        session,  # type: ignore[arg-type]
        new_run(),
        tools=[Tool(name="lookup", input_schema={"type": "object"}, annotations=READ)],
        sleep=no_sleep,
        tracer_provider=tracer_provider,
    )
    assert not asyncio.run(caller.call_tool("lookup", {})).is_error
