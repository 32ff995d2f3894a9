"""A policy that operators update while the host runs: a new `.wasm`, or a new
configuration, read from files the host watches (or on `reload()`), checked by a
gate, and swapped in atomically; `rollback()` returns to the previous good one.
A refused update leaves the last good policy serving and says why. The same
design as the Rust host's (hosts/rust/src/live.rs).

    live = LivePolicy.open(PolicySource(wasm, config, Integrity.ed25519(public_key)))
    live.watch(2.0)                       # polls both files; or live.reload() / live.rollback()
    loaded = live.current()               # per run (or worker): keep it for the run
    instance = loaded.component.instantiate()
    policy = instance.load_policy(loaded.config_json)   # log loaded.identity with its decisions

The gate, before anything serves:

1. integrity: the `.wasm`'s SHA-256 equals a pinned digest, or a detached
   Ed25519 signature (`<wasm>.sig`, 64 bytes, raw or as 128 hex digits) verifies
   under the configured public key; with a key configured an unsigned `.wasm` is
   refused (needs the `cryptography` package: the `signed` extra);
2. the component compiles, speaks this host's contract version and imports
   nothing outside the contract (`PolicyComponent`); a `.wasm` byte-identical
   to the serving one is not compiled again;
3. the configuration loads in it;
4. a self-test: the invariants every policy must keep for the host to stay safe
   (a transient failure of a keyed write is retried with the same key within the
   configured delay, an unkeyed write that timed out is never resent without a
   status check, a 403 escalates, and a failure that persists ends in an
   escalation within the step budget). A trap anywhere in it refuses the update.

Runs in flight finish on the policy they started with: a host takes
`LivePolicy.current()` when it starts a run (or a worker) and keeps that `Loaded`
policy for the run; an update changes what new runs get. Every decision can be
attributed to exactly one policy version (`PolicyIdentity`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import string
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .accounts import EmbeddedAccounts
from .component import Policy, PolicyComponent
from .entropy import SplitMix64
from .errors import (
    ComponentLoadError,
    ConfigError,
    NothingToRollBackTo,
    PolicyTrap,
    RunMisuse,
    UpdateConfigError,
    UpdateError,
    UpdateIntegrityError,
    UpdateLoadError,
    UpdateReadError,
    UpdateSelfTestError,
)
from .types import CallRequest, ToolHints, action_name, http_failure, transport_failure

logger = logging.getLogger("agent_retry_policy.live")

_U64_MAX = (1 << 64) - 1
_HEX = frozenset(string.hexdigits)
SIGNATURE_SUFFIX = ".sig"


@dataclass(frozen=True)
class PolicyIdentity:
    """Which policy made a decision: the component's digest and the configuration's."""

    wasm_sha256: str  # SHA-256 of the .wasm, hex
    config_sha256: str  # SHA-256 of the configuration text, hex
    generation: int  # 1 for the policy the host started with, then one more per accepted update

    def __str__(self) -> str:
        return f"generation {self.generation} (wasm {self.wasm_sha256[:12]}, config {self.config_sha256[:12]})"


@dataclass(frozen=True)
class Loaded:
    """A policy that passed the gate: its compiled component, configuration and identity."""

    component: PolicyComponent
    config_json: str
    identity: PolicyIdentity


def _ed25519() -> tuple[Any, type[Exception]]:
    """cryptography's Ed25519PublicKey and InvalidSignature, or ImportError saying what to install."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as e:
        raise ImportError("Ed25519-signed policy updates need the `cryptography` package: pip install 'agent-retry-policy[signed]'") from e
    return Ed25519PublicKey, InvalidSignature


@dataclass(frozen=True)
class Integrity:
    """How updates are trusted: `Integrity.unchecked()` (any `.wasm` that passes the
    rest of the gate; a development setting), `Integrity.pinned_sha256(hex)` (only
    a `.wasm` with this SHA-256) or `Integrity.ed25519(public_key)` (only a `.wasm`
    whose detached signature `<wasm>.sig` verifies under this 32-byte key)."""

    kind: Literal["unchecked", "pinned-sha256", "ed25519"] = "unchecked"
    sha256: str | None = None
    public_key: bytes | None = None

    def __post_init__(self) -> None:
        if (self.kind == "pinned-sha256") != (self.sha256 is not None) or (self.kind == "ed25519") != (self.public_key is not None):
            raise ValueError("use Integrity.unchecked(), Integrity.pinned_sha256(hex) or Integrity.ed25519(public_key)")

    @classmethod
    def unchecked(cls) -> Integrity:
        return cls()

    @classmethod
    def pinned_sha256(cls, hex_digest: str) -> Integrity:
        digest = hex_digest.strip().lower()
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise ValueError(f"a SHA-256 digest is 64 hex digits, got {hex_digest!r}")
        return cls("pinned-sha256", sha256=digest)

    @classmethod
    def ed25519(cls, public_key: bytes) -> Integrity:
        """Raises ValueError for a key that is not 32 bytes, ImportError without `cryptography`."""
        key = bytes(public_key)
        if len(key) != 32:
            raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(key)}")
        public_key_type, _ = _ed25519()
        public_key_type.from_public_bytes(key)  # ValueError if it is not a valid key
        return cls("ed25519", public_key=key)


@dataclass(frozen=True)
class PolicySource:
    """Where the policy comes from, and how it is trusted."""

    wasm: Path
    config: Path
    integrity: Integrity = field(default_factory=Integrity.unchecked)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wasm", Path(self.wasm))
        object.__setattr__(self, "config", Path(self.config))


# The files' state when last read (mtime in ns, size), to notice a change when polling.
_Stamp = tuple[int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


def _seen(source: PolicySource) -> tuple[_Stamp, _Stamp]:
    return (_stamp(source.wasm), _stamp(source.config))


class LivePolicy:
    """The serving policy, the previous good one, and what counts as an update.
    Thread-safe: `current()` from any thread; updates are serialised."""

    def __init__(self, source: PolicySource, first: Loaded, seen: tuple[_Stamp, _Stamp], log: logging.Logger = logger) -> None:
        """Use `LivePolicy.open`."""
        self.source = source
        self.log = log
        self._lock = threading.Lock()  # guards the fields below; held only to read or swap them
        self._update_lock = threading.Lock()  # one update (reload, rollback) at a time
        self._current = first
        self._previous: Loaded | None = None
        self._seen = seen
        self._last_refusal: str | None = None
        self._closed = threading.Event()

    @classmethod
    def open(cls, source: PolicySource, *, log: logging.Logger = logger) -> LivePolicy:
        """Loads the first policy through the same gate as every update. Raises `UpdateError`."""
        seen = _seen(source)
        first = _candidate(source, 1, None)
        return cls(source, first, seen, log)

    def current(self) -> Loaded:
        """The policy new runs get. Keep it for the run: an update does not change it."""
        with self._lock:
            return self._current

    @property
    def last_refusal(self) -> str | None:
        """Why the last update was refused, if the last attempt was refused."""
        with self._lock:
            return self._last_refusal

    def reload(self) -> PolicyIdentity:
        """Reads the files again, gates the candidate off the hot path, and swaps it
        in. On refusal raises `UpdateError`, logs the reason, and the serving policy
        is unchanged."""
        with self._update_lock:
            seen = _seen(self.source)
            with self._lock:
                self._seen = seen
                serving = self._current
            try:
                loaded = _candidate(self.source, serving.identity.generation + 1, serving)
            except UpdateError as e:
                with self._lock:
                    self._last_refusal = str(e)
                self._log(logging.WARNING, "policy update refused", serving=str(serving.identity), kind=e.kind, reason=str(e))
                raise
            with self._lock:
                self._previous, self._current = self._current, loaded
                self._last_refusal = None
            identity = loaded.identity
            self._log(logging.INFO, "policy update accepted", **_identity_fields(identity))
            return identity

    def rollback(self) -> PolicyIdentity:
        """Returns to the previous good policy (it passed the gate when it served);
        a second rollback returns to the one rolled back from. Raises
        `NothingToRollBackTo` if there is none."""
        with self._update_lock:
            with self._lock:
                if self._previous is None:
                    raise NothingToRollBackTo()
                self._previous, self._current = self._current, self._previous
                identity = self._current.identity
            self._log(logging.INFO, "policy rolled back", **_identity_fields(identity))
            return identity

    def poll(self) -> PolicyIdentity | None:
        """Reloads if either file changed since it was last read (size or mtime):
        the new identity, or None if nothing changed. Raises `UpdateError` on refusal."""
        now = _seen(self.source)
        with self._lock:
            if now == self._seen:
                return None
        return self.reload()

    def watch(self, interval_s: float) -> threading.Thread:
        """Polls the files every `interval_s` seconds on a daemon thread (a file
        watcher that works on every filesystem, network ones included). Refusals are
        logged and kept in `last_refusal`. The thread ends with `close()` or when
        this object is garbage-collected."""
        live = weakref.ref(self)
        closed = self._closed

        def loop() -> None:
            while not closed.is_set():
                target = live()
                if target is None:
                    return
                try:
                    target.poll()
                except UpdateError:
                    pass  # logged by reload
                except Exception:
                    target.log.exception("agent-retry policy watcher: polling failed")
                del target
                if closed.wait(interval_s):
                    return

        thread = threading.Thread(target=loop, name="agent-retry-policy-watch", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stops the watcher threads. The serving policy stays usable."""
        self._closed.set()

    def __enter__(self) -> LivePolicy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _log(self, level: int, message: str, **fields: Any) -> None:
        self.log.log(level, json.dumps({"event": "agent_retry.policy_update", "message": message, **fields}, ensure_ascii=False))


def _identity_fields(identity: PolicyIdentity) -> dict[str, Any]:
    return {
        "policy": str(identity),
        "generation": identity.generation,
        "wasm_sha256": identity.wasm_sha256,
        "config_sha256": identity.config_sha256,
    }


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UpdateReadError(path, e.strerror or str(e)) from e


def _candidate(source: PolicySource, generation: int, serving: Loaded | None) -> Loaded:
    """Reads, checks and compiles a candidate; runs the self-test."""
    wasm = _read(source.wasm)
    config_bytes = _read(source.config)
    try:
        config_json = config_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UpdateConfigError("the configuration is not UTF-8") from e
    wasm_sha256 = hashlib.sha256(wasm).hexdigest()
    integrity = source.integrity
    if integrity.kind == "pinned-sha256":
        if integrity.sha256 != wasm_sha256:
            raise UpdateIntegrityError(f"the .wasm's SHA-256 is {wasm_sha256}, the pinned digest {integrity.sha256}")
    elif integrity.kind == "ed25519":
        assert integrity.public_key is not None
        _verify_signature(source.wasm, wasm, integrity.public_key)
    if serving is not None and serving.identity.wasm_sha256 == wasm_sha256:
        component = serving.component  # the same bytes passed the load check already
    else:
        try:
            component = PolicyComponent(wasm, source=str(source.wasm))
        except ComponentLoadError as e:
            raise UpdateLoadError(e) from e
        except Exception as e:  # anything else wasmtime says about a bad component
            raise UpdateLoadError(ComponentLoadError(f"{source.wasm} cannot be loaded: {e}")) from e
    _self_test(component, config_json)
    config_sha256 = hashlib.sha256(config_bytes).hexdigest()
    return Loaded(component, config_json, PolicyIdentity(wasm_sha256, config_sha256, generation))


def signature_path(wasm: Path) -> Path:
    """Where the detached signature of `wasm` is: `<wasm>.sig`."""
    return wasm.with_name(wasm.name + SIGNATURE_SUFFIX)


def _verify_signature(wasm: Path, data: bytes, public_key: bytes) -> None:
    sig_path = signature_path(wasm)
    try:
        raw = sig_path.read_bytes()
    except OSError:
        raise UpdateIntegrityError(f"unsigned: no signature at {sig_path}") from None
    text = raw.decode("utf-8", "replace").strip()
    if len(raw) == 64:
        signature = raw
    elif len(text) == 128 and set(text) <= _HEX:
        signature = bytes.fromhex(text)
    else:
        raise UpdateIntegrityError(f"{sig_path} is neither 64 bytes nor 128 hex digits")
    try:
        public_key_type, invalid_signature = _ed25519()
    except ImportError as e:
        raise UpdateIntegrityError(str(e)) from e
    try:
        key = public_key_type.from_public_bytes(public_key)
    except ValueError as e:
        raise UpdateIntegrityError(f"the configured public key is not valid: {e}") from e
    try:
        key.verify(signature, data)
    except invalid_signature:
        raise UpdateIntegrityError("the signature does not verify under the configured key") from None


def _self_test(component: PolicyComponent, config_json: str) -> None:
    """The invariants every policy keeps for the host to stay safe, checked on a
    candidate in a fresh instance with its own account budget. Any failure of the
    candidate (a trap, a misuse it reports, a wrong answer) refuses it."""
    try:
        try:
            instance = component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(1))
        except ComponentLoadError as e:
            raise UpdateSelfTestError(f"instantiation failed: {e}") from e
        try:
            policy = instance.load_policy(config_json)
        except ConfigError as e:
            raise UpdateConfigError(f"{e.field}: {e.message}") from e
        _invariants(policy)
    except UpdateError:
        raise
    except (PolicyTrap, RunMisuse) as e:
        raise UpdateSelfTestError(str(e)) from e
    except Exception as e:  # the candidate is untrusted: whatever goes wrong refuses it
        raise UpdateSelfTestError(f"{type(e).__name__}: {e}") from e


def _limit(limits: dict[str, Any], name: str) -> int:
    value = limits.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else _U64_MAX


def _invariants(policy: Policy) -> None:
    try:
        limits = json.loads(policy.effective_config())
    except ValueError as e:
        raise UpdateSelfTestError(f"effective-config is not JSON: {e}") from e
    if not isinstance(limits, dict):
        raise UpdateSelfTestError("effective-config is not a JSON object")
    max_delay = _limit(limits, "max-delay-ms")
    max_steps = _limit(limits, "max-steps-per-run")
    now = 1_764_460_800_000
    # A write whatever `default-effect` says: MCP hints apply to a tool the configuration does not name.
    write: ToolHints = {"read-only": False, "destructive": None, "idempotent": False}

    # A keyed write failing 503 is retried with the same key within the delay cap
    # (or escalated by a budget: a policy may retry less, never worse).
    key = "ar1-00000000000000000000000000000001"
    keyed: CallRequest = {"tool": "self_test_write", "idempotency-key": key, "hints": write}
    with policy.start_run("self-test-1") as run:
        admission = run.begin_call(keyed, now)
        if "send" in admission:
            ticket = admission["send"]  # type: ignore[typeddict-item]
            decision = run.record_outcome(ticket["call-id"], http_failure(503, body="self-test"), now, _U64_MAX)
            match decision["action"]:
                case {"retry": plan}:
                    if plan["idempotency-key"] != key:
                        raise UpdateSelfTestError("a retry changed the call's idempotency key")
                    if plan["delay-ms"] > max_delay:
                        raise UpdateSelfTestError(f"a retry waits {plan['delay-ms']} ms, above max-delay-ms {max_delay}")
                case {"escalate": _}:
                    pass
                case other:
                    raise UpdateSelfTestError(f"a 503 on a keyed write answered {other!r}")

    # An unkeyed write that timed out is never resent without a status check.
    unkeyed: CallRequest = {"tool": "self_test_write", "idempotency-key": None, "hints": write}
    with policy.start_run("self-test-2") as run:
        admission = run.begin_call(unkeyed, now)
        if "send" in admission:
            ticket = admission["send"]  # type: ignore[typeddict-item]
            decision = run.record_outcome(ticket["call-id"], transport_failure("timeout"), now, 1)
            if action_name(decision["action"]) == "retry":
                raise UpdateSelfTestError("an unkeyed write that timed out would be resent without a status check")

    # A 403 escalates; it is never retried.
    with policy.start_run("self-test-3") as run:
        admission = run.begin_call(keyed, now)
        if "send" in admission:
            ticket = admission["send"]  # type: ignore[typeddict-item]
            decision = run.record_outcome(ticket["call-id"], http_failure(403, body="self-test"), now, 1)
            if action_name(decision["action"]) != "escalate":
                raise UpdateSelfTestError(f"a 403 answered {decision['action']!r}")

    # A failure that persists ends in an escalation within the step budget.
    read: CallRequest = {
        "tool": "self_test_read",
        "idempotency-key": None,
        "hints": {"read-only": True, "destructive": None, "idempotent": None},
    }
    limit = min(max_steps + 1, 1_000_000)
    steps = 0
    with policy.start_run("self-test-4") as run:
        ended = False
        while not ended:
            try:
                admission = run.begin_call(read, now)
            except RunMisuse:
                break
            if "send" not in admission:
                break
            call_id = admission["send"]["call-id"]  # type: ignore[typeddict-item]
            while True:
                steps += 1
                if steps > limit:
                    raise UpdateSelfTestError(
                        f"a persistent 503 was still being retried after {steps} steps (max-steps-per-run {max_steps})"
                    )
                try:
                    decision = run.record_outcome(call_id, http_failure(503), now, 1)
                except RunMisuse:
                    ended = True
                    break
                name = action_name(decision["action"])
                if name == "retry":
                    continue
                ended = name == "escalate"
                break  # escalated, or another call (a status check, a replan, a success)


__all__ = [
    "Integrity",
    "LivePolicy",
    "Loaded",
    "PolicyIdentity",
    "PolicySource",
    "signature_path",
]
