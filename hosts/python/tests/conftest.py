"""Prints the conformance vectors' own tally at the end of a run. The fixtures
of the demo MCP server (demo_server.py): `demo` and `serve`; and `server`, a
redis-server of the test's own (redis_server.py). The package's plugin adds
`agent_retry_demo_server` (test_demo_server_fixture.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from demo_server import DemoServer, Desk
from redis_server import RedisServer

# The package's opt-in plugin, as a user's conftest.py loads it.
pytest_plugins = ["agent_retry_policy.pytest_plugin"]


@pytest.fixture
def demo() -> Iterator[Callable[..., DemoServer]]:
    """Starts demo servers for a test (`demo(*flags, faults=..., ledger=...)`, as
    `DemoServer` takes them) and stops them after it."""
    started: list[DemoServer] = []

    def start(*args: str, **options: Any) -> DemoServer:
        server = DemoServer(*args, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def serve(demo: Callable[..., DemoServer]) -> Callable[..., Desk]:
    """`serve(*rules)`: the demo server failing on this fault script (rules as
    demo-server/src/faults.rs reads them), its ledger in a file; a `Desk` that
    records what the client sends it. Stopped after the test."""

    def start(*rules: dict[str, Any]) -> Desk:
        running = demo(faults=list(rules), ledger=True)
        return Desk(running.url, running)

    return start


# The vectors' tally: under pytest-xdist (`make test-python`) the vectors run in
# worker processes, each of which hands its results to the controller.
_WORKER_VECTORS: dict[str, bool] = {}


def _vector_results() -> dict[str, bool]:
    try:
        from test_vectors import RESULTS
    except ImportError:
        return {}
    return dict(RESULTS)


def pytest_sessionfinish(session: Any) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["vectors"] = _vector_results()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: the LangChain venv has no xdist
def pytest_testnodedown(node: Any, error: Any) -> None:  # xdist's controller, a worker done
    _WORKER_VECTORS.update(getattr(node, "workeroutput", {}).get("vectors", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    results = {**_vector_results(), **_WORKER_VECTORS}
    if results:
        passed = sum(1 for ok in results.values() if ok)
        terminalreporter.write_line(f"vectors: {passed} passed, {len(results) - passed} failed")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    running = RedisServer()
    running.start()
    try:
        yield running
    finally:
        if running.process is not None:
            running.resume()
        running.stop()
