"""Sessions after a cut stream or a refused connection (issue 24 row 10), against
the `mcp` 2.x Python SDK's own streamable-HTTP server (tests/mcp-sdk-server/server.py):

- the server SIGKILLed while a read runs, started again on the same port 1.5 s
  later: the call completes on a new session (the cut session is suspect);
- a refused connection (nothing listening for a moment): completes on a new session;
- a server that cuts every answer stream: exactly `max_reconnects_per_run` new
  sessions, then the escalation whose note says the reconnections are spent;
- after a reconnection the tool list is read again (the restarted server's title).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mcp.types import CallToolResult, TextContent

from agent_retry_policy import EmbeddedAccounts, Escalated, McpConnection, PolicyComponent, RetryingToolCaller, SplitMix64

REPO = Path(__file__).resolve().parents[3]
SERVER = REPO / "tests" / "mcp-sdk-server" / "server.py"
PYTHON = REPO / ".venv" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# How long nothing listens between the kill and the restarted server (issue 24 row 10).
DOWN_S = 1.5
# The SDK server takes about 2 s to import: its replacement is started this long
# before it listens (`--listen-at`), so that the gap is DOWN_S, not the import's time.
IMPORT_S = 4.0


class SdkServer:
    """The SDK server on a fixed port, started (again) and killed by the test; its request log."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.log = tmp_path / "requests.log"
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.processes: list[subprocess.Popen[str]] = []

    def spawn(self, *flags: str, listen_at: float = 0.0) -> subprocess.Popen[str]:
        command = [str(PYTHON), str(SERVER), "--port", str(self.port), "--log", str(self.log), "--listen-at", str(listen_at), *flags]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.processes.append(process)
        return process

    @staticmethod
    def listening(process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening"), f"the SDK server did not start: {line!r}"

    def start(self, *flags: str) -> None:
        self.listening(self.spawn(*flags))

    async def kill_and_restart(self, *flags: str) -> None:
        """SIGKILLs the server, and has its replacement listen DOWN_S later on the same port."""
        kill_at = time.time() + IMPORT_S
        replacement = self.spawn(*flags, listen_at=kill_at + DOWN_S)
        await asyncio.sleep(max(0.0, kill_at - time.time()))
        self.kill(self.processes[-2])
        await asyncio.to_thread(self.listening, replacement)

    def kill(self, process: subprocess.Popen[str] | None = None) -> None:
        for each in [process] if process is not None else self.processes:
            if each.poll() is None:
                os.kill(each.pid, signal.SIGKILL)
                each.wait()

    def requests(self) -> list[str]:
        return [line.split()[0] for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def connects(self) -> int:
        """New sessions asked for: the first request of each negotiation (legacy: `initialize`)."""
        return sum(1 for method in self.requests() if method in ("server/discover", "initialize"))


@pytest.fixture
def sdk_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    server = SdkServer(tmp_path)
    yield server
    server.kill()


def new_caller(connection: McpConnection, run_id: str, config: dict[str, object] | None = None, **options: object) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(config if config is not None else {}).start_run(run_id)
    return RetryingToolCaller(connection, run, entropy=SplitMix64(3), **options)  # type: ignore[arg-type]


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def wait_for(predicate, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    ends = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > ends:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_server_killed_mid_read_and_restarted_is_reached_on_a_new_session(sdk_server: SdkServer) -> None:
    sdk_server.start("--slow-s", "30")

    async def body() -> tuple[CallToolResult, int]:
        async with McpConnection.http(sdk_server.url, mode="legacy") as connection:
            caller = new_caller(connection, "row10-kill")
            call = asyncio.ensure_future(caller.call_tool("lookup_order", {"order_id": "K1"}))
            await wait_for(lambda: "slow" in sdk_server.requests(), "the slow read to start")
            await sdk_server.kill_and_restart("--generation", "2")  # mid-read: the answer stream is cut
            result = await call
            return result, connection.generation

    result, _ = asyncio.run(body())
    assert not result.is_error and "generation 2" in text_of(result), text_of(result)
    requests = sdk_server.requests()
    # A new session on the restarted server: its negotiation, then the retried read.
    restarted = requests[requests.index("slow") + 1 :]
    assert restarted[0] == "initialize" and "tools/call" in restarted, requests


def test_a_refused_connection_is_reached_again_on_a_new_session(sdk_server: SdkServer) -> None:
    sdk_server.start()

    async def body() -> tuple[CallToolResult, CallToolResult]:
        async with McpConnection.http(sdk_server.url, mode="legacy") as connection:
            caller = new_caller(connection, "row10-refused")
            first = await caller.call_tool("lookup_order", {"order_id": "R1"})
            restart = asyncio.ensure_future(sdk_server.kill_and_restart("--generation", "2"))
            await wait_for(lambda: len(sdk_server.processes) == 2 and sdk_server.processes[0].poll() is not None, "the kill")
            # Nothing listens: the attempt's connection is refused.
            second = await caller.call_tool("lookup_order", {"order_id": "R2"})
            await restart
            return first, second

    first, second = asyncio.run(body())
    assert "generation 1" in text_of(first) and "generation 2" in text_of(second), (text_of(first), text_of(second))
    assert sdk_server.connects() == 2, sdk_server.requests()


def test_a_server_that_cuts_every_stream_gets_max_reconnects_per_run_new_sessions_then_an_escalation(
    sdk_server: SdkServer,
) -> None:
    sdk_server.start("--cut-calls")
    # Enough attempts for the budget to end the call, not the per-call limit.
    config = {"base-delay-ms": 10, "max-delay-ms": 20, "max-attempts-per-call": 8}

    async def body() -> Escalated:
        async with McpConnection.http(sdk_server.url) as connection:
            caller = new_caller(connection, "row10-budget", config, max_reconnects_per_run=2)
            with pytest.raises(Escalated) as raised:
                await caller.call_tool("lookup_order", {"order_id": "B1"})
            return raised.value

    escalated = asyncio.run(body())
    # The first session and exactly two more; three cut attempts, then none sent.
    assert sdk_server.connects() == 3, sdk_server.requests()
    assert sdk_server.requests().count("tools/call") == 3, sdk_server.requests()
    note = escalated.escalation["note"]
    assert "reconnections spent: 2 new sessions in this run (max_reconnects_per_run 2)" in note, note


def test_the_default_budget_is_3() -> None:
    from agent_retry_policy.mcp_client import DEFAULT_MAX_RECONNECTS_PER_RUN

    assert DEFAULT_MAX_RECONNECTS_PER_RUN == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_max_reconnects_per_run_must_be_a_non_negative_integer(bad: object) -> None:
    connection = McpConnection.http("http://127.0.0.1:9/mcp")
    with pytest.raises(ValueError, match="max_reconnects_per_run"):
        new_caller(connection, "row10-option", max_reconnects_per_run=bad)


def test_the_tool_list_is_read_again_after_a_reconnection(sdk_server: SdkServer) -> None:
    sdk_server.start()

    async def body() -> tuple[str | None, str | None]:
        async with McpConnection.http(sdk_server.url) as connection:
            caller = new_caller(connection, "row10-relist")
            await caller.call_tool("lookup_order", {"order_id": "L1"})
            before = caller._tools["lookup_order"].title if caller._tools else None
            restart = asyncio.ensure_future(sdk_server.kill_and_restart("--generation", "2"))
            await wait_for(lambda: len(sdk_server.processes) == 2 and sdk_server.processes[0].poll() is not None, "the kill")
            await caller.call_tool("lookup_order", {"order_id": "L2"})  # refused, then a new session
            await restart
            await caller.call_tool("lookup_order", {"order_id": "L3"})
            after = caller._tools["lookup_order"].title if caller._tools else None
            return before, after

    before, after = asyncio.run(body())
    assert before == "lookup order (generation 1)" and after == "lookup order (generation 2)", (before, after)
    requests = sdk_server.requests()
    # Listed on the first session, and again on the new one (the SDK may list on its own too).
    reconnected = [i for i, method in enumerate(requests) if method == "server/discover"][1]
    assert "tools/list" in requests[:reconnected] and "tools/list" in requests[reconnected:], " ".join(requests)
