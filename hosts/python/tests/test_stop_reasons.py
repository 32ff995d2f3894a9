"""The reason of a stop line (docs/events.md, "Stop reasons"): `stop_reason`
against every case of tests/events/stop_reasons.json (the vectors every host
checks), and the any-call helper's stops written in those words, in its line
and in the error's message (`{tool}: {reason}`). The MCP wrapper's are checked
in test_pseudo_call_stops.py and test_transport_faults.py (T9)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from log_lines import HELPER_LOGGER, logged

from agent_retry_policy import CallTimedOut, PolicyComponent
from agent_retry_policy._call_core import stop_reason
from agent_retry_policy.any_call import Attempt, call_with_policy
from agent_retry_policy.errors import CallCancelled, ObservedFailure
from agent_retry_policy.types import http_failure

ROOT = Path(__file__).resolve().parents[3]
VECTORS = json.loads((ROOT / "tests/events/stop_reasons.json").read_text(encoding="utf-8"))
CASES = VECTORS["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"case-{i}" for i in range(len(CASES))])
def test_stop_reason_gives_each_vectors_reason(case: dict[str, Any]) -> None:
    assert stop_reason(**case["inputs"]) == case["reason"]


def test_the_vectors_cover_every_cause_place_and_effect() -> None:
    inputs = [case["inputs"] for case in CASES]
    assert {i["cause"] for i in inputs} == {"call-timeout", "run-timeout", "cancelled"}
    assert {i["where"] for i in inputs} == {"in-flight", "between-attempts", "before-send"}
    assert {i["applied"] for i in inputs} == {"nothing-sent", "not-a-write", "may-have-applied", "not-applied"}
    assert {i["during"] for i in inputs} >= {None, "initialize", "tools/list"}
    assert all(set(i) == {"cause", "limit_ms", "where", "attempt", "during", "attempts_sent", "applied"} for i in inputs)


def test_inputs_that_cannot_be_worded_are_refused() -> None:
    with pytest.raises(ValueError, match="limit_ms"):
        stop_reason("call-timeout", None, "between-attempts", None, None, 1, "not-applied")
    with pytest.raises(ValueError, match="attempt"):
        stop_reason("cancelled", None, "in-flight", None, None, 1, "not-applied")
    with pytest.raises(ValueError):
        stop_reason("cancelled", None, "somewhere", None, None, 1, "not-applied")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        stop_reason("cancelled", None, "between-attempts", None, None, 1, "perhaps")  # type: ignore[arg-type]


def new_run() -> Any:
    config = {"tools": {"get_quote": {"effect": "read"}, "send_payment": {"effect": "write"}}}
    return PolicyComponent.load().instantiate().load_policy(config).start_run("RUN-STOPS")


def stop_line(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    (line,) = [line for line in logged(caplog, HELPER_LOGGER, "agent_retry.attempt") if line["action"] == "stop"]
    return line


def test_a_call_limit_with_a_write_in_flight(caplog: pytest.LogCaptureFixture) -> None:
    async def slow(_a: Attempt) -> Any:
        await asyncio.sleep(5)

    with caplog.at_level(logging.INFO, logger=HELPER_LOGGER), pytest.raises(CallTimedOut) as stopped:
        asyncio.run(call_with_policy(new_run(), "send_payment", slow, call_timeout_s=0.1))
    reason = (
        "the call's limit of 100 ms passed while attempt 1 was in flight (1 sent); "
        "the write may have been applied: check before sending it again"
    )
    line = stop_line(caplog)
    assert (line["outcome"], line["attempt"], line["reason"]) == ("call-timeout", 1, reason)
    assert str(stopped.value) == stopped.value.stopped.message == f"send_payment: {reason}"


class StalledClock:
    """A clock whose waits do not end (until the call is cancelled)."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()

    def now_ms(self) -> int:
        return 0

    async def sleep(self, _seconds: float) -> None:
        self.waiting.set()
        await asyncio.sleep(30)


def test_a_cancellation_during_a_backoff(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        clock = StalledClock()

        async def unavailable(_a: Attempt) -> Any:
            raise ObservedFailure(http_failure(503, (), "unavailable"))

        task = asyncio.ensure_future(call_with_policy(new_run(), "get_quote", unavailable, clock=clock, call_timeout_s=60))
        await clock.waiting.wait()
        task.cancel()
        await task

    with caplog.at_level(logging.INFO, logger=HELPER_LOGGER), pytest.raises(CallCancelled) as stopped:
        asyncio.run(go())
    reason = "the call was cancelled between attempts (1 sent); it is not a write"
    line = stop_line(caplog)
    assert (line["outcome"], line["attempt"], line["reason"]) == ("cancelled", 2, reason)
    assert str(stopped.value) == f"get_quote: {reason}"


class EffectsUnreadable:
    """A run whose effects cannot be read (its policy failed), otherwise the run it wraps."""

    def __init__(self, run: Any) -> None:
        self._run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def all_effects(self) -> Any:
        raise RuntimeError("the policy failed")


async def cancelled_in_a_backoff(run: Any) -> None:
    """A keyed write throttled once, cancelled in the backoff before its retry."""
    clock = StalledClock()

    async def throttled(_a: Attempt) -> Any:
        raise ObservedFailure(http_failure(429, (), "slow down"))

    task = asyncio.ensure_future(call_with_policy(run, "send_payment", throttled, clock=clock, call_timeout_s=60, keyed=True))
    await asyncio.wait_for(clock.waiting.wait(), 10)
    task.cancel()
    await task


@pytest.mark.parametrize(
    ("readable", "applied"),
    [(True, "the write was not applied"), (False, "the write may have been applied: check before sending it again")],
)
def test_a_stop_whose_effects_cannot_be_read_assumes_the_worst(caplog: pytest.LogCaptureFixture, readable: bool, applied: str) -> None:
    """As in Node and Rust: a write whose effects the run cannot list may have been applied."""
    run = new_run() if readable else EffectsUnreadable(new_run())
    with caplog.at_level(logging.INFO, logger=HELPER_LOGGER), pytest.raises(CallCancelled) as stopped:
        asyncio.run(cancelled_in_a_backoff(run))
    assert stop_line(caplog)["reason"] == f"the call was cancelled between attempts (1 sent); {applied}"
    assert stopped.value.stopped.may_have_applied is not readable
