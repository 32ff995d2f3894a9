"""Contract 0.7.0's addition in this host (0.9.0 keeps it; the version test
is test_contract_090.py, which refuses a 0.7 or 0.8 component): `Run.abandon_call`,
a call the host stopped (cancelled, or past its deadline) that no longer
counts as open."""

from __future__ import annotations

import pytest

from agent_retry_policy import PolicyComponent, RunMisuse

NOW = 1_764_460_800_000
TOOLS = {"tools": {"lookup_order": {"effect": "read"}, "issue_refund": {"effect": "write"}}}


def test_an_abandoned_write_on_the_wire_is_closed_counted_and_an_unknown_effect() -> None:
    run = PolicyComponent.load().instantiate().load_policy(TOOLS).start_run("r")
    call = run.begin_call("issue_refund", None, None, NOW)
    run.abandon_call(call.call_id, 1, True, "deadline")
    with pytest.raises(RunMisuse) as raised:
        run.record_success(call.call_id, 1, NOW)
    assert raised.value.error == {"call-finished": call.call_id}
    report = run.report()
    assert report["abandoned-calls"] == 1
    assert [(e["tool"], e["status"]) for e in report["effects"]] == [("issue_refund", "unknown")]


def test_abandoning_another_attempt_or_an_unknown_call_is_a_typed_misuse_that_changes_nothing() -> None:
    run = PolicyComponent.load().instantiate().load_policy(TOOLS).start_run("r")
    call = run.begin_call("lookup_order", None, None, NOW)
    with pytest.raises(RunMisuse) as wrong_attempt:
        run.abandon_call(call.call_id, 2, False, "cancelled")
    assert wrong_attempt.value.error == {"attempt-mismatch": {"call-id": call.call_id, "expected": 1, "reported": 2}}
    with pytest.raises(RunMisuse):
        run.abandon_call(99, 1, False, "cancelled")
    assert run.report()["abandoned-calls"] == 0
    assert run.record_success(call.call_id, 1, NOW).action == "succeed"
