"""Every conformance vector (tests/vectors/*.json) through the component in
wasmtime-py, with the canonical JSON mapping and step semantics of
tests/vectors/README.md. Each case runs twice on fresh instances and must give
byte-identical outputs, and a third time in flat mode (contract 0.4.0's hot
path: `begin-call-flat`, `record-success`, `record-failure`, `last-decision`,
`escalation`), which must pass, agree with `last-decision` at every verdict,
and give the rich outputs exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent_retry_policy import PolicyComponent
from agent_retry_policy.component import Run
from agent_retry_policy.conformance import canonical_outputs, default_vector_dir, flat_mismatch, load_vector_files, run_all, run_case

VECTOR_DIR = default_vector_dir()
CASES = [(path.name, case) for path, data in load_vector_files(VECTOR_DIR) for case in data["cases"]]

# Filled by the tests, printed by conftest.py as "vectors: N passed, N failed".
RESULTS: dict[str, bool] = {}


def test_the_vectors_are_all_there() -> None:
    assert len(CASES) >= 183, f"only {len(CASES)} cases found in {VECTOR_DIR}"


@pytest.mark.parametrize(("file", "case"), CASES, ids=[f"{f}:{c['description']}" for f, c in CASES])
def test_vector(file: str, case: dict[str, Any]) -> None:
    component = PolicyComponent.load()
    first = run_case(component, file, case)
    second = run_case(component, file, case)
    flat = flat_mismatch(first, run_case(component, file, case, flat=True)) if first.failure is None else None
    passed = first.failure is None and second.failure is None and canonical_outputs(first) == canonical_outputs(second) and flat is None
    RESULTS[f"{file}:{case['description']}"] = passed
    assert first.failure is None, first.failure
    assert canonical_outputs(first) == canonical_outputs(second), "a second run on a fresh instance gave other outputs"
    assert flat is None, flat


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
    results = run_all(PolicyComponent.load(), tmp_path)
    failures = [r.failure for r in results if r.failure]
    assert len(failures) == 2, failures
    assert "delay-ms" in failures[0] and "class" in failures[1]
    assert all(r.failure is None for r in results if r.file == "keys.json")


def test_flat_mode_runs_the_hot_path_and_fails_a_case_whose_verdict_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    component = PolicyComponent.load()
    source = json.loads((VECTOR_DIR / "runs-transient.json").read_text())
    case = source["cases"][0]
    calls: list[str] = []
    for name in ("begin_call_flat", "record_success", "_record_failure_text", "last_decision"):
        real = getattr(Run, name)

        def spy(self: Run, *args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(Run, name, spy)
    rich, flat = run_case(component, "runs-transient.json", case), run_case(component, "runs-transient.json", case, flat=True)
    assert flat_mismatch(rich, flat) is None
    assert {"begin_call_flat", "_record_failure_text", "last_decision"} <= set(calls), calls
    # A verdict naming another rule than its decision fails the case, naming the step.
    verdict = Run._verdict

    def off_by_one(self: Run, *args: Any) -> Any:
        answer = verdict(self, *args)
        return answer._replace(rule_index=answer.rule_index + 1)

    monkeypatch.setattr(Run, "_verdict", off_by_one)
    tampered = run_case(component, "runs-transient.json", case, flat=True)
    assert tampered.failure is not None and "verdict disagrees with last-decision: rule" in tampered.failure, tampered.failure
    assert tampered.failure.startswith("step "), tampered.failure
    assert "in flat mode: step" in (flat_mismatch(rich, tampered) or "")
