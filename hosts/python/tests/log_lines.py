"""The one reader of the wrappers' JSON log lines (docs/events.md) the tests share."""

from __future__ import annotations

import json
from typing import Any

import pytest

# Where each wrapper logs its attempt lines (the MCP wrapper's other events go to its child `events`).
MCP_LOGGER = "agent_retry_policy.mcp"
HELPER_LOGGER = "agent_retry_policy.calls"


def logged(caplog: pytest.LogCaptureFixture, logger: str, event: str | None = None, *, children: bool = False) -> list[dict[str, Any]]:
    """The JSON lines logged on `logger` (and its child loggers, with `children`), those of `event` only if given."""
    lines = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == logger or (children and record.name.startswith(logger + "."))
    ]
    return [line for line in lines if event is None or line.get("event") == event]
