"""The Python host's exam client for the host-conformance judge
(`agent-retry judge --exam tests/judge/exam.json -- <this command>`).

    python -m agent_retry_policy.exam --url URL --exam tests/judge/exam.json

Reads the exam and makes each of its runs through `RetryingToolCaller`: a fresh
policy instance and run per entry of "runs" (run id, "config", the real-clock
"attempt-timeout-ms", the "key-argument"), then each call in order. A replan
goes on to the next call, an escalation ends the run. The status checks are
built from the exam's "status-checks" spec. One JSON line per call outcome goes
to stdout, the wrapper's attempt log to stderr. Exits 0 once every run was made;
the judge then checks, from the server's side, what the host did. A tool
error's upstream status (the demo server's `structuredContent.error.status`) is
read by the policy itself from the structured content the wrapper passes on.
Mirrors the
Rust host's `agent-retry exam` (host-example/src/commands/exam.rs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcp.types import CallToolResult, TextContent

from .accounts import EmbeddedAccounts
from .component import PolicyComponent
from .entropy import OsEntropy
from .errors import Escalated
from .mcp_client import McpConnection, RetryingToolCaller, StatusCheck, StatusCheckRequest
from .types import StatusCheckResult


def status_check_from_spec(spec: Mapping[str, Any]) -> StatusCheck:
    """A status check built from an exam's spec: call `spec["tool"]` (directly,
    not through the policy) with the call's arguments named in
    `spec["arguments"]`; `found` if `structuredContent[spec["list"]]` holds an
    item whose `spec["match"]` fields all equal the call's arguments, `absent`
    if not, `unknown` if the read failed."""
    tool: str = spec["tool"]
    read_names: list[str] = list(spec["arguments"])
    list_name: str = spec["list"]
    match_names: list[str] = list(spec["match"])

    async def check(request: StatusCheckRequest) -> StatusCheckResult:
        arguments = request.arguments
        read = {name: arguments[name] for name in read_names if name in arguments}
        try:
            result = await request.session.call_tool(tool, read)
        except Exception:
            return "unknown"
        if result.is_error:
            return "unknown"
        structured = result.structured_content
        items = structured.get(list_name) if isinstance(structured, dict) else None
        if not isinstance(items, list):
            items = []
        missing = object()
        found = any(
            isinstance(item, dict) and all(item.get(name, missing) == arguments.get(name, missing) for name in match_names)
            for item in items
        )
        return "found" if found else "absent"

    return check


def _text(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def _emit(line: Mapping[str, Any]) -> None:
    print(json.dumps(line, ensure_ascii=False), flush=True)


async def run_exam(url: str, exam: Mapping[str, Any], component: PolicyComponent) -> int:
    """Makes every run of `exam` against `url`. Returns the number of calls that
    ended in an error that is not a policy outcome (0 when all went as designed)."""
    config = exam["config"]
    attempt_timeout_s = exam["attempt-timeout-ms"] / 1000
    key_argument = exam["key-argument"]
    checks = {tool: status_check_from_spec(spec) for tool, spec in exam.get("status-checks", {}).items()}
    errors = 0
    # The wrapper's own connection, as a user's: it negotiates the revision and
    # declares the tasks extension (the exam's J-9 is answered by a task).
    async with McpConnection.http(url) as connection:
        for run_spec in exam["runs"]:
            run_id = run_spec["run-id"]
            instance = component.instantiate(accounts=EmbeddedAccounts(), entropy=OsEntropy())
            run = instance.load_policy(config).start_run(run_id)
            caller = RetryingToolCaller(
                connection,
                run,
                status_check=checks,
                key_argument=key_argument,
                attempt_timeout_s=attempt_timeout_s,
            )
            for call in run_spec["calls"]:
                tool = call["tool"]
                try:
                    result = await caller.call_tool(tool, call.get("arguments", {}))
                except Escalated as e:
                    _emit({"run": run_id, "tool": tool, "outcome": "escalated", "reason": e.reason, "note": e.note})
                    break
                except Exception as e:  # not a policy outcome: a bug somewhere; report it, go on
                    errors += 1
                    _emit({"run": run_id, "tool": tool, "outcome": "error", "error": f"{type(e).__name__}: {e}"})
                    break
                if result.is_error:  # the wrapper returns a replan as an isError result
                    _emit({"run": run_id, "tool": tool, "outcome": "replan", "message": _text(result)})
                else:
                    _emit({"run": run_id, "tool": tool, "outcome": "done", "result": _text(result)})
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the MCP server's streamable HTTP endpoint")
    parser.add_argument("--exam", required=True, type=Path, help="the exam (tests/judge/exam.json)")
    parser.add_argument("--wasm", default=None, help="the component (default: $AGENT_RETRY_WASM or the repository's build)")
    args = parser.parse_args(argv)
    # The wrapper's attempt log (one JSON line per attempt) to stderr.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("agent_retry_policy.mcp")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    exam = json.loads(args.exam.read_text(encoding="utf-8"))
    component = PolicyComponent.load(args.wasm)
    errors = asyncio.run(run_exam(args.url, exam, component))
    if errors:
        print(f"exam: {errors} call(s) ended in an error that is not a policy outcome", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
