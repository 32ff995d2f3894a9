"""wasmtime's side of `npm run bench:fuel` (bench/fuel.ts): the same calls as
that script's, in the Python host (wasmtime-py), printing the fuel of each
as one JSON object. Run by bench/fuel.ts with the repository's .venv."""

import json
import sys

from agent_retry_policy import PolicyComponent
from agent_retry_policy.types import http_failure, tool_error

RULES = [{"contains": f"e_busy_{i}", "class": "transient"} for i in range(64)]


def main() -> int:
    instance = PolicyComponent.load().instantiate()
    fuel: dict[str, int] = {}
    policy = instance.load_policy({"tool-error-rules": RULES, "tools": {"t": {"effect": "read", "tool-error-rules": RULES}}})
    fuel["from-json"] = instance.fuel_used_by_last_call()
    run = policy.start_run("worst-case")

    def failure(name: str, observation: dict) -> None:
        start = run.begin_call("t", None, None, 1)
        run.record_failure(start.call_id, 1, observation, None, 1, 1)
        fuel[f"record-failure: {name}"] = instance.fuel_used_by_last_call()
        run.last_decision(start.call_id)
        fuel[f"last-decision: {name}"] = instance.fuel_used_by_last_call()

    failure("HTTP 503 with Retry-After", http_failure(503, "retry-after: 1", "upstream unavailable"))
    failure("hostile 8 KB tool error", tool_error("e_a " * 1024, '"' + "e_b " * 1023 + '"'))

    long = instance.load_policy({"max-steps-per-run": 1_000_000}).start_run("long")
    for i in range(10_000):
        long.record_success(long.begin_call("issue_refund", f"ar1-{i:032x}", None, 1).call_id, 1, 1)
    fuel["record-success (the 10,000th keyed write)"] = instance.fuel_used_by_last_call()
    last = long.begin_call("issue_refund", None, None, 1).call_id
    long.record_failure(last, 1, http_failure(403, "", "needs approval"), None, 1, 1)
    fuel["record-failure: 403 escalating a run of 10,000 effects"] = instance.fuel_used_by_last_call()
    long.last_decision(last)
    fuel["last-decision: 403 escalating a run of 10,000 effects"] = instance.fuel_used_by_last_call()
    json.dump(fuel, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
