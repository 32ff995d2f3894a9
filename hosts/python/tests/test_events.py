"""The event model (docs/events.md): the shared scenario against
tests/events/expected.json, the hooks, the metrics against the run report,
and the Prometheus text."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from events_scenario import EXPECTED, run_scenario, write_dump
from log_lines import HELPER_LOGGER, logged

from agent_retry_policy import PolicyComponent
from agent_retry_policy.any_call import call_with_policy
from agent_retry_policy.errors import Escalated, ObservedFailure, ReplanNeeded
from agent_retry_policy.events import AttemptEvent, CallScope, EscalationEvent, ReplanEvent, StatusCheckEvent, WaitEvent, outcome_words
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.metrics import RetryMetrics
from agent_retry_policy.testing import FakeClock, fixed_entropy
from agent_retry_policy.types import http_failure, transport_failure

START = 1_700_000_000_000


def new_run(config: dict[str, Any], run_id: str = "RUN-EV") -> Any:
    return PolicyComponent.load().instantiate(entropy=fixed_entropy(7)).load_policy(config).start_run(run_id)


def scripted(*answers: Any) -> Any:
    """An attempt function answering each attempt in turn: an Observation raises it, anything else is returned."""
    queue = list(answers)

    async def attempt(_attempt: Any) -> Any:
        answer = queue.pop(0)
        if isinstance(answer, dict) and "kind" in answer:
            raise ObservedFailure(answer)
        return answer

    return attempt


def test_the_scenario_emits_what_every_host_emits() -> None:
    dump, facts = run_scenario()
    write_dump(dump)
    # The facts the dump is made of, checked on their own before the comparison.
    assert facts["sleeps_ms"] == [390, 1000]
    assert facts["results"][0] == {"price_cents": 1200}
    assert isinstance(facts["results"][1], ReplanNeeded) and "postcode must be 5 digits" in facts["results"][1].message
    assert isinstance(facts["results"][2], Escalated) and facts["results"][2].reason == "permission-denied"
    kinds = [(e["event"], e.get("action") or e.get("why")) for e in dump["events"]]
    assert kinds == [
        ("agent_retry.attempt", "retry"),
        ("agent_retry.wait", "retry"),
        ("agent_retry.attempt", "retry"),
        ("agent_retry.wait", "retry"),
        ("agent_retry.attempt", "succeed"),
        ("agent_retry.attempt", "replan"),
        ("agent_retry.replan", None),
        ("agent_retry.attempt", "escalate"),
        ("agent_retry.escalation", None),
    ]
    # Counts agree with the run report, and OpenTelemetry's metrics with RetryMetrics.
    report = facts["report"]
    attempts = dump["metrics"]["agent_retry_attempts_total"]
    assert sum(series["value"] for series in attempts) == report["attempts"] == 5
    otel = facts["otel_metrics"]
    assert sorted((p["attributes"]["class"], p["attributes"]["action"], p["value"]) for p in otel["agent_retry.attempts"]) == sorted(
        (s["labels"]["class"], s["labels"]["action"], s["value"]) for s in attempts
    )
    assert otel["agent_retry.wait.duration"][0]["count"] == 2
    assert otel["agent_retry.wait.duration"][0]["bounds"] == [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
    assert report["waited-ms"] == sum(facts["sleeps_ms"])
    # The key of the keyed write is on its lines; the reads carry none.
    assert [e["key"] for e in dump["events"] if e["event"] == "agent_retry.attempt"][3].startswith("ar1-")
    expected = json.loads(EXPECTED.read_text())
    for part in ("events", "spans", "metrics"):
        assert dump[part] == expected[part], f"{part} differ from tests/events/expected.json"


def test_the_scenario_replays_identically() -> None:
    first, _ = run_scenario()
    second, _ = run_scenario()
    assert first == second


def test_the_attempt_line_keeps_its_fields_and_order() -> None:
    scope = CallScope("R", "p", 1, 2, "t")
    event = AttemptEvent(scope, 1, None, "http 503", "transient", "http-status", "retry", 390, None, None, "why")
    assert list(event.to_log(1.5)) == [
        "event",
        "ts",
        "run",
        "policy",
        "step",
        "call",
        "tool",
        "attempt",
        "key",
        "outcome",
        "class",
        "rule",
        "action",
        "delay_ms",
        "hint_ms",
        "escalation",
        "reason",
    ]
    assert list(WaitEvent(scope, 2, "retry", 390, None).to_log(None))[-4:] == ["attempt", "why", "wait_ms", "hint_ms"]
    assert list(StatusCheckEvent(scope, 1, "check", "found").to_log(None))[-3:] == ["attempt", "check_tool", "result"]
    assert list(EscalationEvent(scope, 1, "r", "permission-denied", "n").to_log(None))[-4:] == ["attempt", "rule", "reason", "note"]
    assert list(ReplanEvent(scope, 1, "r", "m").to_log(None))[-3:] == ["attempt", "rule", "message"]


def test_outcome_words_do_not_change() -> None:
    assert outcome_words(http_failure(503)) == "http 503"
    assert outcome_words(transport_failure("timeout")) == "transport timeout"
    assert outcome_words({"kind": {"protocol-error": -32603}}) == "json-rpc -32603"
    assert outcome_words({"kind": {"tool-error": None}}) == "tool error"
    assert outcome_words({"kind": "input-required"}) == "input required"


def test_hooks_see_the_events_with_the_decision_before_the_wrapper_acts() -> None:
    seen: list[tuple[str, Any]] = []
    clock = FakeClock(START)
    hooks = Hooks(
        on_wait=lambda e: seen.append(("wait", (e.attempt, e.why, e.wait_ms, list(clock.sleeps_ms)))),
        on_retry=lambda e: seen.append(("retry", (e.attempt, e.delay_ms, e.decision["action"]["retry"]["delay-ms"], e.policy, e.tool))),
        on_replan=lambda e: seen.append(("replan", e.message)),
        on_escalate=lambda e: seen.append(("escalate", (e.reason, e.note[:11]))),
    )
    run = new_run({"tools": {"q": {"effect": "read"}}})
    metrics = RetryMetrics()

    async def play() -> list[Any]:
        out: list[Any] = []
        out.append(await call_with_policy(run, "q", scripted(http_failure(503), "ok"), hooks=hooks, clock=clock, metrics=metrics))
        with pytest.raises(ReplanNeeded) as replan:
            await call_with_policy(run, "q", scripted(http_failure(400, (), "bad postcode")), hooks=hooks, clock=clock, metrics=metrics)
        out.append(replan.value)
        with pytest.raises(Escalated):
            await call_with_policy(run, "q", scripted(http_failure(403)), hooks=hooks, clock=clock, metrics=metrics)
        return out

    results = asyncio.run(play())
    assert results[0] == "ok"
    # The wait hook ran before the sleep (the clock had not moved); the replan hook got the message.
    delay = clock.sleeps_ms[0]
    assert seen[0] == ("retry", (1, delay, delay, run.instance.policy_identity, "q"))
    assert seen[1] == ("wait", (2, "retry", delay, []))
    assert seen[2][0] == "replan" and "bad postcode" in seen[2][1]
    assert seen[3] == ("escalate", ("permission-denied", "Run RUN-EV "))
    assert len(seen) == 4
    assert metrics.attempts == run.report()["attempts"] == 4


def test_a_raising_hook_is_logged_once_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_event: Any) -> None:
        raise RuntimeError("hook bug")

    hooks = Hooks(on_wait=broken, on_retry=broken, on_escalate=broken)
    run = new_run({"tools": {"q": {"effect": "read"}}})
    clock = FakeClock(START)

    async def play() -> Any:
        first = await call_with_policy(run, "q", scripted(http_failure(503), http_failure(503), "ok"), hooks=hooks, clock=clock)
        with pytest.raises(Escalated):
            await call_with_policy(run, "q", scripted(http_failure(403)), hooks=hooks, clock=clock)
        return first

    with caplog.at_level(logging.WARNING, logger="agent_retry_policy.calls"):
        assert asyncio.run(play()) == "ok"
    failed = logged(caplog, HELPER_LOGGER, "agent_retry.hook_failed")
    # Three hooks raised, two of them twice: each is logged once.
    assert sorted(f["hook"] for f in failed) == ["on_escalate", "on_retry", "on_wait"]
    assert all(f["error"] == "RuntimeError: hook bug" for f in failed)
    assert len(clock.sleeps_ms) == 2  # both retries waited as without hooks


def test_hooks_must_be_hooks() -> None:
    run = new_run({})
    with pytest.raises(TypeError, match="Hooks"):
        asyncio.run(call_with_policy(run, "q", scripted("ok"), hooks={"on_wait": print}))  # type: ignore[arg-type]


def test_prometheus_text_has_the_documented_names_labels_and_buckets() -> None:
    dump, _ = run_scenario()
    metrics = RetryMetrics()
    run = new_run({"tools": {"q": {"effect": "read"}}})
    asyncio.run(call_with_policy(run, "q", scripted(http_failure(503), "ok"), clock=FakeClock(START), metrics=metrics))
    text = metrics.to_prometheus()
    assert text.endswith("\n")
    for name in (
        "agent_retry_attempts_total",
        "agent_retry_replans_total",
        "agent_retry_escalations_total",
        "agent_retry_status_checks_total",
        "agent_retry_waits_total",
        "agent_retry_wait_seconds",
        "agent_retry_account_waits_total",
        "agent_retry_account_refusals_total",
        "agent_retry_policy_updates_total",
    ):
        assert f"# TYPE {name} " in text
    assert 'agent_retry_attempts_total{class="transient",action="retry"} 1' in text
    assert 'agent_retry_attempts_total{class="success",action="succeed"} 1' in text
    assert "agent_retry_replans_total 0" in text
    buckets = re.findall(r'agent_retry_wait_seconds_bucket\{why="retry",le="([^"]+)"\} (\d+)', text)
    assert [le for le, _ in buckets] == ["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf"]
    counts = [int(n) for _, n in buckets]
    assert counts == sorted(counts) and counts[-1] == 1  # cumulative
    assert 'agent_retry_wait_seconds_count{why="retry"} 1' in text
    # Every sample line parses as `name{labels} value`.
    for line in text.splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [0-9.e+-]+', line), line


def test_a_label_value_is_escaped() -> None:
    metrics = RetryMetrics()
    metrics.record(EscalationEvent(CallScope("R", "p", 1, 1, "t"), 1, None, 'a"b\\c\nd', "note"))
    assert 'agent_retry_escalations_total{reason="a\\"b\\\\c\\nd"} 1' in metrics.to_prometheus()


def test_live_policy_updates_reach_the_hook_and_the_counter(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    import os

    from test_live import deployed

    from agent_retry_policy import LivePolicy, UpdateError

    seen: list[Any] = []

    def broken(_event: Any) -> None:
        raise RuntimeError("observer bug")

    source = deployed(tmp_path)
    metrics = RetryMetrics()
    live = LivePolicy.open(source, hooks=Hooks(on_policy_update=seen.append, on_retry=broken), metrics=metrics)
    source.config.write_text('{"default-effect": "read", "max-attempts-per-call": 2}')
    later = os.stat(source.config).st_mtime_ns + 1_000_000_000
    os.utime(source.config, ns=(later, later))
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.live"):
        identity = live.reload()
        source.config.write_text("{not json")
        os.utime(source.config, ns=(later + 1, later + 1))
        with pytest.raises(UpdateError):
            live.reload()
        live.rollback()
    assert [(e.outcome, e.identity) for e in seen] == [("accepted", str(identity)), ("refused", None), ("rolled-back", seen[2].identity)]
    assert seen[1].kind == "config" and seen[1].serving == str(identity)
    updates = {s["labels"]["outcome"]: s["value"] for s in metrics.snapshot()["agent_retry_policy_updates_total"]}
    assert updates == {"accepted": 1, "refused": 1, "rolled-back": 1}
    # The log line is the one of 0.7: event, message, then the fields.
    lines = logged(caplog, "agent_retry_policy.live")
    assert [list(line)[:2] for line in lines] == [["event", "message"]] * 3
    assert [line["message"] for line in lines] == ["policy update accepted", "policy update refused", "policy rolled back"]
