"""Testing helpers: a fake clock and a fixed entropy source, so a run through
the any-call helper (or a wrapper given `clock=`) replays exactly; and the demo
MCP server failing on a fault script (`demo_server`; as a pytest fixture:
`agent_retry_policy.pytest_plugin`).

    clock = FakeClock(1_700_000_000_000)
    value = await call_with_policy(run, "get_quote", fetch, clock=clock, entropy=fixed_entropy(7))
    assert clock.sleeps_ms == [412, 1000]

    with demo_server([{"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503}}]) as url:
        ...  # McpConnection.http(url): the first lookup_order is answered 503
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

from .entropy import SplitMix64

# What `demo_server` takes as a fault script: a file, a list of rules, or one rule.
Faults = Union[str, "os.PathLike[str]", Sequence[Mapping[str, Any]], Mapping[str, Any], None]
# The line the demo server prints on stderr once it listens.
_READY = re.compile(r"demo MCP server at (\S+)")
# How long the server may take to print it.
START_TIMEOUT_S = 30.0


class FakeClock:
    """A clock whose time moves only when slept on: `now_ms()` is the time,
    `await sleep(s)` advances it by `s` seconds at once (yielding to the event
    loop once) and records the sleep (`sleeps_ms`)."""

    def __init__(self, start_ms: int = 0) -> None:
        if isinstance(start_ms, bool) or not isinstance(start_ms, int) or start_ms < 0:
            raise ValueError(f"start_ms must be a non-negative integer, got {start_ms!r}")
        self._now_ms = start_ms
        self.sleeps_ms: list[int] = []

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        """Moves the time on by `ms` without a sleep (time spent elsewhere)."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += ms

    async def sleep(self, seconds: float) -> None:
        ms = max(0, round(seconds * 1000))
        self.sleeps_ms.append(ms)
        self._now_ms += ms
        await asyncio.sleep(0)


def fixed_entropy(seed: int) -> SplitMix64:
    """The entropy of a replayable run: SplitMix64 from `seed`, the same
    sequence in every host."""
    return SplitMix64(seed)


def demo_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """The `agent-retry` binary: `binary`, else $AGENT_RETRY_BIN, else
    `agent-retry` on PATH, else the repository's `target/release/agent-retry`
    (an editable install). Raises `FileNotFoundError` naming what was tried."""
    if binary is not None:
        candidates = [str(binary)]
    elif os.environ.get("AGENT_RETRY_BIN"):
        candidates = [os.environ["AGENT_RETRY_BIN"]]
    else:
        on_path = shutil.which("agent-retry")
        candidates = [on_path] if on_path else []
        candidates.append(str(Path(__file__).resolve().parents[4] / "target" / "release" / "agent-retry"))
    for candidate in candidates:
        if Path(candidate).is_file():
            return candidate
    raise FileNotFoundError(
        f"no agent-retry binary ({', '.join(candidates)}): pass binary=, set AGENT_RETRY_BIN, or build it (`make judge-setup`)"
    )


@contextmanager
def demo_server(faults: Faults = None, *, binary: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """Runs `agent-retry serve --http 127.0.0.1:0 --faults F` (a port the system
    picks free) and yields its URL (`http://127.0.0.1:PORT/mcp`) once it
    listens; stops it on exit. `faults` is a fault script's file, or its rules
    (demo-server/src/faults.rs; one rule or a list), written to a temporary
    file; None: no faults."""
    with tempfile.TemporaryDirectory(prefix="agent-retry-demo-") as scratch:
        command = [demo_binary(binary), "serve", "--http", "127.0.0.1:0"]
        if isinstance(faults, (str, os.PathLike)):
            command += ["--faults", os.fspath(faults)]
        elif faults is not None:
            rules = [faults] if isinstance(faults, Mapping) else list(faults)
            script = Path(scratch, "faults.json")
            script.write_text(json.dumps(rules))
            command += ["--faults", str(script)]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            yield _listening(process, command)
        finally:
            _stop(process)


def _listening(process: subprocess.Popen[str], command: list[str]) -> str:
    """The URL the server prints once it listens; its stderr is read on until it ends (so the pipe never fills)."""
    seen: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            seen.append(line)
            found = _READY.search(line)
            if found and not url:
                url.append(found.group(1))
                ready.set()
        ready.set()  # it ended without listening

    threading.Thread(target=drain, name="agent-retry demo server stderr", daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or not url:
        raise RuntimeError(f"the demo server did not start ({' '.join(command)}): {''.join(seen)[-2000:]}")
    return url[0]


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


__all__ = ["FakeClock", "demo_binary", "demo_server", "fixed_entropy"]
