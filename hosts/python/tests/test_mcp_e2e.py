"""The MCP wrapper end to end: the policy component in wasmtime, the official
MCP SDK client, and the demo MCP server (`target/release/agent-retry serve`,
demo_server.py) over streamable HTTP on 127.0.0.1, failing on each test's fault
script (demo-server/src/faults.rs). What the server applied is read from its
ledger; what was sent, and when, from the client's HTTP layer (`Desk.posts`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from demo_server import Desk, http, timeout_after_apply, tool_text
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from agent_retry_policy import EmbeddedAccounts, Escalated, PolicyComponent, SplitMix64
from agent_retry_policy.mcp_client import RetryingToolCaller, StatusCheckRequest, create_capturing_http_client

T = TypeVar("T")

# Small delays so the tests are quick; tools are resolved from the server's MCP
# annotations (no `tools` entries), as a host that knows nothing else would.
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200}


def run_with_session(desk: Desk, body: Callable[[ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        # An exception raised inside the SDK's task groups would come out wrapped
        # in an ExceptionGroup; keep it and raise it after the session closed.
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


def new_caller(session: ClientSession, run_id: str = "CASE-5016", **kwargs: Any) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(CONFIG).start_run(run_id)
    return RetryingToolCaller(session, run, entropy=SplitMix64(3), **kwargs)


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def order_of(result: CallToolResult) -> str:
    """The order a successful `lookup_order` answered about (its text is the order as JSON)."""
    return json.loads(text_of(result))["order_id"]


# The pseudo-calls connecting and listing the tools (`initialize`, `tools/list`):
# calls of the run too (step null on their lines).
PSEUDO_TOOLS = ("initialize", "tools/list")


def attempt_lines(caplog: pytest.LogCaptureFixture, *, pseudo: bool = False) -> list[dict[str, Any]]:
    """The attempt lines of the model's calls (and, with `pseudo`, of the pseudo-calls)."""
    lines = logged(caplog, MCP_LOGGER, "agent_retry.attempt")
    return [line for line in lines if pseudo or line["tool"] not in PSEUDO_TOOLS]


def test_a_503_then_success_is_retried_and_the_caller_sees_only_the_success(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("lookup_order", {"order_id": "A1"}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error
    assert order_of(result) == "A1"
    assert len(desk.posts_of("lookup_order")) == 2
    # Two calls succeeded: the tools/list pseudo-call (the tool's annotations) and lookup_order.
    assert report["retries"] == 1 and report["succeeded-calls"] == 2
    assert report["statuses"] == [{"status": 503, "count": 1}]
    lines = attempt_lines(caplog, pseudo=True)
    assert [(line["step"], line["tool"], line["attempt"], line["outcome"], line["class"], line["action"]) for line in lines] == [
        (None, "tools/list", 1, "success", "success", "succeed"),
        (1, "lookup_order", 1, "http 503", "transient", "retry"),
        (1, "lookup_order", 2, "success", "success", "succeed"),
    ]


def test_a_429_with_retry_after_waits_at_least_the_hint(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(429, "slow down", (("Retry-After", "1"),))})

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session).call_tool("lookup_order", {"order_id": "A1"})

    result = run_with_session(desk, body)
    assert not result.is_error
    posts = desk.posts_of("lookup_order")
    assert len(posts) == 2
    assert posts[1].at - posts[0].at >= 1.0, "the retry came before Retry-After allowed it"
    first = attempt_lines(caplog)[0]
    assert (first["class"], first["action"]) == ("throttled", "retry")
    assert first["delay_ms"] >= 1000


def test_a_400_is_not_retried_and_the_model_sees_the_error(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(400, "amount must be an integer number of paise")})

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session).call_tool("issue_refund", {"order_id": "A1", "amount_paise": 12})

    result = run_with_session(desk, body)
    assert result.is_error
    assert "HTTP 400" in text_of(result) and "integer number of paise" in text_of(result)
    assert len(desk.posts_of("issue_refund")) == 1
    assert desk.refunds() == []


def test_an_is_error_result_is_not_retried_and_replans(serve: Callable[..., Desk]) -> None:
    # A read whose tool refuses the arguments with an `isError` result.
    desk = serve({"tool": "check_refund_policy", "fault": tool_text("amount must be at most 5000 paise, got 9000")})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("check_refund_policy", {"order_id": "A1", "amount_paise": 9000}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert result.is_error
    assert "at most 5000 paise" in text_of(result)
    assert len(desk.posts_of("check_refund_policy")) == 1
    assert report["replans"] == 1 and report["retries"] == 0


def test_an_empty_result_is_shown_to_the_model_as_an_error(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "lookup_order", "when": {"order_id": "A9"}, "fault": {"kind": "empty"}})

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session).call_tool("lookup_order", {"order_id": "A9"})

    result = run_with_session(desk, body)
    assert result.is_error
    assert "empty" in text_of(result)
    assert len(desk.posts_of("lookup_order")) == 1


def test_a_403_escalates_at_once_with_the_body_in_the_note(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(403, "refunds above 5000 rupees need a person")})

    async def body(session: ClientSession) -> None:
        await new_caller(session).call_tool("issue_refund", {"order_id": "A1", "amount_paise": 600000})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "permission-denied"
    assert "refunds above 5000 rupees need a person" in raised.value.note
    assert raised.value.tool == "issue_refund"
    # The scripted HTTP 403, not the tool's own refusal of the amount.
    assert [line["outcome"] for line in attempt_lines(caplog)] == ["http 403"]
    assert len(desk.posts_of("issue_refund")) == 1
    assert desk.refunds() == []


def test_a_keyed_write_that_timed_out_is_resent_with_the_same_key_and_applied_once(serve: Callable[..., Desk]) -> None:
    # The server applies the refund but answers after the client gave up.
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})

    async def body(session: ClientSession) -> tuple[CallToolResult, str]:
        caller = new_caller(session, attempt_timeout_s=0.3)
        result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})
        return result, caller.run.instance.derive_idempotency_key("CASE-5016", "step-1")

    result, expected_key = run_with_session(desk, body)
    assert not result.is_error
    keys = [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")]
    assert keys == [expected_key, expected_key]
    assert desk.refunds() == [("A1", 500, expected_key)]


def test_a_key_the_application_gave_is_sent_unchanged_with_every_attempt(serve: Callable[..., Desk]) -> None:
    # A 503 once: the keyed write is sent twice, both times with the application's key (never a derived one).
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable")})

    async def body(session: ClientSession) -> tuple[CallToolResult, str]:
        caller = new_caller(session)
        result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500, "idempotency_key": "mine-1"})
        return result, caller.run.instance.derive_idempotency_key("CASE-5016", "step-1")

    result, derived = run_with_session(desk, body)
    assert not result.is_error, text_of(result)
    keys = [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")]
    assert keys == ["mine-1", "mine-1"]
    assert derived != "mine-1"
    assert desk.refunds() == [("A1", 500, "mine-1")]


@pytest.mark.parametrize("given", ["", "k" * 257, "\u00e9" * 129, 42], ids=["empty", "257-bytes", "258-utf8-bytes", "not-a-string"])
def test_a_key_the_application_gave_that_the_policy_cannot_be_told_is_still_sent_unchanged(serve: Callable[..., Desk], given: Any) -> None:
    desk = serve()

    async def body(session: ClientSession) -> tuple[CallToolResult, str]:
        caller = new_caller(session)
        result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500, "idempotency_key": given})
        return result, caller.run.instance.derive_idempotency_key("CASE-5016", "step-1")

    _, derived = run_with_session(desk, body)
    # Never replaced: the server decides what the value means; the policy counts the call as an unkeyed write.
    assert [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")] == [given]
    assert derived not in [r[2] for r in desk.refunds()]


def test_a_none_key_is_none_and_the_derived_key_is_sent(serve: Callable[..., Desk]) -> None:
    desk = serve()

    async def body(session: ClientSession) -> tuple[CallToolResult, str]:
        caller = new_caller(session)
        result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500, "idempotency_key": None})
        return result, caller.run.instance.derive_idempotency_key("CASE-5016", "step-1")

    result, derived = run_with_session(desk, body)
    assert not result.is_error, text_of(result)
    assert [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")] == [derived]


def test_a_key_of_exactly_256_utf8_bytes_is_kept(serve: Callable[..., Desk]) -> None:
    given = "\u00e9" * 128  # 256 bytes, 128 characters
    desk = serve()

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session).call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500, "idempotency_key": given})

    result = run_with_session(desk, body)
    assert not result.is_error, text_of(result)
    assert [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")] == [given]


NOTE = "refund of 700 paise approved"


def test_an_unkeyed_write_that_timed_out_is_checked_not_resent(serve: Callable[..., Desk]) -> None:
    # record_note takes no idempotency key.
    desk = serve({"tool": "record_note", "call": 1, "fault": timeout_after_apply(1000)})
    checks: list[StatusCheckRequest] = []

    async def note_listed(request: StatusCheckRequest) -> Any:
        checks.append(request)
        await asyncio.sleep(0.8)  # let the slow first attempt finish on the server
        listed = await request.session.call_tool("list_notes", {"order_id": request.arguments["order_id"]})
        notes = json.loads(text_of(listed))["notes"]
        return "found" if any(note["text"] == request.arguments["text"] for note in notes) else "absent"

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session, attempt_timeout_s=0.3, status_check=note_listed)
        result = await caller.call_tool("record_note", {"order_id": "A1", "text": NOTE})
        return result, caller.run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error
    assert "already applied" in text_of(result)
    assert len(checks) == 1 and checks[0].idempotency_key is None
    assert len(desk.posts_of("record_note")) == 1
    assert desk.notes() == [("A1", NOTE)]
    assert report["status-checks"] == 1


def test_an_unkeyed_write_with_no_status_check_escalates_instead_of_resending(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "record_note", "call": 1, "fault": timeout_after_apply(1000)})

    async def body(session: ClientSession) -> None:
        await new_caller(session, attempt_timeout_s=0.3).call_tool("record_note", {"order_id": "A1", "text": NOTE})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "status-unknown"
    assert len(desk.posts_of("record_note")) == 1


def test_a_server_that_goes_away_is_retried_then_escalated_and_the_session_survives(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve()
    assert desk.server is not None

    async def body(session: ClientSession) -> None:
        caller = new_caller(session)
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        desk.server.close()  # the process is gone: nothing listens on its port
        await caller.call_tool("lookup_order", {"order_id": "A2"})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "call-attempts-spent"
    outcomes = [line["outcome"] for line in attempt_lines(caplog)][1:]
    assert outcomes == ["transport connection-refused"] * 4  # max-attempts-per-call defaults to 4


def test_retries_wait_the_policy_delay(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(502)}, {"tool": "lookup_order", "call": 2, "fault": http(504)})

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session).call_tool("lookup_order", {"order_id": "A1"})

    started = time.monotonic()
    assert not run_with_session(desk, body).is_error
    assert time.monotonic() - started < 5
    posts = desk.posts_of("lookup_order")
    delays = [line["delay_ms"] for line in attempt_lines(caplog) if line["action"] == "retry"]
    assert len(posts) == 3 and len(delays) == 2
    for before, after, delay in zip(posts, posts[1:], delays, strict=False):
        assert after.at - before.at >= delay / 1000 - 0.005


# Upstream failures relayed by the tool itself, the way real MCP servers relay
# them: HTTP 200, no upstream status or header reaches the client, only the
# result's text (or structured content, or a JSON-RPC error's data). The policy
# reads them; the wrapper passes them on as they are.


def test_a_relayed_503_in_a_tool_error_is_retried_and_the_model_sees_the_success(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": tool_text("upstream returned HTTP 503 Service Unavailable")})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("lookup_order", {"order_id": "R-7"}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error
    assert order_of(result) == "R-7"
    assert len(desk.posts_of("lookup_order")) == 2
    assert report["retries"] == 1 and report["replans"] == 0 and report["succeeded-calls"] == 2  # with tools/list
    lines = attempt_lines(caplog)
    assert [(line["outcome"], line["class"], line["action"], line["rule"]) for line in lines] == [
        ("tool error", "transient", "retry", "tool-error:status"),
        ("success", "success", "succeed", lines[1]["rule"]),
    ]


def test_a_relayed_rate_limit_waits_at_least_the_wait_named_in_its_text(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": tool_text("Rate limit reached for gpt-4o. Please try again in 1s.")})
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(seconds)

    async def body(session: ClientSession) -> CallToolResult:
        return await new_caller(session, sleep=sleep).call_tool("lookup_order", {"order_id": "A1"})

    result = run_with_session(desk, body)
    assert not result.is_error and order_of(result) == "A1"
    posts = desk.posts_of("lookup_order")
    assert len(posts) == 2
    assert slept and slept[-1] >= 1.0, slept
    assert posts[1].at - posts[0].at >= 1.0, "the retry came before the text's 'try again in 1s' allowed it"
    first = attempt_lines(caplog)[0]
    assert (first["class"], first["action"]) == ("throttled", "retry")
    assert first["delay_ms"] >= 1000


def test_a_relayed_403_escalates_and_is_not_shown_to_the_model(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": tool_text("403 Forbidden: Resource not accessible by integration")})

    async def body(session: ClientSession) -> None:
        await new_caller(session).call_tool("lookup_order", {"order_id": "R-7"})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "permission-denied"
    assert "Resource not accessible by integration" in raised.value.note
    assert len(desk.posts_of("lookup_order")) == 1
    (line,) = attempt_lines(caplog)
    assert (line["class"], line["action"], line["escalation"]) == ("permission", "escalate", "permission-denied")


def test_an_overloaded_error_in_structured_content_is_throttled_and_retried(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    # The text alone says nothing the policy knows; the provider's error type is
    # only in structuredContent.
    overloaded = tool_text("the model provider failed", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
    desk = serve({"tool": "lookup_order", "call": 1, "fault": overloaded})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("lookup_order", {"order_id": "A1"}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error and order_of(result) == "A1"
    assert len(desk.posts_of("lookup_order")) == 2
    assert report["retries"] == 1 and report["replans"] == 0
    first = attempt_lines(caplog)[0]
    assert (first["class"], first["action"], first["rule"]) == ("throttled", "retry", "tool-error:provider-code")


def test_a_number_that_only_looks_like_a_status_is_replanned_for_the_model(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    # A keyed write whose tool refuses these arguments.
    refused = tool_text("Cannot reserve 429 items: only 200 left in stock")
    desk = serve({"tool": "issue_refund", "when": {"amount_paise": 429}, "fault": refused})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 429}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert result.is_error
    assert "only 200 left in stock" in text_of(result)
    assert len(desk.posts_of("issue_refund")) == 1
    assert report["replans"] == 1 and report["retries"] == 0 and report["escalation"] is None
    (line,) = attempt_lines(caplog)
    assert (line["class"], line["action"]) == ("deterministic", "replan")


def test_a_json_rpc_errors_data_reaches_the_policy(serve: Callable[..., Desk]) -> None:
    # -32603 alone is transient (retried); the data says the upstream refused with a 403.
    data = {"error": {"status": 403, "message": "Resource not accessible by integration"}}
    fault = {"kind": "json-rpc-error", "code": -32603, "message": "upstream refused the request", "data": data}
    desk = serve({"tool": "lookup_order", "call": 1, "fault": fault})

    async def body(session: ClientSession) -> None:
        await new_caller(session).call_tool("lookup_order", {"order_id": "A1"})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "permission-denied"
    assert len(desk.posts_of("lookup_order")) == 1


def test_a_json_rpc_error_without_data_is_retried(serve: Callable[..., Desk]) -> None:
    desk = serve({"tool": "lookup_order", "call": 1, "fault": {"kind": "json-rpc-error", "code": -32603, "message": "upstream hiccup"}})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        caller = new_caller(session)
        return await caller.call_tool("lookup_order", {"order_id": "R-7"}), caller.run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error
    assert len(desk.posts_of("lookup_order")) == 2
    assert report["retries"] == 1


def test_a_tool_error_rule_in_the_config_classifies_a_servers_own_wording(serve: Callable[..., Desk]) -> None:
    # "E_BUSY" means nothing to the policy by itself (replanned); the tool's rule says transient.
    desk = serve({"tool": "lookup_order", "first": 2, "fault": tool_text("E_BUSY: the report queue is full")})

    async def body(session: ClientSession) -> tuple[CallToolResult, Any]:
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        config = {
            **CONFIG,
            "tools": {"lookup_order": {"effect": "read", "tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}]}},
        }
        run = instance.load_policy(config).start_run("CASE-5017")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3))
        return await caller.call_tool("lookup_order", {"order_id": "R-7"}), run.report()

    result, report = run_with_session(desk, body)
    assert not result.is_error
    assert len(desk.posts_of("lookup_order")) == 3
    assert report["retries"] == 2


def test_a_run_out_of_steps_is_logged_with_the_0_2_reason_name(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve()

    async def body(session: ClientSession) -> None:
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        # Two steps: the tools/list pseudo-call and the first lookup_order.
        run = instance.load_policy({**CONFIG, "max-steps-per-run": 2}).start_run("CASE-5018")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3))
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        await caller.call_tool("lookup_order", {"order_id": "A2"})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "run-steps-spent"
    assert len(desk.posts_of("lookup_order")) == 1
    last = attempt_lines(caplog)[-1]
    assert (last["outcome"], last["action"], last["escalation"]) == ("not sent", "escalate", "run-steps-spent")


# The attempt line: the same fields in the same order in the Rust, Python and Node hosts.
ATTEMPT_LINE_FIELDS = [
    "event",
    "ts",
    "run",
    "policy",
    "step",
    "call",
    "tool",
    "attempt",
    "key",
    "outcome",
    "class",
    "rule",
    "action",
    "delay_ms",
    "hint_ms",
    "escalation",
    "reason",
]


def test_the_attempt_line_has_the_shared_fields_in_order_with_step_key_and_hint(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable", (("Retry-After", "2"),))})
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    async def body(session: ClientSession) -> None:
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        # Three steps: tools/list, then the two attempts of the first issue_refund.
        run = instance.load_policy({**CONFIG, "max-delay-ms": 5_000, "max-steps-per-run": 3}).start_run("CASE-5030")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3), sleep=no_wait)
        assert not (await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})).is_error
        await caller.call_tool("issue_refund", {"order_id": "A2", "amount_paise": 700})  # two attempts spent the steps: not sent

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.reason == "run-steps-spent"
    sent_keys = [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")]
    assert len(sent_keys) == 2 and sent_keys[0] == sent_keys[1] and sent_keys[0]
    lines = [json.loads(r.getMessage(), object_pairs_hook=list) for r in caplog.records if r.name == "agent_retry_policy.mcp"]
    assert [[name for name, _ in line] for line in lines] == [ATTEMPT_LINE_FIELDS] * 4
    listed, first, second, not_sent = (dict(line) for line in lines)

    # The tools/list pseudo-call: no step, no key.
    assert (listed["step"], listed["tool"], listed["attempt"], listed["key"]) == (None, "tools/list", 1, None)
    assert (listed["outcome"], listed["action"]) == ("success", "succeed")

    assert (first["event"], first["run"], first["tool"]) == ("agent_retry.attempt", "CASE-5030", "issue_refund")
    assert (first["step"], first["attempt"], first["key"], first["outcome"]) == (1, 1, sent_keys[0], "http 503")
    assert (first["action"], first["hint_ms"], first["escalation"]) == ("retry", 2_000, None)
    assert first["delay_ms"] >= 2_000 and waits[-1] * 1000 >= 2_000 and isinstance(first["call"], int)
    assert isinstance(first["ts"], float) and first["policy"] == not_sent["policy"]
    assert (second["step"], second["call"], second["attempt"], second["key"]) == (1, first["call"], 2, sent_keys[0])
    assert (second["action"], second["delay_ms"], second["hint_ms"]) == ("succeed", None, None)

    # Not sent: step 2 and the key it would have carried (the same derivation, "step-2").
    expected_key = PolicyComponent.load().instantiate().derive_idempotency_key("CASE-5030", "step-2")
    assert (not_sent["step"], not_sent["call"], not_sent["attempt"], not_sent["key"]) == (2, None, 0, expected_key)
    assert not_sent["key"] != sent_keys[0]
    assert (not_sent["outcome"], not_sent["action"], not_sent["escalation"]) == ("not sent", "escalate", "run-steps-spent")
    assert (not_sent["class"], not_sent["rule"], not_sent["delay_ms"], not_sent["hint_ms"]) == (None, None, None, None)
