"""Contract 0.9.0 in this host: the version (0.8 and 0.10 refused, naming
both; 0.9.x run under its own names), the package's version, and the three
new exports bound (`policy.resume-run`, `run.snapshot`, `run.resumed-call`;
what they do is test_resume.py's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_retry_policy import CONTRACT_VERSION, ContractVersionMismatch, EmbeddedAccounts, PolicyComponent, ResumeAnswer, types
from agent_retry_policy.component import EXPORTED_FUNCTIONS, locate_component

NOW = 1_764_460_800_000
CONFIG = {"tools": {"w": {"effect": "write"}}, "max-attempts-per-call": 1}


def test_the_package_implements_the_contract_of_its_major_minor() -> None:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    (version,) = re.findall(r'(?m)^version = "([^"]+)"$', pyproject)
    assert version == "0.9.0"
    assert version.rsplit(".", 1)[0] == CONTRACT_VERSION.rsplit(".", 1)[0], (version, CONTRACT_VERSION)


def test_the_host_speaks_0_9_0_and_refuses_0_8_and_0_10_naming_both() -> None:
    assert CONTRACT_VERSION == "0.9.0"
    wasm = locate_component().read_bytes()
    assert b"@0.9.0" in wasm
    for theirs in ("0.8.0", "0.8.9", "1.0.0"):
        with pytest.raises(ContractVersionMismatch) as raised:
            PolicyComponent(wasm.replace(b"@0.9.0", f"@{theirs}".encode()), source="other.wasm")
        message = str(raised.value)
        assert f"agent-retry:policy@{theirs}" in message and "this host speaks @0.9.0" in message, message
        assert (raised.value.component_version, raised.value.host_version) == (theirs, "0.9.0")
    # 0.10.0 is one byte longer: the check reads the names, not the binary.
    from agent_retry_policy import check_contract_version

    with pytest.raises(ContractVersionMismatch, match="this host speaks @0.9.0"):
        check_contract_version(["agent-retry:policy/policy@0.10.0"])
    # A compatible 0.9.x is run under its own names, the new exports included.
    patched = PolicyComponent(wasm.replace(b"@0.9.0", b"@0.9.7"), source="later.wasm")
    assert patched.contract_version == "0.9.7"
    policy = patched.instantiate(accounts=EmbeddedAccounts()).load_policy(CONFIG)
    run = policy.start_run("r")
    start = run.begin_call("w", "k", None, NOW)
    run.record_failure(start.call_id, 1, types.transport_failure("timeout", delivery="sent"), None, NOW, 1)
    resumed = policy.resume_run(run.snapshot(None, NOW), ResumeAnswer.abort(), NOW)
    assert resumed.escalation()["reason"] == "aborted"


def test_the_host_binds_the_new_exports() -> None:
    for name in ("[method]policy.resume-run", "[method]run.snapshot", "[method]run.resumed-call"):
        assert name in EXPORTED_FUNCTIONS
