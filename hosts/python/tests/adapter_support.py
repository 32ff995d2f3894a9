"""What the framework adapters' tests share (tests/test_adapter_*.py, in the
main venv): a policy run, and the wrapper's attempt lines read from the log.

The adapters are tested end to end: the framework's own fake model drives the
agent, the demo server (conftest's `serve`, with its fault script and ledger)
answers, and what each side saw is asserted: the model's inputs, the log's
attempt lines, the server's ledger."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from agent_retry_policy import EmbeddedAccounts, PolicyComponent, SplitMix64
from agent_retry_policy.component import Run

# Small delays so the tests are quick; the tools are described by the demo
# server's MCP annotations (lookup_order read-only, issue_refund keyed).
CONFIG: dict[str, Any] = {"base-delay-ms": 20, "max-delay-ms": 200}
WRAPPER_LOGGER = "agent_retry_policy.mcp"
# The any-call helper's (the LangChain interceptor's calls).
HELPER_LOGGER = "agent_retry_policy.calls"
PSEUDO_TOOLS = ("initialize", "tools/list")


def policy_run(run_id: str, config: dict[str, Any] | None = None) -> Run:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    return instance.load_policy(config if config is not None else CONFIG).start_run(run_id)


def attempts(caplog: pytest.LogCaptureFixture, tool: str, logger: str = WRAPPER_LOGGER) -> list[tuple[logging.LogRecord, dict[str, Any]]]:
    """The attempt lines for `tool` (of the MCP wrapper, or of `logger`), each with its record (for its time)."""
    found = []
    for record in caplog.records:
        if record.name != logger:
            continue
        try:
            line = json.loads(record.getMessage())
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("event") == "agent_retry.attempt" and line.get("tool") == tool:
            found.append((record, line))
    return found


def outcomes(caplog: pytest.LogCaptureFixture, tool: str, logger: str = WRAPPER_LOGGER) -> list[tuple[str, str]]:
    """(outcome, action) of each attempt line of `tool`, the outcome in lower
    case (docs/events.md spells it `http 503`; older lines `HTTP 503`)."""
    return [(line["outcome"].lower(), line["action"]) for _record, line in attempts(caplog, tool, logger)]


def replan_messages(caplog: pytest.LogCaptureFixture, tool: str) -> list[str]:
    """The messages of the `agent_retry.replan` events of `tool` (docs/events.md),
    from any of the package's loggers: what the model must be shown."""
    found = []
    for record in caplog.records:
        if not record.name.startswith("agent_retry_policy"):
            continue
        try:
            line = json.loads(record.getMessage())
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("event") == "agent_retry.replan" and line.get("tool") == tool:
            found.append(line["message"])
    return found
