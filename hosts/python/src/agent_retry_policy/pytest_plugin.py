"""The package's pytest plugin, opt-in (`pytest_plugins =
["agent_retry_policy.pytest_plugin"]` in a conftest.py; not an entry point, so
that installing the package never slows or breaks another project's pytest):
the fixture `agent_retry_demo_server`, the URL of the demo MCP server
(`agent-retry serve`, `agent_retry_policy.testing.demo_server`) failing on the
fault script of the test's `agent_retry_faults` mark, stopped after the test.

    @pytest.mark.agent_retry_faults({"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503}})
    def test_a_503_is_retried(agent_retry_demo_server: str) -> None:
        ...  # McpConnection.http(agent_retry_demo_server)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .testing import Faults, demo_server

MARK = "agent_retry_faults"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(*rules, binary=None): the fault script of the agent_retry_demo_server fixture: its rules "
        "(demo-server/src/faults.rs), a list of them, or a file; `binary`: the agent-retry binary",
    )


def faults_of(mark: pytest.Mark | None) -> Faults:
    """The fault script a mark names: one file or list as its only argument, else its arguments as the rules."""
    if mark is None:
        return None
    args: tuple[Any, ...] = mark.args
    if len(args) == 1 and isinstance(args[0], (str, os.PathLike, list, tuple)):
        return args[0]
    return list(args)


@pytest.fixture
def agent_retry_demo_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The demo MCP server's URL, failing on the test's `agent_retry_faults` script (none without the mark)."""
    mark = request.node.get_closest_marker(MARK)
    binary = mark.kwargs.get("binary") if mark is not None else None
    with demo_server(faults_of(mark), binary=binary) as url:
        yield url
