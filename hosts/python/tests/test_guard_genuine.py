"""The genuine policy never trips the run-time guard: every case of
tests/vectors/runs-*.json runs through the conformance runner, and a guard
observes its readable steps as the wrapper would (begin, attempted, verdict,
status check, decision). Zero violations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_guard_vectors import outcome_of, report_poll

from agent_retry_policy.component import PolicyComponent
from agent_retry_policy.conformance import canonical_json_text, run_case
from agent_retry_policy.guard import CallGuard, RunGuard, Violation
from agent_retry_policy.types import action_name

REPO = Path(__file__).resolve().parents[3]
RUN_FILES = sorted((REPO / "tests" / "vectors").glob("runs-*.json"))
CASES = [(path.name, case) for path in RUN_FILES for case in json.loads(path.read_text(encoding="utf-8"))["cases"]]


@pytest.fixture(scope="module")
def component() -> PolicyComponent:
    return PolicyComponent.load()


def observe(case: dict[str, Any], outputs: list[Any]) -> tuple[tuple[Violation, int] | None, int, int]:
    """Feeds the guard each step the runner ran, with the component's answer:
    the first violation and its step (or None), how many verdicts it checked
    and how many poll outcomes it reported (`polled`)."""
    checked = polls = 0
    config = canonical_json_text(case.get("config", {}))
    guard: RunGuard | None = None
    calls: dict[int, CallGuard] = {}
    current: dict[int, int] = {}  # per call, the attempt the runner reports (as `run_step` keeps it)
    counted: dict[int, int] = {}  # per call, the last attempt counted as sent
    polling: set[int] = set()  # the calls whose task lives (their next report of the same attempt is a poll's)
    for index, (step, output) in enumerate(zip(case["steps"], outputs, strict=True)):
        op = step["op"]
        ok = output.get("ok") if isinstance(output, dict) else None
        if op == "load-policy" and ok is not None:
            config = canonical_json_text(step["config"]) if "config" in step else step["config-text"]
        if op == "start-run" and ok is None and "ok" in output:
            guard, calls, current, counted, polling = RunGuard(config), {}, {}, {}, set()
        if op not in ("begin-call", "record-outcome") or ok is None:
            continue
        if guard is None:  # the runner starts run-1 at the first call
            guard = RunGuard(config)
        found: Violation | None = None
        if op == "begin-call":
            if "send" not in ok:
                continue  # not admitted: nothing is sent
            call = step["call"]
            ticket = ok["send"]
            calls[ticket["call-id"]], found = guard.begin(call["tool"], call.get("idempotency-key"), call.get("hints"), ticket["delay-ms"])
            current[ticket["call-id"]], counted[ticket["call-id"]] = 1, 0
        else:
            call_id = step["call-id"]
            guard_call = calls[call_id]
            outcome = step["outcome"]
            attempt = step.get("attempt", current[call_id])
            task = isinstance(outcome, dict) and "task" in outcome
            if isinstance(outcome, dict) and "status-check" in outcome:
                guard_call.status_checked(outcome["status-check"])
            elif (isinstance(outcome, dict) and "poll-failure" in outcome) or (call_id in polling and attempt <= counted[call_id]):
                report_poll(guard_call, outcome)  # a poll's outcome: a status, the task's end, or its failure
                polls += 1
            elif attempt > counted[call_id]:
                guard_call.attempted(outcome_of(outcome))
                counted[call_id] = attempt
            else:
                guard_call.polled(outcome_of(outcome))  # the same attempt reported again (limits.json): its facts
            if task and outcome["task"]["status"] != "cancelled":
                polling.add(call_id)
            elif not (isinstance(outcome, dict) and ("poll-failure" in outcome or "status-check" in outcome)):
                polling.discard(call_id)  # the task ended or was cancelled (or there was none)
            decision = ok
            kind = action_name(decision["action"])
            plan = decision["action"][kind] if kind in ("retry", "poll") else {}
            cancel = decision["cancel-task"]
            found = guard_call.verdict(kind, plan.get("delay-ms", 0), decision["hint-ms"], plan.get("reconnect", False), cancel_task=cancel)
            if cancel:
                polling.discard(call_id)
            found = found or guard_call.decision(decision)
            checked += 1
            if kind == "retry":
                current[call_id] = plan["attempt"]
        if found is not None:
            return (found, index), checked, polls
    return None, checked, polls


@pytest.mark.parametrize("file,case", CASES, ids=[f"{file}: {case['description']}" for file, case in CASES])
def test_the_genuine_policy_keeps_every_invariant(component: PolicyComponent, file: str, case: dict[str, Any]) -> None:
    result = run_case(component, file, case)
    assert result.failure is None, result.failure
    found, checked, polls = observe(case, result.outputs)
    assert found is None, f"step {found[1] + 1}: {found[0]}" if found else ""
    reports = sum(
        1 for step, output in zip(case["steps"], result.outputs, strict=True) if step["op"] == "record-outcome" and "ok" in output
    )
    assert checked == reports  # every verdict the policy gave went through the guard
    assert polls == polls_of(case, result.outputs)  # every poll's outcome was reported as `polled`


def polls_of(case: dict[str, Any], outputs: list[Any]) -> int:
    """How many reports are a poll's outcome: those that follow a `poll` verdict of their call."""
    last: dict[int, str] = {}
    count = 0
    for step, output in zip(case["steps"], outputs, strict=True):
        if step["op"] != "record-outcome" or not isinstance(output, dict) or "ok" not in output:
            continue
        count += last.get(step["call-id"]) == "poll"
        last[step["call-id"]] = action_name(output["ok"]["action"])
    return count


def test_the_replay_sees_tasks_and_failed_polls() -> None:
    # What the replay reports as `polled` is there to report: tasks polled, and polls that failed.
    outcomes = [step.get("outcome") for _, case in CASES for step in case["steps"] if step["op"] == "record-outcome"]
    assert any(isinstance(o, dict) and "task" in o for o in outcomes)
    assert any(isinstance(o, dict) and "poll-failure" in o for o in outcomes)
