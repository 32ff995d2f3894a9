"""A snapshot taken in Python, resumed in the other hosts (contract 0.9.0):
a Python caller escalates a keyed refund against the demo server (applied,
then timed out); its snapshot goes to a file; then the Node worker
(hosts/typescript/dist/test/resume-worker.js) and the Rust worker
(target/release/resume-worker) each resume it with `retry` on a new
connection, and the Python worker (resume_worker.py) in a process of its own
too. Each sends the same call with the Python call's key; the server's
ledger, which dedupes by key, holds one refund for it after all resumed.

A worker that is missing fails the test, naming how to build it, after the
workers that are there were checked."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from demo_server import Desk, timeout_after_apply
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from agent_retry_policy import EmbeddedAccounts, Escalated, PolicyComponent, SplitMix64
from agent_retry_policy.mcp_client import RetryingToolCaller, create_capturing_http_client

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
NODE_WORKER = ROOT / "hosts/typescript/dist/test/resume-worker.js"
RUST_WORKER = ROOT / "target/release/resume-worker"
CONFIG = {"base-delay-ms": 20, "max-delay-ms": 200, "max-attempts-per-call": 1}
REFUND = {"order_id": "A7", "amount_paise": 700}


def _escalate(desk: Desk) -> tuple[Escalated, str]:
    """The Python caller's keyed refund, applied then timed out: its escalation and the key it sent."""

    async def main() -> tuple[Escalated, str]:
        http_client = create_capturing_http_client(event_hooks={"request": [desk.record]})
        async with http_client:
            async with streamable_http_client(desk.url, http_client=http_client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
                    run = instance.load_policy(CONFIG).start_run("CROSS-HOST-1")
                    caller = RetryingToolCaller(session, run, entropy=SplitMix64(3), attempt_timeout_s=0.3)
                    try:
                        await caller.call_tool("issue_refund", dict(REFUND))
                    except Escalated as e:
                        return e, instance.derive_idempotency_key("CROSS-HOST-1", "step-1")
        raise AssertionError("the refund did not escalate")

    return asyncio.run(main())


def _worker(host: str, url: str, config_path: Path, snapshot_path: Path) -> dict[str, Any] | str:
    """One worker's JSON line, or (the worker is missing) what to build."""
    if host == "node":
        if not NODE_WORKER.exists():
            return f"{NODE_WORKER} is missing: build the Node host (npm run build in hosts/typescript)"
        command = [shutil.which("node") or "node", str(NODE_WORKER)]
    elif host == "rust":
        if not RUST_WORKER.exists():
            return f"{RUST_WORKER} is missing: build the workspace's binaries (cargo build --release, make judge-setup)"
        command = [str(RUST_WORKER)]
    else:
        command = [sys.executable, str(HERE / "resume_worker.py")]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    done = subprocess.run(
        [*command, url, str(config_path), str(snapshot_path), "retry"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert done.returncode == 0, f"{host} worker: exit {done.returncode}: {done.stderr[-2000:]}"
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["host"] == host, line
    return line


def test_a_python_snapshot_is_resumed_by_the_node_and_rust_workers_with_the_same_key_and_one_refund(serve: Any, tmp_path: Path) -> None:
    desk: Desk = serve({"tool": "issue_refund", "call": 1, "fault": timeout_after_apply(1000)})
    escalated, key = _escalate(desk)
    assert escalated.reason == "call-attempts-spent"
    assert escalated.snapshot is not None
    assert json.loads(escalated.snapshot)["answers"]["retry"] == "safe"
    assert desk.refunds() == [("A7", 700, key)]
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(CONFIG), encoding="utf-8")
    snapshot_path = tmp_path / "snapshot.json"
    snapshot_path.write_text(escalated.snapshot, encoding="utf-8")

    missing: list[str] = []
    resumed: list[str] = []
    for host in ("node", "rust", "python"):
        line = _worker(host, desk.url, config_path, snapshot_path)
        if isinstance(line, str):
            missing.append(line)
            continue
        resumed.append(host)
        assert line["action"] == "send", (host, line)
        assert line["key"] == key, (host, line, key)
        assert line["attempt"] == 2, (host, line)  # the resumed call's attempt (the snapshot's call stopped at 1)
        assert isinstance(line["call_id"], int), line
        assert "A7" in line["text"], line  # the tool's own result
        # A replay of the same keyed call: the ledger still holds one refund for the key.
        assert [r for r in desk.refunds() if r[2] == key] == [("A7", 700, key)], (host, desk.refunds())
    assert desk.refunds() == [("A7", 700, key)]
    sent_keys = [post.arguments.get("idempotency_key") for post in desk.posts_of("issue_refund")]
    assert sent_keys[0] == key  # the Python caller's attempt (the workers' are on their own connections)
    if missing:
        pytest.fail(f"resumed by {', '.join(resumed)} only; " + "; ".join(missing))
