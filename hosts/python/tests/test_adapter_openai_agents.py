"""The OpenAI Agents SDK adapter (`agent_retry_policy.adapters.openai_agents`)
end to end: the SDK's own scripted model (`agents.testing.ScriptedModel`)
drives `Runner.run` with a `RetryingMCPServer` against the demo server.

- a transient failure is invisible: the model sees only the result;
- a replan reaches the model as the tool's output, and the run goes on;
- an escalation stops the run (`Escalated` out of `Runner.run`, with its note)
  and the model is not asked again;
- a keyed write whose answer was lost leaves one refund in the ledger;
- the capturing client is wired in: a 429's `Retry-After` is waited for, a 503
  with `x-should-retry: false` is not retried;
- the SDK's approval flow (`require_approval`) pauses and resumes around it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import WRAPPER_LOGGER, attempts, outcomes, policy_run, replan_messages
from agents import Agent, RunConfig, Runner
from agents.exceptions import AgentsException
from agents.testing import ScriptedModel, assistant_message, function_call
from demo_server import Desk, http, timeout_after_apply

from agent_retry_policy import Escalated
from agent_retry_policy.adapters.openai_agents import EscalatedRun, RetryingMCPServer, stop_on_policy_errors
from agent_retry_policy.errors import CallTimedOut, Stopped

RUN_ID = "OA-1"
NO_TRACES = RunConfig(tracing_disabled=True)


def drive(desk: Desk, script: list[Any], *, run_id: str = RUN_ID, **server_options: Any) -> tuple[Any, ScriptedModel]:
    """Runs the agent with the scripted model; returns (the run's result, or the exception it raised; the model)."""
    model = ScriptedModel(script)

    async def main() -> Any:
        async with RetryingMCPServer(desk.url, policy_run(run_id), **server_options) as server:
            agent = Agent(name="desk", instructions="Refund desk.", model=model, mcp_servers=[server])
            try:
                return await Runner.run(agent, "Help with order A1", run_config=NO_TRACES)
            except Exception as e:  # returned, so that the server closes first
                return e

    return asyncio.run(main()), model


def tool_outputs(model: ScriptedModel, turn: int) -> list[str]:
    """The tool outputs the model was shown in its `turn`-th call (0 is the first)."""
    items = model.calls[turn].input
    assert isinstance(items, list)
    return [
        json.dumps(item.get("output"), default=str)
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def test_a_transient_failure_is_invisible_to_the_model(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})
    result, model = drive(desk, [[function_call("lookup_order", {"order_id": "A1"}, call_id="c1")], [assistant_message("done")]])
    assert not isinstance(result, BaseException), result
    assert result.final_output == "done"
    assert outcomes(caplog, "lookup_order") == [("http 503", "retry"), ("success", "succeed")]
    (shown,) = tool_outputs(model, 1)
    assert "A1" in shown and "503" not in shown and "unavailable" not in shown


def test_a_replan_reaches_the_model_as_the_tool_output(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(400, "amount must be an integer number of paise")})
    script = [
        [function_call("issue_refund", {"order_id": "A1", "amount_paise": 12}, call_id="c1")],
        [assistant_message("I will ask for the amount again")],
    ]
    result, model = drive(desk, script)
    assert not isinstance(result, BaseException), result
    assert outcomes(caplog, "issue_refund") == [("http 400", "replan")]
    (message,) = replan_messages(caplog, "issue_refund")
    assert "integer number of paise" in message
    items = model.calls[1].input
    assert isinstance(items, list)
    (output,) = [item["output"] for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"]
    assert [part["text"] for part in output] == [message]  # the policy's message, as it is: not the SDK's "Please try again"
    assert desk.refunds() == []


def test_an_escalation_stops_the_run_with_its_note(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(403, "refunds above 5000 rupees need a person")})
    # A second turn is scripted: the run must not reach it.
    script = [[function_call("issue_refund", {"order_id": "A1", "amount_paise": 600000}, call_id="c1")], [assistant_message("all done")]]
    raised, model = drive(desk, script)
    assert isinstance(raised, Escalated), repr(raised)
    assert isinstance(raised, EscalatedRun) and isinstance(raised, AgentsException)
    assert raised.run_data is not None  # the SDK filled in what the run had done
    assert raised.reason == "permission-denied"
    assert "refunds above 5000 rupees need a person" in raised.note
    assert raised.tool == "issue_refund"
    assert len(model.calls) == 1 and model.remaining_steps == 1
    assert desk.refunds() == []


def test_a_keyed_write_whose_answer_was_lost_is_applied_once(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    # The server applies the refund, then holds the answer past the attempt's timeout.
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    script = [[function_call("issue_refund", {"order_id": "A1", "amount_paise": 500}, call_id="c1")], [assistant_message("refunded")]]
    result, _model = drive(desk, script, attempt_timeout_s=0.3)
    assert not isinstance(result, BaseException), result
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]
    lines = [line for _record, line in attempts(caplog, "issue_refund")]
    # Two attempts (the server may answer the second with a task, polled: more lines), one key.
    assert {line["attempt"] for line in lines} == {1, 2} and {line["key"] for line in lines} == {key}


def test_a_429s_retry_after_is_waited_for(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(429, "slow down", (("Retry-After", "1"),))})
    result, _model = drive(desk, [[function_call("lookup_order", {"order_id": "A1"}, call_id="c1")], [assistant_message("done")]])
    assert not isinstance(result, BaseException), result
    (first_record, first), (second_record, second) = attempts(caplog, "lookup_order")
    assert (first["outcome"].lower(), first["class"], first["action"]) == ("http 429", "throttled", "retry")
    assert first["delay_ms"] >= 1000 and first["hint_ms"] == 1000
    assert second_record.created - first_record.created >= 1.0, "the retry came before Retry-After allowed it"
    assert second["outcome"] == "success"


def test_a_503_the_server_says_not_to_retry_is_not_retried(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=WRAPPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "down for maintenance", (("x-should-retry", "false"),))})
    _result, _model = drive(desk, [[function_call("lookup_order", {"order_id": "A1"}, call_id="c1")], [assistant_message("done")]])
    # Whatever the policy then decides (replan or escalate), the 503 is sent once.
    ((outcome, action),) = outcomes(caplog, "lookup_order")
    assert outcome == "http 503" and action != "retry"


def test_the_sdks_approval_pauses_the_run_and_the_approved_call_goes_through_the_policy(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable")})
    model = ScriptedModel(
        [[function_call("issue_refund", {"order_id": "A1", "amount_paise": 500}, call_id="c1")], [assistant_message("ok")]]
    )

    async def main() -> tuple[Any, Any]:
        server = RetryingMCPServer(desk.url, policy_run(RUN_ID), require_approval={"issue_refund": "always"})
        async with server:
            agent = Agent(name="desk", instructions="Refund desk.", model=model, mcp_servers=[server])
            paused = await Runner.run(agent, "Refund A1", run_config=NO_TRACES)
            assert desk.refunds() == []  # nothing sent before the approval
            state = paused.to_state()
            for interruption in paused.interruptions:
                state.approve(interruption)
            return paused, await Runner.run(agent, state, run_config=NO_TRACES)

    paused, resumed = asyncio.run(main())
    assert [item.name for item in paused.interruptions] == ["issue_refund"]
    assert resumed.final_output == "ok"
    # The approved call met a 503 and was retried with its key: one refund.
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]


# The failure function alone: what stops the run and what the SDK may still show the model.

ESCALATION = {
    "reason": "permission-denied",
    "note": "a person must look",
    "last-error": None,
    "resets-in-ms": None,
    "effects": [],
    "effects-total": 0,
}


def test_the_failure_function_raises_the_policys_errors_found_behind_the_sdks_wrapping() -> None:
    shown: list[Exception] = []
    failure = stop_on_policy_errors(lambda _ctx, error: shown.append(error) or "shown to the model")
    with pytest.raises(EscalatedRun) as raised:
        failure(None, _caused_by(Escalated(ESCALATION, tool="issue_refund")))  # type: ignore[arg-type]
    assert raised.value.note == "a person must look" and raised.value.tool == "issue_refund"
    timed_out = CallTimedOut(Stopped("call-timeout", "lookup_order", 1, 1, False, "call_timeout_s passed"))
    with pytest.raises(CallTimedOut):
        failure(None, _caused_by(timed_out))  # type: ignore[arg-type]
    assert shown == []
    # Any other error is the given function's (the SDK's default shows the model a message).
    other = ValueError("the model sent a bad argument")
    assert failure(None, other) == "shown to the model"  # type: ignore[arg-type]
    assert shown == [other]


def test_the_failure_function_survives_a_cycle_of_causes_and_none_lets_the_sdk_raise() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert stop_on_policy_errors(None)(None, first) is None  # type: ignore[arg-type]


def _caused_by(error: BaseException) -> Exception:
    wrapper = AgentsException("Error invoking MCP tool")
    wrapper.__cause__ = error
    return wrapper
