"""Every conformance vector (tests/vectors/*.json) through the component in
wasmtime-py, with the canonical JSON mapping and step semantics of
tests/vectors/README.md: the readable steps translated onto contract 0.8.0's
single run path (conformance.py), every verdict checked against
`last-decision`. Each case runs twice on fresh instances and must give
byte-identical outputs. observations.json runs in its pure form (begin-call
lookup_order, record-failure of the observation, the verdict against
`expect`); test_observations.py runs it through the MCP wrapper."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent_retry_policy import PolicyComponent
from agent_retry_policy.conformance import (
    OBSERVATIONS_FILE,
    canonical_outputs,
    check_observations_file,
    default_vector_dir,
    load_vector_files,
    match,
    run_all,
    run_case,
    run_observation_case,
)

VECTOR_DIR = default_vector_dir()
FILES = load_vector_files(VECTOR_DIR)
CASES = [(path.name, case) for path, data in FILES if path.name != OBSERVATIONS_FILE for case in data["cases"]]
OBSERVATIONS = json.loads((VECTOR_DIR / OBSERVATIONS_FILE).read_text(encoding="utf-8"))

# Filled by the tests, printed by conftest.py as "vectors: N passed, N failed".
RESULTS: dict[str, bool] = {}


def test_the_vectors_are_all_there() -> None:
    assert len(CASES) >= 183, f"only {len(CASES)} cases found in {VECTOR_DIR}"
    assert len(check_observations_file(OBSERVATIONS)) >= 7


@pytest.mark.parametrize(("file", "case"), CASES, ids=[f"{f}:{c['description']}" for f, c in CASES])
def test_vector(file: str, case: dict[str, Any]) -> None:
    component = PolicyComponent.load()
    first = run_case(component, file, case)
    second = run_case(component, file, case)
    passed = first.failure is None and second.failure is None and canonical_outputs(first) == canonical_outputs(second)
    RESULTS[f"{file}:{case['description']}"] = passed
    assert first.failure is None, first.failure
    assert canonical_outputs(first) == canonical_outputs(second), "a second run on a fresh instance gave other outputs"


@pytest.mark.parametrize("case", OBSERVATIONS["cases"], ids=[c["description"] for c in OBSERVATIONS["cases"]])
def test_observation_pure(case: dict[str, Any]) -> None:
    result = run_observation_case(PolicyComponent.load(), OBSERVATIONS_FILE, OBSERVATIONS.get("config"), case)
    RESULTS[f"{OBSERVATIONS_FILE}:{case['description']}"] = result.failure is None
    assert result.failure is None, result.failure


def test_the_runner_reports_a_wrong_expectation(tmp_path: Path) -> None:
    # The runner must be able to fail: change one expected delay and one expected class.
    source = json.loads((VECTOR_DIR / "runs-transient.json").read_text())
    case = source["cases"][0]
    retry_step = next(s for s in case["steps"] if s["op"] == "record-outcome")
    retry_step["expect"]["ok"]["action"]["retry"]["delay-ms"] += 1
    other = json.loads(json.dumps(source["cases"][1]))
    other["description"] += " (tampered)"
    other["steps"][1]["expect"]["ok"]["class"] = "transient"
    (tmp_path / "tampered.json").write_text(json.dumps({"description": "tampered", "cases": [case, other]}))
    shutil.copy(VECTOR_DIR / "keys.json", tmp_path / "keys.json")
    observations = json.loads(json.dumps(OBSERVATIONS))
    observations["cases"] = observations["cases"][:2]
    observations["cases"][1]["expect"]["reconnect"] = not observations["cases"][1]["expect"].get("reconnect", False)
    (tmp_path / OBSERVATIONS_FILE).write_text(json.dumps(observations))
    results = run_all(PolicyComponent.load(), tmp_path)
    failures = [r.failure for r in results if r.failure]
    assert len(failures) == 3, failures
    assert "reconnect" in failures[0] and "delay-ms" in failures[1] and "class" in failures[2], failures
    assert all(r.failure is None for r in results if r.file == "keys.json")


def test_a_verdict_that_disagrees_with_its_decision_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_retry_policy import conformance

    component = PolicyComponent.load()
    case = json.loads((VECTOR_DIR / "runs-transient.json").read_text())["cases"][0]
    assert run_case(component, "runs-transient.json", case).failure is None
    real = conformance.verdict_of
    monkeypatch.setattr(conformance, "verdict_of", lambda value: real(value)._replace(rule_index=real(value).rule_index + 1))
    tampered = run_case(component, "runs-transient.json", case)
    assert tampered.failure is not None and "verdict disagrees with last-decision: rule" in tampered.failure, tampered.failure
    monkeypatch.setattr(conformance, "verdict_of", lambda value: real(value)._replace(reconnect=not real(value).reconnect))
    tampered = run_case(component, "runs-transient.json", case)
    assert tampered.failure is not None and "reconnect" in tampered.failure, tampered.failure


def test_the_any_matcher_matches_one_of_its_matchers_and_a_named_key_must_be_there() -> None:
    assert match({"$any": [{"a": 1}, {"a": 2}]}, {"a": 2}) is None
    assert match({"$any": [{"a": 1}, {"a": 2}]}, {"a": 3}) is not None
    assert match({"$any": ["x", {"$contains": "y"}]}, "xyz") is None
    assert match({"b": 1}, {"a": 1}) is not None


BREAKER_CASE: dict[str, Any] = {
    "description": "the runner's breaker ops (a local case)",
    "config": {"circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60000}, "tools": {"q": {"effect": "read"}}},
    "steps": [
        {"op": "begin-call", "call": {"server": "srv", "tool": "q"}, "expect": {"ok": {"send": {"call-id": 1}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}},
        {"op": "breaker-changes", "expect": []},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}},
        {
            "op": "breaker-changes",
            "expect": [
                {"server": "srv", "tool": None, "old-state": "closed", "new-state": "open", "until-ms": 1764460860000},
                {"server": "srv", "tool": "q", "old-state": "closed", "new-state": "open", "why": {"$contains": "2 failures"}},
            ],
        },
        {"op": "breaker-changes", "expect": []},
        {"op": "start-run", "run-id": "run-2"},
        {
            "op": "begin-call",
            "call": {"server": "srv", "tool": "q"},
            "expect": {
                "ok": {"replan": {"rule": "circuit-open", "attempt": 0, "action": {"replan": {"$contains": "circuit breaker open"}}}}
            },
        },
        {"op": "begin-call", "call": {"tool": "q"}, "expect": {"ok": {"send": {"call-id": 2}}}},
        {"op": "shared-state", "key": "absent", "expect": None},
        {"op": "put-shared-state", "key": "k", "value": "text"},
        {"op": "put-shared-state", "key": "k", "value": "again"},
        {"op": "shared-state", "key": "k", "expect": "again"},
    ],
}


def test_the_runner_passes_a_server_and_answers_the_breaker_ops() -> None:
    from agent_retry_policy.conformance import Subject, run_step

    component = PolicyComponent.load()
    first, second = run_case(component, "local", BREAKER_CASE), run_case(component, "local", BREAKER_CASE)
    assert first.failure is None, first.failure
    assert canonical_outputs(first) == canonical_outputs(second)
    assert first.outputs[10] is None  # put-shared-state has no output
    # The runner's store: CAS by version, no expiry, put raises the version as a store would.
    subject = Subject(component)
    store = subject.shared_state
    assert store.load("k", 5) == {"value": None, "version": 0, "now-ms": 5}
    assert store.store_if("k", 0, "a", 1) and not store.store_if("k", 0, "b", 1)
    run_step(subject, {"op": "put-shared-state", "key": "k", "value": "c"}, {"now": 0, "started": False})
    assert store.load("k", 7) == {"value": "c", "version": 2, "now-ms": 7}
    # A wrong expectation on the new ops fails the case.
    tampered = json.loads(json.dumps(BREAKER_CASE))
    tampered["steps"][4]["expect"][0]["new-state"] = "half-open"
    failed = run_case(component, "local", tampered)
    assert failed.failure is not None and "new-state" in failed.failure, failed.failure
