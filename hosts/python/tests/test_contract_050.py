"""Contract 0.5.0's run path in this host (0.9.0 keeps it: test_contract_060.py
has the version and the additions): one run path (`begin_call`,
`record_success`, `record_empty_result`, `record_failure(observation,
time_left_ms)`, `record_status_check`, `last_decision`), the observation as the
host saw it (`reconnect` is the policy's, not the host's), the probe-answer
rule, the limits from one source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_retry_policy import PolicyComponent, RunMisuse, limits, limits_generated, types

NOW = 1_764_460_800_000


def fresh_run(config: dict | None = None):  # type: ignore[no-untyped-def]
    instance = PolicyComponent.load().instantiate()
    return instance, instance.load_policy(config or {}).start_run("r")


def test_the_rich_api_is_gone() -> None:
    from agent_retry_policy.component import Run

    for name in ("record_outcome", "begin_call_flat"):
        assert not hasattr(Run, name), name
    for name in ("Failure", "Outcome", "CallRequest", "Admission"):
        assert not hasattr(types, name), name


def test_one_run_path_answers_every_report_with_a_verdict_that_says_what_the_decision_says() -> None:
    instance, run = fresh_run({"tools": {"issue_refund": {"effect": "write"}}})
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    assert start.admitted and start.effect == "read"
    lost = run.record_failure(start.call_id, 1, types.http_failure(404, (), "", session_id_sent=True), None, NOW, 1)
    assert (lost.action, lost.reconnect, instance.rule_names()[lost.rule_index]) == ("retry", True, "lost-session")
    decision = run.last_decision(start.call_id)
    assert decision is not None and decision["action"]["retry"]["reconnect"] is True
    with pytest.raises(RunMisuse) as again:
        run.record_failure(start.call_id, 1, types.http_failure(503), None, NOW, 1)
    assert again.value.case == "attempt-mismatch"
    assert run.record_success(start.call_id, 2, NOW).action == "succeed"
    # A 404 without a session id is not a lost session: the host says which, the policy decides.
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    plain = run.record_failure(start.call_id, 1, types.http_failure(404), None, NOW, 1)
    assert (plain.action, plain.reconnect) == ("replan", False)
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    assert run.record_empty_result(start.call_id, 1, "no rows", NOW).action == "replan"
    write = run.begin_call("issue_refund", None, None, NOW)
    timed_out = run.record_failure(write.call_id, 1, types.transport_failure("timeout", delivery="sent"), 5_000, NOW, 1)
    assert timed_out.action == "check-status"
    assert run.record_status_check(write.call_id, 1, "found", 5_000, NOW, 1).action == "succeed"


def test_a_tls_failure_escalates_at_once_as_misconfigured() -> None:
    instance, run = fresh_run()
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    verdict = run.record_failure(start.call_id, 1, types.transport_failure("tls", delivery="not-sent"), None, NOW, 1)
    assert (verdict.action, verdict.class_) == ("escalate", "misconfigured")
    assert run.escalation()["reason"] == "connection-misconfigured"  # type: ignore[index]


def test_the_probe_answer_is_the_policys_rule() -> None:
    instance = PolicyComponent.load().instantiate()
    for status in (401, 403, 408, 429, 500, 503):
        assert instance.read_probe_answer(status, None) == "failure", status
    for status, code in ((400, None), (404, None), (405, None), (None, -32601), (200, -32601)):
        assert instance.read_probe_answer(status, code) == "older-server", (status, code)


def test_the_limits_come_from_the_rust_hosts_file_and_apply_before_crossing() -> None:
    rust = (Path(__file__).resolve().parents[3] / "hosts/rust/src/limits.rs").read_text(encoding="utf-8")
    for name in ("MAX_BODY_BYTES", "MAX_STRUCTURED_BYTES", "MAX_HEADERS", "MAX_HEADER_VALUE_BYTES", "MAX_ID_BYTES"):
        (value,) = re.findall(rf"pub const {name}: usize = ([0-9_]+);", rust)
        assert getattr(limits, name) == getattr(limits_generated, name) == int(value.replace("_", "")), name
    huge = types.http_failure(503, [(f"h{i}", "v" * 5_000) for i in range(200)], "é" * 40_000)
    bounded = limits.bounded_observation(huge)
    assert bounded is not huge
    lines = bounded["headers"].split("\n")
    assert len(lines) == limits.MAX_HEADERS and all(len(line.partition(": ")[2]) == limits.MAX_HEADER_VALUE_BYTES for line in lines)
    assert limits.utf8_size(bounded["body"]) == limits.MAX_BODY_BYTES
    small = types.http_failure(503, [("retry-after", "1")], "busy")
    assert limits.bounded_observation(small) is small
    _, run = fresh_run()
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    assert run.record_failure(start.call_id, 1, huge, None, NOW, 1).action == "retry"


def test_a_header_line_break_cannot_inject_a_header() -> None:
    observation = types.http_failure(503, [("x-note", "a\r\nretry-after: 9999")])
    assert observation["headers"] == "x-note: a  retry-after: 9999"


def test_time_left_cuts_a_retrys_delay() -> None:
    _, run = fresh_run({"base-delay-ms": 5_000, "max-delay-ms": 5_000})
    start = run.begin_call("lookup_order", None, {"read-only": True}, NOW)
    verdict = run.record_failure(start.call_id, 1, types.http_failure(503), 100, NOW, 2**64 - 1)
    assert verdict.action in ("retry", "escalate")
    if verdict.action == "retry":
        assert verdict.delay_ms <= 100
