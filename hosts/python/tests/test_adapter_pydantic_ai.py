"""The PydanticAI adapter (`agent_retry_policy.adapters.pydantic_ai`) end to
end: PydanticAI's own `FunctionModel`, scripted, drives `agent.run` with a
`RetryingMCPToolset` against the demo server.

- a transient failure is invisible: the model sees only the result;
- a replan reaches the model as PydanticAI's retry prompt (`ModelRetry`);
- an escalation stops the run (`Escalated` out of `agent.run`, with its note)
  and the model is not asked again;
- a keyed write whose answer was lost leaves one refund in the ledger;
- the capturing client is wired in: a 429's `Retry-After` is waited for, a 503
  with `x-should-retry: false` is not retried;
- PydanticAI's approval flow (`approval_required`, `DeferredToolRequests`)
  pauses the call before it is sent, and the approved call goes through the policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import WRAPPER_LOGGER, attempts, outcomes, policy_run, replan_messages
from demo_server import Desk, http, timeout_after_apply
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_retry_policy import Escalated, McpConnection
from agent_retry_policy.adapters.pydantic_ai import RetryingMCPToolset

RUN_ID = "PAI-1"


class Script:
    """The model's turns, in order; what it was shown each time."""

    def __init__(self, *turns: ModelResponse) -> None:
        self.turns = list(turns)
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        return self.turns.pop(0)

    def shown(self, turn: int) -> list[Any]:
        """The parts of the last request the model got in its `turn`-th call (0 is the first)."""
        last = self.seen[turn][-1]
        assert isinstance(last, ModelRequest)
        return list(last.parts)


def is_retry_prompt(part: Any) -> bool:
    """PydanticAI's retry prompt of a `ModelRetry`: a `RetryPromptPart`, or (2.68)
    the tool's return part marked `retried` by a model retry."""
    if isinstance(part, RetryPromptPart):
        return True
    retry = getattr(part, "retry", None)
    return getattr(part, "outcome", None) == "retried" and getattr(retry, "cause", None) == "model_retry"


def call(tool: str, args: dict[str, Any], call_id: str = "c1") -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool_name=tool, args=args, tool_call_id=call_id)])


def say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)])


def drive(desk: Desk, script: Script, **toolset_options: Any) -> Any:
    """Runs the agent; returns its output, or the exception it raised."""

    async def main() -> Any:
        async with McpConnection.http(desk.url) as connection:
            agent = Agent(FunctionModel(script), toolsets=[RetryingMCPToolset(connection, policy_run(RUN_ID), **toolset_options)])
            try:
                return (await agent.run("Help with order A1")).output
            except Exception as e:  # returned, so that the connection closes first
                return e

    return asyncio.run(main())


def test_a_transient_failure_is_invisible_to_the_model(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})
    script = Script(call("lookup_order", {"order_id": "A1"}), say("done"))
    assert drive(desk, script) == "done"
    assert outcomes(caplog, "lookup_order") == [("http 503", "retry"), ("success", "succeed")]
    (part,) = script.shown(1)
    assert isinstance(part, ToolReturnPart) and not is_retry_prompt(part)
    assert "A1" in str(part.content) and "503" not in str(part.content)


def test_a_replan_reaches_the_model_as_a_retry_prompt(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(400, "amount must be an integer number of paise")})
    script = Script(call("issue_refund", {"order_id": "A1", "amount_paise": 12}), say("I will ask for the amount again"))
    assert drive(desk, script) == "I will ask for the amount again"
    assert outcomes(caplog, "issue_refund") == [("http 400", "replan")]
    (part,) = script.shown(1)
    (message,) = replan_messages(caplog, "issue_refund")
    assert "integer number of paise" in message
    assert is_retry_prompt(part) and part.tool_name == "issue_refund"
    assert part.content == message  # the policy's message, as it is
    assert desk.refunds() == []


def test_an_escalation_stops_the_run_with_its_note(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(403, "refunds above 5000 rupees need a person")})
    script = Script(call("issue_refund", {"order_id": "A1", "amount_paise": 600000}), say("all done"))
    raised = drive(desk, script)
    assert isinstance(raised, Escalated), repr(raised)
    assert raised.reason == "permission-denied"
    assert "refunds above 5000 rupees need a person" in raised.note
    assert len(script.seen) == 1 and len(script.turns) == 1  # the model was not asked again
    assert desk.refunds() == []


def test_a_keyed_write_whose_answer_was_lost_is_applied_once(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    script = Script(call("issue_refund", {"order_id": "A1", "amount_paise": 500}), say("refunded"))
    assert drive(desk, script, attempt_timeout_s=0.3) == "refunded"
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]
    lines = [line for _record, line in attempts(caplog, "issue_refund")]
    # Two attempts (the server may answer the second with a task, polled: more lines), one key.
    assert {line["attempt"] for line in lines} == {1, 2} and {line["key"] for line in lines} == {key}


def test_a_429s_retry_after_is_waited_for(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(429, "slow down", (("Retry-After", "1"),))})
    assert drive(desk, Script(call("lookup_order", {"order_id": "A1"}), say("done"))) == "done"
    (first_record, first), (second_record, second) = attempts(caplog, "lookup_order")
    assert (first["outcome"].lower(), first["class"], first["action"]) == ("http 429", "throttled", "retry")
    assert first["delay_ms"] >= 1000 and first["hint_ms"] == 1000
    assert second_record.created - first_record.created >= 1.0, "the retry came before Retry-After allowed it"
    assert second["outcome"] == "success"


def test_a_503_the_server_says_not_to_retry_is_not_retried(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "down for maintenance", (("x-should-retry", "false"),))})
    drive(desk, Script(call("lookup_order", {"order_id": "A1"}), say("done"), say("done")))
    ((outcome, action),) = outcomes(caplog, "lookup_order")
    assert outcome == "http 503" and action != "retry"


def test_an_approved_call_goes_through_the_policy(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable")})
    script = Script(call("issue_refund", {"order_id": "A1", "amount_paise": 500}), say("refunded"))

    async def main() -> tuple[Any, Any]:
        async with McpConnection.http(desk.url) as connection:
            toolset = RetryingMCPToolset(connection, policy_run(RUN_ID)).approval_required(
                lambda _ctx, tool, _args: tool.name == "issue_refund"
            )
            agent = Agent(FunctionModel(script), toolsets=[toolset], output_type=[str, DeferredToolRequests])
            paused = await agent.run("Refund A1")
            assert desk.refunds() == []  # nothing sent before the approval
            assert isinstance(paused.output, DeferredToolRequests)
            approvals = {part.tool_call_id: True for part in paused.output.approvals}
            resumed = await agent.run(message_history=paused.all_messages(), deferred_tool_results=DeferredToolResults(approvals=approvals))
            return paused.output, resumed.output

    requested, output = asyncio.run(main())
    assert [part.tool_name for part in requested.approvals] == ["issue_refund"]
    assert output == "refunded"
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]


def test_the_policys_replan_budget_decides_not_pydantic_ais_retry_limit(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    # PydanticAI's own limit (1 ModelRetry a tool by default) would end the run at the second replan;
    # the policy's (max-replans-per-run 2) escalates the third.
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "issue_refund", "fault": http(400, "amount must be an integer number of paise")})
    script = Script(*(call("issue_refund", {"order_id": "A1", "amount_paise": 12}, f"c{n}") for n in range(1, 5)), say("done"))
    raised = drive(desk, script)
    assert isinstance(raised, Escalated), repr(raised)
    assert raised.reason == "replans-spent"
    assert outcomes(caplog, "issue_refund") == [("http 400", "replan"), ("http 400", "replan"), ("http 400", "escalate")]
    assert len(script.seen) == 3
