"""The shared state (the circuit breakers' store) on Redis
(agent_retry_policy.redis_shared_state), against a real redis-server of each
test's own: `RedisSharedState`'s compare-and-set by version, absent keys,
wrong-typed keys, expiry and the server's clock; `FallbackSharedState` with
Redis killed (its own state, logged once) and back; the cross-host test:
Python, Node and Rust worker processes (breaker_worker.py, its twins
hosts/typescript/test/breaker-worker.ts and target/release/breaker-worker) see
one breaker per server; and a half-open breaker lets exactly one probe through
32 component instances asking at once."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_server import RedisServer

from agent_retry_policy import EmbeddedAccounts, FallbackSharedState, PolicyComponent, RedisSharedState, SharedStateError
from agent_retry_policy.redis_accounts import REDIS_TIMEOUT_S
from agent_retry_policy.redis_scripts import STATE_PREFIX

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
NODE_WORKER = ROOT / "hosts/typescript/dist/test/breaker-worker.js"
# The Rust worker (tests/harness, the bin breaker-worker), built by `make judge-setup`.
RUST_WORKER = ROOT / "target/release/breaker-worker"
LOGGER = "agent_retry_policy.shared_state"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cli(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=2)


def test_the_redis_state_compares_and_sets_by_version_on_the_servers_clock(server: RedisServer) -> None:
    state = RedisSharedState.connect(server.url)
    absent = state.try_load("breaker:a")
    assert (absent["value"], absent["version"]) == (None, 0)
    assert not state.try_store_if("breaker:a", 1, "wrong version", 60_000), "absent is version 0"
    assert state.try_store_if("breaker:a", 0, "first", 60_000)
    assert not state.try_store_if("breaker:a", 0, "a second writer from version 0", 60_000)
    assert state.try_store_if("breaker:a", 1, "second ✓", 60_000)
    loaded = state.try_load("breaker:a")
    assert (loaded["value"], loaded["version"]) == ("second ✓", 2)
    raw = cli(server)
    assert raw.type(f"{STATE_PREFIX}breaker:a") == b"hash"
    assert raw.hgetall(f"{STATE_PREFIX}breaker:a") == {b"value": "second ✓".encode(), b"version": b"2"}
    assert 0 < raw.pttl(f"{STATE_PREFIX}breaker:a") <= 60_000
    # now-ms is the server's clock, not the one passed (there is none to pass).
    seconds, micros = raw.time()
    assert abs(loaded["now-ms"] - (seconds * 1000 + micros // 1000)) < 1_000, (loaded, seconds, micros)
    # Another key is another text.
    assert state.try_load("breaker:b")["version"] == 0


def test_a_wrong_typed_key_reads_as_absent_and_the_next_store_replaces_it(server: RedisServer) -> None:
    state = RedisSharedState.connect(server.url)
    raw = cli(server)
    raw.set(f"{STATE_PREFIX}text", "another program's")
    raw.rpush(f"{STATE_PREFIX}list", "x")
    raw.hset(f"{STATE_PREFIX}no-version", "value", "v")
    raw.hset(f"{STATE_PREFIX}bad-version", mapping={"value": "v", "version": "not a number"})
    for key in ("text", "list", "no-version", "bad-version"):
        loaded = state.try_load(key)
        assert (loaded["value"], loaded["version"]) == (None, 0), key
        assert not state.try_store_if(key, 1, "v", 60_000), key
        assert state.try_store_if(key, 0, f"mine {key}", 60_000), key
        assert raw.type(f"{STATE_PREFIX}{key}") == b"hash", key
        loaded = state.try_load(key)
        assert (loaded["value"], loaded["version"]) == (f"mine {key}", 1), key


def test_a_huge_or_undecodable_text_is_never_copied_into_the_component_and_is_replaced(server: RedisServer) -> None:
    """A 50 MB text under a breaker's key once cost every reader the
    instance (PolicyMemoryExceeded, then InstanceUnusable); bytes that are not
    UTF-8 once sent every worker to its local state."""
    state = FallbackSharedState(RedisSharedState.connect(server.url))
    raw = cli(server)
    name = f"https://{uuid.uuid4().hex}.example/mcp"
    key = f"breaker:{len(name)}:{name}"
    raw.hset(f"{STATE_PREFIX}{key}", mapping={"value": "x" * 50_000_000, "version": 7})
    loaded = state.load(key, 1)
    assert (loaded["value"], loaded["version"]) == (None, 7), "absent at its version: the next store replaces it"
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), shared_state=state)
    config = {"tools": {"lookup_order": {"effect": "read"}}, "circuit-breaker": {"failures-to-open": 1}}
    first = run.load_policy(config).start_run("r")
    start = first.begin_call("lookup_order", None, None, now_ms(), server=name)
    assert start.admitted
    first.record_failure(start.call_id, 1, {"kind": {"http-status": 503}, "delivery": "sent"}, None, now_ms(), 0)
    assert raw.hget(f"{STATE_PREFIX}{key}", "value").startswith(b"b1 o "), "replaced by the policy's own text"
    raw.hset(f"{STATE_PREFIX}{key}", mapping={"value": b"\xff\xfe", "version": 9})
    assert (state.load(key, 1)["value"], state.load(key, 1)["version"]) == (None, 9)
    assert state.fallbacks == 0, "bytes that are not a text are not a Redis failure"


def test_a_text_expires_after_its_ttl(server: RedisServer) -> None:
    state = RedisSharedState.connect(server.url)
    assert state.try_store_if("short", 0, "v", 150)
    assert state.try_load("short")["version"] == 1
    time.sleep(0.3)
    expired = state.try_load("short")
    assert (expired["value"], expired["version"]) == (None, 0)
    assert state.try_store_if("short", 0, "again", 60_000), "expired: version 0 again"
    assert state.try_store_if("zero", 0, "v", 0), "a ttl of 0 is stored for 1 ms"
    time.sleep(0.05)
    assert state.try_load("zero")["version"] == 0


def test_a_bad_url_and_a_closed_port_are_clear_errors() -> None:
    with pytest.raises(SharedStateError, match="shared state") as bad:
        RedisSharedState.connect("http://127.0.0.1:6379")
    assert bad.value.kind == "bad-url"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SharedStateError, match="unusable") as refused:
        FallbackSharedState.open(f"redis://127.0.0.1:{closed}/")
    assert refused.value.kind == "unreachable" and time.monotonic() - started < REDIS_TIMEOUT_S + 1


def records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and text in r.getMessage()]


def test_with_redis_killed_the_state_is_this_processs_logged_once_and_redis_is_used_again(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    state = FallbackSharedState.open(server.url, retry_interval_s=0.2)
    assert state.store_if("k", 0, "on redis", 60_000)
    assert state.load("k", 5)["value"] == "on redis"
    assert not state.store_if("big", 0, "x" * 1_025, 60_000), "over 1,024 bytes: refused before Redis"
    assert state.fallbacks == 0
    server.stop()
    started = time.monotonic()
    answers = []
    # Local: empty at first (the fleet's state is not seen), then its own.
    for _ in range(3):
        asked = time.monotonic()
        loaded = state.load("k", 42)
        answers.append(time.monotonic() - asked)
    assert loaded == {"value": None, "version": 0, "now-ms": 42}, "the local state answers, with the now passed"
    assert state.store_if("k", 0, "local", 60_000)
    assert state.load("k", 43) == {"value": "local", "version": 1, "now-ms": 43}
    while time.monotonic() - started < 0.7:  # Redis tried again (every 0.2 s) and still down
        state.load("k", 44)
        time.sleep(0.02)
    assert max(answers) < REDIS_TIMEOUT_S + 0.2, f"answered in time: {max(answers):.3f} s"
    assert state.fallbacks == 1, "one fallback however often Redis was tried again"
    [fallback] = records(caplog, "Redis failed")
    assert fallback.levelname == "WARNING" and fallback.redis == server.url and fallback.reason  # type: ignore[attr-defined]
    server.start()  # the same port, empty
    cli(server).hset(f"{STATE_PREFIX}k", mapping={"value": "the fleet's", "version": 7})
    time.sleep(0.25)
    loaded = state.load("k", 45)
    assert (loaded["value"], loaded["version"]) == ("the fleet's", 7), "Redis again"
    assert loaded["now-ms"] != 45
    assert state.store_if("k", 7, "back", 60_000)
    assert cli(server).hget(f"{STATE_PREFIX}k", "value") == b"back"
    assert state.fallbacks == 1
    assert len(records(caplog, "Redis answers again")) == 1
    assert len(records(caplog, "Redis failed")) == 1


def run_worker(host: str, url: str, server_name: str, mode: str) -> dict[str, Any]:
    """One worker process of `host` ("python", "node", "rust"); its JSON line."""
    if host == "node":
        if not NODE_WORKER.exists():
            pytest.fail(f"{NODE_WORKER} is missing: build the Node host (make hosts-ts-setup, or npm run build in hosts/typescript)")
        command = [shutil.which("node") or "node", str(NODE_WORKER)]
    elif host == "rust":
        if not RUST_WORKER.exists():
            pytest.fail(f"{RUST_WORKER} is missing: build the workspace's binaries (make judge-setup)")
        command = [str(RUST_WORKER)]
    else:
        command = [sys.executable, str(HERE / "breaker_worker.py")]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    done = subprocess.run([*command, url, server_name, mode], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, f"{host} {mode}: exit {done.returncode}: {done.stderr[-2000:]}"
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["host"], line["mode"]) == ({"python": "python", "node": "node", "rust": "rust"}[host], mode), line
    return line


def assert_opened(line: dict[str, Any]) -> None:
    assert line["action"] == "replan", line
    assert {"old": "closed", "new": "open", "tool": None} in line["changes"], line


def assert_refused(line: dict[str, Any], server_name: str) -> None:
    assert (line["admitted"], line["replan"]) == (False, True), line
    # The model is told the scheme and host; the path (here the test's own id) stays out of its context.
    shown = server_name[: server_name.index("/", len("https://"))]
    assert "circuit breaker open" in line["message"] and f"The server {shown} has" in line["message"], line
    assert server_name not in line["message"], line


def test_workers_of_every_host_see_one_breaker_per_server(server: RedisServer) -> None:
    first = f"https://orders.example.com/{uuid.uuid4().hex}"
    assert run_worker("python", server.url, first, "call")["admitted"], "closed at first"
    assert_opened(run_worker("python", server.url, first, "open"))
    assert_refused(run_worker("node", server.url, first, "call"), first)
    assert_refused(run_worker("rust", server.url, first, "call"), first)
    second = f"https://orders.example.com/{uuid.uuid4().hex}"
    assert_opened(run_worker("node", server.url, second, "open"))
    assert_refused(run_worker("python", server.url, second, "call"), second)
    third = f"https://orders.example.com/{uuid.uuid4().hex}"
    assert_opened(run_worker("rust", server.url, third, "open"))
    assert_refused(run_worker("python", server.url, third, "call"), third)
    # Another server's breaker is its own.
    assert run_worker("python", server.url, f"https://orders.example.com/{uuid.uuid4().hex}", "call")["admitted"]


def test_a_half_open_breaker_lets_exactly_one_probe_through_32_instances_at_once(server: RedisServer) -> None:
    config = {"tools": {"lookup_order": {"effect": "read"}}, "circuit-breaker": {"failures-to-open": 1, "cooldown-ms": 200}}
    server_name = f"https://probe.example.com/{uuid.uuid4().hex}"
    component = PolicyComponent.load()
    opener = component.instantiate(accounts=EmbeddedAccounts(), shared_state=FallbackSharedState.open(server.url)).load_policy(config)
    run = opener.start_run("opener")
    start = run.begin_call("lookup_order", None, None, now_ms(), server=server_name)
    assert start.admitted
    failure: Any = {"kind": {"http-status": 503}, "body": "upstream unavailable", "delivery": "sent"}
    run.record_failure(start.call_id, 1, failure, None, now_ms(), 0)
    refused = opener.start_run("refused").begin_call("lookup_order", None, None, now_ms(), server=server_name)
    assert refused.replan, "open after one failure"

    count = 32
    ready = threading.Barrier(count + 1)
    go = threading.Event()
    answers: list[tuple[bool, bool] | BaseException] = [ValueError("no answer")] * count
    states = [FallbackSharedState.open(server.url) for _ in range(count)]

    def worker(i: int) -> None:
        try:
            policy = component.instantiate(accounts=EmbeddedAccounts(), shared_state=states[i]).load_policy(config)
            run = policy.start_run(f"worker-{i}")
        except BaseException as e:
            answers[i] = e
            ready.wait(timeout=60)
            return
        ready.wait(timeout=60)
        go.wait(timeout=60)
        try:
            begun = run.begin_call("lookup_order", None, None, now_ms(), server=server_name)
            answers[i] = (begun.admitted, begun.replan)
        except BaseException as e:
            answers[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=120)  # every instance made, then the cooldown
    time.sleep(0.25)
    go.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert not errors, errors
    assert all(s.fallbacks == 0 for s in states), "every instance on Redis"
    admitted = [a for a in answers if a == (True, False)]
    replans = [a for a in answers if a == (False, True)]
    assert (len(admitted), len(replans)) == (1, count - 1), answers


def test_the_ratio_retry_budget_is_one_account_s_across_instances_on_redis(server: RedisServer) -> None:
    """Contract 0.9.0's `account-budget.retry-ratio` keeps its counts in the
    shared state: two instances with their own Redis clients (two workers)
    count one account's calls and retries together, under one key."""
    account = f"acct-{uuid.uuid4().hex[:8]}"
    config = {
        "tools": {"lookup_order": {"effect": "read"}},
        "account-budget": {
            "account-id": account,
            "capacity": 1000,
            "refill-interval-ms": 1,
            "retry-ratio": {"percent": 100, "min-retries-per-second": 0, "window-ms": 60_000},
        },
    }
    component = PolicyComponent.load()
    workers = [
        component.instantiate(accounts=EmbeddedAccounts(), shared_state=FallbackSharedState.open(server.url)).load_policy(config)
        for _ in range(2)
    ]
    failure: Any = {"kind": {"http-status": 503}, "body": "upstream unavailable", "delivery": "sent"}
    runs = [worker.start_run(f"worker-{i}") for i, worker in enumerate(workers)]
    starts = [run.begin_call("lookup_order", None, None, now_ms()) for run in runs]
    # Two calls in the account allow two retries. The first worker takes both: its
    # second is allowed only because it counts the other worker's call...
    for attempt in (1, 2):
        verdict = runs[0].record_failure(starts[0].call_id, attempt, failure, None, now_ms(), 0)
        assert verdict.action == "retry", (attempt, verdict)
    # ...and the second worker's retry is refused, though its own instance saw one call and no retry.
    second = runs[1].record_failure(starts[1].call_id, 1, failure, None, now_ms(), 0)
    assert second.action == "escalate", second
    escalation = runs[1].escalation()
    assert escalation is not None and escalation["reason"] == "retry-budget-exhausted", escalation
    stored = cli(server).hget(f"{STATE_PREFIX}retry-ratio:{len(account)}:{account}", "value")
    assert stored is not None and stored.decode().split(" ")[2:4] == ["2", "2"], stored
