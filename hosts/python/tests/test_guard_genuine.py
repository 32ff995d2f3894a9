"""The genuine policy never trips the run-time guard: every case of
tests/vectors/runs-*.json runs through the conformance runner, and a guard
observes its readable steps as the wrapper would (begin, attempted, verdict,
status check, decision). Zero violations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_guard_vectors import outcome_of

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


def observe(case: dict[str, Any], outputs: list[Any]) -> tuple[tuple[Violation, int] | None, int]:
    """Feeds the guard each step the runner ran, with the component's answer:
    the first violation and its step (or None), and how many verdicts it checked."""
    checked = 0
    config = canonical_json_text(case.get("config", {}))
    guard: RunGuard | None = None
    calls: dict[int, CallGuard] = {}
    current: dict[int, int] = {}  # per call, the attempt the runner reports (as `run_step` keeps it)
    counted: dict[int, int] = {}  # per call, the last attempt counted as sent
    for index, (step, output) in enumerate(zip(case["steps"], outputs, strict=True)):
        op = step["op"]
        ok = output.get("ok") if isinstance(output, dict) else None
        if op == "load-policy" and ok is not None:
            config = canonical_json_text(step["config"]) if "config" in step else step["config-text"]
        if op == "start-run" and ok is None and "ok" in output:
            guard, calls, current, counted = RunGuard(config), {}, {}, {}
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
            if isinstance(outcome, dict) and "status-check" in outcome:
                guard_call.status_checked(outcome["status-check"])
            elif isinstance(outcome, dict) and "poll-failure" in outcome:
                pass  # a poll is not an attempt
            elif attempt > counted[call_id]:
                guard_call.attempted(outcome_of(outcome))
                counted[call_id] = attempt
            elif not (isinstance(outcome, dict) and "task" in outcome):
                guard_call.outcome(outcome_of(outcome))  # the task ended: the attempt's outcome
            decision = ok
            kind = action_name(decision["action"])
            plan = decision["action"][kind] if kind in ("retry", "poll") else {}
            found = guard_call.verdict(kind, plan.get("delay-ms", 0), decision["hint-ms"], plan.get("reconnect", False))
            found = found or guard_call.decision(decision)
            checked += 1
            if kind == "retry":
                current[call_id] = plan["attempt"]
        if found is not None:
            return (found, index), checked
    return None, checked


@pytest.mark.parametrize("file,case", CASES, ids=[f"{file}: {case['description']}" for file, case in CASES])
def test_the_genuine_policy_keeps_every_invariant(component: PolicyComponent, file: str, case: dict[str, Any]) -> None:
    result = run_case(component, file, case)
    assert result.failure is None, result.failure
    found, checked = observe(case, result.outputs)
    assert found is None, f"step {found[1] + 1}: {found[0]}" if found else ""
    reports = sum(
        1 for step, output in zip(case["steps"], result.outputs, strict=True) if step["op"] == "record-outcome" and "ok" in output
    )
    assert checked == reports  # every verdict the policy gave went through the guard
