"""Per-decision cost of the policy component in Python (wasmtime-py), against
tenacity's per-attempt overhead measured in the same run.

A decision is what a host pays per failed attempt: `run.begin-call` +
`run.record-outcome` (an HTTP 503 with a Retry-After header) + `policy.next-delay`,
through the component. tenacity's figure is a retry loop over a function that
fails N times, with `wait_none()`, divided by the attempts made.

    python hosts/python/bench/bench.py [--rounds 5]

Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_none
from wasmtime.component import Record, Variant

from agent_retry_policy import EmbeddedAccounts, PolicyComponent

CONFIG = {"max-steps-per-run": 1_000_000, "max-retries-per-run": 100_000, "max-attempts-per-call": 100}
FAILURE = {"failure": {"kind": {"http-status": 503}, "headers": [("retry-after", "1")], "body": "upstream unavailable"}}


def per_op_us(run_batch: Callable[[int], None], n: int, rounds: int) -> float:
    """The median over `rounds` of the time per operation, in µs."""
    run_batch(max(n // 10, 1))  # warm up
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        run_batch(n)
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def component_decisions(n: int) -> None:
    policy = INSTANCE.load_policy(CONFIG)
    run = policy.start_run("bench")
    for i in range(n):
        if i % 500 == 499:  # keep each run far from its budgets
            run.close()
            run = policy.start_run(f"bench-{i}")
        now = 1_764_460_800_000 + i
        admission = run.begin_call({"tool": "lookup_order", "idempotency-key": "ar1-key"}, now)
        run.record_outcome(admission["send"]["call-id"], 1, FAILURE, now, 0x1234_5678_9ABC_DEF0)  # type: ignore[index]
        policy.next_delay(1, None, 0x0FED_CBA9_8765_4321)
    run.close()
    policy.close()


def stock_decisions(n: int) -> None:
    """The same calls through wasmtime-py's stock `Func.__call__` (types re-read each call)."""
    from wasmtime import Store
    from wasmtime.component import Linker

    component = PolicyComponent.load()
    store = Store(component.engine)
    store.set_fuel(2**63)
    linker = Linker(component.engine)
    with linker.root() as root:
        with root.add_instance(component.account_budget_interface) as budget:
            budget.add_func("reserve", lambda *_: Variant("granted", 0))
            budget.add_func("refund", lambda *_: None)
        with root.add_instance("wasi:random/random@0.2.6") as random:
            random.add_func("get-random-u64", lambda _store: 0)
    instance = linker.instantiate(store, component.component)
    interface = instance.get_export_index(store, component.policy_interface)

    def func(name: str):  # type: ignore[no-untyped-def]
        return instance.get_func(store, instance.get_export_index(store, name, interface))

    import json

    from_json, start_run = func("[static]policy.from-json"), func("[method]policy.start-run")
    begin, record, next_delay = func("[method]run.begin-call"), func("[method]run.record-outcome"), func("[method]policy.next-delay")
    policy = from_json(store, json.dumps(CONFIG))
    run = start_run(store, policy, "bench")
    for i in range(n):
        if i % 500 == 499:
            run = start_run(store, policy, f"bench-{i}")
        now = 1_764_460_800_000 + i
        call = Record()
        call.tool, call.hints = "lookup_order", None
        setattr(call, "idempotency-key", "ar1-key")
        admission = begin(store, run, call, now)
        failure = Record()
        failure.kind, failure.headers, failure.body = Variant("http-status", 503), [("retry-after", "1")], "upstream unavailable"
        setattr(failure, "structured-content", None)
        record(store, run, getattr(admission.payload.payload, "call-id"), 1, Variant("failure", failure), now, 0x1234_5678_9ABC_DEF0)
        next_delay(store, policy, 1, None, 0x0FED_CBA9_8765_4321)


class Flaky(Exception):
    pass


def tenacity_attempts(failures: int, sleep: Callable[[float], None] = time.sleep) -> Callable[[int], None]:
    def batch(n_attempts: int) -> None:
        calls = max(n_attempts // (failures + 1), 1)
        for _ in range(calls):
            remaining = [failures]

            def flaky(remaining: list[int] = remaining) -> str:
                if remaining[0]:
                    remaining[0] -= 1
                    raise Flaky()
                return "ok"

            retrying = Retrying(
                stop=stop_after_attempt(failures + 1), wait=wait_none(), retry=retry_if_exception_type(Flaky), reraise=True, sleep=sleep
            )
            for attempt in retrying:
                with attempt:
                    flaky()

    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--failures", type=int, default=9, help="N: tenacity's function fails N times, then succeeds")
    args = parser.parse_args()
    global INSTANCE
    INSTANCE = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    decision = per_op_us(component_decisions, args.decisions, args.rounds)
    stock = per_op_us(stock_decisions, max(args.decisions // 4, 100), args.rounds)
    attempts = args.decisions * 10
    tenacity = per_op_us(tenacity_attempts(args.failures), attempts, args.rounds)
    # tenacity calls time.sleep(0) between attempts even with wait_none(); this
    # isolates its bookkeeping from that system call.
    tenacity_cpu = per_op_us(tenacity_attempts(args.failures, sleep=lambda _seconds: None), attempts, args.rounds)
    rows = [
        ("component decision (begin-call + record-outcome + next-delay)", decision, ""),
        ("the same calls via stock wasmtime-py Func.__call__", stock, f"  ({stock / decision:.1f}x the cached codec)"),
        (f"tenacity per attempt (fails {args.failures}x, wait_none)", tenacity, ""),
        ("tenacity per attempt, its sleep(0) replaced by a no-op", tenacity_cpu, ""),
    ]
    for label, value, note in rows:
        print(f"python: {label:<64} {value:8.1f} µs{note}")
    print(
        f"python: ratio decision / tenacity attempt: {decision / tenacity:.2f} (with its sleep(0)), {decision / tenacity_cpu:.2f} (without)"
    )


INSTANCE = None  # set in main

if __name__ == "__main__":
    main()
