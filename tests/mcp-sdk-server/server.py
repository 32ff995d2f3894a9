"""A streamable-HTTP MCP server built on the `mcp` 2.x Python SDK (`MCPServer`),
for the hosts' tests of sessions after a cut stream or a refused connection
(issue 24 row 10). Run with the repository's `.venv/bin/python`:

    server.py --port P --log FILE [--slow-s S] [--cut-calls] [--generation N] [--listen-at T]

- `lookup_order(order_id)` (read-only): answers `order <id> (generation N)`,
  after `--slow-s` seconds (0 by default). It writes `slow <id>` to the log
  before it sleeps, so a test knows when to kill the server mid-read.
- `--cut-calls`: every `tools/call` answer stream is cut after its headers
  (the TCP connection closed, no JSON-RPC response): a server that cuts every stream.
- `--generation N`: in the answers, and in `lookup_order`'s title, so a test
  can tell a restarted server's tool list from the first one's.
- `--listen-at T` (seconds since the epoch): binds the port no sooner than T,
  so that a test can start the replacement ahead (the SDK takes about 2 s to
  import) and choose how long nothing listens.

Every JSON-RPC request is logged as `<method> <mcp-session-id or ->`, one a
line, flushed: the tests count `initialize`/`server/discover` and `tools/list`.
Prints `listening <port>` once it accepts connections."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--cut-calls", action="store_true")
    parser.add_argument("--generation", type=int, default=1)
    parser.add_argument("--listen-at", type=float, default=0.0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the SDK's session lines would interleave with the tests' output
    log = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the process's life

    server = MCPServer("sdk-test-server")

    @server.tool(title=f"lookup order (generation {args.generation})", annotations=ToolAnnotations(readOnlyHint=True))
    async def lookup_order(order_id: str) -> str:
        if args.slow_s > 0:
            log.write(f"slow {order_id}\n")
            await asyncio.sleep(args.slow_s)
        return f"order {order_id} (generation {args.generation})"

    app = server.streamable_http_app()

    async def logged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method", "-")
        except (ValueError, AttributeError):
            method = "-"
        headers = dict(scope["headers"])
        log.write(f"{method} {headers.get(b'mcp-session-id', b'-').decode()}\n")
        if args.cut_calls and method == "tools/call":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b": cut next\n\n", "more_body": True})
            raise ConnectionAbortedError("--cut-calls: the answer stream is cut")  # uvicorn closes the connection
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    config = uvicorn.Config(logged, host="127.0.0.1", port=args.port, log_level="critical", lifespan="on")
    instance = uvicorn.Server(config)

    async def serve() -> None:
        await asyncio.sleep(max(0.0, args.listen_at - time.time()))
        task = asyncio.create_task(instance.serve())
        while not instance.started:
            if task.done():
                await task
                sys.exit(1)
            await asyncio.sleep(0.01)
        print(f"listening {args.port}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
