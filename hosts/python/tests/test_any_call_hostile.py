"""Defects a hostile review found in `call_with_policy` and its helpers: a
span processor that raises, an unhashable hook, a hook that mutates the
decision, a malformed observation, an unread streamed requests body, the
attempt count of a stop during a status check; the order and numbers of a
guard's refusal's lines, the words of an error no mapping knows, and a plain
(sync) function as the call."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import threading
import time
from typing import Any

import pytest
import requests
from log_lines import HELPER_LOGGER, logged
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanProcessor
from test_sandbox import hostile_bytes

from agent_retry_policy import PolicyComponent, _telemetry
from agent_retry_policy.any_call import call_with_policy
from agent_retry_policy.errors import CallTimedOut, Escalated, ObservedFailure, ReplanNeeded
from agent_retry_policy.events import EscalationEvent, ReplanEvent
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.http_errors import observe_result
from agent_retry_policy.metrics import RetryMetrics
from agent_retry_policy.testing import FakeClock
from agent_retry_policy.types import http_failure, transport_failure

READ = {"tools": {"r": {"effect": "read"}}}
WRITE = {"tools": {"w": {"effect": "write"}}}


def new_run(config: Any, run_id: str = "RUN-HOSTILE") -> Any:
    return PolicyComponent.load().instantiate().load_policy(config).start_run(run_id)


class _Raising(SpanProcessor):
    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("exporter down (start)")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("exporter down (end)")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_span_processor_that_raises_changes_nothing(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_telemetry, "_OTEL_FAILED", [])
    provider = TracerProvider()
    provider.add_span_processor(_Raising(where))

    async def ok(attempt: Any) -> str:
        return "value"

    run = new_run(WRITE)
    assert asyncio.run(call_with_policy(run, "w", ok, clock=FakeClock(0), tracer_provider=provider)) == "value"
    assert run.report()["succeeded-calls"] == 1

    async def unmapped(attempt: Any) -> None:
        raise KeyError("original")

    run = new_run(WRITE)
    with pytest.raises(KeyError, match="original"):
        asyncio.run(call_with_policy(run, "w", unmapped, clock=FakeClock(0), tracer_provider=provider))
    assert run.report()["abandoned-calls"] == 1

    async def unavailable(attempt: Any) -> None:
        raise ObservedFailure(http_failure(503, "", ""))

    run = new_run(READ)
    with pytest.raises(Escalated):
        asyncio.run(call_with_policy(run, "r", unavailable, clock=FakeClock(0), tracer_provider=provider))


@dataclasses.dataclass
class _Pager:  # a dataclass with __call__: not hashable
    url: str
    calls: int = 0

    def __call__(self, event: Any) -> None:
        self.calls += 1
        raise RuntimeError("pager down")


def test_an_unhashable_hook_that_raises_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([ObservedFailure(http_failure(503, "", "")), None])

    async def flaky(attempt: Any) -> str:
        error = next(answers)
        if error is not None:
            raise error
        return "value"

    pager = _Pager("x")
    run = new_run(READ)
    with caplog.at_level(logging.WARNING, logger="agent_retry_policy.calls"):
        result = asyncio.run(call_with_policy(run, "r", flaky, clock=FakeClock(0), hooks=Hooks(on_retry=pager)))
    assert result == "value"
    assert pager.calls == 1
    assert run.report()["succeeded-calls"] == 1
    assert any("agent_retry.hook_failed" in r.getMessage() and "pager down" in r.getMessage() for r in caplog.records)


def test_a_hook_cannot_change_the_escalation_or_the_replan_rule() -> None:
    def on_escalate(event: EscalationEvent) -> None:
        assert event.decision is not None
        action = event.decision["action"]["escalate"]  # type: ignore[index]
        action["effects"].append({"HACKED": 1})
        action["note"] = "HACKED"
        event.decision["rule"] = "HACKED"

    def on_replan(event: ReplanEvent) -> None:
        assert event.decision is not None
        event.decision["rule"] = "HACKED-RULE"

    hooks = Hooks(on_escalate=on_escalate, on_replan=on_replan)

    async def unavailable(attempt: Any) -> None:
        raise ObservedFailure(http_failure(503, "", "x"))

    with pytest.raises(Escalated) as escalated:
        asyncio.run(call_with_policy(new_run(WRITE), "w", unavailable, clock=FakeClock(0), hooks=hooks))
    assert {"HACKED": 1} not in escalated.value.escalation["effects"]
    assert escalated.value.escalation["note"] != "HACKED"

    async def not_found(attempt: Any) -> None:
        raise ObservedFailure(http_failure(404, "", "x"))

    with pytest.raises(ReplanNeeded) as replan:
        asyncio.run(call_with_policy(new_run(READ), "r", not_found, clock=FakeClock(0), hooks=hooks))
    assert replan.value.rule != "HACKED-RULE"


def test_a_malformed_observation_abandons_the_call() -> None:
    run = new_run(WRITE)
    metrics = RetryMetrics()

    async def bogus(attempt: Any) -> None:
        raise ObservedFailure({"kind": "bogus"})  # type: ignore[typeddict-item]

    with pytest.raises(Exception, match="bogus") as raised:
        asyncio.run(call_with_policy(run, "w", bogus, clock=FakeClock(0), metrics=metrics))
    assert not isinstance(raised.value, (Escalated, ReplanNeeded))
    report = run.report()
    assert report["abandoned-calls"] == 1
    assert [e["status"] for e in run.all_effects()] == ["unknown"]  # the write may have applied
    assert metrics.attempts == report["attempts"] == 1


class _Endless(io.RawIOBase):
    def __init__(self, limit: int) -> None:
        self.pulled = 0
        self.limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.pulled >= self.limit:
            return 0
        k = min(len(b), self.limit - self.pulled)
        b[:k] = b"x" * k
        self.pulled += k
        return k


def test_an_unread_streamed_requests_body_is_read_only_to_the_limit() -> None:
    response = requests.Response()
    response.status_code = 503
    response.raw = _Endless(50 * 1024 * 1024)
    response._content = False  # type: ignore[assignment]
    response.encoding = "utf-8"
    observation = observe_result(response)
    assert observation is not None
    assert 0 < len(observation["body"]) <= 65_536  # type: ignore[typeddict-item]
    assert response.raw.pulled <= 65_537


def test_a_stop_during_a_status_check_counts_the_attempt_once() -> None:
    async def timed_out(attempt: Any) -> None:
        raise ObservedFailure(transport_failure("timeout", "t", delivery="sent"))

    async def slow_check(attempt: Any) -> str:
        await asyncio.sleep(2)
        return "found"

    run = new_run(WRITE)
    metrics = RetryMetrics()
    started = time.monotonic()
    with pytest.raises(CallTimedOut):
        asyncio.run(call_with_policy(run, "w", timed_out, status_check=slow_check, call_timeout_s=0.2, metrics=metrics))
    assert time.monotonic() - started < 1.5
    assert metrics.attempts == run.report()["attempts"] == 1


def test_a_blocking_plain_status_check_is_bounded_by_the_calls_limit() -> None:
    async def timed_out(attempt: Any) -> None:
        raise ObservedFailure(transport_failure("timeout", "t", delivery="sent"))

    def blocking_check(attempt: Any) -> str:  # a plain function that blocks (a sync HTTP read)
        time.sleep(2)
        return "found"

    run = new_run(WRITE)
    metrics = RetryMetrics()
    started = time.monotonic()
    with pytest.raises(CallTimedOut):
        asyncio.run(call_with_policy(run, "w", timed_out, status_check=blocking_check, call_timeout_s=0.2, metrics=metrics))
    assert time.monotonic() - started < 1.5
    assert metrics.attempts == run.report()["attempts"] == 1


def test_a_plain_status_check_runs_off_the_event_loop_and_its_answer_counts() -> None:
    async def timed_out(attempt: Any) -> None:
        raise ObservedFailure(transport_failure("timeout", "t", delivery="sent"))

    threads: list[int] = []

    def check(attempt: Any) -> str:
        threads.append(threading.get_ident())
        return "found"

    run = new_run(WRITE)
    assert asyncio.run(call_with_policy(run, "w", timed_out, status_check=check, call_timeout_s=5)) is None  # applied: done
    assert threads and threads[0] != threading.get_ident()
    assert run.report()["attempts"] == 1


def test_a_first_send_the_guard_refuses_is_attempt_0_counted_as_the_report_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    # The liar asks for an hour's wait before the first send: the guard refuses it, nothing is sent.
    component = PolicyComponent(hostile_bytes("liar"), source="liar.wasm")
    run = component.instantiate().load_policy({"base-delay-ms": 20, "x-liar": {"start-delay-ms": 3_600_000}}).start_run("LIAR-START")
    sent: list[int] = []

    async def ok(attempt: Any) -> str:
        sent.append(attempt.number)
        return "value"

    metrics = RetryMetrics()
    with caplog.at_level(logging.INFO, logger=HELPER_LOGGER), pytest.raises(Escalated) as escalated:
        asyncio.run(call_with_policy(run, "r", ok, clock=FakeClock(0), metrics=metrics))
    assert escalated.value.reason == "unclassified-failure" and sent == []
    lines = logged(caplog, HELPER_LOGGER)
    # The attempt line first, then the escalation's; both of attempt 0 (docs/events.md: refused before it was sent).
    assert [(line["event"], line["attempt"]) for line in lines] == [("agent_retry.attempt", 0), ("agent_retry.escalation", 0)]
    assert lines[0]["outcome"] == "not sent" and lines[0]["invariant"] == "delay-over-cap"
    assert metrics.attempts == run.report()["attempts"]


def test_an_error_no_mapping_knows_is_an_unmapped_error(caplog: pytest.LogCaptureFixture) -> None:
    async def unmapped(attempt: Any) -> None:
        raise KeyError("original")

    run = new_run(READ)
    metrics = RetryMetrics()
    with caplog.at_level(logging.INFO, logger=HELPER_LOGGER), pytest.raises(KeyError, match="original"):
        asyncio.run(call_with_policy(run, "r", unmapped, clock=FakeClock(0), metrics=metrics))
    [line] = logged(caplog, HELPER_LOGGER, "agent_retry.attempt")
    assert (line["outcome"], line["action"]) == ("unmapped error", "stop")
    assert run.report()["abandoned-calls"] == 1 and metrics.attempts == run.report()["attempts"] == 1


def test_a_plain_function_is_the_call_run_off_the_loop_its_failures_mapped_as_an_async_ones() -> None:
    threads: list[int] = []
    answers: list[BaseException | None] = [ObservedFailure(http_failure(503, (), "")), ConnectionRefusedError("refused"), None]

    def fetch(attempt: Any) -> str:  # a plain function: a sync HTTP client
        threads.append(threading.get_ident())
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return f"value of attempt {attempt.number}"

    run = new_run(READ)
    assert asyncio.run(call_with_policy(run, "r", fetch, clock=FakeClock(0))) == "value of attempt 3"
    assert len(threads) == 3 and threading.get_ident() not in threads
    assert run.report()["retries"] == 2  # the 503 and the refused connection were retried, as raised by an async function

    def unknown(attempt: Any) -> str:
        raise KeyError("original")

    run = new_run(WRITE)
    with pytest.raises(KeyError, match="original"):
        asyncio.run(call_with_policy(run, "w", unknown, clock=FakeClock(0)))
    assert run.report()["abandoned-calls"] == 1

    def stops_iterating(attempt: Any) -> str:
        return next(iter([]))  # StopIteration, which no future may carry

    run = new_run(READ)
    with pytest.raises(Exception) as raised:
        asyncio.run(asyncio.wait_for(call_with_policy(run, "r", stops_iterating, clock=FakeClock(0)), 5))
    assert isinstance(raised.value, (StopIteration, RuntimeError)) and not isinstance(raised.value, TimeoutError)
    assert run.report()["abandoned-calls"] == 1
