"""Live updates in the Python host: what an update costs (read, integrity,
compile, contract and import checks, configuration, the gate's vectors, swap:
`LivePolicy.reload()`) and what decisions cost on another thread while updates
run back to back, against the same decisions at rest, in the same run.

    python hosts/python/bench/live.py [--rounds 10]

Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from agent_retry_policy import EmbeddedAccounts, Integrity, LivePolicy, PolicySource
from agent_retry_policy.component import locate_component
from agent_retry_policy.types import http_failure

CONFIG = {"max-steps-per-run": 1_000_000, "max-retries-per-run": 100_000, "max-attempts-per-call": 100}
FAILURE = http_failure(503, [("retry-after", "1")], "upstream unavailable")
DECISIONS = 2_000


def another_build(wasm: bytes, tag: str) -> bytes:
    """The same component with a custom section appended: another digest, the same policy."""
    name = b"agent-retry-bench"
    body = bytes([len(name)]) + name + tag.encode()
    return wasm + bytes([0, len(body)]) + body


def decision_us(live: LivePolicy) -> float:
    """µs per decision (begin-call + record-failure of a 503 with Retry-After) on the serving policy."""
    loaded = live.current()
    policy = loaded.component.instantiate(accounts=EmbeddedAccounts()).load_policy(json.loads(loaded.config_json))
    run = policy.start_run("bench")
    start = time.perf_counter()
    for i in range(DECISIONS):
        now = time.time_ns() // 1_000_000
        call = run.begin_call("lookup_order", "ar1-key", None, now)
        verdict = run.record_failure(call.call_id, 1, FAILURE, None, now, i)
        assert verdict.action == "retry", verdict
    took = time.perf_counter() - start
    run.close()
    policy.close()
    return took / DECISIONS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    folder = Path(tempfile.mkdtemp(prefix="agent-retry-live-bench-"))
    try:
        wasm = locate_component().read_bytes()
        source = PolicySource(folder / "policy.wasm", folder / "policy.json", Integrity.unchecked())
        source.wasm.write_bytes(wasm)
        source.config.write_text(json.dumps(CONFIG))
        live = LivePolicy.open(source)

        def timed_reload() -> float:
            start = time.perf_counter()
            live.reload()
            return (time.perf_counter() - start) * 1e3

        config_ms = []
        for n in range(rounds):
            source.config.write_text(json.dumps({**CONFIG, "max-attempts-per-call": 10 + n}))
            config_ms.append(timed_reload())
        wasm_ms = []
        for n in range(rounds):
            source.wasm.write_bytes(another_build(wasm, f"update-{n}"))
            wasm_ms.append(timed_reload())

        at_rest = statistics.median(decision_us(live) for _ in range(3))
        done = threading.Event()

        def reload_back_to_back() -> None:
            for n in range(rounds):
                source.wasm.write_bytes(another_build(wasm, f"during-{n}"))
                live.reload()
            done.set()

        reloader = threading.Thread(target=reload_back_to_back)
        reloader.start()
        during = []
        while not done.is_set():
            during.append(decision_us(live))
        reloader.join()
        at_rest_again = statistics.median(decision_us(live) for _ in range(3))
        live.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"live update in the Python host ({rounds} reloads each, median; {len(wasm)} bytes of .wasm)")
    print(f"  configuration change (read, checks, gate vectors, swap; no compile): {statistics.median(config_ms):8.1f} ms")
    print(f"  new .wasm            (read, compile, checks, gate vectors, swap):    {statistics.median(wasm_ms):8.1f} ms")
    print(f"decision (begin-call + record-failure of a 503), {DECISIONS} per measure:")
    print(f"  at rest:                                   {at_rest:8.1f} µs")
    during_us = statistics.mean(during)
    print(f"  while {rounds} new .wasm reload on another thread: {during_us:8.1f} µs = {during_us / at_rest:.2f}x at rest")
    print(f"  at rest again:                             {at_rest_again:8.1f} µs")


if __name__ == "__main__":
    main()
