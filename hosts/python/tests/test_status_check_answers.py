"""A status check may be async or plain (run in a thread, off the loop), in
both wrappers: whatever it raises (StopIteration and SystemExit included) or
answers besides `found` / `absent` / `unknown` reads as `unknown`, with its
`agent_retry.status_check` event, and the call goes on as for unknown (an
unkeyed write escalates `status-unknown`): it never hangs, never escapes,
never leaves the call open. The event names the check by its `__name__`,
else its class's."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from log_lines import HELPER_LOGGER, MCP_LOGGER, logged
from mcp.types import ListToolsResult, Tool

from agent_retry_policy import Escalated, PolicyComponent
from agent_retry_policy.any_call import call_with_policy
from agent_retry_policy.errors import ObservedFailure
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.metrics import RetryMetrics
from agent_retry_policy.testing import FakeClock
from agent_retry_policy.types import transport_failure


def stops_iterating(_question: Any) -> str:
    return next(iter([]))  # a lookup that found no row: StopIteration, which no future may carry


def exits(_question: Any) -> str:
    raise SystemExit(3)


def raises(_question: Any) -> str:
    raise ValueError("ledger down")


def answers_a_number(_question: Any) -> Any:
    return 42


async def exits_async(_question: Any) -> str:
    raise SystemExit(3)


FAILING_CHECKS = [stops_iterating, exits, raises, answers_a_number, exits_async]


class NoteLedger:
    """A check with no `__name__`: a plain callable object."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.threads: list[int] = []

    def __call__(self, _question: Any) -> str:
        self.threads.append(threading.get_ident())
        return self.answer


def helper_call(check: Callable[[Any], Any], metrics: RetryMetrics) -> tuple[Any, Any]:
    """A write without a key that timed out, through `call_with_policy`: (its value or error, the run's report)."""

    async def timed_out(_attempt: Any) -> None:
        raise ObservedFailure(transport_failure("timeout", "t", delivery="sent"))

    run = PolicyComponent.load().instantiate().load_policy({"tools": {"w": {"effect": "write"}}}).start_run("CHECK")

    async def go() -> Any:
        return await call_with_policy(run, "w", timed_out, status_check=check, clock=FakeClock(0), metrics=metrics)

    try:
        ended: Any = asyncio.run(asyncio.wait_for(go(), 5))
    except Escalated as e:
        ended = e
    return ended, run.report()


class SilentSession:
    """Enough of `ClientSession`: one tool without annotations (an unkeyed write) that never answers."""

    tool = Tool(name="record_note", input_schema={"type": "object"})

    async def list_tools(self, params: Any = None) -> ListToolsResult:
        return ListToolsResult(tools=[self.tool])

    async def call_tool(self, name: str, arguments: dict[str, Any], **_options: Any) -> Any:
        await asyncio.sleep(30)


def mcp_call(check: Callable[[Any], Any], metrics: RetryMetrics) -> tuple[Any, Any]:
    """The same write over MCP, its attempt timed out: (its result or error, the run's report)."""
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("CHECK")
    session = SilentSession()
    caller = RetryingToolCaller(
        session,  # type: ignore[arg-type]
        run,
        tools=[session.tool],
        attempt_timeout_s=0.05,
        status_check=check,
        metrics=metrics,
    )
    try:
        ended: Any = asyncio.run(asyncio.wait_for(caller.call_tool("record_note", {"text": "hi"}), 5))
    except Escalated as e:
        ended = e
    return ended, run.report()


WRAPPERS = {"helper": (helper_call, HELPER_LOGGER), "mcp": (mcp_call, MCP_LOGGER)}


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("check", FAILING_CHECKS, ids=lambda check: check.__name__)
def test_a_check_that_raises_or_answers_nonsense_reads_as_unknown(
    wrapper: str, check: Callable[[Any], Any], caplog: pytest.LogCaptureFixture
) -> None:
    call, logger = WRAPPERS[wrapper]
    metrics = RetryMetrics()
    with caplog.at_level(logging.INFO, logger="agent_retry_policy"):
        ended, report = call(check, metrics)
    assert isinstance(ended, Escalated) and ended.reason == "status-unknown"
    [checked] = logged(caplog, logger, "agent_retry.status_check", children=True)
    assert (checked["result"], checked["check_tool"]) == ("unknown", check.__name__)
    assert report["status-checks"] == 1 and report["escalation"] == "status-unknown"
    assert metrics.attempts == report["attempts"]


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_a_plain_callable_object_runs_off_the_loop_and_is_named_by_its_class(wrapper: str, caplog: pytest.LogCaptureFixture) -> None:
    call, logger = WRAPPERS[wrapper]
    ledger = NoteLedger("found")
    metrics = RetryMetrics()
    with caplog.at_level(logging.INFO, logger="agent_retry_policy"):
        ended, report = call(ledger, metrics)
    assert not isinstance(ended, BaseException)  # found: the write applied, the call succeeded
    assert report["succeeded-calls"] >= 1 and report["escalation"] is None
    assert ledger.threads and threading.get_ident() not in ledger.threads
    [checked] = logged(caplog, logger, "agent_retry.status_check", children=True)
    assert (checked["result"], checked["check_tool"]) == ("found", "NoteLedger")
    assert metrics.attempts == report["attempts"]
