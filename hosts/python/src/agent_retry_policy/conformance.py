"""The conformance vector runner (tests/vectors/README.md) for this host.

Every case runs against a fresh instance with a fresh embedded account budget;
inputs are converted from canonical JSON by each function's WIT parameter types
(the same codec every call uses) and outputs converted back, then matched
against the case's expectations.

Every case also runs in flat mode (contract 0.4.0's hot path, through the
host's typed `Run` methods): a `begin-call` step through `begin-call-flat` (and
`escalation()` when not admitted), a `record-outcome` of a success or a failure
through `record-success` / `record-failure` (the headers joined as `name: value`
lines) and then `last-decision(call-id)`, each turned back into the rich
answer; every other step as in rich mode. Each verdict must agree with the
decision `last-decision` gives, and the flat outputs must equal the rich ones
exactly. `--dump` writes the rich outputs.

    python -m agent_retry_policy.conformance [VECTOR_DIR] [--dump OUTPUTS.json]

prints a line per failed case and `N passed, N failed`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import limits
from .accounts import EmbeddedAccounts
from .component import PolicyComponent, PolicyInstance, Run, _repo_root
from .entropy import SplitMix64
from .errors import RunMisuse
from .types import CallStart, Decision, Verdict, action_name

# The clock at the start of every case: 2025-11-30T00:00:00Z.
DEFAULT_START_MS = 1_764_460_800_000
# The entropy of a step that gives none: the middle of the range.
DEFAULT_ENTROPY = 0x8000_0000_0000_0000

STEP_KEYS = frozenset(
    [
        "op",
        "expect",
        "now-ms",
        "entropy",
        "config",
        "config-text",
        "failure",
        "retry",
        "hint-ms",
        "run-id",
        "action-id",
        "call",
        "call-id",
        "attempt",
        "outcome",
        "start",
        "max-count",
        "comment",
    ]
)
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
U32_MAX = 0xFFFF_FFFF
_HEX_U64 = re.compile(r"0x[0-9a-fA-F]{1,16}")


class HarnessError(Exception):
    """A bad vector or a trap: not an answer of the component."""


def default_vector_dir() -> Path:
    return _repo_root() / "tests" / "vectors"


def load_vector_files(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every `*.json` in `directory` but schema.json, sorted by name."""
    paths = sorted(p for p in directory.glob("*.json") if p.name != "schema.json")
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in paths]


_FILE_KEYS = frozenset(["description", "cases"])
_CASE_KEYS = frozenset(["description", "comment", "config", "steps"])


def check_vector_file(document: Any) -> list[dict[str, Any]]:
    """The cases of a parsed vector file, if it is in the format
    (`{"description", "cases": [{"description", "comment"?, "config"?, "steps"}]}`,
    no other keys, as the Rust host's `vectors::format`); else raises
    HarnessError saying what is wrong. Steps are checked when they run."""
    if not isinstance(document, dict):
        raise HarnessError("not a vector file: expected an object")
    unknown = sorted(set(document) - _FILE_KEYS)
    if unknown:
        raise HarnessError(f'unknown field "{unknown[0]}" in the file')
    if not isinstance(document.get("description"), str):
        raise HarnessError('the file needs a "description" (a string)')
    cases = document.get("cases")
    if not isinstance(cases, list):
        raise HarnessError('the file needs "cases" (an array)')
    for i, case in enumerate(cases, start=1):
        if not isinstance(case, dict):
            raise HarnessError(f"case {i} is not an object")
        unknown = sorted(set(case) - _CASE_KEYS)
        if unknown:
            raise HarnessError(f'unknown field "{unknown[0]}" in case {i}')
        if not isinstance(case.get("description"), str):
            raise HarnessError(f'case {i} needs a "description" (a string)')
        if case.get("comment") is not None and not isinstance(case["comment"], str):
            raise HarnessError(f'case {i}: "comment" must be a string')
        if not isinstance(case.get("steps"), list):
            raise HarnessError(f'case {i} ({json.dumps(case["description"], ensure_ascii=False)}) needs "steps" (an array)')
    return cases


def parse_u64(value: Any) -> int:
    """A u64 written as a JSON number or a `0x` hex string."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX:
        return value
    if isinstance(value, str) and _HEX_U64.fullmatch(value):
        return int(value[2:], 16)
    raise HarnessError(f"{value!r} is not a u64")


def _optional_u64(step: dict[str, Any], name: str) -> int | None:
    value = step.get(name)
    return None if value is None else parse_u64(value)


def _u32(step: dict[str, Any], name: str) -> int:
    value = step.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U32_MAX:
        return value
    raise HarnessError(f'"{name}" must be a u32')


def _text(step: dict[str, Any], name: str) -> str:
    value = step.get(name)
    if not isinstance(value, str):
        raise HarnessError(f'"{name}" must be a string')
    return value


def _field(step: dict[str, Any], name: str) -> Any:
    if name not in step:
        raise HarnessError(f'the step has no "{name}"')
    return step[name]


def canonical_json_text(value: Any) -> str:
    """The JSON text the Rust runner sends for a `config`: serde_json's compact
    form, whose maps are sorted by key (no `preserve_order`)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class Subject:
    """The component, called with canonical JSON values."""

    def __init__(self, component: PolicyComponent) -> None:
        # A fixed seed keeps even the guest's own draws reproducible; the vectors
        # always pass entropy, so it is never used.
        self.instance: PolicyInstance = component.instantiate(accounts=EmbeddedAccounts.on_host_clock(), entropy=SplitMix64(0))
        self.policy: Any = None
        self.run: Any = None
        # The current run as the host's typed `Run` (flat mode), made when first needed.
        self._typed_run: Run | None = None

    def load_policy(self, config_text: str) -> Any:
        result = self.instance.call("[static]policy.from-json", config_text)
        if "ok" not in result:
            return result
        policy = result["ok"]
        effective = self.instance.call("[method]policy.effective-config", policy)
        self.policy = policy
        return {"ok": json.loads(effective)}

    def need_policy(self) -> Any:
        if self.policy is None:
            raise HarnessError("no policy loaded")
        return self.policy

    def need_run(self) -> Any:
        if self.run is None:
            raise HarnessError("no run")
        return self.run

    def start_run(self, run_id: str) -> Any:
        """`{"ok": None}` (the started run becomes the current one) or
        `{"err": run-error}` (the current run stays)."""
        result = self.instance.call("[method]policy.start-run", self.need_policy(), run_id)
        if "ok" not in result:
            return result
        self.run = result["ok"]
        self._typed_run = None
        return {"ok": None}

    def typed_run(self) -> Run:
        """The current run, as the typed `Run` whose flat methods flat mode calls
        (never closed here: the run stays the subject's)."""
        if self._typed_run is None or self._typed_run._resource is not self.need_run():
            self._typed_run = Run(self.instance, self.need_run(), "run-1")
        return self._typed_run


def _sent_attempt(answer: Any, *path: str) -> int | None:
    """The attempt number at `path` in a step's answer, if it is there."""
    for key in path:
        if not isinstance(answer, dict) or key not in answer:
            return None
        answer = answer[key]
    return answer if isinstance(answer, int) and not isinstance(answer, bool) else None


def run_step(subject: Subject, step: Any, state: dict[str, Any]) -> Any:
    """Runs one step (hosts/rust/src/steps.rs). `state` carries the clock
    (`now`), whether a run was started (`started`) and, per call id, the attempt
    the runner sent last (`attempts`: 1 after a begin-call answered `send`, then
    each retry plan's), which a record-outcome without `attempt` reports."""
    if not isinstance(step, dict):
        raise HarnessError("a step must be an object")
    unknown = [k for k in step if k not in STEP_KEYS]
    if unknown:
        raise HarnessError(f'unknown step field "{unknown[0]}"')
    now = _optional_u64(step, "now-ms")
    if now is not None:
        state["now"] = now
    entropy = _optional_u64(step, "entropy")
    if entropy is None:
        entropy = DEFAULT_ENTROPY
    op = _text(step, "op")
    attempts: dict[int, int] = state.setdefault("attempts", {})
    if op in ("begin-call", "record-outcome", "report", "effects") and not state["started"]:
        subject.start_run("run-1")
        state["started"] = True
    call = subject.instance.call
    if op == "load-policy":
        has_config, has_text = "config" in step, "config-text" in step
        if has_config and not has_text:
            return subject.load_policy(canonical_json_text(step["config"]))
        if has_text and not has_config and isinstance(step["config-text"], str):
            return subject.load_policy(step["config-text"])
        raise HarnessError('load-policy takes "config" (JSON) or "config-text" (a string)')
    if op == "classify":
        return call("[method]policy.classify", subject.need_policy(), _field(step, "failure"), state["now"])
    if op == "next-delay":
        retry = _u32(step, "retry")
        return call("[method]policy.next-delay", subject.need_policy(), retry, _optional_u64(step, "hint-ms"), entropy)
    if op == "derive-idempotency-key":
        return call("derive-idempotency-key", _text(step, "run-id"), _text(step, "action-id"))
    if op == "start-run":
        answer = subject.start_run(_text(step, "run-id"))
        if "ok" in answer:
            state["started"] = True
            attempts.clear()
        return answer
    flat = state.get("flat", False)
    if op == "begin-call" and flat and isinstance(step.get("call"), dict) and step["call"].keys() <= _CALL_FIELDS:
        answer = _begin_call_flat(subject, step["call"], state["now"])
        call_id = _sent_attempt(answer, "ok", "send", "call-id")
        if call_id is not None:
            attempts[call_id] = 1
        return answer
    if op == "begin-call":
        answer = call("[method]run.begin-call", subject.need_run(), _field(step, "call"), state["now"])
        call_id = _sent_attempt(answer, "ok", "send", "call-id")
        if call_id is not None:
            attempts[call_id] = 1
        return answer
    if op == "record-outcome":
        call_id = _u32(step, "call-id")
        attempt = _u32(step, "attempt") if "attempt" in step else attempts.get(call_id, 1)
        outcome = _field(step, "outcome")
        if flat and _flat_outcome(outcome):
            answer = _record_flat(subject, call_id, attempt, outcome, state["now"], entropy)
        else:
            answer = call("[method]run.record-outcome", subject.need_run(), call_id, attempt, outcome, state["now"], entropy)
        retry = _sent_attempt(answer, "ok", "action", "retry", "attempt")
        if retry is not None:
            attempts[call_id] = retry
        return answer
    if op == "report":
        return call("[method]run.report", subject.need_run())
    if op == "effects":
        return call("[method]run.effects", subject.need_run(), _u32(step, "start"), _u32(step, "max-count"))
    raise HarnessError(f'unknown op "{op}"')


# Flat mode: the hot path's calls, turned back into the rich answers.

_CALL_FIELDS = frozenset(["tool", "idempotency-key", "hints"])
_FAILURE_FIELDS = frozenset(["kind", "headers", "body", "structured-content"])


def _flat_outcome(outcome: Any) -> bool:
    """Whether a record-outcome step's outcome goes through the flat path: a
    success, or a failure (of the record's own fields; anything else is left to
    the rich call, whose conversion refuses it)."""
    if outcome == "success":
        return True
    if isinstance(outcome, dict) and len(outcome) == 1 and isinstance(outcome.get("failure"), dict):
        failure = outcome["failure"]
        return "kind" in failure and failure.keys() <= _FAILURE_FIELDS and isinstance(failure.get("headers", []), list)
    return False


def _begin_call_flat(subject: Subject, request: dict[str, Any], now: int) -> Any:
    """`begin-call-flat` (+ `escalation()` when not admitted) as `begin-call`'s answer."""
    run = subject.typed_run()
    try:
        start = run.begin_call_flat(request.get("tool", ""), request.get("idempotency-key"), request.get("hints"), now)
    except RunMisuse as e:
        return {"err": e.error}
    if not isinstance(start, CallStart):
        raise HarnessError(f"begin-call-flat answered {start!r}, not a call-start")
    if start.admitted:
        ticket = {"call-id": start.call_id, "delay-ms": start.delay_ms, "effect": start.effect, "safe-to-repeat": start.safe_to_repeat}
        return {"ok": {"send": ticket}}
    if start.call_id != 0:
        raise HarnessError(f"begin-call-flat was not admitted but gave call-id {start.call_id} (0 when not admitted)")
    escalation = run.escalation()
    if escalation is None:
        raise HarnessError("begin-call-flat was not admitted, and escalation() is none")
    return {"ok": {"escalate": escalation}}


def _record_flat(subject: Subject, call_id: int, attempt: int, outcome: Any, now: int, entropy: int) -> Any:
    """`record-success` / `record-failure` + `last-decision(call-id)` as
    `record-outcome`'s answer, the verdict checked against the decision."""
    run = subject.typed_run()
    try:
        if outcome == "success":
            verdict = run.record_success(call_id, attempt, now)
        else:
            failure = outcome["failure"]
            headers = limits.join_headers(failure.get("headers", []))
            body, structured = failure.get("body", ""), failure.get("structured-content")
            verdict = run._record_failure_text(call_id, attempt, failure["kind"], headers, body, structured, now, entropy)
    except RunMisuse as e:
        return {"err": e.error}
    which = "record-success" if outcome == "success" else "record-failure"
    decision = run.last_decision(call_id)
    if decision is None:
        raise HarnessError(f"{which} answered {verdict!r}, but last-decision({call_id}) is none")
    disagreement = verdict_disagreement(verdict, decision, subject.instance.rule_names())
    if disagreement is not None:
        raise HarnessError(f"{which}'s verdict disagrees with last-decision: {disagreement} (verdict {verdict!r}, decision {decision!r})")
    return {"ok": decision}


def verdict_disagreement(verdict: Verdict, decision: Decision, rule_names: tuple[str, ...]) -> str | None:
    """None if the flat verdict says what the full decision says, else what differs."""
    action = decision["action"]
    kind = action_name(action)
    plan_delay = action["retry"]["delay-ms"] if kind == "retry" else 0  # type: ignore[index]
    if kind == "succeed":
        has_note = action["succeed"] is not None  # type: ignore[index]
    else:
        has_note = kind in ("replan", "escalate")
    rule = rule_names[verdict.rule_index] if verdict.rule_index < len(rule_names) else None
    checks = (
        ("action", verdict.action, kind),
        ("class", verdict.class_, decision["class"]),
        ("attempt", verdict.attempt, decision["attempt"]),
        ("delay-ms", verdict.delay_ms, plan_delay),
        ("hint-ms", verdict.hint_ms, decision["hint-ms"]),
        ("rule", rule, decision["rule"]),
        ("has-note", verdict.has_note, has_note),
    )
    for name, flat, rich in checks:
        if flat != rich or type(flat) is not type(rich):
            return f"{name}: the verdict says {flat!r}, the decision {rich!r}"
    return None


# Matching `expect` (tests/vectors/README.md, "Expectations").


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar_equal(expected: Any, actual: Any) -> bool:
    # JSON equality, not Python's: true is not 1, and 1 is not 1.0.
    return type(expected) is type(actual) and expected == actual


def match(expected: Any, actual: Any, path: str = "$") -> str | None:
    """None if `actual` matches, else where and why it does not."""
    if isinstance(expected, dict) and len(expected) == 1 and "$contains" in expected:
        needle = expected["$contains"]
        if isinstance(actual, str) and isinstance(needle, str) and needle in actual:
            return None
        return f"{path}: expected a string containing {needle!r}, got {json.dumps(actual)}"
    if isinstance(expected, dict) and len(expected) == 1 and "$range" in expected:
        bounds = expected["$range"]
        if (
            isinstance(bounds, list)
            and len(bounds) == 2
            and all(_is_number(b) for b in bounds)
            and _is_number(actual)
            and bounds[0] <= actual <= bounds[1]
        ):
            return None
        return f"{path}: expected a number in {bounds}, got {json.dumps(actual)}"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected an object, got {json.dumps(actual)}"
        for key, value in expected.items():
            if key not in actual:
                return f"{path}.{key}: missing in {json.dumps(actual)}"
            mismatch = match(value, actual[key], f"{path}.{key}")
            if mismatch:
                return mismatch
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{path}: expected an array, got {json.dumps(actual)}"
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}: {json.dumps(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            mismatch = match(e, a, f"{path}[{i}]")
            if mismatch:
                return mismatch
        return None
    if _scalar_equal(expected, actual):
        return None
    return f"{path}: expected {json.dumps(expected)}, got {json.dumps(actual)}"


@dataclass
class CaseResult:
    file: str
    description: str
    outputs: list[Any] = field(default_factory=list)
    failure: str | None = None


def run_case(
    component: PolicyComponent, file: str, case: dict[str, Any], *, config_text: str | None = None, flat: bool = False
) -> CaseResult:
    """Runs one case on a fresh instance. A case without `config` loads
    `config_text` if given (a live update's own configuration, for the vectors
    it ships with), else `{}`. `flat`: in flat mode (the module docstring)."""
    result = CaseResult(file, case.get("description", "?"))
    subject = Subject(component)
    state: dict[str, Any] = {"now": DEFAULT_START_MS, "started": False, "attempts": {}, "flat": flat}
    if "config" in case or config_text is None:
        config_text = canonical_json_text(case.get("config", {}))
    try:
        loaded = subject.load_policy(config_text)
    except Exception as e:  # a trap or a conversion error is the harness's failure
        result.failure = f"loading the case's config: {e}"
        return result
    if "ok" not in loaded:
        result.failure = f"the case's config was rejected: {json.dumps(loaded)}"
        return result
    for i, step in enumerate(case.get("steps", []), start=1):
        try:
            output = run_step(subject, step, state)
        except Exception as e:
            result.failure = f"step {i}: {e}"
            return result
        result.outputs.append(output)
        if "expect" in step:
            mismatch = match(step["expect"], output)
            if mismatch:
                result.failure = f"step {i} ({step.get('op')}): {mismatch}"
                return result
    return result


def canonical_outputs(result: CaseResult) -> str:
    """The outputs as one canonical text, for exact comparison across runs and hosts."""
    return json.dumps(result.outputs, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def flat_mismatch(rich: CaseResult, flat: CaseResult) -> str | None:
    """None if a case's flat-mode run passed and gave the rich run's outputs
    exactly, else what went wrong (naming the first step that differs)."""
    if flat.failure is not None:
        return f"in flat mode: {flat.failure}"
    if canonical_outputs(flat) == canonical_outputs(rich):
        return None
    for i, (a, b) in enumerate(zip(rich.outputs, flat.outputs, strict=False), start=1):
        if _canonical(a) != _canonical(b):
            return f"in flat mode, step {i} gave {_canonical(b)}, the rich call {_canonical(a)}"
    return f"in flat mode, {len(flat.outputs)} outputs, in rich mode {len(rich.outputs)}"


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def run_all(component: PolicyComponent, directory: Path, *, twice: bool = True, flat: bool = True) -> list[CaseResult]:
    """Every case of every file. With `twice`, each case runs again on a fresh
    instance and must give the same outputs, byte for byte; with `flat`, again
    in flat mode, which must give them too. The results are the rich runs'."""
    results = []
    for path, data in load_vector_files(directory):
        for case in data["cases"]:
            first = run_case(component, path.name, case)
            if twice and first.failure is None:
                second = run_case(component, path.name, case)
                if second.failure is not None or canonical_outputs(second) != canonical_outputs(first):
                    first.failure = f"not deterministic: a second run gave {second.failure or canonical_outputs(second)}"
            if flat and first.failure is None:
                first.failure = flat_mismatch(first, run_case(component, path.name, case, flat=True))
            results.append(first)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "directory", nargs="?", type=Path, default=None, help="the vector directory (default: the repository's tests/vectors)"
    )
    parser.add_argument("--wasm", default=None, help="the component (default: $AGENT_RETRY_WASM or the repository's build)")
    parser.add_argument("--dump", type=Path, default=None, help="write every case's outputs as canonical JSON here")
    args = parser.parse_args(argv)
    component = PolicyComponent.load(args.wasm)
    results = run_all(component, args.directory or default_vector_dir())
    for r in results:
        if r.failure:
            print(f"FAILED {r.file}: {r.description}: {r.failure}")
    if args.dump:
        args.dump.write_text(
            "".join(
                f"{json.dumps([r.file, r.description], separators=(',', ':'), ensure_ascii=False)} {canonical_outputs(r)}\n"
                for r in results
            ),
            encoding="utf-8",
        )
    failed = sum(1 for r in results if r.failure)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
