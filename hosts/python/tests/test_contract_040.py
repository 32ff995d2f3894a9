"""Contract 0.4.0 in this host: the flat hot path (`begin_call_flat`,
`record_success`, `record_failure`, `last_decision`, `escalation`,
`rule_names`): the same decisions as the rich calls, the same limits before a
value crosses, the same sandbox (values out of range refused, traps typed,
threads checked), and a live update's self-test that calls them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from agent_retry_policy import (
    EmbeddedAccounts,
    InstanceUnusable,
    PolicyComponent,
    PolicyOutOfFuel,
    RunMisuse,
    WrongThread,
    limits,
)
from agent_retry_policy._codec import ValueConversionError
from agent_retry_policy.component import Run
from agent_retry_policy.conformance import verdict_disagreement
from agent_retry_policy.types import CallStart, Verdict, http_failure, tool_error, transport_failure

NOW = 1_764_460_800_000
KEY = "ar1-00000000000000000000000000000001"
CONFIG = {"tools": {"issue_refund": {"effect": "write"}, "lookup_order": {"effect": "read"}}}
WRITE_HINTS = {"read-only": False, "destructive": None, "idempotent": False}
NOOP = Path(__file__).resolve().parents[3] / "target" / "noop" / "agent_retry_noop.wasm"


def fresh_run(config: Any = None, **instantiate: Any) -> Run:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), **instantiate)
    return instance.load_policy(config if config is not None else CONFIG).start_run("r")


def test_a_flat_call_decides_what_the_rich_call_decides_and_the_prose_comes_on_demand() -> None:
    rich, flat = fresh_run(), fresh_run()
    rules = flat.instance.rule_names()
    assert isinstance(rules, tuple) and rules and all(isinstance(rule, str) for rule in rules)
    assert flat.instance.rule_names() is rules, "read once per instance"

    ticket = rich.begin_call({"tool": "lookup_order"}, NOW)["send"]  # type: ignore[typeddict-item]
    start = flat.begin_call_flat("lookup_order", None, None, NOW)
    assert isinstance(start, CallStart)
    assert start == (True, ticket["call-id"], ticket["delay-ms"], ticket["effect"], ticket["safe-to-repeat"])
    assert flat.last_decision(start.call_id) is None, "no decision yet"

    headers = [("Retry-After", "2"), ("x-request-id", "abc")]
    decision = rich.record_outcome(ticket["call-id"], 1, http_failure(429, headers, "slow down"), NOW, 7)
    verdict = flat.record_failure(start.call_id, 1, {"http-status": 429}, headers, "slow down", None, NOW, 7)
    assert isinstance(verdict, Verdict)
    assert (verdict.action, verdict.class_, verdict.attempt, verdict.hint_ms) == ("retry", "throttled", 1, 2_000)
    assert verdict.delay_ms == decision["action"]["retry"]["delay-ms"] >= 2_000  # type: ignore[index]
    assert rules[verdict.rule_index] == decision["rule"]
    assert flat.last_decision(start.call_id) == decision, "the same decision, prose and all"
    assert verdict_disagreement(verdict, decision, rules) is None

    decision = rich.record_outcome(ticket["call-id"], 2, "success", NOW, 7)
    verdict = flat.record_success(start.call_id, 2, NOW)
    assert verdict == ("succeed", "success", 2, 0, None, verdict.rule_index, False)
    assert flat.last_decision(start.call_id) == decision
    assert flat.last_decision(start.call_id + 1) is None, "the last decision was about another call"
    assert flat.escalation() is None


def test_an_escalation_is_read_from_the_run_and_a_refused_call_says_not_admitted() -> None:
    run = fresh_run({**CONFIG, "max-steps-per-run": 1})
    start = run.begin_call_flat("issue_refund", KEY, WRITE_HINTS, NOW)
    verdict = run.record_failure(start.call_id, 1, {"http-status": 403}, (), "forbidden", None, NOW, 1)
    assert (verdict.action, verdict.class_, verdict.has_note) == ("escalate", "permission", True)
    escalation = run.escalation()
    assert escalation is not None and escalation["reason"] == "permission-denied"
    decision = run.last_decision(start.call_id)
    assert decision is not None and decision["action"] == {"escalate": escalation}
    with pytest.raises(RunMisuse) as ended:
        run.begin_call_flat("lookup_order", None, None, NOW)
    assert ended.value.case == "run-ended"

    # The step budget spent: begin-call-flat is not admitted, escalation() has the hand-off.
    run = fresh_run({**CONFIG, "max-steps-per-run": 1})
    first = run.begin_call_flat("lookup_order", None, None, NOW)
    run.record_success(first.call_id, 1, NOW)
    refused = run.begin_call_flat("lookup_order", None, None, NOW)
    assert (refused.admitted, refused.call_id) == (False, 0)
    hand_off = run.escalation()
    assert hand_off is not None and hand_off["reason"] == "run-steps-spent"
    assert run.report()["escalation"] == "run-steps-spent"


def test_a_header_line_break_cannot_inject_a_header_and_the_limits_apply_before_crossing() -> None:
    run = fresh_run()
    instance = run.instance
    # Joined raw, "x-note: a\nretry-after: 30" would be two lines, and a 30 s hint.
    start = run.begin_call_flat("lookup_order", None, None, NOW)
    verdict = run.record_failure(start.call_id, 1, {"http-status": 503}, [("x-note", "a\nretry-after: 30")], "", None, NOW, 1)
    assert verdict.hint_ms is None, verdict
    assert limits.join_headers([("a\r\nb", "c\rd"), ("e", "f")]) == "a  b: c d\ne: f"
    assert limits.bounded_headers_text([(f"h{i}", "v" * 5_000) for i in range(200)]).count("\n") == 127
    # 5,800 headers, a 20 MB body and 1 MB of structured content decide without a trap, and little crosses.
    headers = [(f"x-filler-{i}", "1") for i in range(5_800)] + [("Retry-After", "7")]
    verdict = run.record_failure(start.call_id, 2, {"http-status": 503}, headers, "é" * 10_000_000, "{}" * 500_000, NOW, 1)
    assert (verdict.action, verdict.hint_ms) == ("retry", None), "Retry-After was past the 128th header: never passed"
    decision = run.last_decision(start.call_id)
    assert decision is not None and "only the first 64 of 128 headers were read" in decision["reason"], decision["reason"]
    assert instance.memory_bytes() < 8 << 20
    # A tool name or key over 256 bytes is refused as the component would, without a call.
    run.record_success(start.call_id, verdict.attempt + 1, NOW)
    fuel = instance.fuel_used_by_last_call()
    with pytest.raises(RunMisuse) as tool:
        run.begin_call_flat("t" * 257, None, None, NOW)
    assert tool.value.error == {"too-large": {"input": "tool", "size-bytes": 257, "limit-bytes": 256}}
    with pytest.raises(RunMisuse) as key:
        run.begin_call_flat("issue_refund", "k" * 300, None, NOW)
    assert key.value.error == {"too-large": {"input": "idempotency-key", "size-bytes": 300, "limit-bytes": 256}}
    assert instance.fuel_used_by_last_call() == fuel, "refused in the host: nothing crossed"


@pytest.mark.parametrize(
    ("call", "where"),
    [
        (lambda run: run.record_success(-1, 1, NOW), "argument 2: -1 is out of range"),
        (lambda run: run.record_success(1, 2**32, NOW), "argument 3: 4294967296 is out of range"),
        (lambda run: run.record_success(1, True, NOW), "argument 3: True is not an integer"),
        (lambda run: run.record_success(1, 1, 2**64), "argument 4: 18446744073709551616 is out of range"),
        (lambda run: run.record_failure(1, 1, {"http-status": 70_000}, (), "", None, NOW, 1), "argument 4"),
        (lambda run: run.record_failure(1, 1, {"bogus": 1}, (), "", None, NOW, 1), "'bogus' is not a case"),
        (lambda run: run.record_failure(1, 1, {"http-status": 503}, (), b"body", None, NOW, 1), "argument 6"),
        (lambda run: run.record_failure(1, 1, {"http-status": 503}, (), "", None, NOW, -1), "argument 9: -1 is out of range"),
        (lambda run: run.begin_call_flat("t", None, {"read-only": 1}, NOW), "argument 4"),
        (lambda run: run.begin_call_flat("t", None, {"nope": True}, NOW), "are not fields"),
        (lambda run: run.begin_call_flat(7, None, None, NOW), "argument 2"),
        (lambda run: run.begin_call_flat("t", None, None, -5), "argument 5: -5 is out of range"),
    ],
)
def test_a_value_out_of_range_is_refused_before_it_crosses_and_the_run_serves_on(call: Any, where: str) -> None:
    run = fresh_run()
    start = run.begin_call_flat("lookup_order", None, None, NOW)
    with pytest.raises(ValueConversionError, match=where) as refused:
        call(run)
    assert isinstance(refused.value, TypeError)
    assert run.record_success(start.call_id, 1, NOW).action == "succeed", "nothing crossed: the call is still open"


def test_the_generic_path_takes_what_the_fast_path_leaves_to_it() -> None:
    class Id(int):
        pass

    run = fresh_run()
    start = run.begin_call_flat("lookup_order", KEY, {"read-only": True}, hex(NOW))  # type: ignore[arg-type]
    assert start.admitted and start.effect == "read"
    verdict = run.record_failure(Id(start.call_id), 1, {"transport": "timeout"}, (), "", '{"a": 1}', NOW, "0x10")  # type: ignore[arg-type]
    assert (verdict.action, verdict.class_) == ("retry", "transient")
    success = run.record_success(start.call_id, Id(2), NOW)
    assert isinstance(success, Verdict) and (success.action, success.attempt) == ("succeed", 2)


def test_a_trap_in_a_flat_call_is_typed_and_the_instance_is_unusable_after() -> None:
    run = fresh_run()
    run.instance._fuel = 200  # a tank too small for a call (start-run needs more than that too)
    with pytest.raises(PolicyOutOfFuel) as trapped:
        run.begin_call_flat("lookup_order", None, None, NOW)
    assert trapped.value.call == "[method]run.begin-call-flat"
    with pytest.raises(InstanceUnusable):
        run.record_success(1, 1, NOW)
    with pytest.raises(InstanceUnusable):
        run.record_failure(1, 1, {"http-status": 503}, (), "", None, NOW, 1)


def test_flat_calls_belong_to_the_instances_thread_and_a_closed_run_refuses_them() -> None:
    run = fresh_run()
    start = run.begin_call_flat("lookup_order", None, None, NOW)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            run.record_success(start.call_id, 1, NOW)
        except BaseException as e:  # noqa: BLE001 - the assertion reads it
            errors.append(e)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], WrongThread), errors
    assert run.record_success(start.call_id, 1, NOW).action == "succeed"
    run.close()
    with pytest.raises(InstanceUnusable, match="closed"):
        run.record_success(start.call_id, 2, NOW)
    with pytest.raises(InstanceUnusable, match="closed"):
        run.begin_call_flat("lookup_order", None, None, NOW)


def test_many_flat_calls_on_many_runs_keep_the_instance_small() -> None:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    policy = instance.load_policy({**CONFIG, "max-steps-per-run": 1_000_000, "max-retries-per-run": 100_000})
    for r in range(20):
        with policy.start_run(f"r{r}") as run:
            for _ in range(200):
                start = run.begin_call_flat("issue_refund", KEY, None, NOW)
                verdict = run.record_failure(start.call_id, 1, {"http-status": 503}, [("a", "b")], "x", '{"s": 1}', NOW, 1)
                run.record_success(start.call_id, verdict.attempt + 1, NOW)
    assert instance.memory_bytes() < 8 << 20


def test_the_live_gates_self_test_calls_the_flat_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_retry_policy.live import _self_test

    called: set[str] = set()
    for name in ("begin_call_flat", "record_success", "_record_failure_text", "last_decision", "escalation"):
        real = getattr(Run, name)

        def spy(self: Run, *args: Any, _real: Any = real, _name: str = name) -> Any:
            called.add(_name)
            return _real(self, *args)

        monkeypatch.setattr(Run, name, spy)
    _self_test(PolicyComponent.load(), "{}")
    assert called == {"begin_call_flat", "record_success", "_record_failure_text", "last_decision", "escalation"}


@pytest.mark.skipif(not NOOP.is_file(), reason="the no-op component is not built (make noop)")
def test_a_component_that_imports_no_account_budget_loads_like_the_benchmarks_no_op_floor() -> None:
    component = PolicyComponent(NOOP.read_bytes(), source=str(NOOP))
    assert component.account_budget_interface is None
    run = component.instantiate().load_policy("{}").start_run("r")
    start = run.begin_call_flat("lookup_order", None, None, NOW)
    assert isinstance(start, CallStart)
    assert isinstance(run.record_failure(start.call_id, 1, {"http-status": 503}, (), "", None, NOW, 1), Verdict)


def test_a_transport_failure_and_an_unkeyed_write_go_flat_as_rich() -> None:
    rich, flat = fresh_run(), fresh_run()
    for tool, key in (("issue_refund", None), ("issue_refund", KEY), ("lookup_order", None)):
        ticket = rich.begin_call({"tool": tool, "idempotency-key": key}, NOW)["send"]  # type: ignore[typeddict-item]
        start = flat.begin_call_flat(tool, key, None, NOW)
        assert start.safe_to_repeat == ticket["safe-to-repeat"]
        decision = rich.record_outcome(ticket["call-id"], 1, transport_failure("timeout", "t"), NOW, 3)
        verdict = flat.record_failure(start.call_id, 1, {"transport": "timeout"}, (), "t", None, NOW, 3)
        assert verdict_disagreement(verdict, decision, flat.instance.rule_names()) is None
        assert flat.last_decision(start.call_id) == decision
        if verdict.action == "check-status":
            assert rich.record_outcome(ticket["call-id"], 1, {"status-check": "absent"}, NOW, 3) == flat.record_outcome(
                start.call_id, 1, {"status-check": "absent"}, NOW, 3
            )


def test_strings_cross_whole_non_ascii_and_nul_included() -> None:
    rich, flat = fresh_run(), fresh_run()
    body, structured = "upstream\x00 returned 503 é, try again in 20s", '{"a": "\x00€"}'
    ticket = rich.begin_call({"tool": "lookup_order", "idempotency-key": "ké\x00y"}, NOW)["send"]  # type: ignore[typeddict-item]
    start = flat.begin_call_flat("lookup_order", "ké\x00y", None, NOW)
    decision = rich.record_outcome(ticket["call-id"], 1, tool_error(body, structured), NOW, 1)
    verdict = flat.record_failure(start.call_id, 1, {"tool-error": None}, [("x-ñ", "a\x00b")], body, structured, NOW, 1)
    assert verdict.hint_ms == 20_000, "the text after the NUL was read"
    assert flat.last_decision(start.call_id) == decision
    assert decision["action"]["retry"]["idempotency-key"] == "ké\x00y"  # type: ignore[index]
