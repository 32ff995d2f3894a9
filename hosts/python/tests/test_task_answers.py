"""Task answers a server should not give, through the wrapper (contract 0.7.0):
a `tasks/get` answer the wrapper cannot use is reported once as a poll
failure (-32603, its text as the body); numbers that do not fit the contract
are reported as none; a failed task's code past i32 is -32603; the task the
server's latest answer names is the one polled and cancelled; a `tasks/cancel`
that gets no answer never holds the call past its deadline.

The demo server runs the task; a proxy of the test's own, between the wrapper
and the server, answers chosen `tasks/get` requests itself (and may hold
`tasks/cancel` unanswered), and records what the client sent."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from demo_server import DemoServer

from agent_retry_policy import EmbeddedAccounts, Escalated, McpConnection, PolicyComponent, RetryingToolCaller, SplitMix64
from agent_retry_policy.types import Verdict

FLAGS = ("--task-work-ms", "--task-poll-interval-ms", "--task-ttl-ms")
CONFIG: dict[str, Any] = {"base-delay-ms": 10, "max-delay-ms": 50}
REFUND = {"order_id": "A1", "amount_paise": 50_000}

# Answers a `tasks/get` itself: (its number among the proxy's tasks/get, from 1; its params) -> a result, or None to pass it on.
Rewrite = Callable[[int, dict[str, Any]], "dict[str, Any] | None"]


class Proxy:
    """Forwards the client's HTTP to `upstream`; answers a `tasks/get` that
    `rewrite` answers; renames the task ids in `aliases` (the proxy's name ->
    the server's) in what it forwards and back in the server's answers; leaves `tasks/cancel` unanswered for
    `hold_cancel_s`. `sent`: the JSON-RPC requests (method, params) in order."""

    def __init__(self, upstream: str, rewrite: Rewrite | None = None, hold_cancel_s: float = 0.0) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.hold_cancel_s = hold_cancel_s
        self.aliases: dict[str, str] = {}
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                proxy.forward(self, "POST")

            def do_GET(self) -> None:
                proxy.forward(self, "GET")

            def do_DELETE(self) -> None:
                proxy.forward(self, "DELETE")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def of(self, method: str) -> list[dict[str, Any]]:
        return [params for name, params in self.sent if name == method]

    def forward(self, handler: http.server.BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        message = _json(body)
        name = message.get("method") if isinstance(message, dict) else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        if isinstance(name, str):
            params = dict(message.get("params") or {})
            self.sent.append((name, params))
            if name == "tasks/get" and self.rewrite is not None:
                result = self.rewrite(len(self.of("tasks/get")), params)
                if result is not None:
                    _answer(
                        handler,
                        200,
                        {"content-type": "application/json"},
                        json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode(),
                    )
                    return
            if name == "tasks/cancel" and self.hold_cancel_s:
                self.released.wait(self.hold_cancel_s)
            task_id = params.get("taskId")
            if task_id in self.aliases:  # the server knows the task by its own id
                message["params"]["taskId"] = self.aliases[task_id]
                body = json.dumps(message).encode()
                headers = {k: (self.aliases[task_id] if k.lower() == "mcp-name" else v) for k, v in headers.items()}
        request = urllib.request.Request(self.upstream, data=body if method != "GET" else None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, answer_headers, data = response.status, response.getheaders(), response.read()
        except urllib.error.HTTPError as e:
            status, answer_headers, data = e.code, list(e.headers.items()), e.read()
        for alias, real in self.aliases.items():  # and the server's answers name it by the proxy's name
            if isinstance(name, str) and name.startswith("tasks/"):
                data = data.replace(real.encode(), alias.encode())
        kept = {k: v for k, v in answer_headers if k.lower() not in ("content-length", "transfer-encoding", "connection")}
        _answer(handler, status, kept, data)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _answer(handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def proxied(demo: Callable[..., DemoServer]) -> Iterator[Callable[..., tuple[DemoServer, Proxy]]]:
    """`proxied(*server_flags, rewrite=..., hold_cancel_s=...)`: a demo server with its ledger, and a proxy before it."""
    proxies: list[Proxy] = []

    def start(*flags: str, rewrite: Rewrite | None = None, hold_cancel_s: float = 0.0) -> tuple[DemoServer, Proxy]:
        server = demo(*flags, ledger=True, require=FLAGS)
        proxies.append(proxy := Proxy(server.url, rewrite, hold_cancel_s))
        return server, proxy

    yield start
    for proxy in proxies:
        proxy.close()


class Reports:
    """What the wrapper reported to the policy, by export (the run's own methods, wrapped)."""

    def __init__(self, run: Any) -> None:
        self.calls: list[tuple[str, Any]] = []
        for name in ("record_task_status", "record_poll_failure", "record_failure"):
            setattr(run, name, self._wrap(name, getattr(run, name)))

    def _wrap(self, name: str, method: Callable[..., Verdict]) -> Callable[..., Verdict]:
        def reported(call_id: int, attempt: int, what: Any, *rest: Any) -> Verdict:
            self.calls.append((name, what))
            return method(call_id, attempt, what, *rest)

        return reported

    def of(self, name: str) -> list[Any]:
        return [what for export, what in self.calls if export == name]


def call(url: str, config: dict[str, Any] | None = None, call_timeout_s: float = 30) -> tuple[Any, list[Verdict], Reports, float]:
    """One `issue_refund` through the wrapper: the result (or the exception), its verdicts, the reports, the seconds it took."""
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(config or CONFIG).start_run("answers")
    reports = Reports(run)
    verdicts: list[Verdict] = []

    async def go() -> tuple[Any, float]:
        async with McpConnection.http(url) as connection:
            caller = RetryingToolCaller(
                connection,
                run,
                entropy=SplitMix64(1),
                call_timeout_s=call_timeout_s,
                on_verdict=lambda name, _attempt, verdict: verdicts.append(verdict) if name == "issue_refund" else None,
            )
            started = time.monotonic()
            try:
                result: Any = await caller.call_tool("issue_refund", dict(REFUND))
            except Exception as e:  # noqa: BLE001 - the test looks at what it was
                result = e
            return result, time.monotonic() - started

    result, took = asyncio.run(go())
    return result, verdicts, reports, took


def first_only(result: Callable[[dict[str, Any]], dict[str, Any]]) -> Rewrite:
    """Answers the first `tasks/get` with `result(params)`; the server answers the rest."""
    return lambda n, params: result(params) if n == 1 else None


# --- answers the wrapper cannot use -------------------------------------------

UNUSABLE: dict[str, Callable[[str], dict[str, Any]]] = {
    "completed-without-result": lambda task: {"taskId": task, "status": "completed", "resultType": "complete"},
    "failed-without-error": lambda task: {"taskId": task, "status": "failed", "resultType": "complete"},
    "unknown-status": lambda task: {"taskId": task, "status": "paused", "resultType": "complete", "pollIntervalMs": 0},
    "not-a-task": lambda task: {"status": "working", "note": f"no taskId for {task}"},
}


@pytest.mark.parametrize("shape", sorted(UNUSABLE))
def test_an_unusable_tasks_get_answer_is_one_poll_failure_then_polled_as_the_verdict_says(
    shape: str, proxied: Callable[..., tuple[DemoServer, Proxy]]
) -> None:
    answer: dict[str, Any] = {}

    def unusable(params: dict[str, Any]) -> dict[str, Any]:
        answer.update(UNUSABLE[shape](params["taskId"]))
        return answer

    server, proxy = proxied("--task-work-ms", "600", "--task-poll-interval-ms", "100", rewrite=first_only(unusable))
    result, verdicts, reports, _ = call(proxy.url)
    assert not isinstance(result, BaseException) and not result.is_error, result
    (failure,) = reports.of("record_poll_failure")
    assert failure["kind"] == {"protocol-error": -32603} and failure["delivery"] == "answer-started"
    assert json.loads(failure["body"]) == answer, "the answer's text is the body"
    assert reports.of("record_failure") == [], "an unusable poll is no outcome of the attempt"
    assert len(proxy.of("tools/call")) == 1 and len(server.ledger()["refunds"]) == 1
    assert [v.action for v in verdicts][:2] == ["poll", "poll"] and verdicts[-1].action == "succeed"


# --- numbers that do not fit the contract -------------------------------------


def test_numbers_that_do_not_fit_the_contract_are_reported_as_none(proxied: Callable[..., tuple[DemoServer, Proxy]]) -> None:
    odd = {"status": "working", "resultType": "complete", "pollIntervalMs": -5, "ttlMs": 1.5, "createdAt": "yesterday"}
    server, proxy = proxied(
        "--task-work-ms", "600", "--task-poll-interval-ms", "100", rewrite=first_only(lambda p: {"taskId": p["taskId"], **odd})
    )
    result, verdicts, reports, _ = call(proxy.url)
    assert not isinstance(result, BaseException) and not result.is_error, result
    polled = reports.of("record_task_status")[1]  # [0] is the tool call's answer
    assert (polled["poll-interval-ms"], polled["ttl-ms"], polled["age-ms"]) == (None, None, None), polled
    assert len(server.ledger()["refunds"]) == 1 and verdicts[-1].action == "succeed"


def test_a_poll_interval_past_u64_is_reported_as_none(proxied: Callable[..., tuple[DemoServer, Proxy]]) -> None:
    big = {"status": "working", "resultType": "complete", "pollIntervalMs": 2**64, "ttlMs": 2**70}
    _, proxy = proxied(
        "--task-work-ms", "600", "--task-poll-interval-ms", "100", rewrite=first_only(lambda p: {"taskId": p["taskId"], **big})
    )
    result, _, reports, _ = call(proxy.url)
    assert not isinstance(result, BaseException) and not result.is_error, result
    polled = reports.of("record_task_status")[1]
    assert (polled["poll-interval-ms"], polled["ttl-ms"]) == (None, None), polled


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"code": 2**40, "message": "boom"}, -32603),
        ({"code": -(2**31) - 1, "message": "boom"}, -32603),
        ({"code": 1.5, "message": "boom"}, -32603),
        ({"message": "boom"}, -32603),
        ({"code": -32001, "message": "boom"}, -32001),
    ],
    ids=["past-i32", "below-i32", "fractional", "no-code", "in-range"],
)
def test_a_failed_tasks_code_outside_i32_is_reported_as_internal_error(
    error: dict[str, Any], code: int, proxied: Callable[..., tuple[DemoServer, Proxy]]
) -> None:
    failed = {"status": "failed", "resultType": "complete", "error": error}
    _, proxy = proxied(
        "--task-work-ms", "3000", "--task-poll-interval-ms", "100", rewrite=first_only(lambda p: {"taskId": p["taskId"], **failed})
    )
    result, _, reports, _ = call(proxy.url, {**CONFIG, "max-attempts-per-call": 1})
    assert not isinstance(result, Exception) or isinstance(result, Escalated), repr(result)
    (outcome, *_) = reports.of("record_failure")
    assert outcome["kind"] == {"protocol-error": code} and outcome["body"] == "boom" and outcome["delivery"] == "answer-started"


# --- which task -----------------------------------------------------------------


def test_the_task_the_servers_latest_answer_names_is_polled_and_cancelled(proxied: Callable[..., tuple[DemoServer, Proxy]]) -> None:
    # The first poll answers that the task is now "<id>-moved"; the proxy forwards that name to the server as the task it is.
    holder: list[Proxy] = []

    def moved(params: dict[str, Any]) -> dict[str, Any]:
        holder[0].aliases[params["taskId"] + "-moved"] = params["taskId"]
        return {"taskId": params["taskId"] + "-moved", "status": "working", "resultType": "complete", "pollIntervalMs": 50}

    server, proxy = proxied("--task-work-ms", "3000", "--task-poll-interval-ms", "50", rewrite=first_only(moved))
    holder.append(proxy)
    result, verdicts, _, _ = call(proxy.url, {**CONFIG, "max-polls-per-task": 3})
    assert isinstance(result, Escalated) and result.reason == "task-polls-spent", result
    first, *later = [p["taskId"] for p in proxy.of("tasks/get")]
    assert later and set(later) == {first + "-moved"}, (first, later)
    assert [p["taskId"] for p in proxy.of("tasks/cancel")] == [first + "-moved"] and verdicts[-1].cancel_task
    assert server.ledger()["cancelled_tasks"] == [first], "the server saw the cancel of its task"


# --- tasks/cancel within the deadline -----------------------------------------


def test_a_cancel_without_an_answer_never_holds_the_call_past_its_deadline(proxied: Callable[..., tuple[DemoServer, Proxy]]) -> None:
    # The task outlives the 1.5 s call: the policy escalates and cancels it; the server never answers the cancel.
    _, proxy = proxied("--task-work-ms", "3000", "--task-poll-interval-ms", "400", hold_cancel_s=20)
    result, verdicts, _, took = call(proxy.url, call_timeout_s=1.5)
    assert isinstance(result, Escalated) and result.reason == "deadline-too-near", result
    assert verdicts[-1].cancel_task and len(proxy.of("tasks/cancel")) == 1
    assert took < 1.5 + 0.5, f"the call took {took:.2f} s, past its 1.5 s deadline"
