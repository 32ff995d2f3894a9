"""Contract 0.3.0's additions in this host (contract 0.9.0 keeps them all, on
its one run path): the attempt a report names, `start-run`'s run error, paging
through a run's effects, and the limits the host applies before a value crosses
the boundary (a 40 MB tool error, 5,800 headers, ids over 256 bytes, a
configuration over 1 MiB). The package's version: test_contract_050.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from mcp.types import CallToolResult, ListToolsResult, TextContent, Tool, ToolAnnotations

from agent_retry_policy import (
    ConfigError,
    PolicyComponent,
    PolicyInputTooLarge,
    PolicyTrap,
    RunMisuse,
    limits,
    wit_types,
)
from agent_retry_policy.conformance import DEFAULT_START_MS, Subject, run_step
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.types import Observation, http_failure, tool_error, transport_failure

NOW = 1_764_460_800_000
LOOKUP = "lookup_order"
READS = {"default-effect": "read"}


def fresh_run(config: Any = None, run_id: str = "r") -> Any:
    return PolicyComponent.load().instantiate().load_policy(config or {}).start_run(run_id)


def begin(run: Any, tool: str = LOOKUP, key: str | None = None) -> int:
    """Begins a call that must be admitted: its call id."""
    start = run.begin_call(tool, key, None, NOW)
    assert start.admitted, start
    return int(start.call_id)


# Every report names the attempt it reports.


def test_a_report_names_its_attempt_and_a_second_report_of_one_attempt_is_refused() -> None:
    run = fresh_run(READS)
    call_id = begin(run)
    verdict = run.record_failure(call_id, 1, http_failure(503), None, NOW, 1)
    assert (verdict.action, verdict.attempt) == ("retry", 1)
    assert run.last_decision(call_id)["action"]["retry"]["attempt"] == 2
    with pytest.raises(RunMisuse) as again:
        run.record_failure(call_id, 1, http_failure(503), None, NOW, 1)  # the same 503 recorded twice
    assert again.value.error == {"attempt-mismatch": {"call-id": call_id, "expected": 2, "reported": 1}}
    assert again.value.case == "attempt-mismatch"
    with pytest.raises(RunMisuse) as early:
        run.record_success(call_id, 3, NOW)  # an attempt not sent yet
    assert early.value.error == {"attempt-mismatch": {"call-id": call_id, "expected": 2, "reported": 3}}
    assert (run.report()["attempts"], run.report()["retries"]) == (2, 1), "the refused reports changed nothing"
    assert run.record_success(call_id, 2, NOW).action == "succeed"
    assert run.last_decision(call_id)["action"] == {"succeed": None}


def test_a_status_check_reports_the_attempt_whose_effect_it_checked() -> None:
    run = fresh_run()
    call_id = begin(run, "issue_refund")
    assert run.record_failure(call_id, 1, transport_failure("timeout", delivery="sent"), None, NOW, 1).action == "check-status"
    verdict = run.record_status_check(call_id, 1, "absent", None, NOW, 1)
    assert (verdict.action, verdict.attempt) == ("retry", 1)
    assert run.last_decision(call_id)["action"]["retry"]["attempt"] == 2


# start-run can refuse; run errors for ids over 256 bytes, without crossing.


def test_start_run_refuses_a_run_id_over_256_bytes_as_the_component_would_without_crossing() -> None:
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy({})
    assert policy.start_run("r" * 256).run_id == "r" * 256
    policy.effective_config()
    fuel = instance.fuel_used_by_last_call()
    assert fuel > 0
    too_long = "é" * 129  # 258 bytes, 129 characters: the limit counts bytes
    with pytest.raises(RunMisuse) as refused:
        policy.start_run(too_long)
    expected = {"too-large": {"input": "run-id", "size-bytes": 258, "limit-bytes": 256}}
    assert refused.value.error == expected
    assert instance.fuel_used_by_last_call() == fuel, "refused in the host: nothing crossed"
    # The component's own answer, called raw, is the same.
    assert instance.call("[method]policy.start-run", policy.resource, too_long) == {"err": expected}
    assert policy.start_run("r2").report()["run-id"] == "r2", "the instance serves on"


def test_begin_call_refuses_a_tool_or_key_over_256_bytes_and_the_run_goes_on() -> None:
    run = fresh_run()
    with pytest.raises(RunMisuse) as tool:
        run.begin_call("t" * 257, None, None, NOW)
    assert tool.value.error == {"too-large": {"input": "tool", "size-bytes": 257, "limit-bytes": 256}}
    with pytest.raises(RunMisuse) as key:
        run.begin_call("issue_refund", "k" * 300, None, NOW)
    assert key.value.error == {"too-large": {"input": "idempotency-key", "size-bytes": 300, "limit-bytes": 256}}
    assert run.begin_call("issue_refund", "k" * 256, None, NOW).admitted
    assert (run.report()["calls"], run.report()["attempts"]) == (1, 1)


def test_derive_idempotency_key_refuses_ids_over_256_bytes_with_a_typed_host_error() -> None:
    instance = PolicyComponent.load().instantiate()
    for run_id, action_id, which, size in (("r" * 257, "step-1", "run-id", 257), ("r", "a" * 100_000, "action-id", 100_000)):
        with pytest.raises(PolicyInputTooLarge) as refused:
            instance.derive_idempotency_key(run_id, action_id)
        error = refused.value
        assert (error.input, error.size_bytes, error.limit_bytes, error.kind) == (which, size, 256, "input-too-large")
        assert not isinstance(error, PolicyTrap) and isinstance(error, ValueError)
        assert f"{which} is {size} bytes, more than the 256 the policy takes" in str(error)
    assert instance.derive_idempotency_key("r" * 256, "a" * 256).startswith("ar1-"), "not a trap: the instance serves on"


def test_a_configuration_over_1_mib_is_refused_as_the_component_would_without_crossing() -> None:
    instance = PolicyComponent.load().instantiate()
    instance.derive_idempotency_key("r", "1")
    fuel = instance.fuel_used_by_last_call()
    text = '{"tools": {"t": {"effect": "' + "x" * (1 << 20) + '"}}}'
    size = len(text.encode())
    with pytest.raises(ConfigError) as refused:
        instance.load_policy(text)
    error = refused.value
    assert (error.kind, error.field) == ("too-large", "")
    assert error.message == f"the configuration is {size} bytes, more than the 1048576-byte limit"
    assert instance.fuel_used_by_last_call() == fuel, "refused in the host: nothing crossed"
    raw = instance.call("[static]policy.from-json", text)
    assert raw == {"err": {"kind": "too-large", "field": "", "message": error.message}}
    # 80 MiB (more than the instance's memory cap) is refused the same way, not a trap.
    with pytest.raises(ConfigError, match="too-large"):
        instance.load_policy('{"x": "' + "x" * (80 << 20) + '"}')
    assert instance.load_policy({}).effective_config()


# Effects: bounded in a report and an escalation, every one by page.


def test_a_long_runs_report_and_escalation_are_bounded_and_every_effect_is_paged() -> None:
    writes = 1_205
    run = fresh_run({"max-steps-per-run": 1_000_000})
    for i in range(writes):
        call_id = begin(run, "issue_refund", f"k-{i}")
        run.record_success(call_id, 1, NOW)
    report = run.report()
    assert (len(report["effects"]), report["effects-total"]) == (20, writes)
    assert [e["call-id"] for e in report["effects"]] == [*range(1, 11), *range(writes - 9, writes + 1)]
    assert len(run.effects(0, 5_000)) == 1_000, "a page holds at most 1,000"
    assert [e["call-id"] for e in run.effects(10, 3)] == [11, 12, 13]
    assert run.effects(writes, 10) == [] and run.effects(0xFFFF_FFFF, 10) == []
    every = run.all_effects()
    assert [(e["call-id"], e["idempotency-key"]) for e in every] == [(i + 1, f"k-{i}") for i in range(writes)]
    call_id = begin(run, "issue_refund")
    assert run.record_failure(call_id, 1, http_failure(403), None, NOW, 1).action == "escalate"
    escalation = run.last_decision(call_id)["action"]["escalate"]
    assert escalation == run.escalation()
    assert (len(escalation["effects"]), escalation["effects-total"]) == (20, writes)
    assert set(escalation) == set(wit_types.RECORDS["escalation"])


# The limits on an observation, before it crosses.


def test_a_huge_observation_is_cut_before_it_crosses_and_a_small_one_is_passed_as_it_is() -> None:
    small: Observation = http_failure(503, [("a", "b")], "x")
    assert limits.bounded_observation(small) is small
    huge: Observation = {
        "kind": {"tool-error": None},
        "headers": "\n".join(f"h{i}: {'v' * 7_000}" for i in range(5_800)),
        "body": "é" * 20_000_000,
        "structured-content": "{}" * 40_000,
    }
    cut = limits.bounded_observation(huge)
    lines = cut["headers"].split("\n")
    assert len(lines) == limits.MAX_HEADERS == 128
    assert all(len(line.partition(": ")[2].encode()) == limits.MAX_HEADER_VALUE_BYTES == 4_096 for line in lines)
    assert [line.partition(": ")[0] for line in lines] == [f"h{i}" for i in range(128)], "the first 128, in order"
    assert len(cut["body"].encode()) == limits.MAX_BODY_BYTES == 65_536, "cut at a character boundary: é is 2 bytes"
    assert cut["structured-content"] is None, "cut JSON is not JSON: dropped"
    assert huge["headers"].count("\n") == 5_799 and len(huge["body"]) == 20_000_000, "the caller's observation is left as it was"
    odd = limits.bounded_observation({"kind": {"tool-error": None}, "body": "a" + "€" * 30_000, "headers": f"{'n' * 5_000}: v"})
    assert odd["body"] == "a" + "€" * 21_845, "65,536 bytes would split a 3-byte character: cut before it"
    assert odd["headers"] == f"{'n' * 4_096}: v", "a name is cut too"
    kept = '{"a": "' + "x" * 65_000 + '"}'
    assert limits.bounded_observation({"kind": {"tool-error": None}, "structured-content": kept})["structured-content"] == kept
    assert len(limits.cut("é" * 40_000, limits.MAX_BODY_BYTES).encode()) == 65_536
    # An empty result's detail is cut the same way (record_empty_result) and decides without a trap.
    instance = PolicyComponent.load().instantiate()
    run = instance.load_policy(READS).start_run("empty")
    assert run.record_empty_result(begin(run), 1, "é" * 20_000_000, NOW).action == "replan"
    assert instance.memory_bytes() < 8 << 20, "nothing huge reached the guest"


def test_huge_tool_errors_on_one_instance_all_decide_without_a_trap(capsys: pytest.CaptureFixture[str]) -> None:
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy(READS)
    timings = []
    for size in (40_000_000, 20_000_000, 10_000_000, 5_000_000, 2_500_000, 1_250_000):
        text = ("upstream 503 service unavailable " * (size // 33 + 1))[:size]
        run = policy.start_run(f"huge-{size}")
        observation = tool_error(text, '{"detail": "' + "d" * size + '"}')
        call_id = begin(run)
        started = time.perf_counter()
        verdict = run.record_failure(call_id, 1, observation, None, NOW, 1)
        timings.append((size, (time.perf_counter() - started) * 1000, instance.fuel_used_by_last_call()))
        assert (verdict.class_, verdict.action) == ("transient", "retry"), verdict
        classification = policy.classify(tool_error(text), NOW)
        assert classification["class"] == "transient"
    assert instance.memory_bytes() < 8 << 20, "nothing huge reached the guest"
    with capsys.disabled():
        print("\nrecord-failure of a huge tool error (bytes, ms, fuel): " + ", ".join(f"{s:,} {ms:.1f} {f:,}" for s, ms, f in timings))


def test_5800_headers_are_cut_to_128_and_the_policy_names_what_it_left_out() -> None:
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy(READS)
    headers = [(f"x-filler-{i}", "1") for i in range(5_800)] + [("Retry-After", "7")]
    started = time.perf_counter()
    classification = policy.classify(http_failure(503, headers), NOW)
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert classification["class"] == "transient"
    assert classification["hint-ms"] is None, "Retry-After came after the 128th header: never passed"
    fuel = instance.fuel_used_by_last_call()
    assert classification["header-problems"] == [
        {"name": "(headers)", "value": "", "problem": "only the first 64 of 128 headers were read"}
    ], "the host passed 128; the policy read 64 and named the rest"
    assert elapsed_ms < 500, elapsed_ms
    raw = instance.call("[method]policy.classify", policy.resource, http_failure(503, headers), NOW)
    assert raw["header-problems"][0]["problem"] == "only the first 64 of 5801 headers were read"
    assert fuel * 4 < instance.fuel_used_by_last_call(), "all 5,801 passed raw cost the guest far more"
    run = policy.start_run("h")
    assert run.record_failure(begin(run), 1, http_failure(503, headers), None, NOW, 1).action == "retry"


# The MCP wrapper reports each attempt by number.


class ScriptedSession:
    """Enough of `ClientSession` for the wrapper: one tool, answers in order."""

    def __init__(self, tool: Tool, answers: list[str]) -> None:
        self.tool = tool
        self.answers = answers
        self.sent = 0

    async def list_tools(self, params: Any = None) -> ListToolsResult:
        return ListToolsResult(tools=[self.tool])

    async def call_tool(self, name: str, arguments: dict[str, Any], **_options: Any) -> CallToolResult:
        answer = self.answers[self.sent]
        self.sent += 1
        if answer == "hang":
            await asyncio.sleep(5)
        if answer == "503":
            return CallToolResult(content=[TextContent(type="text", text="upstream returned 503, try again")], is_error=True)
        return CallToolResult(content=[TextContent(type="text", text="done")], is_error=False)


def _spy_on_reports(run: Any) -> list[tuple[int, Any]]:
    """Every attempt the wrapper reports, as (attempt, what): through
    `record_success`, `record_empty_result`, `record_failure` or
    `record_status_check`."""
    reports: list[tuple[int, Any]] = []

    def spy(name: str, what: str) -> None:
        real = getattr(run, name)

        def report(call_id: int, attempt: int, *rest: Any) -> Any:
            reports.append((attempt, what))
            return real(call_id, attempt, *rest)

        setattr(run, name, report)

    for name, what in (
        ("record_success", "success"),
        ("record_empty_result", "empty-result"),
        ("record_failure", "failure"),
        ("record_status_check", "status-check"),
    ):
        spy(name, what)
    return reports


def _no_sleep(_seconds: float) -> Any:
    return asyncio.sleep(0)


def test_the_mcp_wrapper_reports_attempt_1_then_each_retry_plans_attempt() -> None:
    run = fresh_run({"max-attempts-per-call": 4})
    reports = _spy_on_reports(run)
    lookup = Tool(name="lookup", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
    session = ScriptedSession(lookup, ["503", "503", "ok"])
    # tools= : no tools/list pseudo-call, whose outcome the spy would see too.
    result = asyncio.run(RetryingToolCaller(session, run, sleep=_no_sleep, tools=[lookup]).call_tool("lookup", {}))  # type: ignore[arg-type]
    assert not result.is_error and session.sent == 3
    assert reports == [(1, "failure"), (2, "failure"), (3, "success")]
    assert run.report()["attempts"] == 3


def test_the_mcp_wrapper_reports_a_status_check_under_the_attempt_it_checked() -> None:
    run = fresh_run()
    reports = _spy_on_reports(run)
    write = Tool(
        name="issue_refund_unkeyed",
        input_schema={"type": "object"},
        annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False),
    )
    session = ScriptedSession(write, ["hang", "ok"])

    async def absent(_request: Any) -> str:
        return "absent"

    caller = RetryingToolCaller(session, run, sleep=_no_sleep, attempt_timeout_s=0.05, status_check=absent, tools=[write])  # type: ignore[arg-type]
    result = asyncio.run(caller.call_tool("issue_refund_unkeyed", {}))
    assert not result.is_error and session.sent == 2
    assert reports == [(1, "failure"), (1, "status-check"), (2, "success")]


# The vector runner's new steps.


def test_the_runner_defaults_a_reports_attempt_pages_effects_and_keeps_the_run_after_a_refused_start() -> None:
    subject = Subject(PolicyComponent.load())
    subject.load_policy("{}")
    state: dict[str, Any] = {"now": DEFAULT_START_MS, "started": False, "attempts": {}}
    assert run_step(subject, {"op": "start-run", "run-id": "first"}, state) == {"ok": None}
    refund = {"tool": "issue_refund", "idempotency-key": "k-1"}
    assert run_step(subject, {"op": "begin-call", "call": refund}, state)["ok"]["send"]["call-id"] == 1
    failure = {"failure": {"kind": {"http-status": 503}}}
    retry = run_step(subject, {"op": "record-outcome", "call-id": 1, "outcome": failure}, state)
    assert retry["ok"]["action"]["retry"]["attempt"] == 2
    # No "attempt": the one the runner sent last (2); a stale one is the component's refusal.
    stale = run_step(subject, {"op": "record-outcome", "call-id": 1, "attempt": 1, "outcome": failure}, state)
    assert stale == {"err": {"attempt-mismatch": {"call-id": 1, "expected": 2, "reported": 1}}}
    assert run_step(subject, {"op": "record-outcome", "call-id": 1, "outcome": "success"}, state)["ok"]["attempt"] == 2
    effects = run_step(subject, {"op": "effects", "start": 0, "max-count": 10}, state)
    assert effects == [{"call-id": 1, "tool": "issue_refund", "idempotency-key": "k-1", "status": "applied"}]
    refused = run_step(subject, {"op": "start-run", "run-id": "x" * 257}, state)
    assert refused == {"err": {"too-large": {"input": "run-id", "size-bytes": 257, "limit-bytes": 256}}}
    assert run_step(subject, {"op": "report"}, state)["run-id"] == "first", "a refused start-run leaves the run current"


def test_the_mcp_wrapper_raises_an_input_over_its_limit_to_the_caller_and_sends_nothing() -> None:
    keyed = Tool(name="issue_refund", input_schema={"type": "object", "properties": {"idempotency_key": {"type": "string"}}})
    session = ScriptedSession(keyed, ["ok"])
    caller = RetryingToolCaller(session, fresh_run(), sleep=_no_sleep)  # type: ignore[arg-type]
    with pytest.raises(PolicyInputTooLarge, match="action-id is 300 bytes"):
        asyncio.run(caller.call_tool("issue_refund", {}, action_id="a" * 300))
    long_name = Tool(name="t" * 300, input_schema={"type": "object"})
    session = ScriptedSession(long_name, ["ok"])
    with pytest.raises(RunMisuse) as refused:
        asyncio.run(RetryingToolCaller(session, fresh_run(), sleep=_no_sleep).call_tool("t" * 300, {}))  # type: ignore[arg-type]
    assert refused.value.case == "too-large" and refused.value.value["input"] == "tool"
    assert session.sent == 0
