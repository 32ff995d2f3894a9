"""A call the wrapper stops is ended in the run (contract 0.7.0's
`abandon-call`), wherever it stops: here during the admission wait, before
its first attempt was sent (a hostile review found the wrapper told the run
attempt 0 there, which the run refused, leaving the call open)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from demo_server import Desk
from mcp import ClientSession
from test_mcp_e2e import run_with_session

from agent_retry_policy import CallCancelled, CallTimedOut, EmbeddedAccounts, PolicyComponent, RunMisuse, SplitMix64
from agent_retry_policy.mcp_client import RetryingToolCaller


def two_tokens(account: str, refill_ms: int) -> dict[str, object]:
    """A burst of two (the wrapper's tools/list and the first call), then one token a `refill_ms`: the
    second call waits for room (within max-wait-ms) before it is sent."""
    return {"account-budget": {"account-id": account, "capacity": 2, "refill-interval-ms": refill_ms, "max-wait-ms": refill_ms}}


def test_a_call_cancelled_while_waiting_to_be_admitted_is_abandoned_at_its_first_attempt(serve: Callable[..., Desk]) -> None:
    desk = serve()

    async def body(session: ClientSession) -> tuple[CallCancelled, RetryingToolCaller]:
        run = (
            PolicyComponent.load()
            .instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(1))
            .load_policy(two_tokens("abandon-1", 60_000))
            .start_run("A-1")
        )
        waiting = asyncio.Event()

        async def sleep(seconds: float) -> None:
            waiting.set()
            await asyncio.sleep(seconds)

        caller = RetryingToolCaller(session, run, entropy=SplitMix64(2), sleep=sleep)
        assert not (await caller.call_tool("lookup_order", {"order_id": "ORD-1"})).is_error  # the bucket's one token
        task = asyncio.ensure_future(caller.call_tool("lookup_order", {"order_id": "ORD-2"}))
        await asyncio.wait_for(waiting.wait(), 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as e:
            stopped = e if isinstance(e, CallCancelled) else e.__context__
            assert isinstance(stopped, CallCancelled), repr(e)
            return stopped, caller
        raise AssertionError("the call was not cancelled")

    stopped, caller = run_with_session(desk, body)
    assert (stopped.cause, stopped.attempts_sent) == ("cancelled", 0)
    assert caller.run.report()["abandoned-calls"] == 1
    with pytest.raises(RunMisuse) as closed:  # closed in the run, at its first attempt
        caller.run.record_success(stopped.call_id, 1, 0)
    assert closed.value.error == {"call-finished": stopped.call_id}
    assert len(desk.posts_of("lookup_order")) == 1


def test_a_call_whose_admission_wait_would_pass_the_run_limit_is_abandoned_at_its_first_attempt(serve: Callable[..., Desk]) -> None:
    desk = serve()

    async def body(session: ClientSession) -> tuple[CallTimedOut, RetryingToolCaller]:
        # An hour's wait for room, past the default run limit of 30 minutes: stopped before it is slept.
        run = (
            PolicyComponent.load()
            .instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(1))
            .load_policy(two_tokens("abandon-2", 3_600_000))
            .start_run("A-2")
        )
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(2))
        assert not (await caller.call_tool("record_note", {"order_id": "ORD-1", "text": "one"})).is_error
        with pytest.raises(CallTimedOut) as stopped:
            await caller.call_tool("record_note", {"order_id": "ORD-1", "text": "two"})
        return stopped.value, caller

    stopped, caller = run_with_session(desk, body)
    assert (stopped.cause, stopped.attempts_sent, stopped.may_have_applied) == ("run-timeout", 0, False)
    report = caller.run.report()
    assert report["abandoned-calls"] == 1
    assert [e["status"] for e in report["effects"]] == ["applied"], "only the first note; the second was never sent"
    assert len(desk.posts_of("record_note")) == 1
