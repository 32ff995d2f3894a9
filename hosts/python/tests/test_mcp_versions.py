"""The MCP revisions and transports the wrapper reaches (issue 22, the 0.4.x
patch): `RetryingToolCaller` over `McpConnection`, which connects through the
SDK's negotiating mode (`server/discover`, else `initialize`), against

- the demo server modern-only (`--era modern`: `initialize` is refused with
  HTTP 400 and JSON-RPC -32022) and dual-era (stateless and `--sessions`; its
  probe cut by the fault proxy, or answered 429, 403, 503 or 404 by an inline
  front, `ProbeFront`), over http:// and, with a CA it makes at start
  (`--tls-ca-out`), https://;
- `@modelcontextprotocol/server-everything`, a 2025-11-25 server, over stdio
  and streamable HTTP;

and the configuration errors raised at construction. Needs node, the demo
server binary with `--era` (`target/release/agent-retry`, `make judge-setup`)
and server-everything (`make fault-proxy-setup`): without them these tests
fail, they do not skip.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import demo_server
import httpx2
import pytest
from demo_server import DemoServer
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

# The fault proxy of the shared transport scenarios (tests/fault-proxy/proxy.mjs).
from test_transport_faults import Proxy, demo_command

from agent_retry_policy import (
    ConnectionConfigError,
    EmbeddedAccounts,
    Escalated,
    McpConnection,
    PolicyComponent,
    RetryingToolCaller,
    SplitMix64,
)
from agent_retry_policy.mcp_client import INITIALIZE, AttemptCapture, CapturingTransport, _current_attempt

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
EVERYTHING = REPO / "tests" / "fault-proxy" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200}
# Bounds every call: a connection retried without end fails the test (CallTimedOut).
CALL_TIMEOUT_S = 60.0


# --- servers ----------------------------------------------------------------


# The flags these tests use, required of the demo server binary.
DEMO_FLAGS = ("--era", "--tls-ca-out")


def require_demo_server() -> str:
    return demo_server.require_demo_server(*DEMO_FLAGS)


@pytest.fixture
def demo(demo: Callable[..., DemoServer]) -> Callable[..., DemoServer]:
    """conftest.py's `demo`, with the flags these tests use required of the binary."""
    return functools.partial(demo, require=DEMO_FLAGS)


def everything_script() -> str:
    if shutil.which("node") is None:
        pytest.fail("node is not installed (server-everything is a Node program)")
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: install it with `make fault-proxy-setup`")
    return str(EVERYTHING)


@pytest.fixture
def everything_http() -> Iterator[str]:
    """server-everything over streamable HTTP on a free port of 127.0.0.1."""
    script = everything_script()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        ["node", script, "streamableHttp"], env={**os.environ, "PORT": str(port)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server-everything (streamableHttp) did not listen on port {port}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def proxies() -> Iterator[Callable[[list[str]], Proxy]]:
    started: list[Proxy] = []

    def start(server: list[str]) -> Proxy:
        proxy = Proxy(server)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each `server/discover` probe the SDK sent (any transport): its version and
    how it ended ("answered", or the error's code)."""
    seen: list[tuple[str, str]] = []
    send_discover = ClientSession.send_discover

    async def spy(self: ClientSession, version: str) -> dict[str, Any]:
        try:
            answer = await send_discover(self, version)
        except MCPError as e:
            seen.append((version, str(e.code)))
            raise
        seen.append((version, "answered"))
        return answer

    monkeypatch.setattr(ClientSession, "send_discover", spy)
    return seen


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The JSON-RPC methods the wrapper's HTTP client POSTs, in order."""
    methods: list[str] = []
    handle = CapturingTransport.handle_async_request

    async def spy(self: CapturingTransport, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            try:
                message = json.loads(request.content)
            except ValueError:
                message = None
            if isinstance(message, dict) and "method" in message:
                methods.append(message["method"])
        return await handle(self, request)

    monkeypatch.setattr(CapturingTransport, "handle_async_request", spy)
    return methods


# --- the wrapper ------------------------------------------------------------


def new_caller(connection: McpConnection, run_id: str) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(CONFIG).start_run(run_id)
    return RetryingToolCaller(connection, run, entropy=SplitMix64(3), attempt_timeout_s=20.0, call_timeout_s=CALL_TIMEOUT_S)


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())  # type: ignore[arg-type]


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def log_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return logged(caplog, MCP_LOGGER, "agent_retry.attempt")


def outcomes(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [(line["tool"], line["outcome"], line["action"]) for line in log_lines(caplog)]


async def look_up(connection: McpConnection, run_id: str) -> tuple[CallToolResult, str | None, bool]:
    """lookup_order A1 through the wrapper: the result, the negotiated revision,
    and whether the session came from the `initialize` handshake."""
    async with connection:
        result = await new_caller(connection, run_id).call_tool("lookup_order", {"order_id": "A1"})
        session = connection.session
        assert session is not None
        return result, session.protocol_version, session.initialize_result is not None


CONNECTED = [
    ("initialize", "success", "succeed"),
    ("tools/list", "success", "succeed"),
]


# --- 1. a modern-only server ------------------------------------------------


def test_a_modern_only_server_over_http_is_reached_without_initialize(
    demo: Callable[..., DemoServer], posted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--era", "modern")
    assert server.url.startswith("http://")

    async def body() -> tuple[CallToolResult, CallToolResult, str | None, bool]:
        async with McpConnection.http(server.url) as connection:
            caller = new_caller(connection, "versions-modern")
            looked_up = await caller.call_tool("lookup_order", {"order_id": "A1"})
            refunded = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})
            session = connection.session
            assert session is not None
            return looked_up, refunded, session.protocol_version, session.initialize_result is not None

    looked_up, refunded, version, handshake = run(body)
    assert not looked_up.is_error and "A1" in text_of(looked_up), text_of(looked_up)
    assert not refunded.is_error, text_of(refunded)
    assert (version, handshake) == (MODERN, False)
    assert "initialize" not in posted and posted[0] == "server/discover", posted
    # The client declares the tasks extension: the 2026-07-28 server answers the refund with a task, polled until it succeeds.
    lines = outcomes(caplog)
    refund = [line for line in lines if line[0] == "issue_refund"]
    assert lines[: len(CONNECTED) + 1] == [*CONNECTED, ("lookup_order", "success", "succeed")]
    assert refund[0] == ("issue_refund", "task working", "poll") and refund[-1] == ("issue_refund", "success", "succeed"), refund
    assert {action for _, _, action in refund[:-1]} == {"poll"}, refund


def test_a_modern_only_server_refuses_the_legacy_handshake(demo: Callable[..., DemoServer], caplog: pytest.LogCaptureFixture) -> None:
    """The control for the test above: the server really refuses `initialize`
    (what the wrapper did before it negotiated; `mode="legacy"` still does)."""
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--era", "modern")

    with pytest.raises(Escalated) as raised:
        run(lambda: look_up(McpConnection.http(server.url, mode="legacy"), "versions-modern-legacy"))
    assert "-32022" in raised.value.note and '"supported":["2026-07-28"]' in raised.value.note, raised.value.note
    # The wrapper reports the HTTP 400 as it came; the policy reads the -32022 in
    # it (rule version-mismatch): a new session, negotiating again, then, refused
    # again, an escalation: the two share no revision.
    assert raised.value.reason == "protocol-version-unsupported"
    assert outcomes(caplog) == [("initialize", "http 400", "retry"), ("initialize", "http 400", "escalate")]
    assert {line["rule"] for line in log_lines(caplog)} == {"version-mismatch"}


# --- 2. a dual-era server ---------------------------------------------------


@pytest.mark.parametrize("sessions", [False, True], ids=["stateless", "sessions"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_dual_era_server_over_http_is_reached(
    sessions: bool, mode: str, demo: Callable[..., DemoServer], posted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--era", "dual", *(["--sessions"] if sessions else []))

    result, version, handshake = run(lambda: look_up(McpConnection.http(server.url, mode=mode), f"versions-dual-{mode}"))  # type: ignore[arg-type]
    assert not result.is_error and "A1" in text_of(result), text_of(result)
    if mode == "auto":  # the newest revision both speak, without a handshake
        assert (version, handshake) == (MODERN, False)
        assert "initialize" not in posted and posted[0] == "server/discover", posted
    else:
        assert (version, handshake) == (LEGACY, True)
        assert "server/discover" not in posted and posted[0] == "initialize", posted
    assert outcomes(caplog) == [*CONNECTED, ("lookup_order", "success", "succeed")]


@pytest.mark.parametrize(("cut", "seen"), [("cut-before", "transport connection-reset"), ("cut-during", "transport stream-closed")])
def test_a_probe_cut_by_the_network_is_retried_not_taken_for_a_legacy_server(
    cut: str, seen: str, proxies: Callable[[list[str]], Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK falls back to `initialize` on any error answering the probe; a
    network error is not an answer: the attempt fails on it and is retried, and
    the dual-era server is still reached at 2026-07-28."""
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    require_demo_server()
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--era", "dual"))
    proxy.faults({"on": "server/discover", "fault": cut})

    result, version, handshake = run(lambda: look_up(McpConnection.http(proxy.url), "versions-cut-probe"))
    assert not result.is_error, text_of(result)
    assert (version, handshake) == (MODERN, False)
    rpcs = [(entry["rpc"], entry["fault"]) for entry in proxy.log() if entry["rpc"] in ("server/discover", "initialize")]
    assert rpcs == [("server/discover", cut), ("server/discover", None)], rpcs
    assert outcomes(caplog) == [("initialize", seen, "retry"), *CONNECTED, ("lookup_order", "success", "succeed")]


class ProbeFront:
    """A minimal HTTP front to a server (the fault proxy answers no chosen status):
    it answers the first `times` `server/discover` POSTs with `status` (its
    `headers` and body) and forwards every other request, its answer streamed
    back. `seen` lists each POST's JSON-RPC method and the status it got."""

    def __init__(self, upstream: str, status: int, headers: tuple[tuple[str, str], ...] = (), *, times: int | None = 1) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.status, self.headers, self.times = status, headers, times
        self.seen: list[tuple[str | None, int]] = []
        self._lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                front.forward(self, b"")

            def do_DELETE(self) -> None:
                front.forward(self, b"")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    message = json.loads(body)
                except ValueError:
                    message = None
                method = message.get("method") if isinstance(message, dict) else None
                if method == "server/discover" and front.take():
                    payload = json.dumps({"error": f"probe answered {front.status} by the front"}).encode()
                    self.send_response(front.status)
                    for name, value in (("content-type", "application/json"), *front.headers):
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    front.note(method, front.status)
                    return
                status = front.forward(self, body)
                if method is not None:
                    front.note(method, status)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{target.path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> bool:
        with self._lock:
            if self.times is None:
                return True
            if self.times > 0:
                self.times -= 1
                return True
            return False

    def note(self, method: str, status: int) -> None:
        with self._lock:
            self.seen.append((method, status))

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> int:
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            skip = ("host", "connection", "content-length")
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in skip}
            upstream.request(handler.command, handler.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            handler.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("connection", "content-length", "transfer-encoding"):
                    handler.send_header(name, value)
            handler.end_headers()  # HTTP/1.0: the body ends when the connection closes
            while chunk := answer.read1(65536):
                handler.wfile.write(chunk)
                handler.wfile.flush()
            return answer.status
        except OSError:
            return 0
        finally:
            upstream.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def probe_front(demo: Callable[..., DemoServer]) -> Iterator[Callable[..., ProbeFront]]:
    """`probe_front(status, headers, times=1)`: a `ProbeFront` to a dual-era demo server."""
    fronts: list[ProbeFront] = []

    def start(status: int, headers: tuple[tuple[str, str], ...] = (), *, times: int | None = 1) -> ProbeFront:
        front = ProbeFront(demo("--era", "dual").url, status, headers, times=times)
        fronts.append(front)
        return front

    yield start
    for front in fronts:
        front.close()


def test_a_probe_answered_429_is_retried_after_its_hint_and_the_server_is_reached_at_the_new_revision(
    probe_front: Callable[..., ProbeFront], caplog: pytest.LogCaptureFixture
) -> None:
    """An HTTP 429 answering `server/discover` is no legacy server's refusal: it
    is the connect attempt's failure, retried after the server's Retry-After,
    and the dual-era server is then reached at 2026-07-28 (the SDK alone would
    have fallen back to the 2025-11-25 handshake)."""
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    front = probe_front(429, (("Retry-After", "1"),))
    started = time.monotonic()

    result, version, handshake = run(lambda: look_up(McpConnection.http(front.url), "versions-probe-429"))
    elapsed = time.monotonic() - started
    assert not result.is_error and "A1" in text_of(result), text_of(result)
    assert (version, handshake) == (MODERN, False)
    assert [m for m, _ in front.seen if m in ("server/discover", "initialize")] == ["server/discover", "server/discover"], front.seen
    assert front.seen[:2] == [("server/discover", 429), ("server/discover", 200)], front.seen
    first = log_lines(caplog)[0]
    assert (first["tool"], first["attempt"], first["outcome"], first["action"]) == (INITIALIZE, 1, "http 429", "retry")
    assert first["hint_ms"] == 1_000 and first["delay_ms"] >= 1_000, first
    assert elapsed >= 1.0, elapsed
    assert outcomes(caplog)[1:] == [*CONNECTED, ("lookup_order", "success", "succeed")]


def test_a_probe_answered_403_escalates_permission_denied_without_a_downgrade(
    probe_front: Callable[..., ProbeFront], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    front = probe_front(403)

    with pytest.raises(Escalated) as raised:
        run(lambda: look_up(McpConnection.http(front.url), "versions-probe-403"))
    assert raised.value.tool == INITIALIZE
    assert raised.value.reason == "permission-denied", raised.value.reason
    assert [(line["tool"], line["attempt"], line["outcome"], line["action"]) for line in log_lines(caplog)] == [
        (INITIALIZE, 1, "http 403", "escalate")
    ]
    # No fallback to the handshake went out: no 2025-11-25 session was made.
    assert front.seen == [("server/discover", 403)], front.seen


def test_a_probe_answered_503_every_time_escalates_after_the_policys_attempts(
    probe_front: Callable[..., ProbeFront], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    front = probe_front(503, times=None)

    with pytest.raises(Escalated) as raised:
        run(lambda: look_up(McpConnection.http(front.url), "versions-probe-503"))
    assert raised.value.tool == INITIALIZE
    assert raised.value.reason == "call-attempts-spent", raised.value.reason
    attempts = 4  # the default max-attempts-per-call
    assert [(line["tool"], line["attempt"], line["outcome"], line["action"]) for line in log_lines(caplog)] == [
        *((INITIALIZE, n, "http 503", "retry") for n in range(1, attempts)),
        (INITIALIZE, attempts, "http 503", "escalate"),
    ]
    assert front.seen == [("server/discover", 503)] * attempts, front.seen


def test_a_probe_answered_404_is_a_legacy_servers_refusal_and_falls_back_to_the_handshake(
    probe_front: Callable[..., ProbeFront], caplog: pytest.LogCaptureFixture
) -> None:
    """The control of the three above: a 404 (like a 400 or 405) is what a legacy
    server answers a method it does not know; the handshake follows, in the same
    attempt, which succeeds."""
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    front = probe_front(404)

    result, version, handshake = run(lambda: look_up(McpConnection.http(front.url), "versions-probe-404"))
    assert not result.is_error and "A1" in text_of(result), text_of(result)
    assert (version, handshake) == (LEGACY, True)
    assert front.seen[:2] == [("server/discover", 404), ("initialize", 200)], front.seen
    assert outcomes(caplog) == [*CONNECTED, ("lookup_order", "success", "succeed")]


@pytest.mark.parametrize(
    ("status", "fails"),
    [(401, True), (403, True), (408, True), (429, True), (500, True), (503, True), (400, False), (404, False), (405, False), (413, False)],
)
def test_the_probe_rule_on_the_capturing_transport(status: int, fails: bool) -> None:
    """The rule for each status answering `server/discover` (the policy's
    `read-probe-answer`), on the transport alone: a failure ends the connect
    attempt (`cut`), is kept, and the SDK's fallback `initialize` is not sent; a
    legacy server's refusal is forgotten when `initialize` goes out."""
    forwarded: list[str] = []
    instance = PolicyComponent.load().instantiate()
    asked: list[tuple[int | None, int | None]] = []

    def read_probe(http_status: int | None, json_rpc_code: int | None) -> str:
        asked.append((http_status, json_rpc_code))
        return instance.read_probe_answer(http_status, json_rpc_code)

    def answer(request: httpx2.Request) -> httpx2.Response:
        method = json.loads(request.content)["method"]
        forwarded.append(method)
        if method == "server/discover":
            return httpx2.Response(status, headers={"Retry-After": "1"}, content=b"no")
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": 2, "result": {}})

    async def connect() -> AttemptCapture:
        capture = AttemptCapture(latest_request_only=True, read_probe=read_probe)
        token = _current_attempt.set(capture)
        try:
            transport = CapturingTransport(httpx2.MockTransport(answer))
            for number, method in enumerate(("server/discover", "initialize"), 1):
                message = json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": {}}).encode()
                response = await transport.handle_async_request(httpx2.Request("POST", "http://127.0.0.1/mcp", content=message))
                await response.aread()
        finally:
            _current_attempt.reset(token)
        return capture

    capture = run(connect)
    assert asked == [(status, None)], "the policy read the probe's answer, once"
    if fails:
        assert capture.cut.is_set() and capture.status == status and ("Retry-After", "1") in capture.headers
        assert forwarded == ["server/discover"]
    else:
        assert not capture.cut.is_set() and not capture.failed
        assert forwarded == ["server/discover", "initialize"]


# --- 3. a legacy (2025-11-25) server ------------------------------------------


def test_server_everything_over_stdio_is_reached_through_the_initialize_fallback(
    probes: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    script = everything_script()

    async def body() -> tuple[CallToolResult, str | None, bool]:
        async with McpConnection.stdio("node", [script, "stdio"]) as connection:
            result = await new_caller(connection, "versions-everything-stdio").call_tool("echo", {"message": "legacy"})
            session = connection.session
            assert session is not None
            return result, session.protocol_version, session.initialize_result is not None

    result, version, handshake = run(body)
    assert text_of(result) == "Echo: legacy"
    assert (version, handshake) == (LEGACY, True)
    # It was probed first (and answered "method not found"), then fell back.
    assert probes == [(MODERN, "-32601")], probes
    # The refused probe is part of connecting, not a failed attempt.
    assert outcomes(caplog) == [*CONNECTED, ("echo", "success", "succeed")]


def test_server_everything_over_http_is_reached_and_its_refused_probe_is_not_a_failure(
    everything_http: str, posted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")

    async def body() -> tuple[CallToolResult, str | None, bool]:
        async with McpConnection.http(everything_http) as connection:
            result = await new_caller(connection, "versions-everything-http").call_tool("echo", {"message": "legacy"})
            session = connection.session
            assert session is not None
            return result, session.protocol_version, session.initialize_result is not None

    result, version, handshake = run(body)
    assert text_of(result) == "Echo: legacy"
    assert (version, handshake) == (LEGACY, True)
    assert posted[:2] == ["server/discover", "initialize"], posted
    # The probe was answered HTTP 400 ("Server not initialized"); the attempt is
    # what its last request (initialize) saw: a success, at the first attempt.
    assert outcomes(caplog) == [*CONNECTED, ("echo", "success", "succeed")]
    assert [line["attempt"] for line in log_lines(caplog) if line["tool"] == "initialize"] == [1]


# --- 4. https with a private CA -----------------------------------------------


def test_an_https_modern_server_with_a_private_ca_is_reached_with_its_roots(
    demo: Callable[..., DemoServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    ca = tmp_path / "ca.pem"
    server = demo("--era", "modern", "--tls-ca-out", str(ca))
    assert server.url.startswith("https://"), server.url
    roots = ca.read_bytes()
    assert b"-----BEGIN CERTIFICATE-----" in roots

    result, version, handshake = run(lambda: look_up(McpConnection.http(server.url, root_certificates_pem=roots), "versions-tls"))
    assert not result.is_error and "A1" in text_of(result), text_of(result)
    assert (version, handshake) == (MODERN, False)
    assert outcomes(caplog) == [*CONNECTED, ("lookup_order", "success", "succeed")]


def test_an_https_server_whose_ca_is_not_trusted_escalates_with_the_certificate_error(
    demo: Callable[..., DemoServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--era", "modern", "--tls-ca-out", str(tmp_path / "ca.pem"))
    started = time.monotonic()

    with pytest.raises(Escalated) as raised:  # not CallTimedOut: it is not retried until the limit
        run(lambda: look_up(McpConnection.http(server.url), "versions-tls-untrusted"))
    elapsed = time.monotonic() - started
    assert raised.value.tool == "initialize"
    assert "CERTIFICATE_VERIFY_FAILED" in raised.value.note, raised.value.note
    # A certificate failure is not a blip: the wrapper reports transport(tls)
    # (capture.classify_network_error) and the policy escalates it at the first
    # attempt, as misconfigured, without a retry.
    assert raised.value.reason == "connection-misconfigured"
    lines = log_lines(caplog)
    assert [(line["tool"], line["attempt"], line["outcome"], line["action"]) for line in lines] == [
        (INITIALIZE, 1, "transport tls", "escalate")
    ]
    assert (lines[0]["class"], lines[0]["escalation"]) == ("misconfigured", "connection-misconfigured")
    assert elapsed < CALL_TIMEOUT_S / 2, elapsed


# --- 5. configuration errors ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("ftp://127.0.0.1/mcp", "'ftp'"),
        ("ws://127.0.0.1:8080/mcp", "'ws'"),
        ("file:///tmp/mcp.sock", "'file'"),
        ("localhost:8080/mcp", "'localhost'"),
        ("127.0.0.1:8080/mcp", "without a scheme"),
    ],
)
def test_a_url_scheme_other_than_http_or_https_is_a_configuration_error(url: str, named: str) -> None:
    with pytest.raises(ConnectionConfigError) as raised:
        McpConnection.http(url)
    assert isinstance(raised.value, ValueError)
    assert raised.value.option == "url"
    assert named in str(raised.value) and "http:// or https://" in str(raised.value), str(raised.value)


def test_roots_that_are_not_pem_certificates_and_an_unknown_mode_are_configuration_errors(tmp_path: Path) -> None:
    for roots in (b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"):
        with pytest.raises(ConnectionConfigError) as raised:
            McpConnection.http("https://127.0.0.1:8443/mcp", root_certificates_pem=roots)
        assert raised.value.option == "root_certificates_pem"
    with pytest.raises(ConnectionConfigError, match="must be bytes"):
        McpConnection.http("https://127.0.0.1:8443/mcp", root_certificates_pem=str(tmp_path / "ca.pem"))  # type: ignore[arg-type]
    with pytest.raises(ConnectionConfigError) as raised:
        McpConnection.http("https://127.0.0.1:8443/mcp", mode="modern")  # type: ignore[arg-type]
    assert raised.value.option == "mode"
