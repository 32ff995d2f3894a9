"""Contract 0.7.0 in this host: the version (0.6 and 0.8 refused, naming both)
and `Run.abandon_call`, a call the host stopped (cancelled, or past its
deadline) that no longer counts as open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_retry_policy import CONTRACT_VERSION, ContractVersionMismatch, PolicyComponent, RunMisuse
from agent_retry_policy.component import locate_component

NOW = 1_764_460_800_000
TOOLS = {"tools": {"lookup_order": {"effect": "read"}, "issue_refund": {"effect": "write"}}}


def test_the_package_implements_the_contract_of_its_major_minor() -> None:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    (version,) = re.findall(r'(?m)^version = "([^"]+)"$', pyproject)
    assert version.rsplit(".", 1)[0] == CONTRACT_VERSION.rsplit(".", 1)[0], (version, CONTRACT_VERSION)


def test_the_host_speaks_0_7_0_and_refuses_0_6_and_0_8_naming_both() -> None:
    assert CONTRACT_VERSION == "0.7.0"
    for theirs in ("0.6.0", "0.8.0"):
        wasm = locate_component().read_bytes().replace(b"@0.7.0", f"@{theirs}".encode())
        with pytest.raises(ContractVersionMismatch) as raised:
            PolicyComponent(wasm, source="other.wasm")
        message = str(raised.value)
        assert f"agent-retry:policy@{theirs}" in message and "this host speaks @0.7.0" in message, message
        assert (raised.value.component_version, raised.value.host_version) == (theirs, "0.7.0")


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
