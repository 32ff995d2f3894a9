"""A real MCP server over streamable HTTP, with scripted faults, for the end-to-end tests.

The tools are an order desk: `lookup_order` (a read), `issue_refund` (a write
that takes an `idempotency_key` and applies each key once), `issue_refund_unkeyed`
(a write that takes no key), `list_refunds` (the read a status check uses),
`validate_amount` (fails with `isError: true`), `search_orders` (returns
nothing) and `delete_asset` (a delete). `fetch_report` (a read), `ask_model` (a
read) and `reserve_stock` (a keyed write) relay an upstream failure the way
real MCP servers do: as an `isError` result (text, or structured content) or a
JSON-RPC error, over HTTP 200 with no status or header of the upstream's
reaching the client; `ServerState.relay` scripts what they relay.

An ASGI middleware in front of the MCP app answers scripted `tools/call` POSTs
itself: an HTTP status with headers and a body (503, 429 + Retry-After, 400,
403), or lets the call run and holds the response back (the client times out
although the write was applied). `ledger` records every refund applied, so a
test can see that a write was not applied twice.

Run it alone with `python tests/fault_server.py` (prints its URL) for manual
tries; the tests start it in a thread on an ephemeral port of 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Union

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, ToolAnnotations


@dataclass(frozen=True)
class HttpFault:
    """Answer the POST with this status instead of running the tool."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: str = ""


@dataclass(frozen=True)
class SlowResponse:
    """Run the tool, then hold the response back this long."""

    seconds: float


Fault = Union[HttpFault, SlowResponse]


@dataclass(frozen=True)
class RaiseToolError:
    """The tool raises `ToolError(message)`: the SDK answers an `isError` result
    whose text is "Error executing tool <name>: <message>"."""

    message: str


@dataclass(frozen=True)
class ErrorResult:
    """The tool returns this `isError` result itself (text and structured content)."""

    text: str
    structured: dict[str, Any] | None = None


@dataclass(frozen=True)
class RaiseMcpError:
    """The tool raises `MCPError`: the SDK answers a JSON-RPC error with this code, message and data."""

    code: int
    message: str
    data: Any = None


Relayed = Union[RaiseToolError, ErrorResult, RaiseMcpError]


@dataclass
class Refund:
    order_id: str
    amount: int
    idempotency_key: str | None


@dataclass
class ServerState:
    """The script and what the server saw: shared by the test and the server thread."""

    faults: dict[str, deque[Fault]] = field(default_factory=lambda: defaultdict(deque))
    ledger: list[Refund] = field(default_factory=list)
    tool_posts: list[tuple[str, float, str | None]] = field(default_factory=list)  # (tool, time, key)
    relayed: dict[str, deque[Relayed]] = field(default_factory=lambda: defaultdict(deque))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def relay(self, tool: str, *failures: Relayed) -> None:
        """The next runs of `tool` relay these upstream failures, in order; later runs succeed."""
        with self.lock:
            self.relayed[tool].extend(failures)

    def next_relayed(self, tool: str) -> Relayed | None:
        with self.lock:
            queue = self.relayed.get(tool)
            return queue.popleft() if queue else None

    def script(self, tool: str, *faults: Fault) -> None:
        """The next calls of `tool` get these faults, in order; later calls run normally."""
        with self.lock:
            self.faults[tool].extend(faults)

    def next_fault(self, tool: str) -> Fault | None:
        with self.lock:
            queue = self.faults.get(tool)
            return queue.popleft() if queue else None

    def posts_of(self, tool: str) -> list[tuple[str, float, str | None]]:
        with self.lock:
            return [p for p in self.tool_posts if p[0] == tool]

    def refunds(self) -> list[Refund]:
        with self.lock:
            return list(self.ledger)


def build_app(state: ServerState) -> Any:
    server = MCPServer("order-desk")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup_order(order_id: str) -> str:
        """Looks an order up."""
        return json.dumps({"order_id": order_id, "status": "delivered", "total": 4999})

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def issue_refund(order_id: str, amount: int, idempotency_key: str = "") -> str:
        """Refunds `amount` paise; a key already applied is not applied again."""
        with state.lock:
            key = idempotency_key or None
            if key is not None and any(r.idempotency_key == key for r in state.ledger):
                return f"refund for {order_id} already applied (key {key})"
            state.ledger.append(Refund(order_id, amount, key))
            return f"refunded {amount} on {order_id}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def issue_refund_unkeyed(order_id: str, amount: int) -> str:
        """A legacy refund endpoint that takes no idempotency key."""
        with state.lock:
            state.ledger.append(Refund(order_id, amount, None))
        return f"refunded {amount} on {order_id}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def list_refunds(order_id: str) -> str:
        with state.lock:
            return json.dumps([r.amount for r in state.ledger if r.order_id == order_id])

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def validate_amount(amount: int) -> str:
        raise ToolError(f"amount must be at most 5000 paise, got {amount}")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def search_orders(query: str) -> list[str]:
        return []

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    def delete_asset(asset_id: str) -> str:
        return f"deleted {asset_id}"

    def relayed_failure(tool: str) -> CallToolResult | None:
        failure = state.next_relayed(tool)
        if isinstance(failure, RaiseToolError):
            raise ToolError(failure.message)
        if isinstance(failure, RaiseMcpError):
            raise MCPError(failure.code, failure.message, failure.data)
        if isinstance(failure, ErrorResult):
            return CallToolResult(
                content=[TextContent(type="text", text=failure.text)], structured_content=failure.structured, is_error=True
            )
        return None

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def fetch_report(report_id: str) -> Any:
        """Fetches a report from an upstream API."""
        return relayed_failure("fetch_report") or f"report {report_id}: 12 refunds"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def ask_model(prompt: str) -> Any:
        """Asks an upstream model provider."""
        return relayed_failure("ask_model") or f"answer to {prompt!r}: 42"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def reserve_stock(sku: str, quantity: int, idempotency_key: str = "") -> Any:
        """Reserves stock in an upstream inventory system."""
        return relayed_failure("reserve_stock") or f"reserved {quantity} of {sku}"

    return FaultInjector(server.streamable_http_app(), state)


class FaultInjector:
    """ASGI middleware: scripted faults for `tools/call` POSTs."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        fault: Fault | None = None
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if isinstance(request, dict) and request.get("method") == "tools/call":
            params = request.get("params") or {}
            tool = params.get("name", "")
            key = (params.get("arguments") or {}).get("idempotency_key")
            with self.state.lock:
                self.state.tool_posts.append((tool, time.monotonic(), key))
            fault = self.state.next_fault(tool)

        if isinstance(fault, HttpFault):
            headers = [(b"content-type", b"text/plain; charset=utf-8")]
            headers += [(k.lower().encode(), v.encode()) for k, v in fault.headers]
            await send({"type": "http.response.start", "status": fault.status, "headers": headers})
            await send({"type": "http.response.body", "body": fault.body.encode()})
            return

        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if isinstance(fault, SlowResponse):
            delay = fault.seconds

            async def slow_send(message: Any) -> None:
                if message["type"] == "http.response.start":
                    await asyncio.sleep(delay)
                try:
                    await send(message)
                except Exception:
                    pass  # the client gave up waiting; that is the point

            await self.app(scope, replay, slow_send)
            return
        await self.app(scope, replay, send)


class RunningServer:
    """The app under uvicorn in a background thread, on an ephemeral port of 127.0.0.1."""

    def __init__(self, state: ServerState | None = None) -> None:
        self.state = state or ServerState()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        # Open SSE streams must not hold a shutdown up for long.
        config = uvicorn.Config(build_app(self.state), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test MCP server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


if __name__ == "__main__":
    with RunningServer() as running:
        print(running.url, flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
