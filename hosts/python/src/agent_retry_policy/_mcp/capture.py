"""The capturing transport and the watching of answer bodies: what the HTTP layer
saw for one attempt (`AttemptCapture`) of the MCP wrapper. The module docstring of
`agent_retry_policy.mcp_client` says what the SDK hides and why the wrapper
captures it."""

from __future__ import annotations

import asyncio
import contextvars
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2

from ..types import Delivery, TransportError

# The header that marks the stand-in answer for a network error.
TRANSPORT_ERROR_HEADER = "x-agent-retry-transport-error"
TRANSPORT_ERROR_STATUS = 599
# How much of a failed response's body is kept (the policy keeps at most
# `max-message-chars` of it anyway).
MAX_CAPTURED_BODY = 64 * 1024


@dataclass
class AttemptCapture:
    """What the HTTP layer saw for one attempt: the first failure of a request
    it made (a non-2xx answer, a network error, an answer cut before the
    JSON-RPC response), and whether any of its requests went through a
    capturing transport at all (`seen`)."""

    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: str = ""
    transport_error: TransportError | None = None
    transport_detail: str = ""
    # How far the failed request got (the contract's `delivery`).
    delivery: Delivery = "unknown"
    # The attempt's latest request carried Mcp-Session-Id (the policy reads a 404
    # or a 400 as a lost session only then).
    session_header: bool = False
    seen: bool = False
    # An answer's status line came for the attempt's latest request: a failure
    # after it is `answer-started`.
    answered: bool = False
    # The JSON-RPC response to the attempt's latest request came whole (a JSON
    # body to its end, or the SSE event carrying it): an error it carries is the
    # server's, even with a code the SDK also gives its own failures (-32000
    # connection closed, -32001 its timeout).
    responded: bool = False
    # The id (as text) of the attempt's latest request, so that only its answer sets `responded`.
    request_id: str | None = None
    # Set when an answer stream ended or was cut before its response, or the
    # `server/discover` probe met a network error or an answer the policy reads
    # as the connect attempt's failure (`read_probe`): the attempt ends then,
    # not at its timeout, and not in the SDK's fallback to `initialize`.
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    # Keep only the failure of the attempt's latest request: connecting sends a
    # `server/discover` probe whose failure (a legacy server's 400 or 404) is
    # expected, then `initialize`; the attempt's outcome is the last one's. (A
    # probe failure that ends the attempt sets `cut`, and is kept.)
    latest_request_only: bool = False
    # The policy's rule for the probe's answer (`PolicyInstance.read_probe_answer`):
    # (http-status, json-rpc-code) -> "failure" | "older-server".
    read_probe: Callable[[int | None, int | None], str] | None = None

    @property
    def failed(self) -> bool:
        return self.status is not None or self.transport_error is not None

    def forget_failure(self) -> None:
        """Drops what a previous request of the attempt saw (`latest_request_only`)."""
        self.status = None
        self.headers = []
        self.body = ""
        self.transport_error = None
        self.transport_detail = ""
        self.delivery = "unknown"
        self.session_header = False
        self.answered = False
        self.responded = False

    def probe_failed(self, status: int | None, body: bytes) -> bool:
        """Whether an answer to the `server/discover` probe that is not a
        discovery result fails the connect attempt, as the policy reads it
        (`read-probe-answer`: the contract's one rule). A policy that cannot
        answer fails the attempt: the record of it then says why."""
        if self.read_probe is None:
            return False
        try:
            return self.read_probe(status, _json_rpc_error_code(body)) == "failure"
        except Exception:  # noqa: BLE001 - a failed policy: the attempt ends, its report escalates
            return True


def _json_rpc_error_code(body: bytes) -> int | None:
    """The code of the JSON-RPC error a body carries, if it is one."""
    try:
        message = json.loads(body)
    except (ValueError, TypeError):
        return None
    error = message.get("error") if isinstance(message, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) and -(2**31) <= code < 2**31 else None


_current_attempt: contextvars.ContextVar[AttemptCapture | None] = contextvars.ContextVar("agent_retry_current_attempt", default=None)


def _in_chain(error: BaseException, kind: type[BaseException]) -> bool:
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, kind):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def classify_network_error(error: BaseException, *, written: bool | None = None) -> tuple[TransportError, Delivery]:
    """An httpx2 exception (or a raw `ssl.SSLError`, which httpcore lets through
    from a read or write on an established TLS connection) as the contract's
    transport error and how far the request got: what the error stands for, no
    decision on what it means. `written`: whether the whole request was written
    (None: not known)."""
    if isinstance(error, httpx2.ConnectError) and _in_chain(error, ssl.SSLError):
        return "tls", "not-sent"  # the handshake failed (httpcore raises it as ConnectError): nothing of the request left
    if _in_chain(error, socket.gaierror):  # the name did not resolve: no connection
        return "name-resolution", "not-sent"
    if isinstance(error, ssl.SSLError):
        # A bad TLS record on a connection whose handshake was done: the connection is
        # broken, the request was written (or partly, if the write failed).
        return "connection-reset", "sent" if written else "unknown"
    if isinstance(error, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return "connection-refused", "not-sent"  # no connection was made
    if isinstance(error, httpx2.ReadTimeout):
        return "timeout", "sent"  # written, no answer byte
    if isinstance(error, httpx2.TimeoutException):  # a write timeout: part of it may have left
        return "timeout", "unknown"
    if isinstance(error, (httpx2.RemoteProtocolError, httpx2.ReadError)):
        return "connection-reset", "sent"  # written, then the connection dropped before an answer
    if isinstance(error, httpx2.WriteError):
        return "connection-reset", "unknown"
    if isinstance(error, httpx2.StreamError):
        return "stream-closed", "unknown"
    return "other", "unknown"


def _json_rpc_request(request: httpx2.Request) -> tuple[bool, str | None]:
    """Whether a POST may carry a request (everything but a JSON-RPC
    notification or response), and the request's id (as text) if it does."""
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError, TypeError):
        return True, None
    if not isinstance(message, dict):
        return True, None
    if message.get("id") is None or "method" not in message:
        return "method" not in message and "result" not in message and "error" not in message, None
    return True, str(message["id"])


def _json_rpc_method(request: httpx2.Request) -> str | None:
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError, TypeError):
        return None
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


class _AnswerWatch:
    """Watches the body of a 2xx answer to one JSON-RPC request, so that the
    attempt's capture says `stream-closed` at once when the answer is lost: a
    JSON body cut by the network (h11 checks its length), or an SSE stream cut
    before the response to that request went by, or ending cleanly before it
    without any event id to resume from. (An SSE stream the server closes on
    purpose after an event id, to be polled, is left to the SDK to resume.)"""

    def __init__(self, capture: AttemptCapture | None, request_id: str, content_type: str) -> None:
        self.capture = capture
        self.request_id = request_id
        kind = content_type.lower()
        self.sse = kind.startswith("text/event-stream")
        self.watched = self.sse or kind.startswith("application/json")
        self.answered = False
        self.resumable = False
        self.pending = b""
        self.data: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        if not self.sse or self.answered:
            return
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                self._event()
            elif line.startswith(b"data:"):
                value = line[5:]
                self.data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"id:") and line[3:].strip():
                self.resumable = True

    def _event(self) -> None:
        data, self.data = b"\n".join(self.data), []
        if not data:
            return
        try:
            message = json.loads(data)
        except ValueError:
            return
        if isinstance(message, dict) and str(message.get("id")) == self.request_id and ("result" in message or "error" in message):
            self.answered = True
            self._responded()

    def _responded(self) -> None:
        capture = self.capture
        if capture is not None and capture.request_id == self.request_id:
            capture.responded = True

    def ended(self) -> None:
        if self.sse and not self.answered and not self.resumable:
            self._fail("the answer stream (SSE) ended before the JSON-RPC response")
        elif self.watched and not self.sse:
            self._responded()  # a JSON answer is the one response, and it came to its end

    def cut(self, error: BaseException) -> None:
        if self.watched and not self.answered:
            what = "SSE" if self.sse else "JSON"
            self._fail(f"the answer ({what}) was cut before the JSON-RPC response ({type(error).__name__}: {error})")

    def _fail(self, detail: str) -> None:
        capture = self.capture
        if capture is None or capture.failed:
            return
        capture.transport_error = "stream-closed"
        capture.transport_detail = detail
        capture.delivery = "answer-started"  # the answer's status line (and maybe more) came
        capture.cut.set()


class _WatchedStream(httpx2.AsyncByteStream):
    """An answer body passed through to the SDK, watched (`_AnswerWatch`). A
    network error mid-body ends the body cleanly instead of reaching the SDK,
    whose POST task would otherwise end the session (a JSON answer) or wait to
    resume it (an SSE answer with event ids)."""

    def __init__(self, inner: httpx2.AsyncByteStream, watch: _AnswerWatch) -> None:
        self.inner = inner
        self.watch = watch

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.inner:
                self.watch.feed(chunk)
                yield chunk
        except (httpx2.TransportError, ssl.SSLError) as e:  # a bad TLS record reaches here raw
            self.watch.cut(e)
            return
        self.watch.ended()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _WriteProgress:
    """httpcore's `trace` extension for one request: notes when the request was
    written whole (its body sent), and passes every event on to the trace the
    request already had."""

    def __init__(self, inner: Callable[[str, dict[str, Any]], Awaitable[None]] | None) -> None:
        self.inner = inner
        self.written = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(".send_request_body.complete"):
            self.written = True
        if self.inner is not None:
            await self.inner(event, info)


def _stand_in(request: httpx2.Request, kind: TransportError, detail: str) -> httpx2.Response:
    """The marked HTTP 599 answer that stands for a request that got no answer."""
    return httpx2.Response(
        TRANSPORT_ERROR_STATUS,
        headers={"content-type": "text/plain", TRANSPORT_ERROR_HEADER: kind},
        content=detail.encode(),
        request=request,
    )


class CapturingTransport(httpx2.AsyncBaseTransport):
    """Wraps a transport. For every POST: a network error becomes a marked
    HTTP 599 answer (the SDK resolves the request with an error instead of
    ending the session), and an answer body cut mid-way ends cleanly. For the
    requests of the attempt in progress (`_current_attempt`) it also records
    the first failure: the status, headers and body of a non-2xx answer, the
    network error, or an answer that ended before its JSON-RPC response."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST":
            return await self.inner.handle_async_request(request)
        may_be_request, request_id = _json_rpc_request(request)
        capture = _current_attempt.get() if may_be_request else None
        if capture is not None:
            capture.seen = True
            if capture.latest_request_only and capture.cut.is_set():
                # The connect attempt already failed (its probe did): the SDK's fallback
                # to `initialize` is not sent, so that no legacy session is made.
                return _stand_in(request, "connection-refused", "not sent: the connect attempt already failed on its server/discover probe")
            if capture.latest_request_only and request_id is not None:
                capture.forget_failure()
            if not capture.failed:
                capture.session_header = "mcp-session-id" in request.headers
                capture.answered = False
                capture.responded = False
                capture.request_id = request_id
        progress = _WriteProgress(request.extensions.get("trace"))
        request.extensions = {**request.extensions, "trace": progress}
        try:
            response = await self.inner.handle_async_request(request)
        except (httpx2.TransportError, ssl.SSLError) as e:
            # httpcore lets an `ssl.SSLError` after the handshake (a bad record) through
            # untyped: it is a broken connection like any other, answered by the stand-in.
            kind, delivery = classify_network_error(e, written=progress.written)
            detail = f"{type(e).__name__}: {e}"
            if capture is not None and not capture.failed:
                capture.transport_error = kind
                capture.transport_detail = detail
                capture.delivery = delivery
                # The SDK takes any error answering its `server/discover` probe as a
                # legacy server's and falls back to `initialize`: a network error is
                # no such answer, so the attempt ends on it here.
                if _json_rpc_method(request) == "server/discover":
                    capture.cut.set()
            # mcp 2.3's POST task would let the exception end the session; an error
            # status instead resolves just this request with an MCPError.
            return _stand_in(request, kind, detail)
        if capture is not None and not capture.failed:
            capture.answered = True
        if response.status_code < 400:
            if request_id is not None:
                watch = _AnswerWatch(capture, request_id, response.headers.get("content-type", ""))
                response.stream = _WatchedStream(cast(httpx2.AsyncByteStream, response.stream), watch)
            return response
        # Read the body here and hand the SDK a fresh response with the same bytes.
        try:
            body = await response.aread()
        except (httpx2.TransportError, ssl.SSLError):
            body = b""
        finally:
            await response.aclose()
        if capture is not None and not capture.failed:
            capture.status = response.status_code
            capture.delivery = "answer-started"
            capture.session_header = "mcp-session-id" in request.headers
            # Every field as received, repeated ones as separate pairs (the policy joins
            # list-valued ones such as RateLimit itself).
            encoding = response.headers.encoding
            capture.headers = [(k.decode(encoding), v.decode(encoding)) for k, v in response.headers.raw]
            capture.body = body[:MAX_CAPTURED_BODY].decode("utf-8", errors="replace")
            # The SDK takes any error answering its `server/discover` probe as a legacy
            # server's refusal and falls back to `initialize`. The policy says which
            # answers are no refusal (`read-probe-answer`): for those the attempt ends
            # here and the policy reads it (its hint, its 403); for the others (an
            # older server's) the fallback goes on.
            if _json_rpc_method(request) == "server/discover" and capture.probe_failed(response.status_code, body):
                capture.cut.set()
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            content=body,
            request=request,
            extensions={k: v for k, v in response.extensions.items() if k == "http_version"},
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def create_capturing_http_client(
    *,
    timeout: httpx2.Timeout | None = None,
    headers: Mapping[str, str] | None = None,
    verify: ssl.SSLContext | bool = True,
    **kwargs: Any,
) -> httpx2.AsyncClient:
    """An httpx2 client for `streamable_http_client(url, http_client=...)` that lets
    the wrapper see failed POSTs. Defaults match the SDK's (30 s, 300 s reads).
    `verify` (an `ssl.SSLContext`, e.g. with a private CA's roots) goes to the
    transport that makes the connections. `McpConnection.http` always uses one."""
    # httpx2 ignores a client's `verify` when it is given a transport: pass it to ours.
    return httpx2.AsyncClient(
        transport=CapturingTransport(httpx2.AsyncHTTPTransport(verify=verify)),
        timeout=timeout or httpx2.Timeout(30.0, read=300.0),
        headers=dict(headers or {}),
        **kwargs,
    )
