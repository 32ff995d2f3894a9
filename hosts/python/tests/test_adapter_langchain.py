"""The LangChain / LangGraph adapter (`agent_retry_policy.adapters.langchain`)
end to end, in its own venv (`make test-python-langchain`: langchain-mcp-adapters
0.3.2 needs mcp<2): langchain-core's fake chat model, scripted with tool calls,
drives LangGraph's `create_react_agent` over `load_retrying_mcp_tools` against
the demo server.

- a transient failure is invisible: the model sees only the result;
- a replan reaches the model as a `ToolMessage` with `status="error"`;
- an escalation stops the graph (`Escalated`, with its note) and the model is
  not asked again;
- a keyed write whose answer was lost leaves one refund in the ledger;
- the capturing client is wired in: a 429's `Retry-After` is waited for, a 503
  with `x-should-retry: false` is not retried;
- LangGraph's own interrupt before the tools pauses the call before it is sent,
  and the resumed call goes through the policy.

In the main venv (mcp 2.x, no langchain) the module is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters", reason="the LangChain adapter runs in .venv-langchain (make test-python-langchain)")

import httpx  # noqa: E402
from adapter_support import HELPER_LOGGER, attempts, outcomes, policy_run, replan_messages  # noqa: E402
from demo_server import Desk, http, timeout_after_apply  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402

from agent_retry_policy import Escalated  # noqa: E402
from agent_retry_policy.adapters.langchain import load_retrying_mcp_tools  # noqa: E402
from agent_retry_policy.limits import MAX_BODY_BYTES  # noqa: E402

RUN_ID = "LC-1"
# create_react_agent is LangGraph's (langchain's create_agent needs the `langchain` package, not installed).
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


class ScriptedChat(GenericFakeChatModel):
    """langchain-core's fake chat model, its answers scripted; it records what it was shown."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **_kwargs: Any) -> ScriptedChat:
        return self  # the script already names the tools

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def chat(*turns: AIMessage) -> ScriptedChat:
    return ScriptedChat(messages=iter(turns), seen=[])


def call(tool: str, args: dict[str, Any], call_id: str = "c1") -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": tool, "args": args, "id": call_id, "type": "tool_call"}])


def connections(desk: Desk) -> dict[str, Any]:
    return {"desk": {"transport": "streamable_http", "url": desk.url}}


def drive(desk: Desk, model: ScriptedChat, **options: Any) -> Any:
    """Runs the graph; returns its final messages, or the exception it raised."""

    async def main() -> Any:
        tools = await load_retrying_mcp_tools(policy_run(RUN_ID), connections(desk), **options)
        agent = create_react_agent(model, tools)
        try:
            return (await agent.ainvoke({"messages": [("user", "Help with order A1")]}))["messages"]
        except Exception as e:
            return e

    return asyncio.run(main())


def tool_messages(model: ScriptedChat, turn: int) -> list[ToolMessage]:
    return [m for m in model.seen[turn] if isinstance(m, ToolMessage)]


def test_a_transient_failure_is_invisible_to_the_model(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=HELPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})
    model = chat(call("lookup_order", {"order_id": "A1"}), AIMessage(content="done"))
    messages = drive(desk, model)
    assert not isinstance(messages, BaseException), messages
    assert messages[-1].content == "done"
    assert outcomes(caplog, "lookup_order", HELPER_LOGGER) == [("http 503", "retry"), ("success", "succeed")]
    (shown,) = tool_messages(model, 1)
    assert shown.status == "success"
    assert "A1" in str(shown.content) and "503" not in str(shown.content)


def test_a_replan_reaches_the_model_as_an_error_tool_message(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=HELPER_LOGGER)
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(400, "amount must be an integer number of paise")})
    model = chat(call("issue_refund", {"order_id": "A1", "amount_paise": 12}), AIMessage(content="I will ask for the amount again"))
    messages = drive(desk, model)
    assert not isinstance(messages, BaseException), messages
    assert outcomes(caplog, "issue_refund", HELPER_LOGGER) == [("http 400", "replan")]
    (message,) = replan_messages(caplog, "issue_refund")
    assert "integer number of paise" in message
    (shown,) = tool_messages(model, 1)
    assert shown.status == "error"
    assert [block["text"] for block in shown.content] == [message]  # the policy's message, as it is
    assert desk.refunds() == []


def test_an_escalation_stops_the_graph_with_its_note(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(403, "refunds above 5000 rupees need a person")})
    model = chat(call("issue_refund", {"order_id": "A1", "amount_paise": 600000}), AIMessage(content="all done"))
    raised = drive(desk, model)
    assert isinstance(raised, Escalated), repr(raised)
    assert raised.reason == "permission-denied"
    assert "refunds above 5000 rupees need a person" in raised.note
    assert len(model.seen) == 1  # the model was not asked again
    assert desk.refunds() == []


def test_a_keyed_write_whose_answer_was_lost_is_applied_once(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=HELPER_LOGGER)
    # The server applies the refund, then holds the answer past the attempt's timeout.
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    model = chat(call("issue_refund", {"order_id": "A1", "amount_paise": 500}), AIMessage(content="refunded"))
    messages = drive(desk, model, attempt_timeout_s=0.3)
    assert not isinstance(messages, BaseException), messages
    assert messages[-1].content == "refunded"
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]
    lines = [line for _record, line in attempts(caplog, "issue_refund", HELPER_LOGGER)]
    assert [(line["outcome"], line["action"]) for line in lines] == [("transport timeout", "retry"), ("success", "succeed")]
    assert {line["key"] for line in lines} == {key}


def test_an_unkeyed_write_whose_answer_was_lost_is_status_checked_not_resent(serve: Callable[..., Desk]) -> None:
    # record_note takes no key: the policy asks the status check instead of sending it again.
    desk = serve({"tool": "record_note", "call": 1, "fault": timeout_after_apply(1000)})
    checks: list[tuple[str, dict[str, Any], str | None]] = []

    async def note_listed(request: Any, attempt: Any) -> str:
        checks.append((request.name, dict(request.args), attempt.idempotency_key))
        await asyncio.sleep(0.8)  # let the slow first attempt finish on the server
        return "found" if ("A1", "called back") in desk.notes() else "absent"

    model = chat(call("record_note", {"order_id": "A1", "text": "called back"}), AIMessage(content="noted"))
    messages = drive(desk, model, attempt_timeout_s=0.3, status_check={"record_note": note_listed})
    assert not isinstance(messages, BaseException), messages
    assert checks == [("record_note", {"order_id": "A1", "text": "called back"}, None)]
    assert desk.notes() == [("A1", "called back")]
    (shown,) = tool_messages(model, 1)
    assert shown.status == "success" and "status check found it applied" in str(shown.content)


def test_a_429s_retry_after_is_waited_for(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=HELPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(429, "slow down", (("Retry-After", "1"),))})
    messages = drive(desk, chat(call("lookup_order", {"order_id": "A1"}), AIMessage(content="done")))
    assert not isinstance(messages, BaseException), messages
    (first_record, first), (second_record, second) = attempts(caplog, "lookup_order", HELPER_LOGGER)
    assert (first["outcome"].lower(), first["class"], first["action"]) == ("http 429", "throttled", "retry")
    assert first["delay_ms"] >= 1000 and first["hint_ms"] == 1000
    assert second_record.created - first_record.created >= 1.0, "the retry came before Retry-After allowed it"
    assert second["outcome"] == "success"


def test_a_503_the_server_says_not_to_retry_is_not_retried(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=HELPER_LOGGER)
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "down for maintenance", (("x-should-retry", "false"),))})
    ended = drive(desk, chat(call("lookup_order", {"order_id": "A1"}), AIMessage(content="done"), AIMessage(content="done")))
    ((outcome, action),) = outcomes(caplog, "lookup_order", HELPER_LOGGER)
    assert outcome == "http 503" and action != "retry"
    # The body reached the policy: mcp 1.x raises before reading it, only the capturing client has it.
    assert isinstance(ended, Escalated) and "down for maintenance" in ended.note, repr(ended)


def test_langgraphs_interrupt_pauses_before_the_call_and_the_resumed_call_goes_through_the_policy(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable")})
    model = chat(call("issue_refund", {"order_id": "A1", "amount_paise": 500}), AIMessage(content="refunded"))

    async def main() -> tuple[Any, Any]:
        tools = await load_retrying_mcp_tools(policy_run(RUN_ID), connections(desk))
        agent = create_react_agent(model, tools, checkpointer=InMemorySaver(), interrupt_before=["tools"])
        thread = {"configurable": {"thread_id": "t1"}}
        await agent.ainvoke({"messages": [("user", "Refund A1")]}, thread)
        paused = await agent.aget_state(thread)
        assert desk.refunds() == []  # nothing sent before the go-ahead
        resumed = await agent.ainvoke(None, thread)
        return paused, resumed

    paused, resumed = asyncio.run(main())
    assert paused.next == ("tools",)
    assert resumed["messages"][-1].content == "refunded"
    key = policy_run(RUN_ID).instance.derive_idempotency_key(RUN_ID, "step-1")
    assert desk.refunds() == [("A1", 500, key)]


# The capturing transport and the error mapping alone (no server).


def capture_of(status: int, body: bytes, headers: list[tuple[str, str]], method: str = "POST") -> Any:
    """What the capturing client records for one request answered so."""
    from agent_retry_policy.adapters import langchain as adapter

    async def main() -> Any:
        inner = httpx.MockTransport(lambda _request: httpx.Response(status, headers=headers, content=body))
        capture = adapter._Capture()
        token = adapter._current.set(capture)
        try:
            async with httpx.AsyncClient(transport=adapter._CapturingTransport(inner)) as client:
                response = await client.request(
                    method, "http://server/mcp", json={"method": "tools/call"}, headers={"mcp-session-id": "s1"}
                )
        finally:
            adapter._current.reset(token)
        return capture, response

    return asyncio.run(main())


def test_the_capture_keeps_headers_as_received_and_bounds_a_huge_body() -> None:
    capture, response = capture_of(503, b"x" * (MAX_BODY_BYTES * 4), [("Retry-After", "2"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")])
    failure = capture.failure
    assert failure["kind"] == {"http-status": 503} and failure["session-id-sent"] is True
    assert "Retry-After: 2" in failure["headers"] and "Set-Cookie: a=1" in failure["headers"] and "Set-Cookie: b=2" in failure["headers"]
    assert len(failure["body"].encode()) <= MAX_BODY_BYTES + 64
    assert capture.call_sent and capture.failed.is_set()
    assert response.status_code == 503 and len(response.content) == MAX_BODY_BYTES * 4  # the client gets the answer unchanged


def test_the_capture_ignores_successes_and_requests_that_are_not_posts() -> None:
    assert capture_of(200, b"{}", [])[0].failure is None
    assert capture_of(405, b"no GET stream", [], method="GET")[0].failure is None
    assert capture_of(404, b"gone", [], method="DELETE")[0].failure is None


class Group(Exception):
    def __init__(self, *inner: BaseException) -> None:
        super().__init__("group")
        self.exceptions = inner


def test_an_mcp_error_inside_exception_groups_is_a_protocol_error_and_an_unknown_one_is_none() -> None:
    from mcp.shared.exceptions import McpError
    from mcp.types import ErrorData

    from agent_retry_policy.adapters.langchain import observe_mcp_error

    error = McpError(ErrorData(code=-32602, message="bad amount", data={"field": "amount_paise"}))
    # mcp's task groups raise exception groups (on 3.10 the backport's): anything with `exceptions`.
    nested = Group(Group(error))
    observation = observe_mcp_error(nested)
    assert observation is not None and observation["kind"] == {"protocol-error": -32602}
    assert observation["body"] == "bad amount" and observation["structured-content"] == '{"field":"amount_paise"}'
    assert observe_mcp_error(Group(KeyError("x"))) is None
