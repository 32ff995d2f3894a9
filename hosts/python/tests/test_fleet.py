"""Fleet updates through Redis (issue 8; the layout of the Rust host's
`fleet.rs`), against a real redis-server started for each test on a free port:
one publication reaches several worker processes; a worker started afterwards
takes the current one; under a key only the publication as signed (its
manifest covers the .wasm, the configuration, the vectors and the revision) is
taken and the old policy keeps serving; Redis restarted or paused while watching
does not stop the watcher. Issue 24 (rows 1 and 9): one revision rule
(tests/vectors/fleet/revisions.json); a publication onto a garbage revision
writes nothing; a publication older than the serving one is refused."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from redis_server import RedisServer

from agent_retry_policy import (
    Integrity,
    LivePolicy,
    UpdateFleetError,
    UpdateIntegrityError,
    UpdateOlderError,
    UpdateSelfTestError,
    locate_component,
    publish_policy,
)
from agent_retry_policy.fleet import DEFAULT_PREFIX, MAX_REVISION, FleetSource, FleetUnavailable, parse_revision
from agent_retry_policy.manifest import ManifestError, sign_publication

try:
    import redis
except ImportError:
    pytest.fail("the fleet tests need redis-py (the `test` extra): pip install -e 'hosts/python[test]'", pytrace=False)

SRC = Path(__file__).resolve().parents[1] / "src"
REVISIONS = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "fleet" / "revisions.json"


def config(attempts: int) -> str:
    return f'{{"default-effect": "read", "max-attempts-per-call": {attempts}}}'


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


@pytest.fixture(scope="module")
def wasm() -> bytes:
    return locate_component().read_bytes()


def eventually(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.02)


WORKER = textwrap.dedent(
    """
    import json, sys, time
    from agent_retry_policy import LivePolicy
    url, prefix, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
    live = LivePolicy.open_redis(url, prefix=prefix)
    live.watch(interval)
    last = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        identity = live.current().identity
        if identity != last:
            print(json.dumps({"generation": identity.generation, "config_sha256": identity.config_sha256,
                              "wasm_sha256": identity.wasm_sha256}), flush=True)
            last = identity
        time.sleep(0.01)
    """
)


class Worker:
    """A worker process: opens the fleet's policy, watches, prints its identity at each change."""

    def __init__(self, url: str, prefix: str, interval_s: float) -> None:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, prefix, str(interval_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def next_identity(self, timeout: float) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            stderr = ""
            if self.process.poll() is not None and self.process.stderr is not None:
                stderr = self.process.stderr.read()[-2000:]
            raise AssertionError(f"the worker printed no identity within {timeout} s (exit {self.process.poll()}): {stderr}") from None

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def test_one_publication_reaches_every_worker_process(server: RedisServer, wasm: bytes) -> None:
    prefix = "fleet-test:a"
    assert publish_policy(server.url, wasm, config(4), prefix=prefix) > 0
    # A long poll interval: the update must come through the channel.
    workers = [Worker(server.url, prefix, 60.0) for _ in range(3)]
    try:
        for worker in workers:
            first = worker.next_identity(60)
            assert (first["generation"], first["config_sha256"]) == (1, sha(config(4)))
        time.sleep(0.5)  # every listener subscribed
        start = time.monotonic()
        assert publish_policy(server.url, wasm, config(2), prefix=prefix) > 0
        for worker in workers:
            update = worker.next_identity(15)
            assert (update["generation"], update["config_sha256"], update["wasm_sha256"]) == (2, sha(config(2)), sha(wasm))
        print(f"one publication reached {len(workers)} worker processes in {time.monotonic() - start:.2f} s")

        # A worker down at update time: killed, a publication (a new .wasm and a
        # new configuration) made while it is down, then a new process in its place.
        down = workers.pop(0)
        down.stop()
        assert down.process.poll() is not None, "the worker is down"
        rebuilt = wasm + bytes([0, 18, 16]) + b"agent-retry-test" + b"\x01"  # a custom section: another digest, the same policy
        assert publish_policy(server.url, rebuilt, config(3), prefix=prefix) > 0
        for worker in workers:
            update = worker.next_identity(15)
            assert (update["generation"], update["config_sha256"], update["wasm_sha256"]) == (3, sha(config(3)), sha(rebuilt))
        workers.append(Worker(server.url, prefix, 60.0))
        back = workers[-1].next_identity(60)
        assert (back["generation"], back["config_sha256"], back["wasm_sha256"]) == (1, sha(config(3)), sha(rebuilt)), (
            "the worker that was down takes the publication it missed when it comes back"
        )
    finally:
        for worker in workers:
            worker.stop()


def test_a_missed_message_is_caught_by_polling_the_revision(server: RedisServer, wasm: bytes) -> None:
    prefix = "fleet-test:b"
    publish_policy(server.url, wasm, config(4), prefix=prefix)
    live = LivePolicy.open_redis(server.url, prefix=prefix)
    live.watch(0.2)
    try:
        # Written as a publication is, without its message.
        client = redis.Redis.from_url(server.url)
        client.set(f"{prefix}:config", config(3))
        client.incr(f"{prefix}:revision")
        client.close()
        loaded = eventually(lambda: live.current() if live.current().identity.generation == 2 else None, 5, "the polled update")
        assert loaded.config_json == config(3)
    finally:
        live.close()


def test_a_worker_started_after_a_publication_takes_the_current_one(server: RedisServer, wasm: bytes) -> None:
    with pytest.raises(UpdateFleetError, match=f"nothing published at {DEFAULT_PREFIX}:wasm"):
        LivePolicy.open_redis(server.url)
    publish_policy(server.url, wasm, config(4))
    latest = publish_policy(server.url, wasm, config(5))
    live = LivePolicy.open_redis(server.url)
    assert live.current().config_json == config(5) and live.current().identity.generation == 1
    assert live.poll() is None, "the revision it opened with is not an update"
    source = FleetSource(server.url)
    client = source.client()
    assert source.revision(client) == latest
    assert client.pubsub_numsub(source.channel) == [(source.channel.encode(), 0)]
    client.close()


def test_under_a_key_only_the_publication_as_signed_is_taken_and_the_old_policy_keeps_serving(
    server: RedisServer, wasm: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, row 2: the signature covered the .wasm alone, so a
    configuration rewritten in Redis after signing was taken (4 attempts on a
    persistent 503 became 100), and deleting `:vectors` dropped their check.
    The signed manifest now covers the whole publication."""
    seed = bytes([5] * 32)
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    prefix = "fleet-test:signed"
    source = FleetSource(server.url, prefix)
    vectors = four_attempts_vectors()
    # An unsigned first publication is refused at open.
    publish_policy(server.url, wasm, config(4), prefix=prefix)
    with pytest.raises(UpdateIntegrityError, match=f"unsigned: no signed manifest at {prefix}:manifest"):
        LivePolicy.open_redis(server.url, prefix=prefix, integrity=Integrity.ed25519(public))
    signed = sign_publication(seed, wasm, config(4), vectors, 4 * 10**12)
    assert publish_policy(server.url, wasm, config(4), signed, prefix=prefix, vectors=vectors) == 4 * 10**12, "the manifest's revision"
    live = LivePolicy.open_redis(server.url, prefix=prefix, integrity=Integrity.ed25519(public))
    good = live.current()
    assert good.config_json == config(4)

    def rewritten(*commands: tuple[str, ...]) -> str:
        """Commands straight to Redis, then the next revision announced: what a worker reads next."""
        for command in commands:
            redis_cli(server, *command)
        revision = redis_cli(server, "INCR", source.key("revision"))
        redis_cli(server, "PUBLISH", source.channel, "rewritten")
        return revision

    live.watch(0.1)
    try:
        with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"):
            rewritten(("SET", source.key("config"), config(100)))
            eventually(lambda: "config-sha256" in (live.last_refusal or ""), 5, "the rewritten configuration refused")
            assert "changed after signing" in (live.last_refusal or "") and live.current() is good
            rewritten(("SET", source.key("config"), config(4)), ("DEL", source.key("vectors")))
            eventually(lambda: "removed after signing" in (live.last_refusal or ""), 5, "the deleted vectors refused")
            revision = rewritten(("SET", source.key("vectors"), vectors))
            eventually(lambda: f"is revision {revision}: not the revision" in (live.last_refusal or ""), 5, "another revision refused")
            publish_policy(server.url, wasm, config(2), prefix=prefix)  # unsigned
            eventually(lambda: f"unsigned: no signed manifest at {prefix}:manifest" in (live.last_refusal or ""), 5, "unsigned refused")
            rewritten(("SET", source.key("wasm.sig"), "00" * 64))
            eventually(lambda: "(before 0.7) is not accepted" in (live.last_refusal or ""), 5, "a signature over the .wasm alone refused")
            time.sleep(0.5)  # several polls: a refused revision is tried once
            assert live.current() is good
            refusals = [r for r in caplog.records if "policy update refused" in r.getMessage()]
            assert len(refusals) == 5, [r.getMessage() for r in refusals]
        # A manifest not newer than the stored revision, or not covering what is published: nothing is written.
        stale = sign_publication(seed, wasm, config(3), None, 4 * 10**12)
        with pytest.raises(FleetUnavailable, match="is not greater than the stored revision .* nothing was written"):
            publish_policy(server.url, wasm, config(3), stale, prefix=prefix)
        with pytest.raises(ManifestError, match="config-sha256 .* changed after signing: nothing was written"):
            publish_policy(server.url, wasm, config(100), stale, prefix=prefix)
        assert redis_cli(server, "GET", source.key("config")) == config(2)
        newer = sign_publication(seed, wasm, config(3), None, 5 * 10**12)
        assert publish_policy(server.url, wasm, config(3), newer, prefix=prefix) == 5 * 10**12
        eventually(lambda: live.current().config_json == config(3), 5, "the signed publication accepted")
        assert live.last_refusal is None and live.current().identity.generation == 2
        assert redis_cli(server, "EXISTS", source.key("wasm.sig")) == "0", "a publication deletes a signature over the .wasm alone"
    finally:
        live.close()


def test_redis_restarted_or_paused_while_watching_does_not_stop_the_watcher(
    server: RedisServer, wasm: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    publish_policy(server.url, wasm, config(4))
    live = LivePolicy.open_redis(server.url)
    poller = live.watch(0.2)
    try:
        with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"):
            server.stop()
            eventually(
                lambda: any("cannot check for a policy update" in r.getMessage() for r in caplog.records), 10, "a logged Redis failure"
            )
            time.sleep(1.0)
            assert poller.is_alive() and live.current().identity.generation == 1
            assert live.current().config_json == config(4), "the last good policy serves on"
            # Back, empty (no persistence): the watcher notices nothing is published, and keeps serving.
            server.start()
            eventually(lambda: "nothing published" in (live.last_refusal or ""), 10, "the empty Redis seen")
            publish_policy(server.url, wasm, config(3))
            eventually(lambda: live.current().config_json == config(3), 10, "the publication after the restart")
            # Paused (SIGSTOP): commands time out; a publication after it resumes is taken.
            server.pause()
            time.sleep(3.0)
            assert poller.is_alive()
            server.resume()
            publish_policy(server.url, wasm, config(2))
            eventually(lambda: live.current().config_json == config(2), 15, "the publication after the pause")
        listeners = [t for t in threading.enumerate() if t.name == "agent-retry-policy-listen" and t.is_alive()]
        assert listeners, "the channel listener survived"
    finally:
        live.close()


FOUR_ATTEMPTS = "a persistent 503 is retried three times, then escalates"


def four_attempts_vectors() -> str:
    """Vectors that hold under the publication's `max-attempts-per-call: 4`, not under 2."""
    failure = {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}}
    steps: list[dict[str, Any]] = [{"op": "begin-call", "call": {"tool": "lookup_order"}}]
    steps += [{**failure, "expect": {"ok": {"action": {"retry": {"attempt": attempt}}}}} for attempt in (2, 3, 4)]
    steps.append({**failure, "expect": {"ok": {"action": {"escalate": {"reason": "call-attempts-spent"}}}}})
    return json.dumps({"description": "shipped with the publication", "cases": [{"description": FOUR_ATTEMPTS, "steps": steps}]})


def test_a_publication_whose_shipped_vectors_fail_is_refused(server: RedisServer, wasm: bytes, caplog: pytest.LogCaptureFixture) -> None:
    prefix = "fleet-test:vectors"
    source = FleetSource(server.url, prefix)
    client = source.client()
    try:
        publish_policy(server.url, wasm, config(4), prefix=prefix, vectors=four_attempts_vectors())
        assert client.get(source.key("vectors")) == four_attempts_vectors().encode()
        live = LivePolicy.open_redis(server.url, prefix=prefix)  # the vectors pass: accepted
        good = live.current()
        assert good.config_json == config(4)

        publish_policy(server.url, wasm, config(2), prefix=prefix, vectors=four_attempts_vectors().encode())
        with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"), pytest.raises(UpdateSelfTestError) as refused:
            live.poll()
        assert refused.value.kind == "self-test" and "vectors" in str(refused.value) and FOUR_ATTEMPTS in str(refused.value)
        assert 'step 3 (record-outcome): $.ok.action.retry: missing in {"escalate"' in str(refused.value)
        assert live.current() is good and live.last_refusal == str(refused.value), "the last good policy keeps serving"
        assert any("policy update refused" in r.getMessage() and FOUR_ATTEMPTS in r.getMessage() for r in caplog.records)
        assert live.poll() is None, "a refused revision is tried once"
        with pytest.raises(UpdateSelfTestError, match=FOUR_ATTEMPTS):
            LivePolicy.open_redis(server.url, prefix=prefix)

        publish_policy(server.url, wasm, config(2), prefix=prefix, vectors="{not json")
        with pytest.raises(UpdateSelfTestError, match=r"vectors \(fleet-test:vectors:vectors \(revision \d+\)\) are not JSON"):
            live.poll()

        # Published without vectors: the key is deleted, and the update goes in.
        publish_policy(server.url, wasm, config(2), prefix=prefix)
        assert client.exists(source.key("vectors")) == 0
        identity = live.poll()
        assert identity is not None and identity.generation == 2 and live.current().config_json == config(2)
    finally:
        client.close()


def test_the_revision_parser_reads_the_shared_vectors() -> None:
    """tests/vectors/fleet/revisions.json, the Rust and Node hosts' too: a
    revision is read as its number, anything else refused naming the value."""
    cases = json.loads(REVISIONS.read_text(encoding="utf-8"))["cases"]
    assert len(cases) >= 19 and MAX_REVISION == 2**53 - 1
    for case in cases:
        text, expected = case["text"], case["revision"]
        for given in (text, text.encode("utf-8")):
            if expected is None:
                with pytest.raises(ValueError) as refused:
                    parse_revision(given)
                assert (
                    str(refused.value)
                    == f"{json.dumps(text, ensure_ascii=False)} is not a revision (decimal digits from 1 to {MAX_REVISION})"
                ), case
            else:
                assert parse_revision(given) == expected, case["description"]


def redis_cli(server: RedisServer, *args: str, stdin: bytes | None = None) -> str:
    """redis-cli against the test's server (`stdin`: the last argument, with -x)."""
    command = ["redis-cli", "-p", str(server.port), *(["-x"] if stdin is not None else []), *args]
    done = subprocess.run(command, input=stdin, capture_output=True, check=True)
    return done.stdout.decode().strip()


def test_a_publication_onto_a_garbage_revision_writes_nothing(server: RedisServer, wasm: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 24, row 9: MULTI/EXEC wrote `:wasm` and `:config` although the
    revision failed, and the Python host read -5 and 2^64 as revisions."""
    source = FleetSource(server.url)
    revision_key = source.key("revision")
    first = publish_policy(server.url, wasm, config(4), vectors=four_attempts_vectors())
    live = LivePolicy.open_redis(server.url)
    good = live.current()
    client = source.client()
    other = wasm + bytes([0, 18, 16]) + b"agent-retry-test" + b"\x02"  # another digest
    try:
        for garbage in ("abc", "-5", "18446744073709551616", str(MAX_REVISION)):
            redis_cli(server, "SET", revision_key, garbage)
            # Another .wasm, a manifest and no vectors: had any of it been written, every key would show it.
            with pytest.raises(FleetUnavailable, match="nothing was written") as refused:
                publish_policy(server.url, other, config(2), sign_publication(bytes(32), other, config(2), None, MAX_REVISION))
            assert revision_key in str(refused.value), refused.value
            assert redis_cli(server, "GET", source.key("config")) == config(4), f"{garbage}: the last good publication's configuration"
            assert client.get(source.key("wasm")) == wasm, garbage
            assert client.exists(source.key("manifest")) == 0 and client.get(source.key("vectors")) == four_attempts_vectors().encode()
            assert redis_cli(server, "GET", revision_key) == garbage
            if garbage == str(MAX_REVISION):
                assert source.revision(client) == MAX_REVISION, "the largest revision is one, but nothing follows it"
                continue
            shown = json.dumps(garbage)
            with pytest.raises(FleetUnavailable) as unread:
                source.revision(client)
            assert str(unread.value) == f"{revision_key}: {shown} is not a revision (decimal digits from 1 to {MAX_REVISION})"
            with pytest.raises(FleetUnavailable, match="is not a revision"):
                source.read(client)
            # A worker: its poll logs it and keeps serving; a reload is refused as `fleet`, naming the key and the value.
            with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"):
                caplog.clear()
                assert live.poll() is None
            (line,) = [r.getMessage() for r in caplog.records if "cannot check for a policy update" in r.getMessage()]
            assert revision_key in line and garbage in line and "is not a revision" in line, line
            with pytest.raises(UpdateFleetError) as fleet_error:
                live.reload()
            assert revision_key in str(fleet_error.value) and shown in str(fleet_error.value)
            assert live.current() is good
        # A good revision again: the publication goes in, and the worker takes it.
        redis_cli(server, "SET", revision_key, str(first))
        after = publish_policy(server.url, other, config(2))
        assert after > first
        assert redis_cli(server, "GET", source.key("config")) == config(2) and client.get(source.key("wasm")) == other
        assert client.exists(source.key("vectors")) == 0
        identity = live.poll()
        assert identity is not None and live.current().config_json == config(2) and identity.wasm_sha256 == sha(other)
    finally:
        client.close()


def test_a_publication_older_than_the_serving_one_is_refused(server: RedisServer, wasm: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 24, "Updates": a publication whose revision is lower than the
    serving policy's (a Redis restored from an old dump, a stale replica) is
    refused as `older`; the serving policy is unchanged; rollback is not refused."""
    prefix = "fleet-test:older"
    source = FleetSource(server.url, prefix)
    old_wasm = wasm + bytes([0, 18, 16]) + b"agent-retry-test" + b"\x03"
    old = publish_policy(server.url, old_wasm, config(4), prefix=prefix)
    live = LivePolicy.open_redis(server.url, prefix=prefix)
    new = publish_policy(server.url, wasm, config(3), prefix=prefix)
    assert new > old
    taken = live.poll()
    assert taken is not None and taken.generation == 2
    serving = live.current()
    assert serving.config_json == config(3) and serving.identity.wasm_sha256 == sha(wasm)

    # The old dump: the older publication's .wasm and configuration, and its lower revision, written directly.
    redis_cli(server, "SET", source.key("wasm"), stdin=old_wasm)
    redis_cli(server, "SET", source.key("config"), config(4))
    redis_cli(server, "SET", source.key("revision"), str(old))
    client = source.client()
    assert client.mget(source.key("wasm"), source.key("config")) == [old_wasm, config(4).encode()]
    client.close()
    with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"), pytest.raises(UpdateOlderError) as polled:
        live.poll()
    assert polled.value.kind == "older" and (polled.value.candidate, polled.value.serving) == (old, new)
    assert f"(revision {old}) is older than the serving policy's, revision {new}" in str(polled.value), polled.value
    assert any("policy update refused" in r.getMessage() and '"kind": "older"' in r.getMessage() for r in caplog.records)
    assert live.poll() is None, "a refused revision is tried once"
    with pytest.raises(UpdateOlderError):
        live.reload()
    assert live.current() is serving and live.last_refusal is not None and "older" in live.last_refusal
    assert live.metrics.refused == 2 and live.metrics.accepted == 1

    # Rollback is not an update: it returns to the older publication's policy, not refused.
    assert live.rollback().generation == 1 and live.current().config_json == config(4)
    assert live.rollback().generation == 2 and live.current() is serving
    # The next publication numbers past both: taken.
    latest = publish_policy(server.url, wasm, config(2), prefix=prefix)
    assert latest > new
    identity = live.poll()
    assert identity is not None and identity.generation == 3 and live.current().config_json == config(2)
