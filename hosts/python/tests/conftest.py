"""Prints the conformance vectors' own tally at the end of a run."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    try:
        from test_vectors import RESULTS
    except ImportError:
        return
    if RESULTS:
        passed = sum(1 for ok in RESULTS.values() if ok)
        terminalreporter.write_line(f"vectors: {passed} passed, {len(RESULTS) - passed} failed")
