"""Continuations and tasks of MCP 2026-07-28 through the wrapper (contract
0.7.0, issue 22), against the demo server:

- `confirm_order` answers `input_required` (MRTR): with the application's
  elicitation handler the SDK answers it in the same attempt; without one the
  wrapper reports `input-required` with the server's question and the run
  escalates `input-required`;
- `issue_refund` answers with a task (the client declares
  `io.modelcontextprotocol/tasks`): polled with `tasks/get` as the verdicts
  say, until it completes (one refund, one attempt), through a poll cut by the
  network or answered 503; a task that asks for approval is answered through
  `tasks/update` by the handler, or escalates without one; a task the policy
  stops waiting for is cancelled (`tasks/cancel`: its work stops, no refund).

Every JSON-RPC request the client sends is recorded on its HTTP layer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import demo_server
import httpx2
import pytest
from demo_server import DemoServer
from mcp.types import ElicitResult

from agent_retry_policy import EmbeddedAccounts, Escalated, McpConnection, PolicyComponent, RetryingToolCaller, SplitMix64
from agent_retry_policy._mcp import connection as connection_module
from agent_retry_policy.types import Verdict

FLAGS = ("--task-work-ms", "--task-poll-interval-ms", "--task-ttl-ms")
CONFIG: dict[str, Any] = {"base-delay-ms": 10, "max-delay-ms": 50}
REFUND = {"order_id": "A1", "amount_paise": 50_000}
LARGE_REFUND = {"order_id": "A2", "amount_paise": 900_000}  # above the approval limit: the task asks a person


class Sent:
    """The JSON-RPC requests the client sent (method, params), in order."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def record(self, request: httpx2.Request) -> None:
        if request.method == "POST":
            try:
                message = json.loads(request.content)
            except ValueError:
                return
            if isinstance(message, dict) and "method" in message:
                self.requests.append((message["method"], dict(message.get("params") or {})))

    def of(self, method: str) -> list[dict[str, Any]]:
        return [params for name, params in self.requests if name == method]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    """Records what McpConnection.http's client sends (its capturing client, with a request hook)."""
    recorder = Sent()
    make = connection_module.create_capturing_http_client

    def with_hook(**options: Any) -> Any:
        return make(event_hooks={"request": [recorder.record]}, **options)

    monkeypatch.setattr(connection_module, "create_capturing_http_client", with_hook)
    yield recorder


async def approve(_context: Any, params: Any) -> ElicitResult:
    field = "approve" if "refund" in params.message else "confirm"
    return ElicitResult(action="accept", content={field: True})


def call(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    config: dict[str, Any] | None = None,
    call_timeout_s: float = 30,
    **connection_options: Any,
) -> tuple[Any, list[tuple[int, Verdict]], Any]:
    """One call through the wrapper: the result (or the `Escalated`), the verdicts of `tool`, the run."""
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(config or CONFIG).start_run("tasks")
    verdicts: list[tuple[int, Verdict]] = []

    async def go() -> Any:
        async with McpConnection.http(url, **connection_options) as connection:
            caller = RetryingToolCaller(
                connection,
                run,
                entropy=SplitMix64(1),
                call_timeout_s=call_timeout_s,
                on_verdict=lambda name, attempt, verdict: verdicts.append((attempt, verdict)) if name == tool else None,
            )
            try:
                return await caller.call_tool(tool, arguments)
            except Escalated as e:
                return e

    return asyncio.run(go()), verdicts, run


def refunds(server: DemoServer) -> list[dict[str, Any]]:
    return list(server.ledger()["refunds"])


# --- continuations (MRTR) -----------------------------------------------------


def test_a_continuation_a_handler_answers_is_one_attempt(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo(ledger=True, require=FLAGS)
    result, verdicts, run = call(server.url, "confirm_order", {"order_id": "A1"}, elicitation_callback=approve)
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert "confirmed" in result.content[0].text
    assert [(attempt, v.action) for attempt, v in verdicts] == [(1, "succeed")]
    assert [r["outcome"] for r in server.ledger()["confirmations"]] == ["asked", "confirmed"]
    assert len(sent.of("tools/call")) == 2  # the question, then the answer: one attempt
    assert run.report()["retries"] == 0


def test_a_continuation_nobody_answers_escalates_input_required_with_the_question(demo: Callable[..., DemoServer]) -> None:
    server = demo(ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "confirm_order", {"order_id": "A1"})
    assert isinstance(result, Escalated) and result.reason == "input-required", result
    assert "Confirm order A1?" in result.note
    assert [(attempt, v.action, v.class_) for attempt, v in verdicts] == [(1, "escalate", "needs-input")]
    assert [r["outcome"] for r in server.ledger()["confirmations"]] == ["asked"]


# --- tasks --------------------------------------------------------------------


def test_a_task_is_polled_to_completion_one_refund_one_attempt(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo("--task-work-ms", "600", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    result, verdicts, run = call(server.url, "issue_refund", dict(REFUND))
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert len(refunds(server)) == 1
    assert len(sent.of("tools/call")) == 1 and len(sent.of("tasks/get")) >= 2
    task_id = sent.of("tasks/get")[0]["taskId"]
    assert {p["taskId"] for p in sent.of("tasks/get")} == {task_id} and sent.of("tasks/cancel") == []
    actions = [v.action for _, v in verdicts]
    assert actions[-1] == "succeed" and set(actions[:-1]) == {"poll"}, actions
    assert {attempt for attempt, _ in verdicts} == {1}
    report = run.report()
    assert (report["tasks"], report["polls"], report["retries"]) == (1, len(actions) - 1, 0)


@pytest.mark.parametrize("fault", [{"kind": "drop"}, {"kind": "http", "status": 503, "headers": [], "body": "busy"}], ids=["cut", "503"])
def test_a_failed_poll_is_polled_again_and_the_refund_is_applied_once(
    fault: dict[str, Any], demo: Callable[..., DemoServer], sent: Sent
) -> None:
    server = demo(
        "--task-work-ms",
        "600",
        "--task-poll-interval-ms",
        "100",
        faults=[{"tool": "tasks/get", "call": 2, "fault": fault}],
        ledger=True,
        require=FLAGS,
    )
    result, verdicts, _ = call(server.url, "issue_refund", dict(REFUND))
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert len(refunds(server)) == 1 and len(sent.of("tools/call")) == 1
    assert [v.action for _, v in verdicts][:3] == ["poll", "poll", "poll"]  # the failed second poll is polled again
    assert {attempt for attempt, _ in verdicts} == {1}


def test_a_task_asking_for_approval_is_answered_by_the_handler(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo("--task-work-ms", "200", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "issue_refund", dict(LARGE_REFUND), elicitation_callback=approve)
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert len(refunds(server)) == 1 and len(sent.of("tasks/update")) == 1
    assert [v.action for _, v in verdicts][-1] == "succeed"


def test_a_task_asking_for_approval_nobody_gives_escalates_and_is_cancelled(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo("--task-work-ms", "200", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "issue_refund", dict(LARGE_REFUND))
    assert isinstance(result, Escalated) and result.reason == "input-required", result
    assert "Approve a refund" in result.note
    assert verdicts[-1][1].cancel_task and len(sent.of("tasks/cancel")) == 1
    assert refunds(server) == []


def test_a_task_the_policy_stops_waiting_for_is_cancelled_and_its_work_stops(demo: Callable[..., DemoServer], sent: Sent) -> None:
    # The work takes 1.5 s; the policy polls at most 3 times, then cancels: the refund is never applied.
    server = demo("--task-work-ms", "1500", "--task-poll-interval-ms", "100", ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "issue_refund", dict(REFUND), {**CONFIG, "max-polls-per-task": 3})
    assert isinstance(result, Escalated) and result.reason == "task-polls-spent", result
    assert verdicts[-1][1].cancel_task
    (cancel,) = sent.of("tasks/cancel")
    assert cancel["taskId"] == sent.of("tasks/get")[0]["taskId"]
    assert server.ledger()["cancelled_tasks"] == [cancel["taskId"]], "the server saw the cancel"
    time.sleep(2.0)  # past the work's end: a task not cancelled would have refunded by now
    assert refunds(server) == []


def test_a_task_past_its_ttl_escalates_task_expired_and_is_cancelled(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo("--task-work-ms", "3000", "--task-poll-interval-ms", "400", "--task-ttl-ms", "1000", ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "issue_refund", dict(REFUND))
    assert isinstance(result, Escalated) and result.reason == "task-expired", result
    assert verdicts[-1][1].cancel_task and len(sent.of("tasks/cancel")) == 1
    assert server.ledger()["cancelled_tasks"] == [sent.of("tasks/cancel")[0]["taskId"]], "the server saw the cancel"
    assert refunds(server) == []


def test_a_task_that_would_outlive_the_calls_deadline_escalates_and_is_cancelled(demo: Callable[..., DemoServer], sent: Sent) -> None:
    server = demo("--task-work-ms", "3000", "--task-poll-interval-ms", "400", ledger=True, require=FLAGS)
    result, verdicts, _ = call(server.url, "issue_refund", dict(REFUND), call_timeout_s=1.5)
    assert isinstance(result, Escalated) and result.reason == "deadline-too-near", result
    assert verdicts[-1][1].cancel_task and len(sent.of("tasks/cancel")) == 1
    assert server.ledger()["cancelled_tasks"] == [sent.of("tasks/cancel")[0]["taskId"]], "the server saw the cancel at the deadline"
    time.sleep(2.0)  # past the work's end: the cancelled task never refunds
    assert refunds(server) == []


def test_a_task_and_a_continuation_over_stdio(tmp_path: Any) -> None:
    # The same path over stdio: the server the wrapper starts, its ledger in a file.
    ledger = tmp_path / "ledger.json"
    command = demo_server.require_demo_server(*FLAGS)
    args = ["serve", "--stdio", "--ledger", str(ledger), "--task-work-ms", "300", "--task-poll-interval-ms", "100"]
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(CONFIG).start_run("stdio")
    verdicts: list[tuple[str, Verdict]] = []

    async def go() -> tuple[Any, Any]:
        async with McpConnection.stdio(command, args, elicitation_callback=approve) as connection:
            caller = RetryingToolCaller(
                connection, run, entropy=SplitMix64(1), call_timeout_s=30, on_verdict=lambda name, _a, v: verdicts.append((name, v))
            )
            return await caller.call_tool("issue_refund", dict(REFUND)), await caller.call_tool("confirm_order", {"order_id": "A1"})

    refunded, confirmed = asyncio.run(go())
    assert not refunded.is_error and not confirmed.is_error, (refunded, confirmed)
    written = json.loads(ledger.read_text())
    assert len(written["refunds"]) == 1 and [r["outcome"] for r in written["confirmations"]] == ["asked", "confirmed"]
    refund_actions = [v.action for name, v in verdicts if name == "issue_refund"]
    assert refund_actions[0] == "poll" and refund_actions[-1] == "succeed", refund_actions
    assert run.report()["tasks"] == 1
