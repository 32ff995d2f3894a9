"""Live policy updates in the Python host (as tests/harness/tests/host/live.rs): configuration
and `.wasm` updates take effect for new runs without a restart; a bad, foreign or
tampered update is refused and the last good policy keeps serving; the gate's
vectors (tests/vectors/gate.json, then the operator's `gate_vectors`, then the
update's own) refuse an update naming the case it fails; rollback; the watcher;
a swap under load; files older than the serving ones refused as `older`, and
two reloads at once ending with the newest files (issue 24, "Updates")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from agent_retry_policy import (
    CONTRACT_VERSION,
    ContractVersionMismatch,
    EmbeddedAccounts,
    Escalated,
    Integrity,
    LivePolicy,
    NothingToRollBackTo,
    Policy,
    PolicySource,
    SplitMix64,
    UpdateConfigError,
    UpdateError,
    UpdateIntegrityError,
    UpdateLoadError,
    UpdateOlderError,
    UpdateReadError,
    UpdateSelfTestError,
    locate_component,
)
from agent_retry_policy.live import Loaded, UpdateMetrics, manifest_path, signature_path
from agent_retry_policy.manifest import sign_publication
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.types import http_failure

READS = '{"default-effect": "read", "max-attempts-per-call": 4}'


def reads(attempts: int) -> str:
    return f'{{"default-effect": "read", "max-attempts-per-call": {attempts}}}'


def deployed(tmp_path: Path, config: str = READS) -> PolicySource:
    """A folder with the component and a configuration, as an operator deploys them."""
    shutil.copy(locate_component(), tmp_path / "policy.wasm")
    (tmp_path / "policy.json").write_text(config)
    return PolicySource(tmp_path / "policy.wasm", tmp_path / "policy.json", Integrity.unchecked())


def attempts_against_a_persistent_503(loaded: Loaded, seed: int = 3, run_id: str = "probe") -> int:
    """Attempts a read makes against a persistent 503 under `loaded`."""
    instance = loaded.component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(seed))
    policy = instance.load_policy(loaded.config_json)
    return _attempts(policy, run_id)


def _attempts(policy: Policy, run_id: str) -> int:
    with policy.start_run(run_id) as run:
        start = run.begin_call("lookup_order", None, None, 1)
        assert start.admitted, start
        attempts = 1
        while (verdict := run.record_failure(start.call_id, attempts, http_failure(503), None, 1, 1)).action == "retry":
            attempts = verdict.attempt + 1
        return attempts


def test_a_configuration_update_changes_a_budget_for_new_runs_without_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    before = live.current()  # a run in flight keeps this
    assert attempts_against_a_persistent_503(live.current()) == 4
    source.config.write_text(reads(2))
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.live"):
        identity = live.reload()
    assert identity.generation == 2
    assert identity.config_sha256 != before.identity.config_sha256
    assert identity.wasm_sha256 == before.identity.wasm_sha256
    assert attempts_against_a_persistent_503(live.current()) == 2, "new runs get the new budget"
    assert '"max-attempts-per-call": 4' in before.config_json, "the run in flight keeps its policy"
    assert attempts_against_a_persistent_503(before) == 4
    assert any("policy update accepted" in r.getMessage() and str(identity) in r.getMessage() for r in caplog.records)
    assert live.last_refusal is None


def test_a_bad_configuration_is_refused_and_the_last_good_one_keeps_serving(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    source.config.write_text('{"max-attempts-per-call": 0}')
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.live"), pytest.raises(UpdateConfigError) as refused:
        live.reload()
    assert refused.value.kind == "config" and "max-attempts-per-call" in str(refused.value)
    assert live.current().identity.generation == 1
    assert live.last_refusal is not None and "max-attempts-per-call" in live.last_refusal
    assert attempts_against_a_persistent_503(live.current()) == 4, "the old policy still decides"
    (line,) = [r for r in caplog.records if "policy update refused" in r.getMessage()]
    assert line.levelno == logging.WARNING and "generation 1" in line.getMessage() and "max-attempts-per-call" in line.getMessage()
    assert live.metrics == UpdateMetrics(accepted=0, refused=1, rolled_back=0), "the refusal is counted"

    # Not UTF-8, and a file that is gone: refused the same way.
    source.config.write_bytes(b"\xff{}")
    with pytest.raises(UpdateConfigError, match="not UTF-8"):
        live.reload()
    source.config.unlink()
    with pytest.raises(UpdateReadError) as gone:
        live.reload()
    assert gone.value.kind == "read" and gone.value.path == source.config
    assert live.current().identity.generation == 1
    assert live.metrics == UpdateMetrics(accepted=0, refused=3, rolled_back=0)
    # A good one is counted as accepted.
    source.config.write_text(reads(2))
    assert live.reload().generation == 2
    assert live.metrics == UpdateMetrics(accepted=1, refused=3, rolled_back=0)


def test_a_configuration_that_breaks_an_invariant_is_refused_naming_the_gate_case(tmp_path: Path) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    # It loads, but it would retry a 403: gate.json's case says a 403 escalates.
    source.config.write_text('{"status-overrides": {"403": "transient"}}')
    with pytest.raises(UpdateSelfTestError) as refused:
        live.reload()
    message = str(refused.value)
    assert refused.value.kind == "self-test"
    assert 'gate.json) fail: "a 403 escalates and is never retried" step 2 (record-outcome): $.ok.action.escalate: missing' in message, (
        message
    )
    assert live.current().identity.generation == 1 and live.last_refusal == message
    assert attempts_against_a_persistent_503(live.current()) == 4, "the last good policy keeps serving"
    # The same gate at start.
    with pytest.raises(UpdateSelfTestError, match="a 403 escalates and is never retried"):
        LivePolicy.open(source)


def test_the_operators_gate_vectors_run_on_every_candidate_after_gate_json(tmp_path: Path) -> None:
    # What this deployment relies on besides the package's gate: a read is tried at least three times.
    gate = tmp_path / "our-gate.json"
    steps: list[dict[str, object]] = [{"op": "begin-call", "call": {"tool": "lookup_order"}}]
    steps += [{**_503(), "expect": {"ok": {"action": {"retry": {"attempt": attempt}}}}} for attempt in (2, 3)]
    gate.write_text(json.dumps({"description": "ours", "cases": [{"description": "a read gets three attempts", "steps": steps}]}))
    plain = deployed(tmp_path)
    source = PolicySource(plain.wasm, plain.config, plain.integrity, gate_vectors=[gate])
    assert source.gate_vectors == (gate,)
    live = LivePolicy.open(source)
    source.config.write_text(reads(3))
    assert live.reload().generation == 2, "three attempts pass"
    source.config.write_text(reads(2))
    with pytest.raises(UpdateSelfTestError) as refused:
        live.reload()
    message = str(refused.value)
    assert f'the operator\'s gate vectors ({gate}) fail: "a read gets three attempts" step 3 (record-outcome)' in message, message
    assert live.current().identity.generation == 2
    # Without them the same configuration passes the package's gate.
    assert LivePolicy.open(plain).current().identity.generation == 1
    # A file that is gone is refused like any file of the update.
    gate.unlink()
    source.config.write_text(reads(3))
    with pytest.raises(UpdateError):
        live.reload()
    assert live.current().identity.generation == 2
    with pytest.raises(TypeError, match="a list of paths"):
        PolicySource(plain.wasm, plain.config, gate_vectors=gate)  # type: ignore[arg-type]


def test_a_broken_or_foreign_component_is_refused_and_rollback_returns_to_the_previous_policy(tmp_path: Path) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    with pytest.raises(NothingToRollBackTo):
        live.rollback()
    assert live.metrics == UpdateMetrics(), "nothing to roll back to is not a rollback"
    good = source.wasm.read_bytes()

    source.wasm.write_bytes(b"\0asm not really")
    with pytest.raises(UpdateLoadError) as broken:
        live.reload()
    assert broken.value.kind == "load"

    # The same component, speaking another major contract version.
    ours, theirs = f"agent-retry:policy/policy@{CONTRACT_VERSION}".encode(), b"agent-retry:policy/policy@1.0.0"
    assert good.count(ours) > 0
    source.wasm.write_bytes(good.replace(ours, theirs))
    with pytest.raises(UpdateLoadError) as foreign:
        live.reload()
    mismatch = foreign.value.error
    assert isinstance(mismatch, ContractVersionMismatch), foreign.value
    assert (mismatch.component_version, mismatch.host_version) == ("1.0.0", CONTRACT_VERSION) == ("1.0.0", "0.9.0")
    assert "agent-retry:policy@1.0.0" in str(foreign.value) and "@0.9.0" in str(foreign.value)
    assert live.current().identity.generation == 1, "nothing was swapped in"
    assert live.metrics == UpdateMetrics(accepted=0, refused=2, rolled_back=0)

    source.wasm.write_bytes(good)
    source.config.write_text(reads(3))
    assert live.reload().generation == 2
    assert attempts_against_a_persistent_503(live.current()) == 3
    back = live.rollback()
    assert back.generation == 1
    assert attempts_against_a_persistent_503(live.current()) == 4
    assert live.rollback().generation == 2, "a second rollback returns to the one rolled back from"
    assert live.rollback().generation == 1
    assert live.metrics == UpdateMetrics(accepted=1, refused=2, rolled_back=3)
    assert live.reload().generation == 3, "the next update after a rollback gets a number no policy had before"
    assert live.metrics == UpdateMetrics(accepted=2, refused=2, rolled_back=3)


def with_custom_section(wasm: bytes, payload: bytes) -> bytes:
    """The same component with a custom section appended: another digest, the same policy."""
    name = b"agent-retry-test"
    body = bytes([len(name)]) + name + payload
    assert len(body) < 128  # one-byte LEB128 size
    return wasm + bytes([0, len(body)]) + body


def test_a_new_component_is_compiled_gated_and_swapped_in(tmp_path: Path) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    before = live.current()
    source.wasm.write_bytes(with_custom_section(source.wasm.read_bytes(), b"v2"))
    identity = live.reload()
    assert identity.generation == 2 and identity.wasm_sha256 != before.identity.wasm_sha256
    assert identity.config_sha256 == before.identity.config_sha256
    assert live.current().component is not before.component
    assert attempts_against_a_persistent_503(live.current()) == 4
    assert attempts_against_a_persistent_503(before) == 4, "the old component still serves its runs"


def test_a_pinned_digest_refuses_a_tampered_component(tmp_path: Path) -> None:
    source = deployed(tmp_path)
    data = source.wasm.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    source = PolicySource(source.wasm, source.config, Integrity.pinned_sha256(digest.upper()))
    live = LivePolicy.open(source)
    assert live.current().identity.wasm_sha256 == digest
    # One byte changed: the digest no longer matches.
    source.wasm.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(UpdateIntegrityError) as refused:
        live.reload()
    assert refused.value.kind == "integrity" and digest in str(refused.value)
    assert live.current().identity.generation == 1
    with pytest.raises(ValueError):
        Integrity.pinned_sha256("not a digest")


def test_with_a_key_configured_only_a_signed_publication_is_accepted(tmp_path: Path) -> None:
    """Issue 24, row 2, for files: under a key the signed manifest
    (`<wasm>.manifest`) covers the .wasm, the configuration and the vectors;
    before, a signature covered the .wasm alone, so a configuration edited
    after signing was taken."""
    source = deployed(tmp_path)
    seed = bytes([7] * 32)
    key = Ed25519PrivateKey.from_private_bytes(seed)
    source = PolicySource(source.wasm, source.config, Integrity.ed25519(key.public_key().public_bytes_raw()))
    manifest = manifest_path(source.wasm)
    assert manifest.name == "policy.wasm.manifest"
    data = source.wasm.read_bytes()

    # Unsigned: refused at start; a signature over the .wasm alone (before 0.7) is named and refused.
    with pytest.raises(UpdateIntegrityError, match="unsigned: no signed manifest at .*policy.wasm.manifest"):
        LivePolicy.open(source)
    signature_path(source.wasm).write_bytes(key.sign(data))
    with pytest.raises(UpdateIntegrityError, match=r"\(before 0.7\) is not accepted: sign the whole publication"):
        LivePolicy.open(source)

    # Signed for files: accepted.
    manifest.write_text(sign_publication(seed, data, READS))
    live = LivePolicy.open(source)
    assert attempts_against_a_persistent_503(live.current()) == 4

    # The configuration edited after signing (4 attempts became 8): refused, the signed one keeps serving.
    eight = '{"default-effect": "read", "max-attempts-per-call": 8}'
    source.config.write_text(eight)
    with pytest.raises(UpdateIntegrityError, match="config-sha256 .* changed after signing") as edited:
        live.reload()
    assert edited.value.kind == "integrity"
    assert live.current().identity.generation == 1 and attempts_against_a_persistent_503(live.current()) == 4

    # Signed by another key: refused.
    manifest.write_text(sign_publication(bytes([9] * 32), data, eight))
    with pytest.raises(UpdateIntegrityError, match="does not verify under the configured key"):
        live.reload()

    # Malformed: refused by name.
    manifest.write_text("agent-retry publication 1\n")
    with pytest.raises(UpdateIntegrityError, match="is malformed: it has 1 lines, not 6"):
        live.reload()

    # Tampered after signing: one byte of the .wasm changed.
    manifest.write_text(sign_publication(seed, data, eight))
    source.wasm.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(UpdateIntegrityError, match="wasm-sha256 .* changed after signing"):
        live.reload()
    assert live.metrics == UpdateMetrics(accepted=0, refused=4, rolled_back=0)

    # Vectors configured but not signed: refused as added after signing.
    source.wasm.write_bytes(data)
    vectors = tmp_path / "vectors.json"
    vectors.write_text('{"description": "shipped", "cases": []}')
    with pytest.raises(UpdateIntegrityError, match="added after signing"):
        LivePolicy.open(PolicySource(source.wasm, source.config, source.integrity, vectors=vectors))

    # Re-signed: accepted (the edited budget serves now).
    assert live.reload().generation == 2
    assert attempts_against_a_persistent_503(live.current()) == 8
    with pytest.raises(ValueError):
        Integrity.ed25519(b"short")


def test_the_watcher_picks_up_a_changed_configuration(tmp_path: Path) -> None:
    source = deployed(tmp_path)
    with LivePolicy.open(source) as live:
        assert live.poll() is None, "nothing changed"
        watcher = live.watch(0.02)
        assert watcher.daemon
        time.sleep(0.05)
        source.config.write_text(reads(2))
        deadline = time.monotonic() + 10
        while live.current().identity.generation == 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live.current().identity.generation == 2
        assert attempts_against_a_persistent_503(live.current()) == 2
        # A refused change is kept for operators; the watcher goes on.
        source.config.write_text('{"max-attempts-per-call": 0}')
        deadline = time.monotonic() + 10
        while live.last_refusal is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live.last_refusal is not None and live.current().identity.generation == 2
    watcher.join(timeout=5)
    assert not watcher.is_alive(), "close() stops the watcher"


class _Lines(logging.Handler):
    """Keeps every log line's message (thread-safe: `logging` locks each handler)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _Always503:
    """Enough of `ClientSession` for the wrapper: every call an isError 503."""

    async def call_tool(self, name: str, arguments: dict[str, Any], **_options: Any) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="upstream returned 503, try again")], is_error=True)


async def _no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


def test_decisions_never_fail_while_the_policy_is_swapped_under_load(tmp_path: Path) -> None:
    """Four workers run agent runs through the MCP wrapper without pause while the
    `.wasm` (two byte-different builds, in turn) and the configuration are swapped
    twenty times. From the wrapper's log lines alone: no run failed, every run's
    lines name exactly one generation, the identity (so the build's digest) that
    reload() swapped in, and the run's decisions are that generation's budget."""
    source = deployed(tmp_path)
    build_a = source.wasm.read_bytes()
    build_b = with_custom_section(build_a, b"build-b")
    digest_a, digest_b = hashlib.sha256(build_a).hexdigest(), hashlib.sha256(build_b).hexdigest()
    live = LivePolicy.open(source)
    log = logging.getLogger("agent_retry_policy.mcp.swap-under-load")
    log.setLevel(logging.INFO)
    log.propagate = False
    captured = _Lines()
    log.addHandler(captured)
    lookup = Tool(name="lookup", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
    stop = threading.Event()
    runs: list[list[str]] = [[] for _ in range(4)]
    failures: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            n = 0
            while not stop.is_set():
                loaded = live.current()  # a run keeps the policy it started with
                instance = loaded.component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(w))
                policy = instance.load_policy(loaded.config_json)
                for _ in range(10):
                    run_id = f"w{w}-{n}"
                    n += 1
                    caller = RetryingToolCaller(
                        _Always503(),  # type: ignore[arg-type]
                        policy.start_run(run_id),
                        tools=[lookup],
                        sleep=_no_sleep,
                        log=log,
                        policy_identity=str(loaded.identity),
                    )
                    with pytest.raises(Escalated):
                        asyncio.run(caller.call_tool("lookup", {}))
                    runs[w].append(run_id)
        except BaseException as e:  # reported below
            failures.append(e)

    first = live.current().identity
    swapped_in = {first.generation: (str(first), digest_a, 4)}  # generation -> (identity as logged, build, attempts)
    workers = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for thread in workers:
        thread.start()
    try:
        for swap in range(20):
            wasm, attempts = (build_b, 2) if swap % 2 == 0 else (build_a, 4)
            source.wasm.write_bytes(wasm)
            source.config.write_text(reads(attempts))
            identity = live.reload()
            swapped_in[identity.generation] = (str(identity), identity.wasm_sha256, attempts)
            time.sleep(0.015)
    finally:
        stop.set()
        for thread in workers:
            thread.join()
        log.removeHandler(captured)
    assert not failures, failures
    assert {build for _, build, _ in swapped_in.values()} == {digest_a, digest_b}

    # From the log alone.
    by_run: dict[str, list[dict[str, Any]]] = {}
    for text in captured.lines:
        line = json.loads(text)
        if line.get("event") == "agent_retry.attempt":
            by_run.setdefault(line["run"], []).append(line)
    all_runs = [run for per_worker in runs for run in per_worker]
    assert len(all_runs) >= 80, f"{len(all_runs)} runs"
    generations: set[int] = set()
    builds: set[str] = set()
    for run in all_runs:
        lines = by_run[run]
        policies = {line["policy"] for line in lines}
        assert len(policies) == 1, f"{run}'s lines name exactly one policy: {policies}"
        (policy,) = policies
        generation = int(policy.removeprefix("generation ").split(" ")[0])
        identity, build, attempts = swapped_in[generation]
        assert policy == identity, f"{run}: the identity reload() swapped in for generation {generation}"
        assert f"wasm {build[:12]}" in policy, f"{run}: {policy} names its build's digest"
        actions = [line["action"] for line in lines]
        assert actions == ["retry"] * (attempts - 1) + ["escalate"], (
            f"{run} (generation {generation}) decided with its own policy: {actions}"
        )
        assert lines[-1]["escalation"] == "call-attempts-spent"
        generations.add(generation)
        builds.add(build)
    print(f"{len(all_runs)} runs attributed from the log across {len(generations)} generations and {len(builds)} builds during 20 swaps")
    assert len(generations) > 2, f"the swaps were seen by the workers: {sorted(generations)}"
    assert builds == {digest_a, digest_b}, "both builds decided"


# $AGENT_RETRY_HOSTILE_DIR: the fixtures built elsewhere (as test_sandbox.py).
HOSTILE = Path(os.environ.get("AGENT_RETRY_HOSTILE_DIR") or Path(__file__).resolve().parents[3] / "target" / "hostile")
# Refused at load; the others fault in a call that gate.json makes.
LOAD_TIME = ("extra-import", "extra-import-sockets", "wrong-world", "other-major")
HOSTILE_NAMES = (
    "endless-loop",
    "memory-bomb",
    "trap",
    "enum-out-of-range",
    "invalid-utf8",
    "pointer-out-of-bounds",
    "extra-import",
    "extra-import-sockets",
    "wrong-world",
    "other-major",
)


def test_every_hostile_component_offered_to_one_live_policy_is_refused_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As the Node host's live test: each hostile component of tests/hostile/build.mjs
    (`make hostile`) in turn, to the same LivePolicy; each refused (typed, logged,
    counted; one that faults in a call, naming the gate.json case it faulted in),
    the last good policy serving throughout; then a good update is accepted."""
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    good = live.current()
    good_bytes = source.wasm.read_bytes()
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.live"):
        for refused, name in enumerate(HOSTILE_NAMES, start=1):
            path = HOSTILE / f"{name}.wasm"
            if not path.is_file():
                pytest.fail(f"{path} is missing: run `make hostile` (node tests/hostile/build.mjs) in the repository root")
            shutil.copy(path, source.wasm)
            with pytest.raises((UpdateLoadError, UpdateSelfTestError)) as error:
                live.reload()
            if name in LOAD_TIME:
                assert isinstance(error.value, UpdateLoadError), f"{name}: {error.value}"
            else:
                assert isinstance(error.value, UpdateSelfTestError), f"{name}: {error.value}"
                assert "gate.json) fail: " in str(error.value), f"{name}: {error.value}"
            assert live.metrics == UpdateMetrics(accepted=0, refused=refused, rolled_back=0), name
            assert live.current() is good and live.last_refusal == str(error.value), name
            assert attempts_against_a_persistent_503(live.current()) == 4, f"the last good policy serves after {name}"
        refusals = [r for r in caplog.records if "policy update refused" in r.getMessage()]
        assert len(refusals) == len(HOSTILE_NAMES), "one warning per refusal"
        source.wasm.write_bytes(good_bytes)
        assert live.reload().generation == 2
    assert live.metrics == UpdateMetrics(accepted=1, refused=len(HOSTILE_NAMES), rolled_back=0)


def test_every_refusal_is_an_update_error_with_its_kind() -> None:
    kinds = {cls.kind for cls in UpdateError.__subclasses__()}
    assert kinds == {"read", "integrity", "load", "config", "self-test", "fleet", "older", "nothing-to-roll-back-to"}


# The vectors an update ships with (`PolicySource(..., vectors=path)`): after the
# gate's own vectors, every case must pass against the candidate; a case without
# `config` runs in the update's configuration.
FOUR_ATTEMPTS = "a persistent 503 is retried three times, then escalates"


def _503(call_id: int = 1) -> dict[str, object]:
    return {"op": "record-outcome", "call-id": call_id, "outcome": {"failure": {"kind": {"http-status": 503}}}}


def four_attempts_vectors() -> str:
    """Vectors that hold under `max-attempts-per-call: 4` (the update's configuration), not under 2."""
    steps: list[dict[str, object]] = [{"op": "begin-call", "call": {"tool": "lookup_order"}}]
    steps += [{**_503(), "expect": {"ok": {"action": {"retry": {"attempt": attempt}}}}} for attempt in (2, 3, 4)]
    steps.append({**_503(), "expect": {"ok": {"action": {"escalate": {"reason": "call-attempts-spent"}}}}})
    own_config = {
        "description": "a case with its own configuration runs in it",
        "config": {"default-effect": "read", "max-attempts-per-call": 1},
        "steps": [
            {"op": "begin-call", "call": {"tool": "lookup_order"}},
            {**_503(), "expect": {"ok": {"action": {"escalate": {"reason": "call-attempts-spent"}}}}},
        ],
    }
    return json.dumps({"description": "shipped with the update", "cases": [own_config, {"description": FOUR_ATTEMPTS, "steps": steps}]})


def two_attempts_vectors() -> str:
    steps = [
        {"op": "begin-call", "call": {"tool": "lookup_order"}},
        {**_503(), "expect": {"ok": {"action": {"retry": {"attempt": 2}}}}},
        {**_503(), "expect": {"ok": {"action": {"escalate": {"reason": "call-attempts-spent"}}}}},
    ]
    return json.dumps({"description": "shipped with the update", "cases": [{"description": "two attempts", "steps": steps}]})


def with_vectors(source: PolicySource, text: str) -> PolicySource:
    vectors = source.wasm.with_name("vectors.json")
    vectors.write_text(text)
    return PolicySource(source.wasm, source.config, source.integrity, vectors=vectors)


def test_an_update_whose_shipped_vectors_pass_is_accepted(tmp_path: Path) -> None:
    source = with_vectors(deployed(tmp_path), four_attempts_vectors())
    assert source.vectors == tmp_path / "vectors.json"
    live = LivePolicy.open(source)
    assert attempts_against_a_persistent_503(live.current()) == 4
    # A new component with the same vectors: they run against it, and pass.
    source.wasm.write_bytes(with_custom_section(source.wasm.read_bytes(), b"v2"))
    assert live.reload().generation == 2


def test_an_update_whose_shipped_vector_fails_is_refused_naming_the_case(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = with_vectors(deployed(tmp_path), four_attempts_vectors())
    live = LivePolicy.open(source)
    source.config.write_text(reads(2))  # loads, passes gate.json, breaks the shipped vectors
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.live"), pytest.raises(UpdateSelfTestError) as refused:
        live.reload()
    message = str(refused.value)
    assert refused.value.kind == "self-test"
    assert "vectors" in message and f'"{FOUR_ATTEMPTS}"' in message, message
    assert 'step 3 (record-outcome): $.ok.action.retry: missing in {"escalate"' in message, "the first mismatch: " + message
    assert live.current().identity.generation == 1 and live.last_refusal == message
    assert attempts_against_a_persistent_503(live.current()) == 4, "the last good policy keeps serving"
    (line,) = [r for r in caplog.records if "policy update refused" in r.getMessage()]
    assert line.levelno == logging.WARNING and '"kind": "self-test"' in line.getMessage() and FOUR_ATTEMPTS in line.getMessage()
    # The same gate at start.
    with pytest.raises(UpdateSelfTestError, match=FOUR_ATTEMPTS):
        LivePolicy.open(source)

    # A change of the vectors alone is an update: vectors that hold under 2 attempts let the configuration in.
    assert source.vectors is not None
    source.vectors.write_text(two_attempts_vectors())
    identity = live.poll()
    assert identity is not None and identity.generation == 2
    assert attempts_against_a_persistent_503(live.current()) == 2
    assert live.poll() is None, "nothing changed since"


def test_malformed_or_unreadable_shipped_vectors_are_refused(tmp_path: Path) -> None:
    source = with_vectors(deployed(tmp_path), four_attempts_vectors())
    live = LivePolicy.open(source)
    assert source.vectors is not None
    for text, why in [
        ("{not json", "not JSON"),
        (b"\xff{}", "not JSON"),
        ("[]", "not a vector file"),
        ('{"description": "d", "cases": {}}', '"cases"'),
        ('{"description": "d", "cases": [{"description": "c"}]}', '"steps"'),
        ('{"description": "d", "cases": [{"description": "c", "steps": [], "extra": 1}]}', '"extra"'),
        ('{"cases": []}', '"description"'),
    ]:
        if isinstance(text, bytes):
            source.vectors.write_bytes(text)
        else:
            source.vectors.write_text(text)
        with pytest.raises(UpdateSelfTestError, match="vectors") as refused:
            live.reload()
        assert why in str(refused.value), (text, str(refused.value))
    # A step the runner does not know is the case's failure.
    source.vectors.write_text(json.dumps({"description": "d", "cases": [{"description": "odd step", "steps": [{"op": "fly"}]}]}))
    with pytest.raises(UpdateSelfTestError, match='"odd step" step 1: unknown op "fly"'):
        live.reload()
    source.vectors.unlink()
    with pytest.raises(UpdateReadError) as gone:
        live.reload()
    assert gone.value.path == source.vectors
    assert live.current().identity.generation == 1
    source.vectors.write_text(json.dumps({"description": "none yet", "cases": []}))
    assert live.reload().generation == 2


def newest_mtime_ns(source: PolicySource) -> int:
    return max(os.stat(path).st_mtime_ns for path in (source.wasm, source.config))


def test_files_older_than_the_serving_ones_are_refused_as_older(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 24, "Updates": a candidate whose files' newest modification time is
    before the serving policy's (an old copy restored with its times, `cp -p`)
    is refused as `older`; the same time is not older; rollback is not refused."""
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    serving_ns = newest_mtime_ns(source)
    assert live.reload().generation == 2, "the same files again: the same time is not older"
    good = live.current()

    source.config.write_text(reads(2))
    back = serving_ns - 60 * 10**9  # a minute before the serving files
    for path in (source.wasm, source.config):
        os.utime(path, ns=(back, back))
    with caplog.at_level(logging.WARNING, logger="agent_retry_policy.live"), pytest.raises(UpdateOlderError) as refused:
        live.reload()
    assert refused.value.kind == "older" and (refused.value.candidate, refused.value.serving) == (back, serving_ns)
    assert "the files' newest modification time" in str(refused.value) and "is before the serving policy's" in str(refused.value)
    assert live.current() is good and live.last_refusal == str(refused.value)
    assert attempts_against_a_persistent_503(live.current()) == 4, "the serving policy is unchanged"
    assert any("policy update refused" in r.getMessage() and '"kind": "older"' in r.getMessage() for r in caplog.records)
    assert live.poll() is None, "a refused change is tried once"
    assert live.metrics == UpdateMetrics(accepted=1, refused=1, rolled_back=0)

    # The configuration touched now (the .wasm still a minute back): its newest time is after the serving one's.
    os.utime(source.config)
    assert live.poll() is not None and attempts_against_a_persistent_503(live.current()) == 2
    # Rollback is not an update: never refused as older.
    assert live.rollback().generation == 2 and live.current() is good
    assert live.metrics == UpdateMetrics(accepted=2, refused=1, rolled_back=1)


def test_two_reloads_at_once_end_with_the_newest_files_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, row 1 (the Rust host's race; Python serialises read, gate and
    swap): the first reload reads, the files change, a second reload starts and
    the first waits for it (up to 2 s) before it gates. Serialised, the second
    reads the newest files after the first swapped: they serve, and poll() sees
    nothing new. Unserialised, the first's older files would swap in last."""
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    origin = live._origin
    read = origin.read
    first_read, second_done = threading.Event(), threading.Event()
    reads_made: list[str] = []
    lock = threading.Lock()

    def reading() -> Any:
        got = read()
        with lock:
            reads_made.append(got.config.decode())
            first = len(reads_made) == 1
        if first:
            first_read.set()
            second_done.wait(2.0)  # serialised, the second cannot finish (nor read) before this one swaps
        return got

    monkeypatch.setattr(origin, "read", reading)
    base = newest_mtime_ns(source)
    errors: list[BaseException] = []

    def reload(done: threading.Event | None = None) -> None:
        try:
            live.reload()
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            if done is not None:
                done.set()

    source.config.write_text(reads(3))
    os.utime(source.config, ns=(base + 10**9, base + 10**9))
    first = threading.Thread(target=reload)
    first.start()
    assert first_read.wait(10), "the first reload read"
    source.config.write_text(reads(2))  # changed between the two reads
    os.utime(source.config, ns=(base + 2 * 10**9, base + 2 * 10**9))
    second = threading.Thread(target=reload, args=(second_done,))
    second.start()
    first.join(30)
    second.join(30)
    assert not errors, errors
    assert reads_made == [reads(3), reads(2)], "the second read after the first"
    assert live.current().config_json == reads(2), "the newest files serve"
    assert attempts_against_a_persistent_503(live.current()) == 2
    assert live.current().identity.generation == 3
    assert live.poll() is None, "nothing new since the newest files"
