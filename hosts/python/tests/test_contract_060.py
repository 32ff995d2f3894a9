"""Contract 0.6.0's additions in this host (0.9.0 keeps them; the version test
is test_contract_090.py): the task reports (`record_task_status`, `record_poll_failure`) on the typed
path, the verdict's `cancel_task`, `call-start`'s per-tool timeouts and the
failure kind `input-required`."""

from __future__ import annotations

import pytest

from agent_retry_policy import PolicyComponent, RunMisuse, limits, types

NOW = 1_764_460_800_000


def fresh_run(config: dict | None = None):  # type: ignore[no-untyped-def]
    instance = PolicyComponent.load().instantiate()
    return instance, instance.load_policy(config or {}).start_run("r")


def test_call_start_carries_the_tools_timeouts_else_the_defaults() -> None:
    _, run = fresh_run({"tools": {"export_report": {"idle-timeout-ms": 1_000, "attempt-timeout-ms": 9_000}}})
    own = run.begin_call("export_report", None, {"read-only": True}, NOW)
    assert (own.idle_timeout_ms, own.attempt_timeout_ms) == (1_000, 9_000)
    default = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    assert (default.idle_timeout_ms, default.attempt_timeout_ms) == (30_000, 600_000)
    # The generic path (a key given as an int subclass is not the fast path's) reads the same record.
    generic = run.begin_call("export_report", None, {"read-only": True}, type("Ms", (int,), {})(NOW))
    assert (generic.idle_timeout_ms, generic.attempt_timeout_ms) == (1_000, 9_000)


def test_a_task_is_polled_at_the_servers_interval_then_completes_and_the_report_counts_it() -> None:
    instance, run = fresh_run({"tools": {"issue_refund": {"effect": "write"}}})
    start = run.begin_call("issue_refund", "ar1-k", None, NOW)
    task: types.TaskReport = {"task-id": "t-1", "status": "working", "poll-interval-ms": 1_500, "ttl-ms": 60_000, "age-ms": 0}
    verdict = run.record_task_status(start.call_id, 1, task, None, NOW, 1)
    assert (verdict.action, verdict.delay_ms, verdict.attempt, verdict.cancel_task, verdict.reconnect) == ("poll", 1_500, 1, False, False)
    decision = run.last_decision(start.call_id)
    assert decision is not None and decision["action"] == {"poll": {"delay-ms": 1_500, "task-id": "t-1", "reconnect": False}}
    assert decision["cancel-task"] is False
    # A poll cut by the network is polled again: the same attempt, no retry.
    cut = types.transport_failure("connection-reset", delivery="sent")
    again = run.record_poll_failure(start.call_id, 1, cut, None, NOW + 1_500, 1)
    assert (again.action, again.attempt) == ("poll", 1)
    assert run.record_success(start.call_id, 1, NOW + 3_000).action == "succeed"
    report = run.report()
    assert (report["tasks"], report["polls"], report["attempts"], report["retries"]) == (1, 2, 1, 0)


def test_a_task_past_its_ttl_escalates_and_the_verdict_says_cancel() -> None:
    instance, run = fresh_run({"tools": {"issue_refund": {"effect": "write"}}})
    start = run.begin_call("issue_refund", "ar1-k", None, NOW)
    task: types.TaskReport = {"task-id": "t-2", "status": "working", "poll-interval-ms": 5_000, "ttl-ms": 6_000, "age-ms": 4_000}
    verdict = run.record_task_status(start.call_id, 1, task, None, NOW, 1)
    assert (verdict.action, verdict.cancel_task) == ("escalate", True)
    escalation = run.escalation()
    assert escalation is not None and escalation["reason"] == "task-expired" and "t-2" in escalation["note"]


def test_a_poll_failure_without_a_task_is_a_run_error() -> None:
    _, run = fresh_run()
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    with pytest.raises(RunMisuse) as misuse:
        run.record_poll_failure(start.call_id, 1, types.http_failure(503), None, NOW, 1)
    assert misuse.value.case == "no-task"


def test_input_nobody_answered_escalates_input_required_with_the_question() -> None:
    _, run = fresh_run()
    start = run.begin_call("confirm_order", None, {"read-only": True}, NOW)
    verdict = run.record_failure(start.call_id, 1, types.input_required("Confirm order A1?"), None, NOW, 1)
    assert (verdict.action, verdict.class_) == ("escalate", "needs-input")
    escalation = run.escalation()
    assert escalation is not None and escalation["reason"] == "input-required" and "Confirm order A1?" in escalation["note"]


def test_a_tasks_message_is_cut_before_it_crosses() -> None:
    huge: types.TaskReport = {"task-id": "t-3", "status": "working", "message": "é" * 40_000}
    bounded = limits.bounded_task(huge)
    assert limits.utf8_size(bounded["message"]) == limits.MAX_BODY_BYTES and huge["message"] != bounded["message"]
    small: types.TaskReport = {"task-id": "t-3", "status": "working", "message": "busy"}
    assert limits.bounded_task(small) is small
    _, run = fresh_run()
    start = run.begin_call("export_report", None, {"read-only": True}, NOW)
    assert run.record_task_status(start.call_id, 1, huge, None, NOW, 1).action == "poll"
