"""The run-time guard replays tests/vectors/guard/guard.json: every case, its
events in order; the first violation's invariant and event index must be the
case's `expect` (the same in every host)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_retry_policy.conformance import translate_failure
from agent_retry_policy.guard import CallGuard, Invariant, Outcome, RunGuard, Violation, speaks_about_retrying

REPO = Path(__file__).resolve().parents[3]
GUARD_VECTORS = REPO / "tests" / "vectors" / "guard" / "guard.json"
CASES: list[dict[str, Any]] = json.loads(GUARD_VECTORS.read_text(encoding="utf-8"))["cases"]


def outcome_of(readable: Any) -> Outcome:
    """A readable outcome (`"success"`, `{"failure"}`, `{"task"}`, `{"empty-result"}`) as the guard's facts."""
    if isinstance(readable, dict) and "failure" in readable:
        return Outcome.of(translate_failure(readable["failure"]))  # type: ignore[arg-type]
    if isinstance(readable, dict) and "task" in readable:
        return Outcome.task(readable["task"]["status"])
    return Outcome.of(None)


def report_poll(call: CallGuard, readable: Any) -> None:
    """A `polled` event: a task status, the task's end, or the poll's own failure."""
    if isinstance(readable, dict) and "poll-failure" in readable:
        call.poll_failed()
    else:
        call.polled(outcome_of(readable))


def decision_of(words: dict[str, Any]) -> dict[str, Any]:
    """A vector's `{action, delay-ms, reconnect, idempotency-key}` as a `last-decision` value."""
    kind = words["action"]
    payloads: dict[str, Any] = {
        "retry": {
            "delay-ms": words.get("delay-ms", 0),
            "attempt": 0,
            "idempotency-key": words.get("idempotency-key"),
            "reconnect": words.get("reconnect", False),
        },
        "poll": {"delay-ms": words.get("delay-ms", 0), "task-id": "t", "reconnect": words.get("reconnect", False)},
        "replan": "",
        "succeed": None,
        "escalate": {
            "reason": "unclassified-failure",
            "last-error": None,
            "resets-in-ms": None,
            "effects": [],
            "effects-total": 0,
            "note": "",
        },
    }
    action: Any = kind if kind == "check-status" else {kind: payloads[kind]}
    return {"action": action, "class": "unclassified", "attempt": 0, "hint-ms": None, "rule": "", "reason": "", "cancel-task": False}


def replay(case: dict[str, Any]) -> tuple[Violation, int] | None:
    """The first violation and its event's index, or None."""
    guard = RunGuard(json.dumps(case["config"]))
    calls: list[CallGuard] = []
    for index, event in enumerate(case["events"]):
        call = calls[event["call"]] if "call" in event else (calls[-1] if calls else None)
        found: Violation | None = None
        if "begin" in event:
            begin = event["begin"]
            call, found = guard.begin(begin["tool"], begin["idempotency-key"], begin["hints"], begin["delay-ms"])
            calls.append(call)
        elif "attempted" in event:
            assert call is not None
            call.attempted(outcome_of(event["attempted"]))
        elif "polled" in event:
            assert call is not None
            report_poll(call, event["polled"])
        elif "verdict" in event:
            assert call is not None
            v = event["verdict"]
            found = call.verdict(v["action"], v["delay-ms"], v["hint-ms"], v["reconnect"], cancel_task=v.get("cancel-task", False))
        elif "status-check" in event:
            assert call is not None
            call.status_checked(event["status-check"])
        elif "decision" in event:
            assert call is not None
            found = call.decision(decision_of(event["decision"]))  # type: ignore[arg-type]
        else:
            raise AssertionError(f"unknown event {event}")
        if found is not None:
            return found, index
    return None


def test_the_vectors_cover_every_invariant() -> None:
    named = {case["expect"]["violation"] for case in CASES}
    assert named >= {invariant.value for invariant in Invariant} | {None}


@pytest.mark.parametrize("case", CASES, ids=[case["description"] for case in CASES])
def test_guard_vector(case: dict[str, Any]) -> None:
    found = replay(case)
    expect = case["expect"]
    if expect["violation"] is None:
        assert found is None, f"refused {found[0]} at event {found[1]}" if found else ""
        return
    assert found is not None, f"expected {expect['violation']} at event {expect['event']}, none refused"
    violation, index = found
    assert (violation.invariant.value, index) == (expect["violation"], expect["event"]), violation.detail
    assert violation.detail and str(violation).startswith(f"invariant {expect['violation']}: ")


def test_the_first_violation_is_kept() -> None:
    guard = RunGuard("{}")
    call, _ = guard.begin("issue_refund", None, None, 0)
    call.attempted(Outcome(http_status=403))
    first = call.verdict("retry", 100, None, False)
    assert first is not None and guard.violation == first
    call.verdict("retry", 10**12, None, False)
    assert guard.violation == first


@pytest.mark.parametrize("config", ["not json", "[]", '{"tools": 3, "status-overrides": [], "account-budget": 7}', "null"])
def test_a_configuration_the_guard_cannot_read_takes_the_defaults(config: str) -> None:
    guard = RunGuard(config)
    assert (guard.max_delay_ms, guard.max_steps_per_run, guard.account_wait_ms) == (30_000, 30, 0)
    assert guard.unkeyed_write("issue_refund", None, None)


def test_delays_up_to_u64_max_are_refused_without_overflow() -> None:
    guard = RunGuard("{}")
    call, found = guard.begin("t", "k", None, 2**64 - 1)
    assert found is not None and found.invariant is Invariant.DELAY_OVER_CAP
    call.attempted(Outcome(http_status=503))
    assert (v := call.verdict("retry", 2**64 - 1, 2**64 - 1, False)) is not None and v.invariant is Invariant.DELAY_OVER_CAP


@pytest.mark.parametrize(
    ("headers", "speaks"),
    [
        ("X-Should-Retry:  TRUE ", True),
        ("content-type: text/plain\nx-should-retry: false", False),
        ("GRPC-Status: 14", True),
        ("x-envoy-overloaded:", True),
        ("x-amzn-errortype", False),  # a line without a colon names no header
        ("x-should-retry-after: true", False),
    ],
)
def test_a_server_speaks_about_retrying_in_its_headers(headers: str, speaks: bool) -> None:
    assert speaks_about_retrying(headers) is speaks


def test_a_retry_that_cancels_the_task_first_is_no_task_resent() -> None:
    # The wrapper cancels the task before it acts on the verdict: a keyed call may be sent again;
    # an unkeyed write may not, since the cancelled task leaves its outcome unknown.
    for key, expected in (("k-1", None), (None, Invariant.UNKNOWN_WRITE_RESENT)):
        guard = RunGuard("{}")
        call, _ = guard.begin("archive_orders", key, None, 0)
        call.attempted(Outcome.task("working"))
        call.poll_failed()
        assert call.verdict("retry", 100, None, False) is not None  # task-resent without the cancel
        guard = RunGuard("{}")
        call, _ = guard.begin("archive_orders", key, None, 0)
        call.attempted(Outcome.task("working"))
        call.poll_failed()
        found = call.verdict("retry", 100, None, False, cancel_task=True)
        assert (found.invariant if found else None) is expected
