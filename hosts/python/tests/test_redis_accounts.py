"""The account budget on Redis (agent_retry_policy.redis_accounts), against a
real redis-server of each test's own: the Rust host's semantics sequence; the
limit held by several workers on separate connections; the fallback to a local
share when Redis is killed, logged once, and the return with the local takes
charged; a wrong-typed key repaired and logged; a lost key re-created from the
last TAT seen; every exchange with a paused Redis ended within the timeout;
bad configurations as clear errors; and the cross-host test: Python, Node and
Rust worker processes (accounts_draw.py, its twins accounts-draw.ts and
tests/harness/src/bin/accounts-draw.rs) on one account, never past its allowance."""

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
from pathlib import Path

import pytest
import redis
from redis_server import RedisServer

from agent_retry_policy import AccountsError, Bucket, PolicyComponent, RedisAccounts, Reservation, SharedAccounts
from agent_retry_policy.redis_accounts import REDIS_TIMEOUT_S
from agent_retry_policy.redis_scripts import ACCOUNT_PREFIX

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
NODE_DRAW = ROOT / "hosts/typescript/dist/test/accounts-draw.js"
# The Rust worker (tests/harness/src/bin/accounts-draw.rs), built by `make judge-setup`.
RUST_DRAW = ROOT / "target/release/accounts-draw"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cli(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=2)


def close(got: Reservation, granted: bool, wait_ms: int) -> None:
    assert got.granted == granted and abs(got.wait_ms - wait_ms) <= 200, f"got {got}, expected about {(granted, wait_ms)}"


def test_the_redis_backend_has_the_rust_hosts_semantics(server: RedisServer) -> None:
    # tests/harness/tests/e2e/accounts.rs check_semantics, step for step.
    shared = SharedAccounts.open(server.url, workers=16)
    bucket = Bucket(3, 10_000)

    def take(tokens: int) -> Reservation:
        return shared.reserve("semantics", tokens, bucket, 25_000, now_ms())

    for _ in range(3):
        close(take(1), True, 0)
    close(take(1), True, 10_000)
    close(take(1), True, 20_000)
    close(take(1), False, 30_000)
    close(take(1), False, 30_000)
    close(take(0), True, 0)
    close(shared.reserve("other", 3, bucket, 0, now_ms()), True, 0)
    shared.refund("semantics", 2, bucket, now_ms())
    close(take(1), True, 10_000)
    shared.refund("semantics", 1000, bucket, now_ms())
    for _ in range(3):
        close(take(1), True, 0)
    close(take(1), True, 10_000)
    assert shared.fallbacks == 0, "every answer came from Redis"
    assert cli(server).type(f"{ACCOUNT_PREFIX}semantics") == b"string", "the Rust host's key"


def test_a_bad_url_a_closed_port_and_a_garbage_server_are_clear_errors() -> None:
    with pytest.raises(AccountsError) as bad:
        RedisAccounts.connect("http://127.0.0.1:6379")
    assert bad.value.kind == "bad-url"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(AccountsError) as refused:
        RedisAccounts.connect(f"redis://127.0.0.1:{closed}/")
    assert refused.value.kind == "unreachable" and time.monotonic() - started < 5
    # A server that answers something else, then nothing: an error within the timeout, not a hang.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage() -> None:
        connection, _ = listener.accept()
        connection.recv(256)
        connection.sendall(b"HTTP/1.1 200 OK\r\n\r\nthis is not redis")
        time.sleep(5)
        connection.close()

    threading.Thread(target=garbage, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(AccountsError, match="unusable") as garbled:
        RedisAccounts.connect(f"redis://127.0.0.1:{listener.getsockname()[1]}/")
    assert garbled.value.kind == "unreachable" and time.monotonic() - started < REDIS_TIMEOUT_S + 0.5
    listener.close()


def busiest(times: list[int], window_ms: int) -> int:
    """The most grants in any window of `window_ms` (sliding)."""
    times = sorted(times)
    return max((sum(1 for t in times[i:] if t < start + window_ms) for i, start in enumerate(times)), default=0)


def test_several_workers_on_separate_connections_stay_inside_the_allowance(server: RedisServer) -> None:
    # 6 workers, each its own SharedAccounts and connection, each asking far
    # more often than the bucket allows: 10 at once, then one per 50 ms.
    workers, capacity, interval, duration = 6, 10, 50, 1_500
    backends = [SharedAccounts.open(server.url, workers=workers) for _ in range(workers)]
    grants: list[list[int]] = [[] for _ in range(workers)]
    start = now_ms() + 200

    def work(w: int) -> None:
        while now_ms() < start:
            time.sleep(0.001)
        while (now := now_ms()) < start + duration:
            if backends[w].reserve("limit", 1, Bucket(capacity, interval), 0, now).granted:
                grants[w].append(now_ms())
            time.sleep(0.002)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [t for g in grants for t in g]
    allowed = capacity + duration // interval
    print(
        f"python, {workers} workers: {len(every)} grants in {duration} ms (the bucket allows {allowed}), busiest 1000 ms {busiest(every, 1000)}"
    )
    assert len(every) <= allowed + 2, f"{len(every)} grants, the bucket allows {allowed}"
    assert busiest(every, 1_000) <= capacity + 1_000 // interval + 3
    assert len(every) >= allowed * 3 // 4, f"the workers asked far more than allowed, yet got only {len(every)}"
    assert sum(1 for g in grants if g) >= 2, "the grants went to several workers"
    assert all(b.fallbacks == 0 for b in backends)


def test_instances_of_the_component_on_separate_connections_share_the_account(server: RedisServer) -> None:
    config = {"account-budget": {"account-id": "component", "capacity": 1, "refill-interval-ms": 60_000, "max-wait-ms": 0}}
    component = PolicyComponent.load()
    first, second = (component.instantiate(accounts=SharedAccounts.open(server.url, workers=2)).load_policy(config) for _ in range(2))
    assert first.start_run("a").begin_call("lookup", None, None, now_ms()).admitted
    run = second.start_run("b")
    refused = run.begin_call("lookup", None, None, now_ms())
    assert not refused.admitted, f"the other instance took the only token: {refused}"
    escalation = run.escalation()
    assert escalation is not None and escalation["reason"] == "account-budget-exhausted", escalation


def records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agent_retry_policy.accounts" and text in r.getMessage()]


def test_redis_killed_falls_back_to_the_local_share_logs_once_and_comes_back(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agent_retry_policy.accounts")
    # 2 workers: this one's share is 4 at once and one per 400 ms, of 8 and one per 200 ms.
    shared = SharedAccounts(RedisAccounts.connect(server.url), 2, retry_interval_s=0.2)
    bucket = Bucket(8, 200)
    assert shared.reserve("failover", 1, bucket, 0, now_ms()).granted
    server.stop()
    started = time.monotonic()
    local_grants = 0
    answers = []
    while time.monotonic() - started < 1.2:
        answered = time.monotonic()
        reservation = shared.reserve("failover", 1, bucket, 0, now_ms())
        answers.append(time.monotonic() - answered)
        local_grants += reservation.granted
        time.sleep(0.01)
    assert max(answers) < REDIS_TIMEOUT_S + 0.2, f"every reservation answered in time: {max(answers):.3f} s"
    assert shared.fallbacks == 1, "one fallback, however often Redis was tried again"
    [fallback] = records(caplog, "Redis unavailable")
    assert (fallback.redis, fallback.workers) == (server.url, 2) and fallback.reason  # type: ignore[attr-defined]
    # 1.2 s on a share that starts empty: 1200 / 400 = 3 tokens at most (the whole bucket allows 8 + 6).
    assert 1 <= local_grants <= 3, f"{local_grants} granted on the local share"
    server.start()  # the same port, empty
    time.sleep(0.25)
    assert shared.reserve("failover", 1, bucket, 0, now_ms()).granted
    assert shared.recoveries == 1
    [back] = records(caplog, "Redis answers again")
    assert back.charged == local_grants  # type: ignore[attr-defined]
    # The shared bucket holds the local takes: another worker sees them.
    other = RedisAccounts.connect(server.url)
    assert other.try_reserve("failover", 8 - local_grants - 1, bucket, 0) == Reservation(True, 0)
    assert not other.try_reserve("failover", 1, bucket, 0).granted, "the bucket is full with the local takes charged"


def test_a_wrong_typed_account_key_is_repaired_loudly_and_the_allowance_holds(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="agent_retry_policy.accounts")
    accounts = RedisAccounts.connect(server.url)
    raw = cli(server)
    raw.hset(f"{ACCOUNT_PREFIX}wrong-hash", "f", "v")
    raw.set(f"{ACCOUNT_PREFIX}wrong-text", "hello")
    for name in ("hash", "text"):
        # Repaired to an empty bucket: the first call waits a whole interval, as after a full burst.
        first = accounts.try_reserve(f"wrong-{name}", 1, Bucket(3, 1_000), 5_000)
        assert first.granted and first.wait_ms > 800, f"{name}: {first}"
        assert raw.type(f"{ACCOUNT_PREFIX}wrong-{name}") == b"string", f"{name}: repaired"
    assert accounts.repairs == 2
    logged = records(caplog, "held something other than a number")
    assert [(r.levelname, r.redis, r.key) for r in logged] == [  # type: ignore[attr-defined]
        ("ERROR", server.url, f"{ACCOUNT_PREFIX}wrong-hash"),
        ("ERROR", server.url, f"{ACCOUNT_PREFIX}wrong-text"),
    ]


def test_a_lost_key_is_recreated_from_the_last_tat_seen_not_full(server: RedisServer) -> None:
    accounts = RedisAccounts.connect(server.url)
    bucket = Bucket(3, 10_000)
    for _ in range(3):
        assert accounts.try_reserve("lost", 1, bucket, 0) == Reservation(True, 0)
    cli(server).flushall()
    close(accounts.try_reserve("lost", 1, bucket, 20_000), True, 10_000)
    # A process that never saw the account starts it full, as the script says.
    assert RedisAccounts.connect(server.url).try_reserve("never-seen", 3, bucket, 0) == Reservation(True, 0)


def test_every_exchange_with_a_paused_redis_ends_within_the_timeout(server: RedisServer) -> None:
    accounts = RedisAccounts.connect(server.url)
    bucket = Bucket(100, 10)
    accounts.try_reserve("paused", 1, bucket, 0)
    server.pause()
    worst = 0.0
    try:
        for _ in range(3):  # the first on the open connection, then two that must connect first
            started = time.monotonic()
            with pytest.raises(AccountsError):
                accounts.try_reserve("paused", 1, bucket, 0)
            worst = max(worst, time.monotonic() - started)
    finally:
        server.resume()
    print(f"longest exchange with a paused Redis: {worst * 1000:.0f} ms (timeout {REDIS_TIMEOUT_S * 1000:.0f} ms)")
    assert worst < REDIS_TIMEOUT_S + 0.15
    assert accounts.try_reserve("paused", 1, bucket, 0).granted, "answers again once resumed"


def test_a_take_its_client_gave_up_on_spends_nothing_when_a_paused_redis_runs_it(server: RedisServer) -> None:
    # Issue 24, row 8: a take sent to a paused Redis and given up on used to run
    # on resume and spend the token. It now reaches the script past its deadline.
    accounts = RedisAccounts.connect(server.url)
    bucket = Bucket(1000, 60_000)
    accounts.try_reserve("late", 1, bucket, 0)
    key = f"{ACCOUNT_PREFIX}late"
    before = cli(server).get(key)
    server.pause()
    try:
        with pytest.raises(AccountsError):
            accounts.try_reserve("late", 1, bucket, 0)  # sent on the open connection, then given up on
        time.sleep(0.3)
    finally:
        server.resume()
    time.sleep(0.3)  # the resumed server reads the waiting take
    assert cli(server).get(key) == before, "the late take left the bucket as it was"
    assert accounts.try_reserve("late", 1, bucket, 0).granted, "a live take is served again"
    assert cli(server).get(key) != before


def draw_processes(url: str, account: str, hosts: list[str], capacity: int, interval: int, duration: int) -> list[dict]:
    """Worker processes of each host in `hosts` ("python", "node", "rust") drawing on
    one account from a common start, once all are connected; their JSON lines."""
    args = [url, account, str(capacity), str(interval), str(len(hosts)), str(duration)]
    processes = []
    for host in hosts:
        if host == "node":
            if not NODE_DRAW.exists():
                pytest.fail(f"{NODE_DRAW} is missing: build the Node host (make hosts-ts-setup, or npm run build in hosts/typescript)")
            command = [shutil.which("node") or "node", str(NODE_DRAW), *args]
        elif host == "rust":
            if not RUST_DRAW.exists():
                pytest.fail(f"{RUST_DRAW} is missing: build the workspace's binaries (make judge-setup)")
            command = [str(RUST_DRAW), *args]
        else:
            command = [sys.executable, str(HERE / "accounts_draw.py"), *args]
        env = dict(os.environ, ACCOUNTS_DRAW="1", PYTHONPATH=str(HERE.parent / "src"))
        processes.append(
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )
    try:
        for process in processes:
            assert process.stdout is not None
            ready = process.stdout.readline()  # after it has loaded and connected
            if ready.strip() != "ready":
                _, err = process.communicate(timeout=10)
                pytest.fail(f"{process.args}: {ready!r}, exit {process.returncode}: {err[-2000:]}")
        start = now_ms() + 300
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(f"{start}\n")
            process.stdin.flush()  # every worker has the start before any ends (communicate closes stdin)
        results = []
        for process in processes:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, f"{process.args}: exit {process.returncode}: {err[-2000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def test_workers_of_every_host_share_one_account_and_never_exceed_it(server: RedisServer) -> None:
    capacity, interval, duration = 10, 50, 2_000
    hosts = ["python", "node", "python", "node", "rust", "rust"]
    results = draw_processes(server.url, "cross-host", hosts, capacity, interval, duration)
    every = [t for r in results for t in r["grants"]]
    allowed = capacity + duration // interval
    by_host = {host: sum(len(r["grants"]) for r in results if r["host"] == host) for host in dict.fromkeys(hosts)}
    print(
        f"cross-host: {len(every)} grants ({by_host}) in {duration} ms, the bucket allows {allowed}; busiest 1000 ms {busiest(every, 1000)}"
    )
    assert len(every) <= allowed + 2, f"{len(every)} grants, the bucket allows {allowed}"
    assert busiest(every, 1_000) <= capacity + 1_000 // interval + 3
    assert len(every) >= allowed * 3 // 4, f"the workers asked {sum(r['asked'] for r in results)} times, yet got only {len(every)}"
    assert all(n > 0 for n in by_host.values()), f"every host drew on the account: {by_host}"
    assert all(r["fallbacks"] == 0 for r in results)
