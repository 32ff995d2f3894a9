"""The conformance vector runner (tests/vectors/README.md) for this host.

Every case runs against a fresh instance with a fresh embedded account budget
and a fresh shared state (`VectorSharedState`: compare-and-set by version, no
expiry, no bounds), each shared by every run of the case;
inputs are converted from canonical JSON by each function's WIT parameter types
(the same codec every call uses) and outputs converted back, then matched
against the case's expectations.

The vectors keep their readable steps; this module is the one place that
translates them onto contract 0.8.0's single run path (kept by 0.9.0) (`translate_*` below): a
`begin-call` step calls `begin-call` with the call's `server` (none if absent),
and `escalation()` when not admitted, or `last-decision(call-id)` when not
admitted as a replan (a circuit breaker open);
a `record-outcome` of a success calls `record-success`, of an empty result
`record-empty-result`, of a failure `record-failure` (with an observation built
from the readable failure: headers pairs joined as `name: value` lines,
`session-id-sent` false and `delivery` "unknown" unless given), of a status
check `record-status-check`, of a task `record-task-status` (a readable task
report: `message` "" unless given), of a poll failure `record-poll-failure`
(its failure as for a failure); the answer is `last-decision(call-id)`, and the
verdict must say what that decision says. `classify` takes the readable
failure as an observation too; `read-probe-answer` asks the rule for the
`server/discover` probe's answer. `put-shared-state` stores a text in the
case's shared state as a store would (version + 1), `shared-state` reads it
(or null), `breaker-changes` is `run.take-breaker-changes()` (never called
otherwise); `last-decision` and `escalation` are the run's, `snapshot` is
`run.snapshot` (its text kept for the next `resume`), `resume` is
`policy.resume-run` (with `edit`'s one replacement) then `run.resumed-call`,
the resumed run becoming the current one (contract 0.9.0). observations.json (raw transport
observations and the verdict each must produce) runs in its pure form:
`begin-call lookup_order`, `record-failure(observation)`, the verdict compared
with the case's `expect`. `--dump` writes the outputs.

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
from .component import PolicyComponent, PolicyInstance, _repo_root
from .entropy import SplitMix64
from .guard import RunGuard
from .types import Decision, Loaded, Verdict, action_name

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
        "time-left-ms",
        "http-status",
        "json-rpc-code",
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
        "sent",
        "why",
        "key",
        "value",
        "arguments-json",
        "answer",
        "edit",
        "snapshot-text",
    ]
)
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
U32_MAX = 0xFFFF_FFFF
_HEX_U64 = re.compile(r"0x[0-9a-fA-F]{1,16}")


class HarnessError(Exception):
    """A bad vector or a trap: not an answer of the component."""


def default_vector_dir() -> Path:
    return _repo_root() / "tests" / "vectors"


# The file of raw transport observations (its own format: `run_observation_case`).
OBSERVATIONS_FILE = "observations.json"


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


class VectorSharedState:
    """The runner's shared state (one per case, shared by its runs):
    compare-and-set by version as a store does, but no expiry and no size
    bounds, so that a case is deterministic; `load` answers the `now-ms` it was
    passed."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, int]] = {}

    def load(self, key: str, now_ms: int) -> Loaded:
        entry = self.entries.get(key)
        if entry is None:
            return {"value": None, "version": 0, "now-ms": now_ms}
        return {"value": entry[0], "version": entry[1], "now-ms": now_ms}

    def store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool:
        version = self.entries[key][1] if key in self.entries else 0
        if version != expected_version:
            return False
        self.entries[key] = (value, version + 1)
        return True

    def put(self, key: str, value: str) -> None:
        """The `put-shared-state` op: stored as a store would (version + 1), whatever was there."""
        version = self.entries[key][1] if key in self.entries else 0
        self.entries[key] = (value, version + 1)

    def text(self, key: str) -> str | None:
        entry = self.entries.get(key)
        return entry[0] if entry is not None else None


class Subject:
    """The component, called with canonical JSON values."""

    def __init__(self, component: PolicyComponent) -> None:
        self.shared_state = VectorSharedState()
        # A fixed seed keeps even the guest's own draws reproducible; the vectors
        # always pass entropy, so it is never used.
        self.instance: PolicyInstance = component.instantiate(
            accounts=EmbeddedAccounts.on_host_clock(), entropy=SplitMix64(0), shared_state=self.shared_state
        )
        self.policy: Any = None
        self.run: Any = None

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
        return {"ok": None}


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
    if (
        op in ("begin-call", "record-outcome", "report", "effects", "breaker-changes", "last-decision", "escalation", "snapshot")
        and not state["started"]
    ):
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
        return call("[method]policy.classify", subject.need_policy(), translate_failure(_field(step, "failure")), state["now"])
    if op == "next-delay":
        retry = _u32(step, "retry")
        return call("[method]policy.next-delay", subject.need_policy(), retry, _optional_u64(step, "hint-ms"), entropy)
    if op == "derive-idempotency-key":
        return call("derive-idempotency-key", _text(step, "run-id"), _text(step, "action-id"))
    if op == "read-probe-answer":
        return call("read-probe-answer", step.get("http-status"), step.get("json-rpc-code"))
    if op == "start-run":
        answer = subject.start_run(_text(step, "run-id"))
        if "ok" in answer:
            state["started"] = True
            attempts.clear()
        return answer
    if op == "begin-call":
        answer = translate_begin_call(subject, _field(step, "call"), state["now"])
        call_id = _sent_attempt(answer, "ok", "send", "call-id")
        if call_id is not None:
            attempts[call_id] = 1
        return answer
    if op == "record-outcome":
        call_id = _u32(step, "call-id")
        attempt = _u32(step, "attempt") if "attempt" in step else attempts.get(call_id, 1)
        time_left = _optional_u64(step, "time-left-ms")
        answer = translate_record_outcome(subject, call_id, attempt, _field(step, "outcome"), time_left, state["now"], entropy)
        retry = _sent_attempt(answer, "ok", "action", "retry", "attempt")
        if retry is not None:
            attempts[call_id] = retry
        return answer
    if op == "abandon-call":
        call_id = _u32(step, "call-id")
        attempt = _u32(step, "attempt") if "attempt" in step else attempts.get(call_id, 1)
        sent = step.get("sent", True)
        if not isinstance(sent, bool):
            raise HarnessError('"sent" must be a boolean')
        return call("[method]run.abandon-call", subject.need_run(), call_id, attempt, sent, _text(step, "why"))
    if op == "report":
        return call("[method]run.report", subject.need_run())
    if op == "breaker-changes":
        return call("[method]run.take-breaker-changes", subject.need_run())
    if op == "put-shared-state":
        subject.shared_state.put(_text(step, "key"), _text(step, "value"))
        return None
    if op == "shared-state":
        return subject.shared_state.text(_text(step, "key"))
    if op == "effects":
        return call("[method]run.effects", subject.need_run(), _u32(step, "start"), _u32(step, "max-count"))
    if op == "last-decision":
        return call("[method]run.last-decision", subject.need_run(), _u32(step, "call-id"))
    if op == "escalation":
        return call("[method]run.escalation", subject.need_run())
    if op == "snapshot":
        arguments = step.get("arguments-json")
        answer = call("[method]run.snapshot", subject.need_run(), arguments if isinstance(arguments, str) else None, state["now"])
        state["snapshot"] = answer.get("ok") if isinstance(answer, dict) and isinstance(answer.get("ok"), str) else None
        return answer
    if op == "resume":
        return _resume_step(subject, step, state)
    raise HarnessError(f'unknown op "{op}"')


def _resume_step(subject: Subject, step: dict[str, Any], state: dict[str, Any]) -> Any:
    """The `resume` op: the last snapshot (or `snapshot-text`), with `edit`'s
    one replacement, through `policy.resume-run`, then `run.resumed-call`; the
    resumed run becomes the current one."""
    if "snapshot-text" in step:
        text = step["snapshot-text"]
        if not isinstance(text, str):
            raise HarnessError("snapshot-text must be a string")
    else:
        text = state.get("snapshot")
        if text is None:
            raise HarnessError("resume needs a snapshot step first, or snapshot-text")
    if "edit" in step:
        edit = step["edit"]
        if not isinstance(edit, list) or len(edit) != 2:
            raise HarnessError("edit must be [from, to]")
        old, new = edit
        if not isinstance(old, str) or not isinstance(new, str):
            raise HarnessError("edit must be two strings")
        if old not in text:
            raise HarnessError(f"edit: {json.dumps(old)} is not in the snapshot")
        text = text.replace(old, new, 1)
    answer = subject.instance.call("[method]policy.resume-run", subject.need_policy(), text, _field(step, "answer"), state["now"])
    if "ok" not in answer:
        return answer
    subject.run = answer["ok"]
    state["started"] = True
    resumed = subject.instance.call("[method]run.resumed-call", subject.run)
    if isinstance(resumed, dict):
        call_id, attempt = resumed.get("call-id"), resumed.get("attempt")
        if isinstance(call_id, int) and isinstance(attempt, int):
            state.setdefault("attempts", {})[call_id] = attempt
    return {"ok": resumed}


# The translation of the readable steps onto the single run path (contract 0.8.0), in one place.

_CALL_FIELDS = frozenset(["server", "tool", "idempotency-key", "hints"])
_FAILURE_FIELDS = frozenset(["kind", "headers", "body", "structured-content", "session-id-sent", "delivery"])
_TASK_FIELDS = ("task-id", "status", "poll-interval-ms", "ttl-ms", "age-ms", "message")


def translate_failure(failure: Any) -> dict[str, Any]:
    """A readable failure (`{kind, headers: [[name, value], ...], body,
    structured-content, session-id-sent?, delivery?}`) as the contract's
    observation: the headers joined as `name: value` lines with "\n",
    `session-id-sent` false and `delivery` "unknown" unless given. Nothing is
    cut: the vectors test the component, not this host's limits."""
    if not isinstance(failure, dict):
        raise HarnessError(f"a failure must be an object, got {json.dumps(failure)}")
    unknown = sorted(set(failure) - _FAILURE_FIELDS)
    if unknown:
        raise HarnessError(f'unknown failure field "{unknown[0]}"')
    if "kind" not in failure:
        raise HarnessError('a failure needs a "kind"')
    headers = failure.get("headers", [])
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 and all(isinstance(part, str) for part in h) for h in headers
    ):
        raise HarnessError(f'a failure\'s "headers" must be [[name, value], ...], got {json.dumps(headers)}')
    return {
        "kind": failure["kind"],
        "headers": limits.join_headers(headers),
        "body": failure.get("body", ""),
        "structured-content": failure.get("structured-content"),
        "session-id-sent": failure.get("session-id-sent", False),
        "delivery": failure.get("delivery", "unknown"),
    }


def translate_task_report(task: Any) -> dict[str, Any]:
    """A readable task report (`{task-id, status, poll-interval-ms?, ttl-ms?,
    age-ms?, message?}`) as the contract's `task-report`: absent (or null)
    options none, `message` "" unless given (hosts/rust/src/steps.rs,
    `task_report_json`)."""
    if not isinstance(task, dict):
        raise HarnessError(f"a task report must be an object: {json.dumps(task)}")
    unknown = [name for name in task if name not in _TASK_FIELDS]
    if unknown:
        raise HarnessError(f'unknown task report field "{unknown[0]}"')
    report = {name: task.get(name) for name in _TASK_FIELDS}
    if report["message"] is None:
        report["message"] = ""
    return report


def translate_begin_call(subject: Subject, request: Any, now: int) -> Any:
    """`begin-call` (+ `escalation()` when not admitted, `last-decision(call-id)`
    when not admitted as a replan) as the readable answer: `{"ok": {"send":
    ticket}}`, `{"ok": {"escalate": escalation}}`, `{"ok": {"replan":
    decision}}` or `{"err": run-error}`."""
    if not isinstance(request, dict) or not request.keys() <= _CALL_FIELDS or "tool" not in request:
        raise HarnessError(f'"call" must be {{server?, tool, idempotency-key?, hints?}}, got {json.dumps(request)}')
    call = subject.instance.call
    run = subject.need_run()
    server, tool = request.get("server"), request["tool"]
    answer = call("[method]run.begin-call", run, server, tool, request.get("idempotency-key"), request.get("hints"), now)
    if "ok" not in answer:
        return answer
    start = answer["ok"]
    if start["admitted"]:
        fields = ("call-id", "delay-ms", "effect", "safe-to-repeat", "idle-timeout-ms", "attempt-timeout-ms")
        ticket = {k: start[k] for k in fields}
        return {"ok": {"send": ticket}}
    if start["replan"]:
        if start["call-id"] == 0:
            raise HarnessError("begin-call answered replan with call-id 0 (a replan names its call)")
        decision = call("[method]run.last-decision", run, start["call-id"])
        if decision is None or action_name(decision["action"]) != "replan":
            raise HarnessError(f"begin-call answered replan, but last-decision({start['call-id']}) is {json.dumps(decision)}")
        return {"ok": {"replan": decision}}
    if start["call-id"] != 0:
        raise HarnessError(f"begin-call was not admitted but gave call-id {start['call-id']} (0 when not admitted)")
    escalation = call("[method]run.escalation", run)
    if escalation is None:
        raise HarnessError("begin-call was not admitted, and escalation() is none")
    return {"ok": {"escalate": escalation}}


def translate_record_outcome(
    subject: Subject, call_id: int, attempt: int, outcome: Any, time_left: int | None, now: int, entropy: int
) -> Any:
    """A readable outcome reported on the single path, answered with
    `last-decision(call-id)` as `{"ok": decision}` (or `{"err": run-error}`),
    the verdict checked against the decision."""
    call = subject.instance.call
    run = subject.need_run()
    if outcome == "success":
        which, answer = "record-success", call("[method]run.record-success", run, call_id, attempt, now)
    elif isinstance(outcome, dict) and len(outcome) == 1 and "empty-result" in outcome:
        detail = outcome["empty-result"]
        which, answer = "record-empty-result", call("[method]run.record-empty-result", run, call_id, attempt, detail, now)
    elif isinstance(outcome, dict) and len(outcome) == 1 and "failure" in outcome:
        observation = translate_failure(outcome["failure"])
        which = "record-failure"
        answer = call("[method]run.record-failure", run, call_id, attempt, observation, time_left, now, entropy)
    elif isinstance(outcome, dict) and len(outcome) == 1 and "status-check" in outcome:
        found = outcome["status-check"]
        which = "record-status-check"
        answer = call("[method]run.record-status-check", run, call_id, attempt, found, time_left, now, entropy)
    elif isinstance(outcome, dict) and len(outcome) == 1 and "task" in outcome:
        task = translate_task_report(outcome["task"])
        which = "record-task-status"
        answer = call("[method]run.record-task-status", run, call_id, attempt, task, time_left, now, entropy)
    elif isinstance(outcome, dict) and len(outcome) == 1 and "poll-failure" in outcome:
        observation = translate_failure(outcome["poll-failure"])
        which = "record-poll-failure"
        answer = call("[method]run.record-poll-failure", run, call_id, attempt, observation, time_left, now, entropy)
    else:
        raise HarnessError(
            f'unknown outcome {json.dumps(outcome)}: "success", {{"empty-result"}}, {{"failure"}}, {{"status-check"}}, '
            '{"task"} or {"poll-failure"}'
        )
    if "ok" not in answer:
        return answer
    verdict = verdict_of(answer["ok"])
    decision = call("[method]run.last-decision", run, call_id)
    if decision is None:
        raise HarnessError(f"{which} answered {verdict!r}, but last-decision({call_id}) is none")
    disagreement = verdict_disagreement(verdict, decision, subject.instance.rule_names())
    if disagreement is not None:
        raise HarnessError(f"{which}'s verdict disagrees with last-decision: {disagreement} (verdict {verdict!r}, decision {decision!r})")
    return {"ok": decision}


def verdict_of(value: dict[str, Any]) -> Verdict:
    """A lifted `verdict` record as the host's `Verdict`."""
    return Verdict(
        value["action"],
        value["class"],
        value["attempt"],
        value["delay-ms"],
        value["hint-ms"],
        value["rule-index"],
        value["has-note"],
        value["reconnect"],
        value["cancel-task"],
        value["breaker-changed"],
    )


def verdict_disagreement(verdict: Verdict, decision: Decision, rule_names: tuple[str, ...]) -> str | None:
    """None if the verdict says what the full decision says, else what differs."""
    action = decision["action"]
    kind = action_name(action)
    # A poll's plan carries its delay and reconnect as a retry's does.
    plan = action[kind] if kind in ("retry", "poll") else None  # type: ignore[literal-required]
    plan_delay = plan["delay-ms"] if plan is not None else 0
    plan_reconnect = plan["reconnect"] if plan is not None else False
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
        ("reconnect", verdict.reconnect, plan_reconnect),
        ("cancel-task", verdict.cancel_task, decision["cancel-task"]),
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
    if isinstance(expected, dict) and len(expected) == 1 and "$any" in expected:
        options = expected["$any"]
        if not isinstance(options, list) or not options:
            return f"{path}: $any takes a non-empty array of matchers, got {json.dumps(options)}"
        misses = []
        for option in options:
            mismatch = match(option, actual, path)
            if mismatch is None:
                return None
            misses.append(mismatch)
        return f"{path}: matches none of $any: " + "; ".join(misses)
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
    # The exception behind `failure`, if a call raised (a trap of the component):
    # the update gate refuses with it as the cause.
    error: BaseException | None = field(default=None, compare=False, repr=False)


def with_config_values(expected: Any, config_text: str) -> Any:
    """`expected` with each `{"$config": "<field>"}` replaced by that field of the
    configuration the case runs under, read by the host (the guard's reading:
    its defaults are the guest's), never by the component under test."""
    if isinstance(expected, dict):
        if len(expected) == 1 and isinstance(expected.get("$config"), str):
            return RunGuard(config_text).cap(expected["$config"])
        return {k: with_config_values(v, config_text) for k, v in expected.items()}
    if isinstance(expected, list):
        return [with_config_values(v, config_text) for v in expected]
    return expected


def run_case(component: PolicyComponent, file: str, case: dict[str, Any], *, config_text: str | None = None) -> CaseResult:
    """Runs one case on a fresh instance. A case without `config` loads
    `config_text` if given (a live update's own configuration, for the gate's
    vectors), else `{}`."""
    result = CaseResult(file, case.get("description", "?"))
    subject = Subject(component)
    state: dict[str, Any] = {"now": DEFAULT_START_MS, "started": False, "attempts": {}}
    if "config" in case or config_text is None:
        config_text = canonical_json_text(case.get("config", {}))
    try:
        loaded = subject.load_policy(config_text)
    except Exception as e:  # a trap or a conversion error is the harness's failure
        result.failure, result.error = f"loading the case's config: {e}", e
        return result
    if "ok" not in loaded:
        result.failure = f"the case's config was rejected: {json.dumps(loaded)}"
        return result
    for i, step in enumerate(case.get("steps", []), start=1):
        try:
            output = run_step(subject, step, state)
        except Exception as e:
            result.failure, result.error = f"step {i}: {e}", e
            return result
        result.outputs.append(output)
        if "expect" in step:
            mismatch = match(with_config_values(step["expect"], config_text), output)
            if mismatch:
                result.failure = f"step {i} ({step.get('op')}): {mismatch}"
                return result
    return result


def canonical_outputs(result: CaseResult) -> str:
    """The outputs as one canonical text, for exact comparison across runs and hosts."""
    return json.dumps(result.outputs, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


_OBSERVATION_CASE_KEYS = frozenset(["description", "comment", "answer", "session-id-sent", "observation", "expect"])
_OBSERVATION_EXPECT_KEYS = ("action", "class", "rule", "reconnect")
# The tool every observation case calls (a read, attempt 1).
OBSERVATION_TOOL = "lookup_order"


def check_observations_file(document: Any) -> list[dict[str, Any]]:
    """The cases of observations.json (`{"description", "config", "cases":
    [{"description", "answer", "session-id-sent", "observation", "expect"}]}`),
    else raises HarnessError saying what is wrong."""
    if not isinstance(document, dict) or not isinstance(document.get("cases"), list):
        raise HarnessError('not an observations file: expected {"description", "config", "cases": [...]}')
    unknown = sorted(set(document) - {"description", "comment", "config", "cases"})
    if unknown:
        raise HarnessError(f'unknown field "{unknown[0]}" in the file')
    for i, case in enumerate(document["cases"], start=1):
        if not isinstance(case, dict):
            raise HarnessError(f"case {i} is not an object")
        unknown = sorted(set(case) - _OBSERVATION_CASE_KEYS)
        if unknown:
            raise HarnessError(f'unknown field "{unknown[0]}" in case {i}')
        for key in ("description", "observation", "expect"):
            if key not in case:
                raise HarnessError(f'case {i} needs "{key}"')
        expect = case["expect"]
        if not isinstance(expect, dict) or "action" not in expect or not set(expect) <= set(_OBSERVATION_EXPECT_KEYS):
            raise HarnessError(f'case {i}: "expect" takes "action" and any of {list(_OBSERVATION_EXPECT_KEYS[1:])}')
    return document["cases"]


def observed_verdict(verdict: Verdict, rule_names: tuple[str, ...]) -> dict[str, Any]:
    """What an observation case compares: the verdict's action, class, rule
    (by name) and reconnect."""
    rule = rule_names[verdict.rule_index] if verdict.rule_index < len(rule_names) else f"<rule-index {verdict.rule_index}>"
    return {"action": verdict.action, "class": verdict.class_, "rule": rule, "reconnect": verdict.reconnect}


def run_observation_case(component: PolicyComponent, file: str, config: Any, case: dict[str, Any]) -> CaseResult:
    """One case of observations.json in its pure form: a fresh instance, the
    file's `config`, a run, `begin-call lookup_order`, `record-failure` of the
    case's observation for attempt 1; the verdict must match `expect`."""
    result = CaseResult(file, case.get("description", "?"))
    subject = Subject(component)
    try:
        loaded = subject.load_policy(canonical_json_text(config if config is not None else {}))
        if "ok" not in loaded:
            result.failure = f"the file's config was rejected: {json.dumps(loaded)}"
            return result
        subject.start_run("run-1")
        begun = translate_begin_call(subject, {"tool": OBSERVATION_TOOL}, DEFAULT_START_MS)
        call_id = _sent_attempt(begun, "ok", "send", "call-id")
        if call_id is None:
            result.failure = f"begin-call {OBSERVATION_TOOL} was not admitted: {json.dumps(begun)}"
            return result
        observation = translate_failure(case["observation"])
        answer = subject.instance.call(
            "[method]run.record-failure", subject.need_run(), call_id, 1, observation, None, DEFAULT_START_MS, DEFAULT_ENTROPY
        )
        if "ok" not in answer:
            result.failure = f"record-failure answered {json.dumps(answer)}"
            return result
        got = observed_verdict(verdict_of(answer["ok"]), subject.instance.rule_names())
    except Exception as e:  # a trap or a bad case is the harness's failure
        result.failure, result.error = f"{type(e).__name__}: {e}", e
        return result
    result.outputs.append(got)
    mismatch = match(case["expect"], got)
    if mismatch:
        result.failure = f"the verdict: {mismatch}"
    return result


def run_all(component: PolicyComponent, directory: Path, *, twice: bool = True) -> list[CaseResult]:
    """Every case of every file (observations.json in its pure form). With
    `twice`, each case runs again on a fresh instance and must give the same
    outputs, byte for byte."""
    results = []
    for path, data in load_vector_files(directory):
        if path.name == OBSERVATIONS_FILE:
            try:
                cases = check_observations_file(data)
            except HarnessError as e:
                results.append(CaseResult(path.name, "(the file)", failure=str(e)))
                continue
            results.extend(run_observation_case(component, path.name, data.get("config"), case) for case in cases)
            continue
        for case in data["cases"]:
            first = run_case(component, path.name, case)
            if twice and first.failure is None:
                second = run_case(component, path.name, case)
                if second.failure is not None or canonical_outputs(second) != canonical_outputs(first):
                    first.failure = f"not deterministic: a second run gave {second.failure or canonical_outputs(second)}"
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
        # The step vectors, as the Rust runner dumps them (observations.json is
        # checked against its expectations here and through the wrapper).
        args.dump.write_text(
            "".join(
                f"{json.dumps([r.file, r.description], separators=(',', ':'), ensure_ascii=False)} {canonical_outputs(r)}\n"
                for r in results
                if r.file != "observations.json"
            ),
            encoding="utf-8",
        )
    failed = sum(1 for r in results if r.failure)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
