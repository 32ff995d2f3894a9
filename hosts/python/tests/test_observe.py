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
    failure = tool_error_outcome(result)
    assert failure["kind"] == {"tool-error": None}  # the wrapper reads no status itself
    assert (failure["delivery"], failure["session-id-sent"], failure["headers"]) == ("answer-started", False, "")
    assert failure["body"] == "Error executing tool ask_model: upstream failed\nPlease try again in 20s."
    assert json.loads(failure["structured-content"] or "") == {"error": {"type": "overloaded_error", "message": "Überlastet"}}
    classification = PolicyComponent.load().instantiate().load_policy({}).classify(failure, 0)
    assert classification["class"] == "throttled"
    assert classification["hint-ms"] == 20_000 and classification["hint-source"] == "text"


def test_a_tool_error_without_structured_content_passes_none() -> None:
    result = CallToolResult(content=[TextContent(type="text", text="no")], is_error=True)
    failure = tool_error_outcome(result)
    assert failure["body"] == "no" and failure["structured-content"] is None
    assert tool_error_outcome(result, session_id_sent=True)["session-id-sent"] is True


def test_a_json_rpc_errors_data_is_passed_as_json_text() -> None:
    failure = protocol_error_outcome(MCPError(-32603, "upstream refused", {"status": 403}))
    assert failure["kind"] == {"protocol-error": -32603}
    assert failure["body"] == "upstream refused"
    assert json.loads(failure["structured-content"] or "") == {"status": 403}
    assert (failure["delivery"], failure["session-id-sent"]) == ("answer-started", False), "an answer arrived"
    assert protocol_error_outcome(MCPError(-32602, "bad amount"))["structured-content"] is None
    assert protocol_error_outcome(MCPError(-32602, "bad amount"), session_id_sent=True)["session-id-sent"] is True
    policy = PolicyComponent.load().instantiate().load_policy({})
    assert policy.classify(protocol_error_outcome(MCPError(-32603, "x", {"status": 403})), 0)["class"] == "permission"
    assert policy.classify(protocol_error_outcome(MCPError(-32603, "x")), 0)["class"] == "transient"


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


# Answers cut or ended before their JSON-RPC response: seen by the capturing
# transport when the body ends, not at the attempt timeout.

REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo"}}


class _Body(httpx2.AsyncByteStream):
    """An answer body: these chunks, then (optionally) a cut connection."""

    def __init__(self, chunks: list[bytes], cut: bool = False) -> None:
        self.chunks = chunks
        self.cut = cut

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for chunk in self.chunks:
            yield chunk
        if self.cut:
            raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")


def _read_answer(content_type: str, body: _Body, message: dict[str, object] = REQUEST) -> tuple[AttemptCapture, bytes]:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, stream=body)

    async def post() -> tuple[AttemptCapture, bytes]:
        capture = AttemptCapture()
        token = _current_attempt.set(capture)
        try:
            transport = CapturingTransport(httpx2.MockTransport(answer))
            response = await transport.handle_async_request(httpx2.Request("POST", "http://127.0.0.1/mcp", json=message))
            received = b"".join([chunk async for chunk in response.aiter_raw()])  # never raises: a cut body just ends
        finally:
            _current_attempt.reset(token)
        return capture, received

    return asyncio.run(post())


def test_the_capture_says_the_response_came_only_when_it_came_whole() -> None:
    error = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"Session not found"}}'
    assert _read_answer("application/json", _Body([error]))[0].responded
    assert not _read_answer("application/json", _Body([error[:20]], cut=True))[0].responded
    event = b"event: message\ndata: " + error + b"\n\n"
    assert _read_answer("text/event-stream", _Body([event]))[0].responded
    other = b'event: message\ndata: {"jsonrpc":"2.0","id":8,"error":{"code":-32000,"message":"x"}}\n\n'
    assert not _read_answer("text/event-stream", _Body([other, b"id: 1\ndata: \n\n"]))[0].responded


def test_an_sse_answer_that_ends_before_its_response_is_stream_closed() -> None:
    progress = b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
    capture, received = _read_answer("text/event-stream", _Body([progress]))
    assert received == progress
    assert (capture.transport_error, capture.cut.is_set()) == ("stream-closed", True)
    assert "ended before the JSON-RPC response" in capture.transport_detail


def test_an_sse_answer_cut_before_its_response_is_stream_closed_and_one_with_it_is_not() -> None:
    capture, _ = _read_answer("text/event-stream", _Body([b'event: message\ndata: {"jsonrpc":'], cut=True))
    assert capture.transport_error == "stream-closed" and "RemoteProtocolError" in capture.transport_detail
    # The response went by (split over two chunks, its data over two lines): a cut after it changes nothing.
    answered = [b'event: message\ndata: {"jsonrpc":"2.0",\ndata: "id":7,"res', b'ult":{"content":[]}}\r\n\r\n']
    capture, _ = _read_answer("text/event-stream", _Body(answered, cut=True))
    assert capture.transport_error is None and not capture.cut.is_set()


def test_an_sse_answer_ended_after_an_event_id_is_left_to_the_sdk_to_resume() -> None:
    capture, _ = _read_answer("text/event-stream", _Body([b"id: 42\ndata: \n\n"]))
    assert capture.transport_error is None
    # Cut by the network, it is stream-closed all the same.
    capture, _ = _read_answer("text/event-stream", _Body([b"id: 42\ndata: \n\n"], cut=True))
    assert capture.transport_error == "stream-closed"


def test_a_json_answer_cut_mid_body_is_stream_closed_and_a_whole_one_is_not() -> None:
    capture, received = _read_answer("application/json", _Body([b'{"jsonrpc":"2.0","id":7,"res'], cut=True))
    assert received == b'{"jsonrpc":"2.0","id":7,"res'
    assert capture.transport_error == "stream-closed" and "(JSON)" in capture.transport_detail
    capture, _ = _read_answer("application/json", _Body([b'{"jsonrpc":"2.0","id":7,"result":{}}']))
    assert capture.transport_error is None


def test_a_notifications_failure_is_not_the_attempts_and_does_not_end_the_session() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused")

    async def post(message: dict[str, object]) -> tuple[AttemptCapture, int]:
        capture = AttemptCapture()
        token = _current_attempt.set(capture)
        try:
            transport = CapturingTransport(httpx2.MockTransport(refuse))
            response = await transport.handle_async_request(httpx2.Request("POST", "http://127.0.0.1/mcp", json=message))
        finally:
            _current_attempt.reset(token)
        return capture, response.status_code

    capture, status = asyncio.run(post({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    assert status == 599 and capture.transport_error is None and not capture.seen
    capture, status = asyncio.run(post(REQUEST))
    assert status == 599 and capture.transport_error == "connection-refused" and capture.seen
