"""One worker of the cross-host resume test (test_resume_across_hosts.py; its
twins are hosts/typescript/test/resume-worker.ts, built to
hosts/typescript/dist/test/resume-worker.js, and the Rust resume-worker, built
to target/release/resume-worker): a new caller on a new connection to the MCP
server at URL, the policy configuration at CONFIG_PATH (JSON), resumes the
snapshot at SNAPSHOT_PATH with ANSWER (`retry`, `done` [TEXT] or
`done:TEXT` as the Rust worker takes it, `skip`, `abort`) and prints one JSON
line (`attempt`: the resumed call's, `Run.resumed_call()["attempt"]`):

    {"host": "python", "action": "send"|"succeed"|"replan"|"escalate",
     "text": <the tool's result text, the replan's message or the escalation's note>,
     "call_id": n, "attempt": n, "key": <the idempotency key sent, or null>}

    python resume_worker.py URL CONFIG_PATH SNAPSHOT_PATH retry|done|skip|abort [TEXT]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from mcp.types import TextContent

from agent_retry_policy import EmbeddedAccounts, Escalated, PolicyComponent, ResumeAnswer
from agent_retry_policy.mcp_client import McpConnection, RetryingToolCaller

USAGE = "usage: resume_worker.py URL CONFIG_PATH SNAPSHOT_PATH retry|done|skip|abort [TEXT]"


def answer_of(word: str, text: str | None) -> ResumeAnswer:
    if word == "retry":
        return ResumeAnswer.retry()
    if word == "done":
        return ResumeAnswer.done(text)
    if word.startswith("done:"):
        return ResumeAnswer.done(word[len("done:") :])
    if word == "skip":
        return ResumeAnswer.skip()
    if word == "abort":
        return ResumeAnswer.abort()
    raise SystemExit(USAGE)


async def main(url: str, config_path: str, snapshot_path: str, word: str, text: str | None = None) -> dict[str, Any]:
    answer = answer_of(word, text)
    config = Path(config_path).read_text(encoding="utf-8")
    snapshot = Path(snapshot_path).read_text(encoding="utf-8")
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    run = instance.load_policy(config).start_run("resume-worker")
    async with McpConnection.http(url) as connection:
        caller = RetryingToolCaller(connection, run)
        try:
            result = await caller.resume(snapshot, answer)
            said = " ".join(block.text for block in result.content if isinstance(block, TextContent))
        except Escalated as e:
            said = e.note
        call = caller.run.resumed_call()
    action = call["action"] if call is not None else "escalate"
    return {
        "host": "python",
        "action": action,
        "text": said,
        "call_id": call["call-id"] if call is not None else None,
        "attempt": call["attempt"] if call is not None else None,
        # The wrapper sends a resumed call's key as it sends every key (`key_argument`).
        "key": call["idempotency-key"] if call is not None and action == "send" else None,
    }


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        raise SystemExit(USAGE)
    print(json.dumps(asyncio.run(main(*sys.argv[1:6]))), flush=True)
