"""Contract 0.9.0's resumable escalation in this host: the low-level API
(`Run.snapshot`, `Policy.resume_run`, `Run.resumed_call`, `SnapshotError`)
and the MCP wrapper (`Escalated.snapshot`, `RetryingToolCaller.resume`)
against the demo server and its ledger."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from demo_server import Desk, timeout_after_apply
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from agent_retry_policy import (
    CONTRACT_VERSION,
    EmbeddedAccounts,
    Escalated,
    PolicyComponent,
    ResumeAnswer,
    SnapshotError,
    SplitMix64,
    types,
)
from agent_retry_policy.limits import MAX_SNAPSHOT_BYTES
from agent_retry_policy.mcp_client import RetryingToolCaller, StatusCheckRequest, create_capturing_http_client

T = TypeVar("T")
NOW = 1_764_460_800_000
WRITE = {"tools": {"w": {"effect": "write"}, "r": {"effect": "read"}}, "max-attempts-per-call": 1}
EVENTS_LOGGER = MCP_LOGGER + ".events"


def _escalated_run(config: dict[str, Any] = WRITE) -> tuple[Any, Any]:
    """A policy and a run whose keyed write `w` timed out after it was sent: escalated (call-attempts-spent)."""
    policy = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(config)
    run = policy.start_run("RESUME-1")
    read = run.begin_call("r", None, None, NOW)
    run.record_success(read.call_id, 1, NOW)  # one call succeeded first
    write = run.begin_call("w", "ar1-key", None, NOW + 1)
    verdict = run.record_failure(write.call_id, 1, types.transport_failure("timeout", delivery="sent"), None, NOW + 2, 1)
    assert verdict.action == "escalate"
    return policy, run


# -- the low-level API


def test_resume_answer_is_a_small_frozen_value() -> None:
    assert (ResumeAnswer.retry().kind, ResumeAnswer.retry().result) == ("retry", None)
    assert ResumeAnswer.done("ok").canonical() == {"done": "ok"}
    assert ResumeAnswer.done().canonical() == {"done": None}
    assert [ResumeAnswer.skip().canonical(), ResumeAnswer.abort().canonical()] == ["skip", "abort"]
    with pytest.raises(ValueError):
        ResumeAnswer("later")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ResumeAnswer("retry", "text")
    with pytest.raises(AttributeError):
        ResumeAnswer.retry().kind = "abort"  # type: ignore[misc]


def test_a_run_that_has_not_escalated_refuses_a_snapshot() -> None:
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(WRITE).start_run("r")
    run.begin_call("r", None, None, NOW)
    with pytest.raises(SnapshotError) as raised:
        run.snapshot(None, NOW)
    assert raised.value.kind == "not-escalated"
    assert raised.value.message


def test_the_snapshot_is_a_versioned_document_whose_answers_the_note_names() -> None:
    _policy, run = _escalated_run()
    text = run.snapshot('{"order_id":"A1"}', NOW + 3)
    document = json.loads(text)
    assert document["contract"] == CONTRACT_VERSION == "0.9.0"
    assert document["run-id"] == "RESUME-1"
    assert document["arguments"] == '{"order_id":"A1"}'
    assert document["answers"] == {"retry": "safe", "done": "check first", "skip": "check first", "abort": "safe"}
    assert "A person may answer (resume-run): retry (safe)" in run.escalation()["note"]


def test_a_tampered_snapshot_is_refused() -> None:
    policy, run = _escalated_run()
    text = run.snapshot(None, NOW + 3)
    assert '"attempts":2' in text
    tampered = text.replace('"attempts":2', '"attempts":0', 1)
    with pytest.raises(SnapshotError) as raised:
        policy.resume_run(tampered, ResumeAnswer.retry(), NOW + 4)
    assert raised.value.kind == "tampered"


def test_a_snapshot_of_another_contract_is_refused_naming_both_versions() -> None:
    policy, run = _escalated_run()
    text = run.snapshot(None, NOW + 3).replace('"contract":"0.9.0"', '"contract":"0.8.0"', 1)
    with pytest.raises(SnapshotError) as raised:
        policy.resume_run(text, ResumeAnswer.retry(), NOW + 4)
    assert raised.value.kind == "other-contract"
    assert "0.8.0" in raised.value.message and "0.9.0" in raised.value.message, raised.value.message


def test_what_is_not_a_snapshot_or_too_large_is_refused_without_a_run() -> None:
    policy, _run = _escalated_run()
    with pytest.raises(SnapshotError) as raised:
        policy.resume_run("not json", ResumeAnswer.abort(), NOW)
    assert raised.value.kind == "malformed"
    with pytest.raises(SnapshotError) as raised:
        policy.resume_run(" " * (MAX_SNAPSHOT_BYTES + 1), ResumeAnswer.abort(), NOW)
    assert raised.value.kind == "too-large"
    assert str(MAX_SNAPSHOT_BYTES) in raised.value.message
    with pytest.raises(TypeError):
        policy.resume_run("{}", "retry", NOW)  # type: ignore[arg-type]


def test_a_resumed_run_keeps_its_counters_and_sends_the_same_key() -> None:
    policy, run = _escalated_run()
    before = run.report()
    text = run.snapshot('{"order_id":"A1"}', NOW + 3)
    resumed = policy.resume_run(text, ResumeAnswer.retry(), NOW + 4)
    assert resumed.run_id == "RESUME-1"
    after = resumed.report()
    assert after["attempts"] >= before["attempts"] == 2
    assert after["retries"] >= before["retries"]
    assert after["succeeded-calls"] >= before["succeeded-calls"] == 1
    call = resumed.resumed_call()
    assert call is not None
    assert (call["action"], call["tool"], call["idempotency-key"], call["attempt"]) == ("send", "w", "ar1-key", 2)
    assert call["arguments-json"] == '{"order_id":"A1"}'
    assert call["ticket"] is not None and call["ticket"]["call-id"] == call["call-id"]
    # The attempt is reported as any: it succeeds, and the write is applied.
    verdict = resumed.record_success(call["call-id"], call["attempt"], NOW + 5)
    assert verdict.action == "succeed"
    assert resumed.report()["attempts"] >= after["attempts"]
    assert [e["status"] for e in resumed.all_effects() if e["call-id"] == call["call-id"]] == ["applied"]
    # A run that was not resumed has no resumed call.
    assert run.resumed_call() is None


@pytest.mark.parametrize(
    ("answer", "action", "reason"),
    [
        (ResumeAnswer.done("refund 42 issued"), "succeed", None),
        (ResumeAnswer.skip(), "replan", None),
        (ResumeAnswer.abort(), "escalate", "aborted"),
    ],
)
def test_done_skip_and_abort_say_what_the_host_does(answer: ResumeAnswer, action: str, reason: str | None) -> None:
    policy, run = _escalated_run()
    resumed = policy.resume_run(run.snapshot(None, NOW + 3), answer, NOW + 4)
    call = resumed.resumed_call()
    assert call is not None and call["action"] == action and call["ticket"] is None
    escalation = resumed.escalation()
    assert (escalation["reason"] if escalation else None) == reason
    if action == "succeed":
        assert call["result-text"] == "refund 42 issued"
    if action == "replan":
        decision = resumed.last_decision(call["call-id"])
        assert decision is not None and "replan" in decision["action"]


def test_abandon_call_closes_a_call_in_flight_so_that_a_snapshot_can_be_taken() -> None:
    policy = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(WRITE)
    run = policy.start_run("r")
    other = run.begin_call("r", None, None, NOW)
    write = run.begin_call("w", "ar1-key", None, NOW)
    run.record_failure(write.call_id, 1, types.transport_failure("timeout", delivery="sent"), None, NOW, 1)
    with pytest.raises(SnapshotError) as raised:
        run.snapshot(None, NOW)
    assert raised.value.kind == "calls-open"
    run.abandon_call(other.call_id, 1, False, "cancelled")  # accepted on an escalated run (0.9.0)
    assert json.loads(run.snapshot(None, NOW))["run-id"] == "r"


def test_the_names_of_the_new_reasons_and_rule() -> None:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    assert instance.rule_names()[25] == "resumed"
    assert typing_args(types.EscalationReason)[-2:] == ("retry-budget-exhausted", "aborted")


def typing_args(alias: Any) -> tuple[Any, ...]:
    import typing

    return typing.get_args(alias)


# -- the MCP wrapper against the demo server

# Short delays; one attempt a call, so a timeout escalates at once.
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200, "max-attempts-per-call": 1}


def run_with_session(desk: Desk, body: Callable[[ClientSession], Awaitable[T]]) -> T:
    """`body` on a new connection (its own HTTP client and session) to the desk's server."""

    async def main() -> T:
        failure: BaseException | None = None
        http_client = create_capturing_http_client(event_hooks={"request": [desk.record]})
        async with http_client:
            async with streamable_http_client(desk.url, http_client=http_client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    try:
                        result = await body(session)
                    except Exception as e:
                        failure = e
        if failure is not None:
            raise failure
        return result

    return asyncio.run(main())


def new_caller(session: ClientSession, run_id: str = "CASE-9001", **kwargs: Any) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(CONFIG).start_run(run_id)
    return RetryingToolCaller(session, run, entropy=SplitMix64(3), **kwargs)


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


REFUND = {"order_id": "A1", "amount_paise": 500}


def _escalated_refund(desk: Desk) -> tuple[Escalated, str]:
    """A keyed refund applied, then timed out: the escalation (with its snapshot) and the key sent."""

    async def body(session: ClientSession) -> tuple[Escalated, str]:
        caller = new_caller(session, attempt_timeout_s=0.3)
        key = caller.run.instance.derive_idempotency_key("CASE-9001", "step-1")
        with pytest.raises(Escalated) as raised:
            await caller.call_tool("issue_refund", dict(REFUND))
        return raised.value, key

    return run_with_session(desk, body)


def test_a_keyed_refund_escalated_after_a_timeout_is_retried_by_a_new_caller_with_the_same_key_and_applied_once(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=MCP_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    escalated, key = _escalated_refund(desk)
    assert escalated.reason == "call-attempts-spent"
    assert escalated.snapshot is not None
    document = json.loads(escalated.snapshot)
    assert document["answers"]["retry"] == "safe", document["answers"]
    assert json.loads(document["arguments"]) == REFUND  # the model's arguments, compact JSON
    assert document["arguments"] == json.dumps(REFUND, separators=(",", ":"))
    assert desk.refunds() == [("A1", 500, key)]  # the first attempt was applied

    stored = escalated.snapshot  # e.g. in a database, until a person answers

    async def later(session: ClientSession) -> tuple[CallToolResult, RetryingToolCaller, CallToolResult]:
        caller = new_caller(session, run_id="PLACEHOLDER")  # a new caller, a new connection, a new instance
        result = await caller.resume(stored, ResumeAnswer.retry())
        # The caller goes on with the resumed run: a new call, a key the run never used.
        following = await caller.call_tool("issue_refund", {"order_id": "A2", "amount_paise": 200})
        return result, caller, following

    result, caller, following = run_with_session(desk, later)
    assert not result.is_error, text_of(result)
    assert "A1" in text_of(result)  # the tool's own result
    assert caller.run.run_id == "CASE-9001"  # the caller continues the resumed run
    posts = desk.posts_of("issue_refund")
    assert [post.arguments.get("idempotency_key") for post in posts[:2]] == [key, key]
    assert {k: v for k, v in posts[1].arguments.items() if k != "idempotency_key"} == REFUND
    assert [r for r in desk.refunds() if r[2] == key] == [("A1", 500, key)]  # one refund for the key
    assert not following.is_error, text_of(following)
    later_key = posts[2].arguments.get("idempotency_key")
    assert len(posts) == 3 and later_key not in (None, key)
    assert desk.refunds() == [("A1", 500, key), ("A2", 200, later_key)]
    posts = desk.posts_of("issue_refund")
    (line,) = logged(caplog, EVENTS_LOGGER, "agent_retry.resume")
    assert {k: line[k] for k in ("run", "tool", "answer", "action", "attempt")} == {
        "run": "CASE-9001",
        "tool": "issue_refund",
        "answer": "retry",
        "action": "send",
        "attempt": 2,
    }
    assert set(line) == {"event", "ts", "run", "policy", "call", "tool", "answer", "action", "attempt"}
    assert isinstance(line["call"], int) and line["policy"].startswith("agent-retry:policy@0.9.0 wasm ")
    report = caller.run.report()
    assert report["succeeded-calls"] >= 2


@pytest.mark.parametrize("answer", ["done", "skip", "abort"])
def test_done_skip_and_abort_through_the_wrapper(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture, answer: str) -> None:
    caplog.set_level(logging.INFO, logger=MCP_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    escalated, _key = _escalated_refund(desk)
    assert escalated.snapshot is not None
    given = {"done": ResumeAnswer.done("refund R-77 confirmed by a person"), "skip": ResumeAnswer.skip(), "abort": ResumeAnswer.abort()}

    async def later(session: ClientSession) -> Any:
        caller = new_caller(session, run_id="PLACEHOLDER")
        try:
            return await caller.resume(escalated.snapshot, given[answer])  # type: ignore[arg-type]
        except Escalated as e:
            return e

    outcome = run_with_session(desk, later)
    assert len(desk.posts_of("issue_refund")) == 1  # nothing sent again
    (line,) = logged(caplog, EVENTS_LOGGER, "agent_retry.resume")
    if answer == "done":
        assert isinstance(outcome, CallToolResult) and not outcome.is_error
        assert text_of(outcome) == "refund R-77 confirmed by a person"
        assert line["action"] == "succeed"
    elif answer == "skip":
        assert isinstance(outcome, CallToolResult) and outcome.is_error
        assert text_of(outcome)  # the run's message for the model
        assert line["action"] == "replan"
        assert logged(caplog, EVENTS_LOGGER, "agent_retry.replan")[-1]["message"] == text_of(outcome)
    else:
        assert isinstance(outcome, Escalated)
        assert outcome.reason == "aborted"
        assert line["action"] == "escalate"
        # An aborted run is over: the component refuses its snapshot, and the wrapper does not ask (nor warns).
        assert outcome.snapshot is None
        assert not logged(caplog, EVENTS_LOGGER, "agent_retry.snapshot_refused")
        assert "A person may answer" not in outcome.note
    assert line["answer"] == answer


def test_a_tampered_snapshot_is_refused_by_the_wrapper_and_nothing_is_sent(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    escalated, _key = _escalated_refund(desk)
    assert escalated.snapshot is not None
    tampered = escalated.snapshot.replace('"amount_paise\\":500', '"amount_paise\\":50000', 1)
    assert tampered != escalated.snapshot

    async def later(session: ClientSession) -> None:
        await new_caller(session, run_id="PLACEHOLDER").resume(tampered, ResumeAnswer.retry())

    with pytest.raises(SnapshotError) as raised:
        run_with_session(desk, later)
    assert raised.value.kind == "tampered"
    assert len(desk.posts_of("issue_refund")) == 1


@pytest.mark.parametrize("kept", [None, "[1,2]"], ids=["none", "not-an-object"])
def test_a_resumed_send_without_its_arguments_is_never_sent(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture, kept: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=MCP_LOGGER)
    desk = serve()
    # A low-level snapshot of an escalated keyed refund that keeps no arguments (taken with None), or no object.
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(CONFIG).start_run("CASE-9004")
    call = run.begin_call("issue_refund", "ar1-no-arguments", None, NOW)
    verdict = run.record_failure(call.call_id, 1, types.transport_failure("timeout", delivery="sent"), None, NOW + 1, 1)
    assert verdict.action == "escalate"
    snapshot = run.snapshot(kept, NOW + 2)
    assert json.loads(snapshot)["arguments"] == kept
    assert json.loads(snapshot)["answers"]["retry"] == "safe"  # the component would send it again: the wrapper may not

    async def later(session: ClientSession) -> tuple[SnapshotError, Any]:
        caller = new_caller(session, run_id="PLACEHOLDER")
        with pytest.raises(SnapshotError) as raised:
            await caller.resume(snapshot, ResumeAnswer.retry())
        return raised.value, caller.run

    refused, resumed = run_with_session(desk, later)
    assert refused.kind == "malformed"
    assert refused.message == (
        f"the snapshot keeps no arguments for call {call.call_id} (issue_refund): it cannot be sent again; nothing was sent"
    )
    assert desk.posts_of("issue_refund") == [] and desk.refunds() == []  # nothing reached the server
    # The resumed run closed the call unsent: it is no longer open.
    assert resumed.run_id == "CASE-9004"
    assert resumed.report()["abandoned-calls"] == 1
    (line,) = logged(caplog, EVENTS_LOGGER, "agent_retry.resume")
    assert (line["tool"], line["answer"], line["action"]) == ("issue_refund", "retry", "send")


def test_an_unkeyed_write_whose_status_is_unknown_says_retry_needs_a_check_first(serve: Callable[..., Desk]) -> None:
    # record_note takes no key; the status check cannot tell.
    desk = serve({"tool": "record_note", "call": 1, "fault": timeout_after_apply(1000)})

    async def unknown(_request: StatusCheckRequest) -> str:
        return "unknown"

    async def body(session: ClientSession) -> Escalated:
        caller = new_caller(session, attempt_timeout_s=0.3, status_check=unknown)
        with pytest.raises(Escalated) as raised:
            await caller.call_tool("record_note", {"order_id": "A1", "text": "call me"})
        return raised.value

    escalated = run_with_session(desk, body)
    assert escalated.reason == "status-unknown"
    assert escalated.snapshot is not None
    answers = json.loads(escalated.snapshot)["answers"]
    assert answers["retry"] == "check first", answers
    assert "retry (check first)" in escalated.note


def test_a_refused_snapshot_leaves_none_and_is_logged_once(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=MCP_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})

    async def body(session: ClientSession) -> tuple[Escalated, Escalated]:
        caller = new_caller(session, attempt_timeout_s=0.3)
        # Another call of the run is open (begun and never reported): the snapshot is refused, calls-open.
        caller.run.begin_call("lookup_order", None, None, caller.clock())
        with pytest.raises(Escalated) as first:
            await caller.call_tool("issue_refund", dict(REFUND))
        # Refused again (the same run, still a call open): not logged a second time.
        again = Escalated(first.value.escalation, tool="issue_refund")
        caller._attach_snapshot(again, dict(REFUND))
        return first.value, again

    first, again = run_with_session(desk, body)
    assert first.reason == "call-attempts-spent"
    assert first.snapshot is None and again.snapshot is None
    refused = logged(caplog, EVENTS_LOGGER, "agent_retry.snapshot_refused")
    assert len(refused) == 1 and refused[0]["kind"] == "calls-open", refused


def test_an_escalation_while_connecting_is_resumed_by_connecting(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=MCP_LOGGER)
    from agent_retry_policy.mcp_client import McpConnection

    desk = serve()

    async def first() -> Escalated:
        # Nothing listens on port 9 of the loopback: connecting is refused until the policy escalates.
        async with McpConnection.http("http://127.0.0.1:9/mcp") as connection:
            instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
            caller = RetryingToolCaller(connection, instance.load_policy(CONFIG).start_run("CASE-9002"), entropy=SplitMix64(3))
            with pytest.raises(Escalated) as raised:
                await caller.call_tool("lookup_order", {"order_id": "A1"})
            return raised.value

    escalated = asyncio.run(first())
    assert escalated.tool == "initialize"
    assert escalated.snapshot is not None
    assert json.loads(escalated.snapshot)["arguments"] is None  # the stopped call is the connecting, not the model's

    async def later() -> tuple[CallToolResult, CallToolResult]:
        async with McpConnection.http(desk.url) as connection:
            instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
            caller = RetryingToolCaller(connection, instance.load_policy(CONFIG).start_run("PLACEHOLDER"), entropy=SplitMix64(3))
            resumed = await caller.resume(escalated.snapshot, ResumeAnswer.retry())  # type: ignore[arg-type]
            again = await caller.call_tool("lookup_order", {"order_id": "A1"})
            return resumed, again

    resumed, again = asyncio.run(later())
    assert not resumed.is_error and "call the tool again" in text_of(resumed)
    assert not again.is_error and json.loads(text_of(again))["order_id"] == "A1"
    (line,) = logged(caplog, EVENTS_LOGGER, "agent_retry.resume")
    assert (line["tool"], line["action"], line["answer"]) == ("initialize", "send", "retry")


def test_an_escalation_at_begin_carries_a_snapshot_and_a_retry_sends_the_call(serve: Callable[..., Desk]) -> None:
    desk = serve()

    async def body(session: ClientSession) -> tuple[Escalated, CallToolResult]:
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        # Two steps: tools/list and the first lookup; the second is not admitted (run-steps-spent).
        run = instance.load_policy({**CONFIG, "max-steps-per-run": 2}).start_run("CASE-9003")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3))
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        with pytest.raises(Escalated) as raised:
            await caller.call_tool("lookup_order", {"order_id": "A2"})
        assert raised.value.snapshot is not None
        return raised.value, await caller.resume(raised.value.snapshot, ResumeAnswer.retry())  # the same caller

    escalated, result = run_with_session(desk, body)
    assert escalated.reason == "run-steps-spent"
    document = json.loads(escalated.snapshot or "")
    assert json.loads(document["arguments"]) == {"order_id": "A2"} and document["begun"] is False
    assert not result.is_error and json.loads(text_of(result))["order_id"] == "A2"
    assert [post.arguments for post in desk.posts_of("lookup_order")] == [{"order_id": "A1"}, {"order_id": "A2"}]
