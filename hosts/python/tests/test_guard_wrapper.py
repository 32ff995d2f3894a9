"""The run-time guard in the real wrapper: the liar component
(target/hostile/liar.wasm, `make hostile`: the real policy plus the lies of
`"x-liar"` in its configuration) against the demo server. Each lie is stopped
by the wrapper, not by the component: nothing is sent after it, the call ends
with the policy-failure escalation naming the invariant, and so does every
later call of the run."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from demo_server import DemoServer, Desk, http, timeout_after_apply
from mcp import ClientSession
from test_mcp_e2e import attempt_lines, run_with_session
from test_sandbox import hostile_bytes
from test_tasks_and_continuations import FLAGS, Sent, sent  # noqa: F401  (`sent` is a fixture)

from agent_retry_policy import (
    FUEL_PER_CALL,
    EmbeddedAccounts,
    Escalated,
    Integrity,
    LivePolicy,
    McpConnection,
    PolicyBoundaryViolation,
    PolicyComponent,
    PolicySource,
    SplitMix64,
)
from agent_retry_policy.limits import MAX_LIFTED_TEXT_BYTES, utf8_size
from agent_retry_policy.mcp_client import DEFAULT_RUN_TIMEOUT_S, RetryingToolCaller
from agent_retry_policy.types import Verdict

# The default caps (max-delay-ms 30 s, 4 attempts a call), short real waits.
CONFIG: dict[str, Any] = {"base-delay-ms": 20}
REFUND = {"order_id": "ORD-1", "amount_paise": 100}
LOOKUP = {"order_id": "ORD-1"}


def liar_caller(session: ClientSession, lies: dict[str, Any], sleeps: list[float] | None = None, **sandbox: Any) -> RetryingToolCaller:
    """A caller whose policy is the liar telling `lies`; `sleeps` records every wait it asks for."""
    component = PolicyComponent(hostile_bytes("liar"), source="liar.wasm")
    instance = component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7), **sandbox)
    run = instance.load_policy({**CONFIG, "x-liar": lies}).start_run("GUARD-1")
    options: dict[str, Any] = {}
    if sleeps is not None:

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)

        options["sleep"] = sleep
    # The call's limit only keeps a wrapper without the guard from retrying for the run's 30 minutes.
    return RetryingToolCaller(session, run, entropy=SplitMix64(3), attempt_timeout_s=0.5, call_timeout_s=10, **options)


def liar_run(lies: dict[str, Any], run_id: str) -> Any:
    """A run of the liar telling `lies`."""
    component = PolicyComponent(hostile_bytes("liar"), source="liar.wasm")
    return (
        component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7)).load_policy({**CONFIG, "x-liar": lies}).start_run(run_id)
    )


def broken_by(escalated: Escalated, invariant: str) -> None:
    """The policy-failure escalation of a broken invariant."""
    assert isinstance(escalated.policy_failure, PolicyBoundaryViolation), escalated.policy_failure
    assert escalated.policy_failure.kind == "boundary-violation"
    assert escalated.reason == "unclassified-failure"
    assert f"the retry policy failed (PolicyBoundaryViolation: invariant {invariant}: " in escalated.note, escalated.note


def invariant_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(line["tool"], line["invariant"]) for line in attempt_lines(caplog, pseudo=True) if "invariant" in line]


def call_twice(desk: Desk, lies: dict[str, Any], tool: str, arguments: dict[str, Any], **options: Any) -> tuple[Escalated, Escalated]:
    """`tool` under the liar, then `lookup_order` in the same run: both must escalate."""

    async def body(session: ClientSession) -> tuple[Escalated, Escalated]:
        caller = liar_caller(session, lies, **options)
        with pytest.raises(Escalated) as first:
            await caller.call_tool(tool, arguments)
        with pytest.raises(Escalated) as later:
            await caller.call_tool("lookup_order", LOOKUP)
        return first.value, later.value

    return run_with_session(desk, body)


def test_a_403_the_policy_retries_is_sent_once_and_ends_the_run(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "issue_refund", "fault": http(403, "forbidden")})
    first, later = call_twice(desk, {"retry": True, "tools": ["issue_refund"]}, "issue_refund", REFUND)
    assert len(desk.posts_of("issue_refund")) == 1
    broken_by(first, "client-error-repeated")
    assert "Last outcome of issue_refund: http 403" in first.note
    # The rest of the run: the same escalation, nothing sent.
    assert desk.posts_of("lookup_order") == []
    assert later.note == first.note and later.tool == "lookup_order"
    assert invariant_lines(caplog) == [("issue_refund", "client-error-repeated"), ("lookup_order", "client-error-repeated")]
    # The violation's line names the call and the attempt the verdict answered; the later call was never begun.
    lines = [line for line in attempt_lines(caplog) if "invariant" in line]
    assert [(line["call"], line["attempt"]) for line in lines] == [(lines[0]["call"], 1), (None, 0)]
    assert isinstance(lines[0]["call"], int) and lines[0]["call"] > 0


def test_an_unkeyed_write_that_timed_out_is_not_resent(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "record_note", "fault": timeout_after_apply(3_000)})
    first, _ = call_twice(desk, {"retry": True, "tools": ["record_note"]}, "record_note", {"order_id": "ORD-1", "text": "called back"})
    assert len(desk.posts_of("record_note")) == 1
    broken_by(first, "unknown-write-resent")


@pytest.mark.parametrize("delay_ms", [2_592_000_000, 3_600_000], ids=["30 days", "1 hour"])
def test_a_retry_past_the_delay_caps_is_not_waited_for(serve: Callable[..., Desk], delay_ms: int) -> None:
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "unavailable")})
    sleeps: list[float] = []

    async def body(session: ClientSession) -> Escalated:
        caller = liar_caller(session, {"retry": True, "delay-ms": delay_ms, "tools": ["lookup_order"]}, sleeps)
        with pytest.raises(Escalated) as stopped:
            await caller.call_tool("lookup_order", LOOKUP)
        return stopped.value

    broken_by(run_with_session(desk, body), "delay-over-cap")
    assert len(desk.posts_of("lookup_order")) == 1
    assert sleeps == []


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING], ids=["INFO", "WARNING"])
def test_words_that_disagree_with_the_verdict_are_a_violation_at_any_log_level(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture, level: int
) -> None:
    # The real policy escalates a 403 on a read; last-decision says retry.
    caplog.set_level(level, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "fault": http(403, "forbidden")})
    first, _ = call_twice(desk, {"decision-action": "retry", "tools": ["lookup_order"]}, "lookup_order", LOOKUP)
    broken_by(first, "verdict-disagrees")
    assert len(desk.posts_of("lookup_order")) == 1


def test_a_plan_that_names_another_key_is_a_violation(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    # The real policy retries a keyed write after a 503; with INFO on the wrapper reads the plan's words.
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "unavailable")})
    first, _ = call_twice(desk, {"decision-key": "forged", "tools": ["issue_refund"]}, "issue_refund", REFUND)
    broken_by(first, "key-changed")
    assert "'forged'" in first.note
    posts = desk.posts_of("issue_refund")
    assert len(posts) == 1 and posts[0].arguments["idempotency_key"] != "forged"


def test_a_20_mb_reason_is_cut_before_it_is_logged_or_returned(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    # A sandbox large enough for the liar to say it all (the default one stops it by fuel).
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "fault": http(403, "forbidden")})
    lies = {"reason-bytes": 20_971_520, "tools": ["lookup_order"]}
    sandbox = {"fuel_per_call": FUEL_PER_CALL * 1000, "max_memory_bytes": 512 * 2**20}

    async def body(session: ClientSession) -> Escalated:
        caller = liar_caller(session, lies, **sandbox)
        with pytest.raises(Escalated) as escalated:
            await caller.call_tool("lookup_order", LOOKUP)
        return escalated.value

    escalated = run_with_session(desk, body)
    assert escalated.policy_failure is None, escalated.note  # the policy's own escalation, its words cut
    longest = MAX_LIFTED_TEXT_BYTES + utf8_size(" … [cut: 20971520 bytes]")
    assert utf8_size(escalated.note) <= longest and escalated.note.endswith(" bytes]") and " … [cut: " in escalated.note
    (line,) = [line for line in attempt_lines(caplog) if line["tool"] == "lookup_order"]
    assert utf8_size(line["reason"]) <= longest and " … [cut: " in line["reason"]


def test_the_liar_passes_the_update_gate_and_the_wrapper_still_stops_it(serve: Callable[..., Desk], tmp_path: Path) -> None:
    shutil.copy(Path(__file__).resolve().parents[3] / "target" / "hostile" / "liar.wasm", tmp_path / "policy.wasm")
    (tmp_path / "policy.json").write_text('{"base-delay-ms": 20, "x-liar": {"tools": ["issue_refund"], "retry": true}}')
    live = LivePolicy.open(PolicySource(tmp_path / "policy.wasm", tmp_path / "policy.json", Integrity.unchecked()))
    loaded = live.current()  # accepted: gate.json does not catch a lie told only for issue_refund
    desk = serve({"tool": "issue_refund", "fault": http(403, "forbidden")})

    async def body(session: ClientSession) -> Escalated:
        instance = loaded.component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        run = instance.load_policy(loaded.config_json).start_run("GUARD-LIVE")
        caller = RetryingToolCaller(session, run, policy_identity=str(loaded.identity), call_timeout_s=10)
        with pytest.raises(Escalated) as stopped:
            await caller.call_tool("issue_refund", REFUND)
        return stopped.value

    broken_by(run_with_session(desk, body), "client-error-repeated")
    assert len(desk.posts_of("issue_refund")) == 1


def test_a_run_has_a_deadline_of_30_minutes_unless_the_caller_turns_it_off() -> None:
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("GUARD-DEADLINE")
    assert DEFAULT_RUN_TIMEOUT_S == 1800.0
    assert RetryingToolCaller(object(), run).run_timeout_s == DEFAULT_RUN_TIMEOUT_S  # type: ignore[arg-type]
    assert RetryingToolCaller(object(), run, run_timeout_s=None).run_timeout_s is None  # type: ignore[arg-type]


def test_a_wait_of_u64_max_ms_neither_overflows_nor_outlives_the_deadline() -> None:
    # The guard refuses such a wait first; the timer code must be safe on its own.
    from agent_retry_policy._mcp.caller import _CallState, _DeadlinePassed

    run = PolicyComponent.load().instantiate().load_policy({}).start_run("GUARD-TIMER")
    longest = (2**64 - 1) / 1000

    async def waits() -> None:
        unlimited = RetryingToolCaller(object(), run, run_timeout_s=None)  # type: ignore[arg-type]
        state = _CallState("t", None, "run-timeout", None)
        with pytest.raises(asyncio.TimeoutError):  # it sleeps (until cancelled), no OverflowError
            await asyncio.wait_for(unlimited._sleep(state, longest), 0.05)
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        limited = RetryingToolCaller(object(), run, sleep=sleep)  # type: ignore[arg-type]
        state = _CallState("t", limited._run_deadline, "run-timeout", limited.run_timeout_s)
        with pytest.raises(_DeadlinePassed):  # past the 30-minute deadline: not slept at all
            await limited._sleep(state, longest)
        assert slept == []

    asyncio.run(waits())


# --- Amendment A (after a hostile test) ---------------------------------------


def test_a_409_the_server_says_to_retry_is_retried_by_the_genuine_policy(serve: Callable[..., Desk]) -> None:
    # `x-should-retry: true` is the server's own word: the component reads it, and the guard lets it.
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(409, "conflict, try again", (("x-should-retry", "true"),))})

    async def body(session: ClientSession) -> Any:
        run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7)).load_policy(CONFIG).start_run("G-409")
        return await RetryingToolCaller(session, run, entropy=SplitMix64(3)).call_tool("lookup_order", LOOKUP)

    result = run_with_session(desk, body)
    assert not result.is_error, result
    assert len(desk.posts_of("lookup_order")) == 2


def test_a_403_retried_on_a_new_session_is_sent_once(
    demo: Callable[..., DemoServer],
    sent: Sent,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A session id was sent, but a 403 refuses the caller, not its session: a new one changes nothing.
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    fault = {"tool": "issue_refund", "fault": http(403, "refunds above 5000 rupees need a person")}
    server = demo("--era", "handshake", "--sessions", faults=[fault], ledger=True)
    run = liar_run({"retry": True, "reconnect": True, "tools": ["issue_refund"]}, "G-403-SESSION")

    async def go() -> Escalated:
        async with McpConnection.http(server.url) as connection:
            with pytest.raises(Escalated) as stopped:
                await RetryingToolCaller(connection, run, entropy=SplitMix64(3), call_timeout_s=10).call_tool("issue_refund", REFUND)
            return stopped.value

    escalated = asyncio.run(go())
    broken_by(escalated, "client-error-repeated")
    assert [params["name"] for params in sent.of("tools/call")] == ["issue_refund"]
    assert len(sent.of("initialize")) == 1  # no new session either
    # The violation's line names the call (after initialize and tools/list) and the attempt the verdict answered.
    (line,) = [line for line in attempt_lines(caplog) if "invariant" in line]
    assert (line["tool"], line["call"], line["attempt"], line["invariant"]) == ("issue_refund", 3, 1, "client-error-repeated")


def test_a_tool_called_again_while_its_task_lives_is_stopped(demo: Callable[..., DemoServer], sent: Sent) -> None:  # noqa: F811
    # archive_orders is an unkeyed write; its task works 1.5 s. The first poll is dropped, and the run
    # answers that poll failure with a retry of the tool (any component could): the task still lives.
    fault = {"tool": "tasks/get", "call": 1, "fault": {"kind": "drop"}}
    server = demo("--task-work-ms", "1500", "--task-poll-interval-ms", "100", faults=[fault], ledger=True, require=FLAGS)
    real = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7)).load_policy(CONFIG).start_run("G-TASK")

    class RetriesAFailedPoll:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def record_poll_failure(self, call_id: int, attempt: int, *_rest: Any) -> Verdict:
            return Verdict("retry", "transient", attempt, 10, None, 0, False, False, False, False)

    async def go() -> Escalated:
        async with McpConnection.http(server.url) as connection:
            caller = RetryingToolCaller(connection, RetriesAFailedPoll(), entropy=SplitMix64(3), call_timeout_s=10)  # type: ignore[arg-type]
            with pytest.raises(Escalated) as stopped:
                await caller.call_tool("archive_orders", {"before": "2024-01-01"})
            return stopped.value

    escalated = asyncio.run(go())
    broken_by(escalated, "task-resent")
    assert [params["name"] for params in sent.of("tools/call")] == ["archive_orders"]
    assert len(sent.of("tasks/get")) == 1
    # The one task runs to its end: one archive, not two.
    deadline = time.monotonic() + 30
    while not server.ledger().get("archives") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [archive["before"] for archive in server.ledger().get("archives", [])] == ["2024-01-01"]


def test_the_task_polled_is_the_one_the_server_named_not_last_decisions(demo: Callable[..., DemoServer], sent: Sent) -> None:  # noqa: F811
    # The liar's words for issue_refund are not the verdict's; with INFO off nothing reads them:
    # the wrapper polls the task the server answered with, and the call succeeds.
    server = demo("--task-work-ms", "300", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    run = liar_run({"retry": True, "tools": ["issue_refund"]}, "G-TASK-ID")

    async def go() -> Any:
        async with McpConnection.http(server.url) as connection:
            return await RetryingToolCaller(connection, run, entropy=SplitMix64(3), call_timeout_s=10).call_tool("issue_refund", REFUND)

    result = asyncio.run(go())
    assert not result.is_error, result
    assert [params["name"] for params in sent.of("tools/call")] == ["issue_refund"]
    (task_id,) = {params["taskId"] for params in sent.of("tasks/get")}
    assert [refund["order_id"] for refund in server.ledger()["refunds"]] == ["ORD-1"]
    assert task_id
