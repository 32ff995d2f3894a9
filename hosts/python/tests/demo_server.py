"""The one MCP server of the host's tests: the demo server (`demo-server/`, run
as `target/release/agent-retry serve --http 127.0.0.1:0 ...`).

- `DemoServer` starts it with a fault script (a JSON array of rules, see
  demo-server/src/faults.rs; `http`, `tool_text` and `timeout_after_apply`
  build its faults), a ledger file and any other flags, reads its URL from the
  line it prints on stderr, reads its ledger, and stops it.
- `Desk` is a server a test runs against with every `tools/call` the client
  sent it, recorded on the client's HTTP layer (`Desk.record`, an httpx2
  request hook): the tool, when, its arguments.
- conftest.py's fixtures `demo` and `serve` stop what a test started.

The binary is built by `make judge-setup`; without it a test fails, it does
not skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

REPO = Path(__file__).resolve().parents[3]
# $AGENT_RETRY_BIN: another build of the binary (e.g. one made from a work tree of its own).
AGENT_RETRY = Path(os.environ.get("AGENT_RETRY_BIN") or REPO / "target" / "release" / "agent-retry")
_READY = re.compile(r"demo MCP server at (\S+)")


def require_demo_server(*flags: str) -> str:
    """The demo server binary, which must know `flags` (e.g. `--era`)."""
    if not AGENT_RETRY.exists():
        pytest.fail(f"{AGENT_RETRY} is missing: build it (`make judge-setup`)")
    if flags:
        usage = subprocess.run([str(AGENT_RETRY), "serve", "--help"], capture_output=True, text=True, timeout=30)
        missing = [flag for flag in flags if flag not in usage.stdout + usage.stderr]
        if missing:
            pytest.fail(f"{AGENT_RETRY} serve has no {', '.join(missing)}: rebuild it from a tree that has them")
    return str(AGENT_RETRY)


class DemoServer:
    """`agent-retry serve --http 127.0.0.1:0 [--faults F] [--ledger L] ARGS`.

    `faults`: the fault script's rules; `ledger`: keep the ledger in a file that
    `ledger()` reads; `require`: flags the binary must know."""

    def __init__(self, *args: str, faults: list[dict[str, Any]] | None = None, ledger: bool = False, require: tuple[str, ...] = ()) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="agent-retry-demo-")
        self.ledger_path: Path | None = Path(self._dir.name, "ledger.json") if ledger else None
        command = [require_demo_server(*require), "serve", "--http", "127.0.0.1:0"]
        if faults is not None:
            script = Path(self._dir.name, "faults.json")
            script.write_text(json.dumps(faults))
            command += ["--faults", str(script)]
        if self.ledger_path is not None:
            command += ["--ledger", str(self.ledger_path)]
        command += args
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # keeps reading, so that the pipe never fills
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.stderr.append(line)
                matched = _READY.search(line)
                if matched and not found:
                    found.append(matched.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or not found:
            self.close()
            pytest.fail(f"the demo server did not start ({' '.join(command)}): {''.join(self.stderr)[-2000:]}")
        self.url = found[0]

    def ledger(self) -> dict[str, Any]:
        """What the server applied (demo-server/src/ledger.rs): `refunds`, `notes`,
        `assets`, `uploads`; all empty before its first applied call."""
        assert self.ledger_path is not None, "start the server with ledger=True"
        ledger = json.loads(self.ledger_path.read_text()) if self.ledger_path.exists() else {}
        return {"refunds": [], "notes": [], "assets": {}, "uploads": {}, **ledger}

    def close(self) -> None:
        """Stops the server (it is gone when this returns)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._dir.cleanup()

    def __enter__(self) -> DemoServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Post:
    """A `tools/call` the client sent: the tool, when (time.monotonic()), its arguments."""

    tool: str
    at: float
    arguments: dict[str, Any]


class Desk:
    """The MCP server a test runs against (the demo server, with its fault script
    and ledger), and every `tools/call` the client sent it, recorded by a request
    hook on the client's HTTP layer just before it goes out."""

    def __init__(self, url: str, server: DemoServer | None = None) -> None:
        self.url = url
        self.server = server
        self.posts: list[Post] = []
        self._lock = threading.Lock()

    async def record(self, request: httpx2.Request) -> None:
        if request.method != "POST":
            return
        try:
            message = json.loads(request.content)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("method") == "tools/call":
            params = message.get("params") or {}
            with self._lock:
                self.posts.append(Post(params.get("name", ""), time.monotonic(), dict(params.get("arguments") or {})))

    def posts_of(self, tool: str) -> list[Post]:
        with self._lock:
            return [post for post in self.posts if post.tool == tool]

    def refunds(self) -> list[tuple[str, int, str | None]]:
        """The refunds the server applied: (order, paise, idempotency key)."""
        assert self.server is not None
        return [(r["order_id"], r["amount_paise"], r["idempotency_key"]) for r in self.server.ledger()["refunds"]]

    def notes(self) -> list[tuple[str, str]]:
        """The notes the server applied: (order, text)."""
        assert self.server is not None
        return [(n["order_id"], n["text"]) for n in self.server.ledger()["notes"]]


def http(status: int, body: str = "", headers: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """A fault: this HTTP answer instead of running the tool."""
    return {"kind": "http", "status": status, "headers": [list(h) for h in headers], "body": body}


def tool_text(text: str, structured: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fault: an `isError` result relaying an upstream failure, its text (and structured content) only."""
    return {"kind": "tool-text", "text": text, **({"structured": structured} if structured is not None else {})}


def timeout_after_apply(delay_ms: int) -> dict[str, Any]:
    """A fault: the tool runs (a write is applied), then its answer is held back this long."""
    return {"kind": "timeout-after-apply", "delay-ms": delay_ms}
