"""One worker of the cross-host breaker test (test_redis_shared_state.py; its
twins are hosts/typescript/test/breaker-worker.ts and the Rust
tests/harness breaker-worker, built to target/release/breaker-worker): the
component with a breaker configuration and the shared state on Redis at URL
(`FallbackSharedState`), one run, and:

- `open`: a call of `lookup_order` on SERVER fails twice with 503, which opens
  the breakers; prints {"host", "mode", "action" (the verdict's of attempt 2),
  "changes": [{old, new, tool}]};
- `call`: begins a call of `lookup_order` on SERVER; prints {"host", "mode",
  "admitted", "replan", "message" (the replan's text, else null)}.

    python breaker_worker.py URL SERVER open|call
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from agent_retry_policy import EmbeddedAccounts, FallbackSharedState, PolicyComponent

CONFIG = {"tools": {"lookup_order": {"effect": "read"}}, "circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60000}}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def main(url: str, server: str, mode: str) -> dict[str, Any]:
    if mode not in ("open", "call"):
        raise SystemExit("usage: breaker_worker.py URL SERVER open|call")
    shared_state = FallbackSharedState.open(url)
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), shared_state=shared_state)
    run = instance.load_policy(CONFIG).start_run("breaker-worker")
    start = run.begin_call("lookup_order", None, None, now_ms(), server=server)
    if mode == "call":
        message = None
        if start.replan:
            decision = run.last_decision(start.call_id)
            action = decision["action"] if decision is not None else None
            message = action["replan"] if isinstance(action, dict) and "replan" in action else ""
        elif not start.admitted:
            escalation = run.escalation()
            message = escalation.get("note") if escalation is not None else None
        return {"host": "python", "mode": "call", "admitted": start.admitted, "replan": start.replan, "message": message}
    if not start.admitted:
        raise SystemExit(f"open: the call was not admitted: {start}")
    action = ""
    for attempt in (1, 2):
        failure = {"kind": {"http-status": 503}, "body": "upstream unavailable", "delivery": "sent"}
        action = run.record_failure(start.call_id, attempt, failure, None, now_ms(), 0).action  # type: ignore[arg-type]
    changes = [{"old": c["old-state"], "new": c["new-state"], "tool": c["tool"]} for c in run.take_breaker_changes()]
    if shared_state.fallbacks:
        raise SystemExit(f"open: Redis at {url} failed {shared_state.fallbacks} time(s): the breaker stayed in this process")
    return {"host": "python", "mode": "open", "action": action, "changes": changes}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: breaker_worker.py URL SERVER open|call")
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
