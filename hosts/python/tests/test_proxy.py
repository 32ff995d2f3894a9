"""`agent-retry proxy` (host-example/src/proxy/) seen from the official Python
MCP SDK client: the policy between a client that knows nothing of it and the
demo server (`serve --http` with a fault script and a ledger, demo_server.py;
`serve --stdio` once) or the third-party server-everything (once).

The proxy runs in both of its forms: over stdio (the SDK's `stdio_client`
starts it) and over streamable HTTP (`proxy --listen 127.0.0.1:0`, its URL read
from its stderr). Each test asserts what the client sees and, where it can, what
the server saw: its ledger, or how many calls it had counted (a probe rule in
the fault script that marks the server's next call of the tool).

Needs `make judge-setup` (the binary) and, for server-everything, node and
`make fault-proxy-setup`; without them a test fails, it does not skip.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
from demo_server import REPO, DemoServer, Desk, http, require_demo_server, timeout_after_apply, tool_text
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

T = TypeVar("T")

EVERYTHING = REPO / "tests" / "fault-proxy" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
# Short policy delays, so that each test is quick.
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200}
# Bounds every test's client side: a hang fails the test, it does not block the run.
TEST_TIMEOUT_S = 45.0
READ_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"agent-retry proxy at (\S+)")
TRANSPORTS = ["stdio", "http"]

# A probe rule's text: the server's call of the tool that carries it is the one counted.
PROBE = "probe: the server's call number {n} of {tool}"


def probe_rule(tool: str, n: int) -> dict[str, Any]:
    """A rule answering the server's `n`th call of `tool` with a marked `isError`
    result: a call made after the test's calls tells whether the server had seen
    exactly `n - 1` of them (every matching rule counts a call)."""
    return {"tool": tool, "call": n, "fault": tool_text(PROBE.format(n=n, tool=tool))}


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def run(body: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body, TEST_TIMEOUT_S)

    return asyncio.run(bounded())


# --- the proxy ----------------------------------------------------------------


class Files:
    """The proxy's files for one test: its policy configuration and settings."""

    def __init__(self, directory: Path, settings: dict[str, Any] | None = None) -> None:
        self.config = directory / "policy.json"
        self.config.write_text(json.dumps(CONFIG))
        self.settings = directory / "settings.json"
        self.settings.write_text(json.dumps(settings or {}))
        self.stderr = directory / "proxy-stderr.log"

    def args(self, *upstream: str) -> list[str]:
        return ["proxy", "--config", str(self.config), "--settings", str(self.settings), *upstream]


class HttpProxy:
    """`agent-retry proxy --listen 127.0.0.1:0 ARGS`, its URL read from stderr,
    its stderr kept (read on by a thread so the pipe never fills)."""

    def __init__(self, args: list[str]) -> None:
        command = [require_demo_server(), *args[:1], "--listen", "127.0.0.1:0", *args[1:]]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.lines.append(line)
                matched = _LISTENING.search(line)
                if matched and not found:
                    found.append(matched.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or not found:
            self.close()
            pytest.fail(f"the proxy did not start ({' '.join(command)}): {''.join(self.lines)[-2000:]}")
        self.url = found[0]

    def stderr(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Client:
    """A client's session through the proxy, and the proxy's stderr so far."""

    def __init__(self, session: ClientSession, stderr: Callable[[], str], process: subprocess.Popen[str] | None) -> None:
        self.session = session
        self.stderr = stderr
        self.process = process

    async def logged(
        self, event: str, timeout_s: float = 5.0, until: Callable[[list[dict[str, Any]]], bool] = bool
    ) -> list[dict[str, Any]]:
        """The proxy's JSON log lines of `event`, waiting (bounded) until `until`
        holds of them (by default: there is one). The proxy writes them to its
        stderr, which may be read after the answer the client already has."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = [json.loads(line) for line in self.stderr().splitlines() if line.startswith("{")]
            found = [line for line in lines if line.get("event") == event]
            if until(found) or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.05)


def two_attempts_of(tool: str) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether attempt lines of attempts 1 and 2 of `tool` were read."""
    return lambda lines: {line.get("attempt") for line in lines if line.get("tool") == tool} >= {1, 2}


@pytest.fixture
def files(tmp_path: Path) -> Callable[..., Files]:
    return lambda settings=None: Files(tmp_path, settings)


@asynccontextmanager
async def through_proxy(transport: str, args: list[str], stderr_path: Path) -> AsyncIterator[Client]:
    """An initialized SDK session with the proxy started with `args`, over `transport`."""
    if transport == "stdio":
        with stderr_path.open("w") as errlog:
            params = StdioServerParameters(command=require_demo_server(), args=args)
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as session:
                    await session.initialize()
                    yield Client(session, stderr_path.read_text, None)
        return
    proxy = HttpProxy(args)
    try:
        async with streamable_http_client(proxy.url) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as session:
                await session.initialize()
                yield Client(session, proxy.stderr, proxy.process)
    finally:
        proxy.close()


async def server_counted(url: str, tool: str, arguments: dict[str, Any]) -> str:
    """Calls `tool` on the demo server directly (not through the proxy): its text,
    a probe's mark if the server's count of the tool's calls reached it."""
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as session:
            await session.initialize()
            return text_of(await session.call_tool(tool, arguments))


# --- what the client sees, and the server --------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_503_once_is_invisible_and_the_server_saw_two_calls(
    serve: Callable[..., Desk], files: Callable[..., Files], transport: str
) -> None:
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")}, probe_rule("lookup_order", 3))
    proxy = files()

    async def body() -> tuple[CallToolResult, str]:
        async with through_proxy(transport, proxy.args("--upstream", desk.url), proxy.stderr) as client:
            result = await client.session.call_tool("lookup_order", {"order_id": "A1"})
        return result, await server_counted(desk.url, "lookup_order", {"order_id": "A1"})

    result, next_call = run(body())
    assert result.is_error is not True, text_of(result)
    assert json.loads(text_of(result))["order_id"] == "A1"
    assert "503" not in text_of(result)
    # The server's third call of lookup_order was the test's own: the proxy's were two.
    assert next_call == PROBE.format(n=3, tool="lookup_order")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_400_is_a_replan_with_the_policys_message_not_the_raw_body(
    serve: Callable[..., Desk], files: Callable[..., Files], transport: str
) -> None:
    raw = "amount must be an integer number of paise"
    desk = serve({"tool": "check_refund_policy", "call": 1, "fault": http(400, raw)}, probe_rule("check_refund_policy", 2))
    proxy = files()

    async def body() -> tuple[CallToolResult, str]:
        async with through_proxy(transport, proxy.args("--upstream", desk.url), proxy.stderr) as client:
            result = await client.session.call_tool("check_refund_policy", {"order_id": "A1", "amount_paise": 100})
        return result, await server_counted(desk.url, "check_refund_policy", {"order_id": "A1", "amount_paise": 100})

    result, next_call = run(body())
    assert result.is_error is True
    text = text_of(result)
    assert text != raw
    # The policy's sentence: the tool, the status, then what the server said.
    assert text.startswith("check_refund_policy failed: HTTP 400"), text
    assert raw in text
    assert next_call == PROBE.format(n=2, tool="check_refund_policy"), "a 400 was retried"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_403_escalates_as_an_error_result_with_the_note_and_a_log_line(
    serve: Callable[..., Desk], files: Callable[..., Files], transport: str
) -> None:
    desk = serve({"tool": "issue_refund", "call": 1, "fault": http(403, "refunds above 5000 rupees need a person")})
    proxy = files()

    async def body() -> tuple[CallToolResult, list[dict[str, Any]]]:
        async with through_proxy(transport, proxy.args("--upstream", desk.url), proxy.stderr) as client:
            result = await client.session.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 600000})
            return result, await client.logged("agent_retry.proxy_escalation")

    result, escalations = run(body())
    assert result.is_error is True
    note = text_of(result)
    assert "stopped: permission denied; a person must grant access or approve the action" in note
    assert "HTTP 403: refunds above 5000 rupees need a person" in note
    assert "No effects were made in this run" in note
    assert len(escalations) == 1
    assert (escalations[0]["tool"], escalations[0]["reason"], escalations[0]["message"]) == ("issue_refund", "permission-denied", note)
    assert desk.refunds() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_keyed_write_that_timed_out_is_applied_once(serve: Callable[..., Desk], files: Callable[..., Files], transport: str) -> None:
    # The server applies the refund, then holds its answer past the attempt's timeout.
    desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1500)})
    proxy = files({"attempt-timeout-ms": 300})

    async def body() -> tuple[CallToolResult, list[dict[str, Any]]]:
        async with through_proxy(transport, proxy.args("--upstream", desk.url), proxy.stderr) as client:
            result = await client.session.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})
            return result, await client.logged("agent_retry.attempt", until=two_attempts_of("issue_refund"))

    result, attempts = run(body())
    assert result.is_error is not True, text_of(result)
    refunds = desk.refunds()
    assert len(refunds) == 1, refunds
    order, paise, key = refunds[0]
    assert (order, paise) == ("A1", 500) and key
    # The proxy sent a second attempt (the first timed out), with the same key.
    sent = [line for line in attempts if line.get("tool") == "issue_refund"]
    assert {line["key"] for line in sent} == {key}
    assert {line["attempt"] for line in sent} >= {1, 2}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_key_the_client_sends_reaches_the_server_unchanged(
    serve: Callable[..., Desk], files: Callable[..., Files], transport: str
) -> None:
    # The 503 answers only a call carrying the client's key: the retry proves the first attempt carried it.
    desk = serve({"tool": "issue_refund", "when": {"idempotency_key": "client-key-1"}, "call": 1, "fault": http(503, "busy")})
    proxy = files()

    async def body() -> tuple[CallToolResult, list[dict[str, Any]]]:
        async with through_proxy(transport, proxy.args("--upstream", desk.url), proxy.stderr) as client:
            arguments = {"order_id": "A1", "amount_paise": 500, "idempotency_key": "client-key-1"}
            result = await client.session.call_tool("issue_refund", arguments)
            return result, await client.logged("agent_retry.attempt", until=two_attempts_of("issue_refund"))

    result, attempts = run(body())
    assert result.is_error is not True, text_of(result)
    assert desk.refunds() == [("A1", 500, "client-key-1")]
    sent = [(line["attempt"], line["key"], line["outcome"]) for line in attempts if line.get("tool") == "issue_refund"]
    assert sent[0] == (1, "client-key-1", "http 503")
    assert {key for _, key, _ in sent} == {"client-key-1"} and len({attempt for attempt, _, _ in sent}) == 2


def test_a_key_over_256_bytes_is_sent_unchanged(serve: Callable[..., Desk], files: Callable[..., Files]) -> None:
    desk = serve()
    proxy = files()
    too_long = "k" * 257

    async def body() -> CallToolResult:
        async with through_proxy("stdio", proxy.args("--upstream", desk.url), proxy.stderr) as client:
            return await client.session.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500, "idempotency_key": too_long})

    result = run(body())
    assert result.is_error is not True, text_of(result)
    # Never replaced by a derived key: a second call with the same key would then be a second refund.
    assert desk.refunds() == [("A1", 500, too_long)]


def test_the_demo_server_over_stdio_as_the_upstream(files: Callable[..., Files], tmp_path: Path) -> None:
    # Over stdio the demo server's scripted 503 is a tool error reporting the status: retried all the same.
    faults, ledger = tmp_path / "faults.json", tmp_path / "ledger.json"
    faults.write_text(json.dumps([{"tool": "issue_refund", "call": 1, "fault": http(503, "upstream unavailable")}]))
    proxy = files()
    upstream = ["--", require_demo_server(), "serve", "--stdio", "--faults", str(faults), "--ledger", str(ledger)]

    async def body() -> tuple[CallToolResult, CallToolResult, list[dict[str, Any]]]:
        async with through_proxy("stdio", proxy.args(*upstream), proxy.stderr) as client:
            looked_up = await client.session.call_tool("lookup_order", {"order_id": "A2"})
            refunded = await client.session.call_tool(
                "issue_refund", {"order_id": "A2", "amount_paise": 300, "idempotency_key": "stdio-key"}
            )
            return looked_up, refunded, await client.logged("agent_retry.attempt", until=two_attempts_of("issue_refund"))

    looked_up, refunded, attempts = run(body())
    assert looked_up.is_error is not True and json.loads(text_of(looked_up))["order_id"] == "A2"
    assert refunded.is_error is not True, text_of(refunded)
    refunds = json.loads(ledger.read_text())["refunds"]
    assert [(r["order_id"], r["amount_paise"], r["idempotency_key"]) for r in refunds] == [("A2", 300, "stdio-key")]
    # Two attempts (a task's polls log lines of their attempt too), each with the client's key.
    sent = [line for line in attempts if line.get("tool") == "issue_refund"]
    assert sorted({line["attempt"] for line in sent}) == [1, 2]
    assert {line["key"] for line in sent} == {"stdio-key"}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_server_everything_through_the_proxy(files: Callable[..., Files], transport: str) -> None:
    if shutil.which("node") is None:
        pytest.fail("node is not installed (server-everything is a Node program)")
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: install it with `make fault-proxy-setup`")
    proxy = files()

    async def body() -> tuple[list[str], CallToolResult, str]:
        async with through_proxy(transport, proxy.args("--", "node", str(EVERYTHING), "stdio"), proxy.stderr) as client:
            info = client.session.server_info
            tools = await client.session.list_tools()
            result = await client.session.call_tool("echo", {"message": "through the proxy"})
            return [tool.name for tool in tools.tools], result, info.name if info is not None else ""

    names, result, server = run(body())
    assert "echo" in names
    assert server == "mcp-servers/everything"
    assert result.is_error is not True
    assert text_of(result) == "Echo: through the proxy"


# --- bad input ---------------------------------------------------------------


class RawStdio:
    """The stdio proxy driven with raw JSON-RPC lines (no SDK), each answer read with a bound."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [require_demo_server(), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=20)
        except queue.Empty:
            pytest.fail("the proxy did not answer within 20 s")
        assert line is not None, "the proxy closed stdout"
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def raw_stdio() -> Iterator[Callable[[list[str]], RawStdio]]:
    started: list[RawStdio] = []

    def start(args: list[str]) -> RawStdio:
        started.append(proxy := RawStdio(args))
        return proxy

    yield start
    for proxy in started:
        proxy.close()


def test_bad_lines_over_stdio_get_json_rpc_errors_and_the_proxy_stays_up(
    serve: Callable[..., Desk], files: Callable[..., Files], raw_stdio: Callable[[list[str]], RawStdio]
) -> None:
    desk = serve()
    proxy = raw_stdio(files({"max-message-bytes": 2048}).args("--upstream", desk.url))
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    proxy.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize}).encode())
    assert proxy.receive()["id"] == 1
    proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    proxy.send(b"this is not json")
    not_json = proxy.receive()
    assert (not_json["id"], not_json["error"]["code"]) == (None, -32700)

    oversized = {
        "jsonrpc": "2.0",
        "id": "big-7",
        "method": "tools/call",
        "params": {"name": "lookup_order", "arguments": {"order_id": "x" * 4000}},
    }
    proxy.send(json.dumps(oversized).encode())
    refused = proxy.receive()
    assert (refused["id"], refused["error"]["code"]) == ("big-7", -32600)
    assert "2048" in refused["error"]["message"]

    proxy.send(b'{"jsonrpc":"2.0","id":3,"method":"ping"}')
    assert proxy.receive() == {"jsonrpc": "2.0", "id": 3, "result": {}}
    assert proxy.process.poll() is None


def test_bad_posts_over_http_get_400_and_413_with_json_rpc_errors(serve: Callable[..., Desk], files: Callable[..., Files]) -> None:
    desk = serve()
    proxy = HttpProxy(files({"max-message-bytes": 2048}).args("--upstream", desk.url))
    try:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        with httpx2.Client(timeout=20) as client:
            not_json = client.post(proxy.url, content=b"this is not json", headers=headers)
            oversized = {"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"pad": "x" * 4000}}
            too_large = client.post(proxy.url, content=json.dumps(oversized).encode(), headers=headers)
        assert not_json.status_code == 400
        assert not_json.json()["jsonrpc"] == "2.0" and not_json.json()["error"]["code"] == -32700
        assert too_large.status_code == 413
        assert too_large.json()["jsonrpc"] == "2.0" and too_large.json()["error"]["code"] == -32600

        async def ping() -> None:
            async with streamable_http_client(proxy.url) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as session:
                    await session.initialize()
                    await session.send_ping()

        run(ping())
        assert proxy.process.poll() is None
    finally:
        proxy.close()


# --- an upstream that dies -----------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_upstream_that_dies_gives_an_error_result_and_the_proxy_stays_up(
    demo: Callable[..., DemoServer], files: Callable[..., Files], transport: str
) -> None:
    server = demo(ledger=True)
    proxy = files()

    async def body() -> tuple[CallToolResult, CallToolResult, bool]:
        async with through_proxy(transport, proxy.args("--upstream", server.url), proxy.stderr) as client:
            before = await client.session.call_tool("lookup_order", {"order_id": "A1"})
            server.close()
            after = await client.session.call_tool("lookup_order", {"order_id": "A1"})
            await client.session.send_ping()
            alive = client.process is None or client.process.poll() is None
            return before, after, alive

    before, after, alive = run(body())
    assert before.is_error is not True
    assert after.is_error is True
    assert "could not reach the MCP server" in text_of(after), text_of(after)
    assert alive
