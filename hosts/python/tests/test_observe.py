"""What the MCP wrapper passes to the policy for each way an attempt can fail:
the tool error's text and structured content, a JSON-RPC error's data, a failed
POST's headers as received."""

from __future__ import annotations

import asyncio
import json

import httpx2
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, ImageContent, TextContent

from agent_retry_policy import PolicyComponent
from agent_retry_policy.mcp_client import AttemptCapture, CapturingTransport, _current_attempt, protocol_error_outcome, tool_error_outcome


def test_a_tool_error_is_its_text_blocks_joined_and_its_structured_content_as_json() -> None:
    result = CallToolResult(
        content=[
            TextContent(type="text", text="Error executing tool ask_model: upstream failed"),
            ImageContent(type="image", data="AAAA", mime_type="image/png"),
            TextContent(type="text", text="Please try again in 20s."),
        ],
        structured_content={"error": {"type": "overloaded_error", "message": "Überlastet"}},
        is_error=True,
    )
    failure = tool_error_outcome(result)["failure"]
    assert failure["kind"] == {"tool-error": None}  # the wrapper reads no status itself
    assert failure["body"] == "Error executing tool ask_model: upstream failed\nPlease try again in 20s."
    assert json.loads(failure["structured-content"] or "") == {"error": {"type": "overloaded_error", "message": "Überlastet"}}
    classification = PolicyComponent.load().instantiate().load_policy({}).classify(failure, 0)
    assert classification["class"] == "throttled"
    assert classification["hint-ms"] == 20_000 and classification["hint-source"] == "text"


def test_a_tool_error_without_structured_content_passes_none() -> None:
    failure = tool_error_outcome(CallToolResult(content=[TextContent(type="text", text="no")], is_error=True))["failure"]
    assert failure["body"] == "no" and failure["structured-content"] is None


def test_a_json_rpc_errors_data_is_passed_as_json_text() -> None:
    failure = protocol_error_outcome(MCPError(-32603, "upstream refused", {"status": 403}))["failure"]
    assert failure["kind"] == {"protocol-error": -32603}
    assert failure["body"] == "upstream refused"
    assert json.loads(failure["structured-content"] or "") == {"status": 403}
    assert protocol_error_outcome(MCPError(-32602, "bad amount"))["failure"]["structured-content"] is None
    policy = PolicyComponent.load().instantiate().load_policy({})
    assert policy.classify(protocol_error_outcome(MCPError(-32603, "x", {"status": 403}))["failure"], 0)["class"] == "permission"
    assert policy.classify(protocol_error_outcome(MCPError(-32603, "x"))["failure"], 0)["class"] == "transient"


def test_repeated_header_fields_are_captured_as_separate_pairs_as_received() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        headers = [("RateLimit", '"minute";r=0;t=5'), ("RateLimit", '"day";r=10;t=3600'), ("Retry-After", "5")]
        return httpx2.Response(429, headers=headers, content=b"slow down")

    async def post() -> AttemptCapture:
        capture = AttemptCapture()
        token = _current_attempt.set(capture)
        try:
            transport = CapturingTransport(httpx2.MockTransport(answer))
            response = await transport.handle_async_request(httpx2.Request("POST", "http://127.0.0.1/mcp", content=b"{}"))
            assert response.status_code == 429 and await response.aread() == b"slow down"
        finally:
            _current_attempt.reset(token)
        return capture

    capture = asyncio.run(post())
    assert capture.status == 429 and capture.body == "slow down"
    assert [h for h in capture.headers if h[0].lower() != "content-length"] == [
        ("RateLimit", '"minute";r=0;t=5'),
        ("RateLimit", '"day";r=10;t=3600'),
        ("Retry-After", "5"),
    ]
