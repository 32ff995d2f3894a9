"""Listing an MCP server's tools through the policy, for the adapters whose
framework asks for the tool list before the model's first call.

`RetryingToolCaller` lists the tools itself (the `tools/list` pseudo-call,
retried and escalated as the policy says) on its first call; a framework needs
them earlier, to describe them to the model. This runs the same pseudo-call
(connecting first, the `initialize` pseudo-call, if needed) and returns what
the caller will use, so the framework and the wrapper see one list.
"""

from __future__ import annotations

from typing import cast

from mcp.types import Tool

from .._mcp.caller import TOOLS_LIST, RetryingToolCaller, _CallState, _CallTag, _DeadlinePassed
from ..errors import CallTimedOut, StopCause


async def list_tools(caller: RetryingToolCaller) -> list[Tool]:
    """The tools, listed once through the policy (again after a new session)."""
    # Bounded by the run's limit only: listing is no call of the model's.
    state = _CallState(TOOLS_LIST, _CallTag(None), caller._run_deadline, cast(StopCause, "run-timeout"), caller.run_timeout_s)
    try:
        await caller._ensure_session(state)
        await caller._tool(state, "")
    except _DeadlinePassed:
        raise CallTimedOut(caller._stop(state, state.cause)) from None
    return list((caller._tools or {}).values())
