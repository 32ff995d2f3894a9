"""Runs tests/events/scenario.json (docs/events.md, "One scenario, three hosts")
through `call_with_policy` with a fake clock, fixed entropy and OpenTelemetry's
in-memory exporters, and gives the dump every host writes to
target/events/<host>.json: the log lines without `ts`, the span tree, the metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_retry_policy import EmbeddedSharedState, PolicyComponent
from agent_retry_policy.any_call import call_with_policy
from agent_retry_policy.conformance import translate_failure
from agent_retry_policy.errors import Escalated, ObservedFailure, ReplanNeeded
from agent_retry_policy.metrics import RetryMetrics
from agent_retry_policy.testing import FakeClock, fixed_entropy

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "tests/events/scenario.json"
EXPECTED = ROOT / "tests/events/expected.json"
DUMP = ROOT / "target/events/python.json"


class Lines(logging.Handler):
    """Keeps the JSON log lines a logger writes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def span_tree(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    """The spans in the order they ended: name, parent's name, kind, status, attributes, events."""
    spans = exporter.get_finished_spans()
    names = {span.context.span_id: span.name for span in spans}
    return [
        {
            "name": span.name,
            "parent": names.get(span.parent.span_id) if span.parent is not None else None,
            "kind": span.kind.name.lower(),
            "status": span.status.status_code.name.lower(),
            "attributes": dict(span.attributes or {}),
            "events": [{"name": event.name, "attributes": dict(event.attributes or {})} for event in span.events],
        }
        for span in spans
    ]


def otel_metrics(reader: InMemoryMetricReader) -> dict[str, list[dict[str, Any]]]:
    """The OpenTelemetry metric points by instrument: attributes and value (counters) or count and sum (histograms)."""
    data = reader.get_metrics_data()
    out: dict[str, list[dict[str, Any]]] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = []
                for point in metric.data.data_points:
                    if hasattr(point, "bucket_counts"):
                        entry = {"attributes": dict(point.attributes), "count": point.count, "sum": point.sum}
                        entry["bounds"] = list(point.explicit_bounds)
                    else:
                        entry = {"attributes": dict(point.attributes), "value": point.value}
                    points.append(entry)
                out[metric.name] = sorted(points, key=lambda p: json.dumps(p["attributes"], sort_keys=True))
    return out


def run_scenario() -> tuple[dict[str, Any], dict[str, Any]]:
    """The dump, and what else the test checks (the run report, the sleeps, the OpenTelemetry metrics, the results)."""
    scenario = json.loads(SCENARIO.read_text())
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics = RetryMetrics()
    clock = FakeClock(scenario["clock_start_ms"])
    entropy = fixed_entropy(scenario["entropy_seed"])
    run = (
        PolicyComponent.load()
        # A store of its own: the scenario's breakers (if any) start closed however often it runs.
        .instantiate(entropy=fixed_entropy(scenario["entropy_seed"]), shared_state=EmbeddedSharedState())
        .load_policy(scenario["config"])
        .start_run(scenario["run_id"])
    )
    log = logging.getLogger("agent_retry_policy.calls.scenario")
    log.setLevel(logging.INFO)
    log.propagate = False
    lines = Lines()
    log.addHandler(lines)
    results: list[Any] = []

    async def play() -> None:
        for call in scenario["calls"]:
            answers = iter(call["answers"])

            async def attempt(_attempt: Any, answers: Any = answers) -> Any:
                answer = next(answers)
                if "failure" in answer:
                    raise ObservedFailure(translate_failure(answer["failure"]))
                return answer["ok"]

            try:
                results.append(
                    await call_with_policy(
                        run,
                        call["tool"],
                        attempt,
                        server=call.get("server"),
                        clock=clock,
                        entropy=entropy,
                        policy_identity=scenario["policy_identity"],
                        metrics=metrics,
                        log=log,
                        tracer_provider=tracer_provider,
                        meter_provider=meter_provider,
                    )
                )
            except (ReplanNeeded, Escalated) as e:
                results.append(e)

    try:
        asyncio.run(play())
    finally:
        log.removeHandler(lines)
    events = [{name: value for name, value in line.items() if name != "ts"} for line in lines.lines]
    dump = {"events": events, "spans": span_tree(exporter), "metrics": metrics.snapshot()}
    facts = {"report": run.report(), "sleeps_ms": clock.sleeps_ms, "otel_metrics": otel_metrics(reader), "results": results}
    return json.loads(json.dumps(dump, sort_keys=True)), facts


def write_dump(dump: dict[str, Any]) -> None:
    DUMP.parent.mkdir(parents=True, exist_ok=True)
    DUMP.write_text(json.dumps(dump, sort_keys=True, indent=2, ensure_ascii=False) + "\n")
