"""What real transports do to the MCP wrapper: the scenarios T1..T12 of
tests/fault-proxy/README.md, with the project's fault programs
(`tests/fault-proxy/proxy.mjs` for streamable HTTP, `stdio.mjs` for stdio), the
demo server (`target/release/agent-retry serve ... --ledger PATH`) and the
third-party `@modelcontextprotocol/server-everything`. Each test asserts what
the server's ledger (or the proxy's and the shim's logs) shows: no duplicate
effect, no lost call, and the model shown only errors it can act on.

Needs node, `make judge-setup` (the demo server binary) and `make
fault-proxy-setup` (server-everything); `make test-python` does both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import select
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from log_lines import MCP_LOGGER, logged
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from agent_retry_policy import (
    CallCancelled,
    CallTimedOut,
    EmbeddedAccounts,
    Escalated,
    McpConnection,
    PolicyComponent,
    RetryingToolCaller,
    SessionLost,
    SplitMix64,
)
from agent_retry_policy.mcp_client import CAPTURE_MISSING_SUFFIX, StatusCheckRequest
from agent_retry_policy.types import RunReport, Verdict

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
FAULT_PROXY = REPO / "tests" / "fault-proxy"
AGENT_RETRY = REPO / "target" / "release" / "agent-retry"
EVERYTHING = FAULT_PROXY / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

# Short policy delays, so that each test is quick.
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200}
# Long enough that "seen at once" is told apart from "seen at the timeout".
ATTEMPT_TIMEOUT_S = 10.0


def require(path: Path, how: str) -> str:
    if shutil.which("node") is None:
        pytest.fail("node is not installed (the fault proxy is a Node program)")
    if not path.exists():
        pytest.fail(f"{path} is missing: {how}")
    return str(path)


def demo_command(*args: str) -> list[str]:
    return [require(AGENT_RETRY, "build it with `make judge-setup`"), "serve", *args]


def everything_command(mode: str) -> list[str]:
    return ["node", require(EVERYTHING, "install it with `make fault-proxy-setup`"), mode]


class Proxy:
    """`node proxy.mjs -- <server>`: its URL, its fault queue, its log."""

    def __init__(self, server: list[str]) -> None:
        program = require(FAULT_PROXY / "proxy.mjs", "tests/fault-proxy/proxy.mjs is part of the repository")
        self.process = subprocess.Popen(["node", program, "--", *server], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            self.close()
            pytest.fail(f"the fault proxy did not start: {' '.join(server)}")
        info = json.loads(line)
        self.base: str = info["url"]
        self.url = f"{self.base}/mcp"

    def _post(self, path: str, value: Any = None) -> Any:
        data = json.dumps(value).encode() if value is not None else b""
        request = urllib.request.Request(f"{self.base}/__proxy/{path}", data=data, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def faults(self, *faults: dict[str, Any]) -> None:
        self._post("faults", list(faults))

    def restart(self) -> None:
        self._post("restart")

    def log(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.base}/__proxy/log", timeout=30) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Shim:
    """`node stdio.mjs --script S --log L -- <server>`, as the command of an
    `McpConnection.stdio`: its faults file and its log."""

    def __init__(self, tmp_path: Path, server: list[str], faults: list[dict[str, Any]]) -> None:
        self.script = tmp_path / "stdio-faults.json"
        self.log_path = tmp_path / "stdio-log.jsonl"
        self.script.write_text(json.dumps(faults))
        program = require(FAULT_PROXY / "stdio.mjs", "tests/fault-proxy/stdio.mjs is part of the repository")
        self.args = [program, "--script", str(self.script), "--log", str(self.log_path), "--", *server]

    def connection(self) -> McpConnection:
        return McpConnection.stdio("node", self.args)

    def log(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def remaining_faults(self) -> list[dict[str, Any]]:
        return json.loads(self.script.read_text())


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.json"


def read_ledger(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"refunds": [], "notes": []}
    ledger = json.loads(path.read_text())
    return {"refunds": ledger.get("refunds", []), "notes": ledger.get("notes", [])}


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


def new_caller(
    connection: McpConnection | ClientSession, run_id: str, config: dict[str, Any] | None = None, **kwargs: Any
) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(config or CONFIG).start_run(run_id)
    kwargs.setdefault("attempt_timeout_s", ATTEMPT_TIMEOUT_S)
    return RetryingToolCaller(connection, run, entropy=SplitMix64(3), **kwargs)


def key_of(run_id: str, step: int = 1) -> str:
    return PolicyComponent.load().instantiate().derive_idempotency_key(run_id, f"step-{step}")


def text_of(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def log_lines(caplog: pytest.LogCaptureFixture, event: str = "agent_retry.attempt") -> list[dict[str, Any]]:
    return logged(caplog, MCP_LOGGER, event)


def outcomes(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    # A refund the demo server answers with a task is polled (Tasks extension):
    # the polls are not attempts, and these scenarios are about the attempts.
    return [(line["tool"], line["outcome"], line["action"]) for line in log_lines(caplog) if line["action"] != "poll"]


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())  # type: ignore[arg-type]


async def note_listed(request: StatusCheckRequest) -> str:
    """The status check of record_note: is the note in list_notes?"""
    listed = await request.session.call_tool("list_notes", {"order_id": request.arguments["order_id"]})
    if listed.is_error or not isinstance(listed.structured_content, dict):
        return "unknown"
    notes = listed.structured_content.get("notes", [])
    return "found" if any(note.get("text") == request.arguments["text"] for note in notes) else "absent"


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of ours is gone too (exited, not yet reaped).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


# --- streamable HTTP, the demo server ---------------------------------------


def test_T1_a_restarted_server_loses_the_session_and_the_wrapper_reinitialises(
    proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--sessions", "--ledger", str(ledger)))

    verdicts: list[tuple[str, int, Verdict]] = []

    async def body() -> tuple[CallToolResult, CallToolResult, int]:
        # A session (Mcp-Session-Id) exists only with the handshake: 2026-07-28 has none.
        async with McpConnection.http(proxy.url, mode="legacy") as connection:
            caller = new_caller(connection, "T1", on_verdict=lambda *seen: verdicts.append(seen))
            looked_up = await caller.call_tool("lookup_order", {"order_id": "A1"})
            proxy.restart()  # every session the server held is gone
            refunded = await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})
            return looked_up, refunded, connection.generation

    looked_up, refunded, generation = run(body)
    assert not looked_up.is_error
    assert not refunded.is_error, text_of(refunded)
    assert "session" not in text_of(refunded).lower()
    initializes = [entry for entry in proxy.log() if entry["rpc"] == "initialize"]
    assert len(initializes) == 2 and not initializes[1]["session"]
    lost = [entry for entry in proxy.log() if entry["rpc"] == "tools/call" and entry["status"] == 404]
    assert len(lost) == 1 and lost[0]["session"], proxy.log()
    # The wrapper reports the 404 as it came (it sent a session id); the policy
    # says the session is lost (rule lost-session) and to reconnect before the
    # retry; the wrapper does so: a new handshake, then the same key.
    assert outcomes(caplog) == [
        ("initialize", "success", "succeed"),
        ("tools/list", "success", "succeed"),
        ("lookup_order", "success", "succeed"),
        ("issue_refund", "http 404", "retry"),
        ("initialize", "success", "succeed"),
        ("issue_refund", "success", "succeed"),
    ]
    lost_verdict = next(v for tool, attempt, v in verdicts if (tool, attempt) == ("issue_refund", 1))
    assert (lost_verdict.action, lost_verdict.reconnect) == ("retry", True), lost_verdict
    assert generation == 2, "one new session, opened because the verdict said reconnect"
    refund_lines = [line for line in log_lines(caplog) if line["tool"] == "issue_refund"]
    assert refund_lines[0]["rule"] == "lost-session", refund_lines[0]
    assert all(line["step"] == 2 and line["key"] == key_of("T1", 2) for line in refund_lines)
    assert [line["step"] for line in log_lines(caplog) if line["tool"] in ("initialize", "tools/list")] == [None, None, None]
    refunds = read_ledger(ledger)["refunds"]
    assert [(r["order_id"], r["amount_paise"], r["idempotency_key"]) for r in refunds] == [("A1", 500, key_of("T1", 2))]


def test_T1_a_bare_session_that_is_lost_raises_SessionLost_not_an_sdk_error(
    proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--sessions", "--ledger", str(ledger)))

    async def body() -> None:
        # Raised inside the SDK's context managers, an error would come out wrapped
        # in their task groups' ExceptionGroup: kept, and raised after they closed.
        failure: BaseException | None = None
        async with streamable_http_client(proxy.url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            caller = new_caller(session, "T1-bare")
            assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
            proxy.restart()
            try:
                await caller.call_tool("issue_refund", {"order_id": "A1", "amount_paise": 500})
            except Exception as e:
                failure = e
        if failure is not None:
            raise failure

    with pytest.raises(SessionLost) as raised:
        run(body)
    assert "cannot re-establish" in str(raised.value) and raised.value.tool == "issue_refund"
    # Without the capturing client, the wrapper reports what the SDK's own error
    # stands for (a 404 to a request that carried a session id, nothing more);
    # the policy says reconnect, which a bare session cannot do.
    (lost,) = [line for line in log_lines(caplog) if line["tool"] == "issue_refund"]
    assert (lost["outcome"], lost["action"], lost["rule"]) == ("http 404", "retry", "lost-session"), lost
    assert lost["reason"].endswith(CAPTURE_MISSING_SUFFIX), lost["reason"]
    assert read_ledger(ledger)["refunds"] == []


def test_T2_a_cut_answer_to_a_keyed_write_is_seen_at_once_and_resent_with_the_same_key(
    proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--ledger", str(ledger)))
    proxy.faults({"on": "tools/call", "tool": "issue_refund", "fault": "cut-during"})

    async def body() -> tuple[CallToolResult, float, int]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T2")
            started = time.monotonic()
            result = await caller.call_tool("issue_refund", {"order_id": "A2", "amount_paise": 700})
            return result, time.monotonic() - started, connection.generation

    result, elapsed, generation = run(body)
    assert not result.is_error, text_of(result)
    assert elapsed < ATTEMPT_TIMEOUT_S / 2, f"the cut was seen after {elapsed:.2f} s, not at once"
    # The cut left the session suspect: the retry went on a new one (issue 24 row 10).
    connects = [entry["rpc"] for entry in proxy.log() if entry["rpc"] in ("initialize", "server/discover")]
    assert generation == 2 and connects == ["server/discover", "server/discover"], connects
    calls = [entry for entry in proxy.log() if entry["rpc"] == "tools/call"]
    assert [entry["fault"] for entry in calls] == ["cut-during", None]
    # The retry is answered by a task (the demo server speaks the Tasks extension): its polls are not attempts.
    lines = [line for line in log_lines(caplog) if line["tool"] == "issue_refund" and line["action"] != "poll"]
    assert [(line["attempt"], line["outcome"], line["action"]) for line in lines] == [
        (1, "transport stream-closed", "retry"),
        (2, "success", "succeed"),
    ]
    assert lines[0]["key"] == lines[1]["key"] == key_of("T2")
    refunds = read_ledger(ledger)["refunds"]
    assert [(r["order_id"], r["idempotency_key"]) for r in refunds] == [("A2", key_of("T2"))]


def test_T3_a_cut_answer_to_an_unkeyed_write_is_status_checked_not_resent(
    proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--ledger", str(ledger)))
    proxy.faults({"on": "tools/call", "tool": "record_note", "fault": "cut-during"})
    checks: list[StatusCheckRequest] = []

    async def check(request: StatusCheckRequest) -> str:
        checks.append(request)
        return await note_listed(request)

    async def body() -> tuple[CallToolResult, int]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T3", status_check={"record_note": check})
            result = await caller.call_tool("record_note", {"order_id": "A3", "text": "customer called"})
            return result, connection.generation

    result, generation = run(body)
    assert not result.is_error, text_of(result)
    assert generation == 2  # the cut left the session suspect: the status check went on a new one
    assert len(checks) == 1 and checks[0].idempotency_key is None
    assert [entry["tool"] for entry in proxy.log() if entry["rpc"] == "tools/call"] == ["record_note", "list_notes"]
    assert read_ledger(ledger)["notes"] == [{"order_id": "A3", "text": "customer called"}]
    lines = [line for line in log_lines(caplog) if line["tool"] == "record_note"]
    assert [(line["outcome"], line["action"]) for line in lines] == [
        ("transport stream-closed", "check-status"),
        ("status check found", "succeed"),
    ]


# What the wrapper sees of each cut: before the answer, a reset connection; during
# it, a stream closed before the response; after it, nothing (the answer was whole).
CUT_SEEN_AS = {"cut-before": "transport connection-reset", "cut-during": "transport stream-closed", "cut-after": None}


@pytest.mark.parametrize("cut", list(CUT_SEEN_AS))
def test_T4_cut_initialize_tools_list_and_get_stream_are_retried_and_the_session_lives_on(
    cut: str, proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--sessions", "--ledger", str(ledger)))
    proxy.faults({"on": "initialize", "fault": cut}, {"on": "tools/list", "fault": cut}, {"on": "GET", "fault": cut})

    async def body() -> tuple[CallToolResult, CallToolResult, int, int]:
        # The handshake and its GET stream: the legacy era (test_mcp_versions.py cuts the probe).
        async with McpConnection.http(proxy.url, mode="legacy") as connection:
            caller = new_caller(connection, "T4")
            first = await caller.call_tool("issue_refund", {"order_id": "A4", "amount_paise": 400})
            generation = connection.generation
            for _ in range(100):  # the SDK opens its GET stream on its own, after initialize
                if any(entry["http"] == "GET" for entry in proxy.log()):
                    break
                await asyncio.sleep(0.02)
            second = await caller.call_tool("lookup_order", {"order_id": "A4"})
            return first, second, generation, connection.generation

    first, second, generation, generation_after = run(body)
    assert not first.is_error and not second.is_error
    assert generation == generation_after  # no session was lost after the first call
    faulted = sorted((entry["rpc"], entry["fault"]) for entry in proxy.log() if entry["fault"])
    assert faulted == [("GET", cut), ("initialize", cut), ("tools/list", cut)]
    seen = CUT_SEEN_AS[cut]
    # One session after the failed initialize, one more after the cut tools/list
    # (it left its session suspect), kept to the end.
    assert [entry["rpc"] for entry in proxy.log()].count("initialize") == (3 if seen else 1)
    assert generation == (3 if seen else 1)
    failed = [("initialize", seen, "retry")] if seen else []
    listed = [("tools/list", seen, "retry"), ("initialize", "success", "succeed")] if seen else []
    assert outcomes(caplog) == [
        *failed,
        ("initialize", "success", "succeed"),
        *listed,
        ("tools/list", "success", "succeed"),
        ("issue_refund", "success", "succeed"),
        ("lookup_order", "success", "succeed"),
    ]
    assert len(read_ledger(ledger)["refunds"]) == 1


def test_T8_a_bare_session_without_the_capturing_client_warns_once_and_says_so_in_the_reason(
    proxies: Callable[[list[str]], Proxy], tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    script = tmp_path / "faults.json"
    throttle = {"kind": "http", "status": 429, "headers": [["Retry-After", "1"]], "body": "slow down"}
    script.write_text(
        json.dumps(
            [
                {"tool": "lookup_order", "when": {"order_id": "A8"}, "first": 2, "fault": throttle},
                {"tool": "lookup_order", "when": {"order_id": "B8"}, "first": 1, "fault": throttle},
            ]
        )
    )
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--faults", str(script), "--ledger", str(ledger)))

    async def bare() -> CallToolResult:
        async with streamable_http_client(proxy.url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            caller = new_caller(session, "T8-bare")
            return await caller.call_tool("lookup_order", {"order_id": "A8"})

    assert not run(bare).is_error
    warnings = log_lines(caplog, "agent_retry.capture_missing")
    assert len(warnings) == 1, warnings
    failed = [line for line in log_lines(caplog) if line["tool"] == "lookup_order" and line["outcome"] != "success"]
    assert [line["outcome"] for line in failed] == ["json-rpc -32603", "json-rpc -32603"]
    assert all(line["reason"].endswith(CAPTURE_MISSING_SUFFIX) for line in failed)
    succeeded = [line for line in log_lines(caplog) if line["outcome"] == "success"]
    assert succeeded and not any(line["reason"].endswith(CAPTURE_MISSING_SUFFIX) for line in succeeded)

    # The same fault through McpConnection: the status and the Retry-After reach the policy.
    caplog.clear()

    async def connected() -> CallToolResult:
        async with McpConnection.http(proxy.url) as connection:
            return await new_caller(connection, "T8", sleep=lambda _s: asyncio.sleep(0)).call_tool("lookup_order", {"order_id": "B8"})

    assert not run(connected).is_error
    assert log_lines(caplog, "agent_retry.capture_missing") == []
    (throttled,) = [line for line in log_lines(caplog) if line["outcome"] == "http 429"]
    assert throttled["class"] == "throttled" and throttled["delay_ms"] >= 1000
    assert not throttled["reason"].endswith(CAPTURE_MISSING_SUFFIX)


def test_T9_a_call_timeout_stops_an_attempt_in_flight_and_says_the_write_may_have_applied(
    proxies: Callable[[list[str]], Proxy], ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--ledger", str(ledger)))

    async def body() -> tuple[CallTimedOut, float, RunReport]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T9")
            assert not (await caller.call_tool("lookup_order", {"order_id": "A9"})).is_error  # connected, tools listed
            caller.call_timeout_s = 0.3  # from here: connecting under a loaded machine's clock is not what is timed
            proxy.faults({"on": "tools/call", "tool": "issue_refund", "fault": "delay", "delay_ms": 5000})
            started = time.monotonic()
            try:
                await caller.call_tool("issue_refund", {"order_id": "A9", "amount_paise": 900})
            except CallTimedOut as e:
                return e, time.monotonic() - started, caller.run.report()
            raise AssertionError("the call did not time out")

    stopped, elapsed, report = run(body)
    # The run was told (contract 0.7.0's abandon-call): the call is closed, its write possibly applied.
    assert report["abandoned-calls"] == 1
    assert [(e["call-id"], e["status"]) for e in report["effects"]] == [(stopped.call_id, "unknown")]
    assert 0.29 <= elapsed < 1.5, elapsed
    assert isinstance(stopped, TimeoutError)
    assert (stopped.cause, stopped.tool, stopped.attempts_sent, stopped.may_have_applied) == ("call-timeout", "issue_refund", 1, True)
    assert stopped.call_id is not None
    reason = (
        "the call's limit of 300 ms passed while attempt 1 was in flight (1 sent); "
        "the write may have been applied: check before sending it again"
    )
    assert str(stopped) == f"issue_refund: {reason}"
    (line,) = [line for line in log_lines(caplog) if line["action"] == "stop"]
    assert line["reason"] == reason
    assert (line["tool"], line["outcome"], line["call"], line["attempt"], line["step"]) == (
        "issue_refund",
        "call-timeout",
        stopped.call_id,
        1,
        2,
    )
    # It was applied: the server ran it and held the answer back (as a task
    # of the Tasks extension, whose work ends a moment after the stop).
    deadline = time.monotonic() + 3.0
    while not read_ledger(ledger)["refunds"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(read_ledger(ledger)["refunds"]) == 1


def test_T9_a_cancelled_call_stops_during_its_backoff_at_once(
    proxies: Callable[[list[str]], Proxy], tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    script = tmp_path / "faults.json"
    throttle = {"kind": "http", "status": 429, "headers": [["Retry-After", "5"]], "body": "slow down"}
    script.write_text(json.dumps([{"tool": "issue_refund", "first": 1, "fault": throttle}]))
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--faults", str(script), "--ledger", str(ledger)))
    backing_off = asyncio.Event

    async def body() -> tuple[CallCancelled, float, RunReport]:
        waiting = backing_off()

        async def sleep(seconds: float) -> None:
            waiting.set()
            await asyncio.sleep(seconds)

        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T9-cancel", {**CONFIG, "max-hint-ms": 10_000}, sleep=sleep)
            task = asyncio.ensure_future(caller.call_tool("issue_refund", {"order_id": "B9", "amount_paise": 900}))
            await asyncio.wait_for(waiting.wait(), 10)
            cancelled_at = time.monotonic()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as e:
                assert task.cancelled()  # still a cancellation for asyncio
                # Python 3.10 raises a new CancelledError to the awaiter, the task's own as its context.
                stopped = e if isinstance(e, CallCancelled) else e.__context__
                assert isinstance(stopped, CallCancelled), repr(e)
                return stopped, time.monotonic() - cancelled_at, caller.run.report()
            raise AssertionError("the call was not cancelled")

    stopped, elapsed, report = run(body)
    # Abandoned during the wait before attempt 2: closed, and nothing on the wire.
    assert (report["abandoned-calls"], report["effects"]) == (1, [])
    assert elapsed < 0.5, elapsed
    assert isinstance(stopped, asyncio.CancelledError)
    # A 429 was not applied (the policy does not list it as unknown), and nothing
    # was in flight during the backoff.
    assert (stopped.cause, stopped.attempts_sent, stopped.may_have_applied) == ("cancelled", 1, False)
    assert str(stopped) == "issue_refund: the call was cancelled between attempts (1 sent); the write was not applied"
    lines = [line for line in log_lines(caplog) if line["tool"] == "issue_refund"]
    assert [(line["outcome"], line["action"]) for line in lines] == [("http 429", "retry"), ("cancelled", "stop")]
    assert lines[1]["reason"] == "the call was cancelled between attempts (1 sent); the write was not applied"
    assert lines[0]["delay_ms"] >= 5_000
    assert read_ledger(ledger)["refunds"] == []


def test_T9_a_backoff_that_would_end_past_the_run_limit_is_not_slept(
    proxies: Callable[[list[str]], Proxy], tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    script = tmp_path / "faults.json"
    throttle = {"kind": "http", "status": 429, "headers": [["Retry-After", "5"]], "body": "slow down"}
    script.write_text(json.dumps([{"tool": "lookup_order", "first": 1, "fault": throttle}]))
    proxy = proxies(demo_command("--http", "127.0.0.1:{port}", "--faults", str(script), "--ledger", str(ledger)))

    async def body() -> tuple[Escalated, float]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T9-run", {**CONFIG, "max-hint-ms": 10_000}, run_timeout_s=3.0)
            started = time.monotonic()
            try:
                await caller.call_tool("lookup_order", {"order_id": "C9"})
            except Escalated as e:
                return e, time.monotonic() - started
            raise AssertionError("the run's limit did not stop the call")

    stopped, elapsed = run(body)
    assert elapsed < 2.0, f"slept {elapsed:.2f} s of a backoff that ends past the run's limit"
    # The wrapper passes the time left to the run's deadline with the 429; the
    # policy sees the server's 5 s wait cannot fit and escalates at once.
    assert stopped.reason == "deadline-too-near", stopped.note
    left = re.search(r"the server asks to wait 5000 ms; (\d+) ms remain", stopped.note)
    assert left is not None and 0 < int(left.group(1)) <= 3_000, stopped.note
    lines = [line for line in log_lines(caplog) if line["tool"] == "lookup_order"]
    assert [(line["outcome"], line["action"], line["escalation"], line["hint_ms"]) for line in lines] == [
        ("http 429", "escalate", "deadline-too-near", 5_000)
    ]


# --- stdio, the demo server through stdio.mjs ---------------------------------


def test_T5_a_stdio_server_killed_after_a_keyed_write_is_respawned_and_the_write_resent_once(
    tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    shim = Shim(
        tmp_path, demo_command("--stdio", "--ledger", str(ledger)), [{"on": "tools/call", "tool": "issue_refund", "fault": "kill-after"}]
    )

    async def body() -> tuple[CallToolResult, float]:
        async with shim.connection() as connection:
            caller = new_caller(connection, "T5")
            started = time.monotonic()
            result = await caller.call_tool("issue_refund", {"order_id": "A5", "amount_paise": 500})
            return result, time.monotonic() - started

    result, elapsed = run(body)
    assert not result.is_error, text_of(result)
    assert elapsed < ATTEMPT_TIMEOUT_S / 2, elapsed
    refunds = read_ledger(ledger)["refunds"]
    assert [(r["order_id"], r["idempotency_key"]) for r in refunds] == [("A5", key_of("T5"))]
    log = shim.log()
    pids = sorted({entry["pid"] for entry in log})
    assert len(pids) == 2, log
    assert [(entry["tool"], entry["fault"]) for entry in log if entry["rpc"] == "tools/call"] == [
        ("issue_refund", "kill-after"),
        ("issue_refund", None),
    ]
    assert outcomes(caplog) == [
        ("initialize", "success", "succeed"),
        ("tools/list", "success", "succeed"),
        ("issue_refund", "transport stream-closed", "retry"),
        ("initialize", "success", "succeed"),
        ("issue_refund", "success", "succeed"),
    ]
    # close() ended the respawned server: no process is left.
    assert all(pid_gone(pid) for pid in pids)


def test_T6_a_stdio_server_killed_after_an_unkeyed_write_is_respawned_and_status_checked(
    tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    shim = Shim(
        tmp_path, demo_command("--stdio", "--ledger", str(ledger)), [{"on": "tools/call", "tool": "record_note", "fault": "kill-after"}]
    )
    sessions: list[ClientSession] = []

    async def check(request: StatusCheckRequest) -> str:
        sessions.append(request.session)
        return await note_listed(request)

    async def body() -> tuple[CallToolResult, ClientSession | None]:
        async with shim.connection() as connection:
            caller = new_caller(connection, "T6", status_check=check)
            result = await caller.call_tool("record_note", {"order_id": "A6", "text": "refund promised"})
            return result, connection.session

    result, session = run(body)
    assert not result.is_error, text_of(result)
    assert sessions == [session]  # checked on the new session
    assert read_ledger(ledger)["notes"] == [{"order_id": "A6", "text": "refund promised"}]
    log = shim.log()
    assert len({entry["pid"] for entry in log}) == 2
    assert [entry["tool"] for entry in log if entry["rpc"] == "tools/call"] == ["record_note", "list_notes"]
    lines = [line for line in log_lines(caplog) if line["tool"] == "record_note"]
    assert [(line["outcome"], line["action"]) for line in lines] == [
        ("transport stream-closed", "check-status"),
        ("status check found", "succeed"),
    ]


def test_T7_a_stdio_server_that_cannot_be_started_again_escalates_after_a_bounded_number_of_starts(
    tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    shim = Shim(tmp_path, demo_command("--stdio", "--ledger", str(ledger)), [])

    async def body() -> None:
        async with shim.connection() as connection:
            caller = new_caller(connection, "T7")
            assert not (await caller.call_tool("lookup_order", {"order_id": "A7"})).is_error  # started once
            # From now on: the server dies on the refund, and cannot be started again.
            shim.script.write_text(
                json.dumps([{"on": "tools/call", "tool": "issue_refund", "fault": "kill-before"}, {"fault": "exit-at-start", "count": 50}])
            )
            await caller.call_tool("issue_refund", {"order_id": "A7", "amount_paise": 500})

    with pytest.raises(Escalated) as raised:
        run(body)
    assert raised.value.tool == "initialize"
    assert raised.value.reason == "call-attempts-spent"
    assert "could not reach the MCP server again" in raised.value.note
    assert "issue_refund" in raised.value.note  # the write that may have been applied is named
    starts = [entry for entry in shim.log() if entry["fault"] == "exit-at-start"]
    assert len(starts) == 4  # max-attempts-per-call of the initialize pseudo-call
    assert shim.remaining_faults() == [{"fault": "exit-at-start", "count": 46}]
    assert read_ledger(ledger)["refunds"] == []  # killed before it ran
    reconnects = [line for line in log_lines(caplog) if line["tool"] == "initialize"][1:]
    assert len(reconnects) == 4 and reconnects[-1]["action"] == "escalate"


def test_a_stdio_server_that_cannot_be_spawned_escalates_with_the_reason_not_an_os_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")

    async def body() -> None:
        async with McpConnection.stdio("/nonexistent/agent-retry-test-server") as connection:
            await new_caller(connection, "spawn").call_tool("lookup_order", {"order_id": "A1"})

    with pytest.raises(Escalated) as raised:
        run(body)
    assert raised.value.tool == "initialize"
    assert "could not connect to the MCP server" in raised.value.note and "could not start the server" in raised.value.note
    assert {line["outcome"] for line in log_lines(caplog)} == {"transport connection-refused"}


# --- server-everything --------------------------------------------------------


def test_T10_server_everything_restarted_over_http_the_wrapper_reinitialises(
    proxies: Callable[[list[str]], Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(everything_command("streamableHttp"))

    async def body() -> tuple[CallToolResult, CallToolResult]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T10")
            first = await caller.call_tool("echo", {"message": "one"})
            proxy.restart()
            second = await caller.call_tool("echo", {"message": "two"})
            return first, second

    first, second = run(body)
    assert text_of(first) == "Echo: one" and text_of(second) == "Echo: two"
    assert len([entry for entry in proxy.log() if entry["rpc"] == "initialize"]) == 2
    # server-everything answers an unknown session with a 400: reported as it
    # came; the policy reads it as a lost session and says reconnect.
    lost = [line for line in log_lines(caplog) if (line["tool"], line["outcome"]) == ("echo", "http 400")]
    assert [(line["action"], line["rule"]) for line in lost] == [("retry", "lost-session")], lost
    assert outcomes(caplog)[-2:] == [("initialize", "success", "succeed"), ("echo", "success", "succeed")]


def test_T11_server_everything_over_stdio_killed_after_echo_is_respawned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    shim = Shim(tmp_path, everything_command("stdio"), [{"on": "tools/call", "tool": "echo", "fault": "kill-after"}])

    async def body() -> CallToolResult:
        async with shim.connection() as connection:
            return await new_caller(connection, "T11").call_tool("echo", {"message": "again"})

    result = run(body)
    assert text_of(result) == "Echo: again"
    assert len({entry["pid"] for entry in shim.log()}) == 2
    assert ("echo", "transport stream-closed", "retry") in outcomes(caplog)


def test_T12_server_everything_cut_sse_answer_is_seen_at_once_and_retried(
    proxies: Callable[[list[str]], Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    proxy = proxies(everything_command("streamableHttp"))
    proxy.faults({"on": "tools/call", "tool": "echo", "fault": "cut-during"})

    async def body() -> tuple[CallToolResult, float, int]:
        async with McpConnection.http(proxy.url) as connection:
            caller = new_caller(connection, "T12")
            started = time.monotonic()
            result = await caller.call_tool("echo", {"message": "cut"})
            return result, time.monotonic() - started, connection.generation

    result, elapsed, generation = run(body)
    assert text_of(result) == "Echo: cut"
    assert generation == 2  # the cut left the session suspect: the retry went on a new one
    assert elapsed < ATTEMPT_TIMEOUT_S / 2, elapsed
    lines = [line for line in log_lines(caplog) if line["tool"] == "echo"]
    assert [(line["outcome"], line["action"]) for line in lines] == [("transport stream-closed", "retry"), ("success", "succeed")]
    assert [entry["fault"] for entry in proxy.log() if entry["rpc"] == "tools/call"] == ["cut-during", None]


def test_a_closed_connection_raises_SessionLost_without_connecting(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")

    async def body() -> None:
        connection = McpConnection.http("http://127.0.0.1:9/mcp")
        await connection.close()
        await new_caller(connection, "closed").call_tool("lookup_order", {"order_id": "A1"})

    with pytest.raises(SessionLost, match="was closed"):
        run(body)
    assert log_lines(caplog) == []
