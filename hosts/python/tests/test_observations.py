"""tests/vectors/observations.json through the REAL wrapper: for each case the
demo server answers `lookup_order`'s first call with the case's `answer`
(a fault rule `{"tool": "lookup_order", "call": 1, "fault": answer}`), the
`RetryingToolCaller` captures it, reports its observation, and the verdict it
acted on for attempt 1 (its `on_verdict` hook) must match the case's `expect`:
action, class, rule and reconnect. A case with `session-id-sent` runs a
2025-11-25 handshake session (`--era handshake --sessions`, the wrapper in
`mode="legacy"`), so that the wrapper sends `Mcp-Session-Id`; the others the
2026-07-28 mode. A wrapper that maps an SDK error to the wrong observation, or
decides itself what an answer means, fails here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from demo_server import DemoServer

from agent_retry_policy import EmbeddedAccounts, Escalated, PolicyComponent, SplitMix64
from agent_retry_policy.conformance import OBSERVATION_TOOL, OBSERVATIONS_FILE, default_vector_dir, match
from agent_retry_policy.mcp_client import McpConnection, RetryingToolCaller
from agent_retry_policy.types import Verdict

OBSERVATIONS = json.loads((default_vector_dir() / OBSERVATIONS_FILE).read_text(encoding="utf-8"))
CASES = OBSERVATIONS["cases"]


async def first_verdict(url: str, mode: str, config: Any) -> tuple[dict[str, Any], list[tuple[str, int, Verdict]]]:
    """Calls lookup_order once through the wrapper; the verdict it acted on for
    the tool's attempt 1, as (action, class, rule, reconnect), and every verdict."""
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy(config).start_run("observations")
    verdicts: list[tuple[str, int, Verdict]] = []
    async with McpConnection.http(url, mode=mode) as connection:  # type: ignore[arg-type]
        caller = RetryingToolCaller(
            connection,
            run,
            entropy=SplitMix64(3),
            attempt_timeout_s=20.0,
            call_timeout_s=60.0,
            sleep=lambda _s: asyncio.sleep(0),
            on_verdict=lambda tool, attempt, verdict: verdicts.append((tool, attempt, verdict)),
        )
        try:
            await caller.call_tool(OBSERVATION_TOOL, {"order_id": "A1"})
        except Escalated:
            pass  # an escalation is a verdict like any other: compared below
    first = next(v for tool, attempt, v in verdicts if tool == OBSERVATION_TOOL and attempt == 1)
    names = instance.rule_names()
    return {"action": first.action, "class": first.class_, "rule": names[first.rule_index], "reconnect": first.reconnect}, verdicts


@pytest.mark.parametrize("case", CASES, ids=[c["description"] for c in CASES])
def test_the_wrapper_acts_on_the_verdict_of_the_observation(case: dict[str, Any], demo: Callable[..., DemoServer]) -> None:
    faults = [{"tool": OBSERVATION_TOOL, "call": 1, "fault": case["answer"]}]
    if case["session-id-sent"]:
        server, mode = demo("--era", "handshake", "--sessions", faults=faults), "legacy"
    else:
        server, mode = demo("--era", "dual", faults=faults), "auto"
    got, verdicts = asyncio.run(first_verdict(server.url, mode, OBSERVATIONS.get("config", {})))
    mismatch = match(case["expect"], got)
    assert mismatch is None, f"{mismatch} (the wrapper acted on {got}; every verdict: {verdicts})"
    if got["action"] == "retry":
        # The retry went out (on a new session when the verdict said reconnect) and the call ended.
        assert any(tool == OBSERVATION_TOOL and attempt == 2 for tool, attempt, _ in verdicts), verdicts


def test_a_wrong_verdict_fails_the_comparison() -> None:
    # The comparison must be able to fail: a lost session read as a plain 400.
    case = next(c for c in CASES if c["expect"].get("reconnect"))
    assert match(case["expect"], {**case["expect"], "reconnect": False}) is not None
