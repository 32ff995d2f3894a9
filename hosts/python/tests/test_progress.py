"""Per-tool attempt timeouts and progress (contract 0.7.0, issue 22): each
attempt's timeouts come from the policy (`call-start`'s `idle-timeout-ms` and
`attempt-timeout-ms`, set per tool in the configuration); every `tools/call`
carries a progress token, each `notifications/progress` for it starts the idle
timeout again (never past the attempt's whole timeout) and reaches
`on_progress(tool, progress, total, message)`. Against the demo server's
`export_report {seconds}` (progress every `--progress-interval-ms`); its ledger
shows each run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from demo_server import DemoServer

from agent_retry_policy import EmbeddedAccounts, Escalated, McpConnection, PolicyComponent, RetryingToolCaller, SplitMix64
from agent_retry_policy.types import CallStart, Verdict

FLAGS = ("--progress-interval-ms",)


def config(idle_ms: int, whole_ms: int = 600_000, attempts: int = 2) -> dict[str, Any]:
    tool = {"effect": "read", "idle-timeout-ms": idle_ms, "attempt-timeout-ms": whole_ms}
    return {"base-delay-ms": 10, "max-delay-ms": 20, "max-attempts-per-call": attempts, "tools": {"export_report": tool}}


async def export(
    url: str, policy_config: dict[str, Any], seconds: float, **options: Any
) -> tuple[Any, list[tuple[str, float, float | None, str | None]], list[tuple[int, Verdict]], Any]:
    """Calls export_report once through the wrapper: the result (or the
    `Escalated`), the progress the hook saw, the verdicts, the run."""
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(policy_config).start_run("progress")
    seen: list[tuple[str, float, float | None, str | None]] = []
    verdicts: list[tuple[int, Verdict]] = []
    async with McpConnection.http(url) as connection:
        caller = RetryingToolCaller(
            connection,
            run,
            entropy=SplitMix64(1),
            call_timeout_s=30,
            on_verdict=lambda tool, attempt, verdict: verdicts.append((attempt, verdict)) if tool == "export_report" else None,
            **{"on_progress": lambda *event: seen.append(event), **options},
        )
        try:
            outcome: Any = await caller.call_tool("export_report", {"seconds": seconds})
        except Escalated as e:
            outcome = e
    return outcome, seen, verdicts, run


def reports(server: DemoServer) -> list[dict[str, Any]]:
    return list(server.ledger().get("reports", []))


def test_progress_keeps_a_long_read_alive_past_its_idle_timeout_in_one_attempt(demo: Callable[..., DemoServer]) -> None:
    server = demo("--progress-interval-ms", "200", ledger=True, require=FLAGS)
    result, seen, verdicts, run = asyncio.run(export(server.url, config(idle_ms=1_000), 3))
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert [(attempt, v.action) for attempt, v in verdicts] == [(1, "succeed")]
    assert run.report()["attempts"] == 3  # initialize, tools/list, then the one export_report attempt
    (ran,) = reports(server)
    assert ran["finished"] and ran["progress_token"] is not None, ran
    # The hook saw the server's notifications, for this tool, in order.
    assert len(seen) >= 10 and {event[0] for event in seen} == {"export_report"}, seen
    assert [event[1] for event in seen] == sorted(event[1] for event in seen)
    assert seen[-1][2] is not None and seen[-1][3] and "of" in seen[-1][3], seen[-1]


def test_a_progress_hook_that_raises_is_logged_and_the_attempt_goes_on(
    demo: Callable[..., DemoServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = demo("--progress-interval-ms", "200", ledger=True, require=FLAGS)

    def broken(*_event: Any) -> None:
        raise RuntimeError("the application's hook failed")

    result, _, verdicts, _ = asyncio.run(export(server.url, config(idle_ms=1_000), 1, on_progress=broken))
    assert not isinstance(result, Escalated) and not result.is_error, result
    assert [(attempt, v.action) for attempt, v in verdicts] == [(1, "succeed")]
    assert any("agent_retry.on_progress_failed" in record.getMessage() for record in caplog.records)


def test_a_silent_tool_is_cut_at_its_idle_timeout(demo: Callable[..., DemoServer]) -> None:
    # No notification before the answer at 3 s: the 1 s idle timeout cuts each attempt.
    server = demo("--progress-interval-ms", "5000", ledger=True, require=FLAGS)
    result, seen, verdicts, run = asyncio.run(export(server.url, config(idle_ms=1_000), 3))
    assert isinstance(result, Escalated) and result.reason == "call-attempts-spent", result
    assert [(attempt, v.action, v.class_) for attempt, v in verdicts] == [(1, "retry", "transient"), (2, "escalate", "transient")]
    assert seen == []
    assert "idle-timeout-ms" in (result.escalation["last-error"] or ""), result.escalation
    assert [r["finished"] for r in reports(server)] == [False, False]


def test_progress_never_carries_an_attempt_past_its_whole_timeout(demo: Callable[..., DemoServer]) -> None:
    server = demo("--progress-interval-ms", "200", ledger=True, require=FLAGS)
    result, seen, verdicts, _ = asyncio.run(export(server.url, config(idle_ms=1_000, whole_ms=1_500, attempts=1), 3))
    assert isinstance(result, Escalated), result
    assert [(attempt, v.action) for attempt, v in verdicts] == [(1, "escalate")]
    assert "attempt-timeout-ms" in (result.escalation["last-error"] or ""), result.escalation
    assert seen, "progress came, and still the whole timeout cut the attempt"


def test_an_explicit_attempt_timeout_caps_the_policys_idle_timeout(demo: Callable[..., DemoServer]) -> None:
    # The policy allows 1 s of silence, the user 0.5 s: notifications every 0.7 s are too far apart.
    server = demo("--progress-interval-ms", "700", ledger=True, require=FLAGS)
    result, _, verdicts, _ = asyncio.run(export(server.url, config(idle_ms=1_000, attempts=1), 2, attempt_timeout_s=0.5))
    assert isinstance(result, Escalated) and "idle-timeout-ms" in (result.escalation["last-error"] or ""), result
    assert [(attempt, v.action) for attempt, v in verdicts] == [(1, "escalate")]


def test_the_idle_timeout_is_the_policys_unless_the_user_set_a_lower_one() -> None:
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("r")
    start = CallStart(True, 1, 0, "read", True, 1_000, 9_000, False, False)
    assert RetryingToolCaller(object(), run)._idle_timeout_s(start) == 1.0  # type: ignore[arg-type]
    assert RetryingToolCaller(object(), run, attempt_timeout_s=0.25)._idle_timeout_s(start) == 0.25  # type: ignore[arg-type]
    assert RetryingToolCaller(object(), run, attempt_timeout_s=5)._idle_timeout_s(start) == 1.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempt_timeout_s"):
        RetryingToolCaller(object(), run, attempt_timeout_s=0)  # type: ignore[arg-type]
