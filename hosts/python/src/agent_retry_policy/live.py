"""A policy that operators update while the host runs: a new `.wasm`, or a new
configuration, read from files the host watches (or on `reload()`), or published
once for a whole fleet in Redis (`LivePolicy.open_redis`, `fleet.py`), checked
by a gate, and swapped in atomically; `rollback()` returns to the previous good one.
A refused update leaves the last good policy serving and says why (the raised
`UpdateError`, a warning log line, and `LivePolicy.metrics`, an `UpdateMetrics` of
updates accepted, refused and rolled back). The same design as the Rust host's
(hosts/rust/src/live.rs).

    live = LivePolicy.open(PolicySource(wasm, config, Integrity.ed25519(public_key)))
    live.watch(2.0)                       # polls both files; or live.reload() / live.rollback()
    loaded = live.current()               # per run (or worker): keep it for the run
    instance = loaded.component.instantiate()
    policy = instance.load_policy(loaded.config_json)   # log loaded.identity with its decisions:
    caller = RetryingToolCaller(session, policy.start_run(run_id), policy_identity=str(loaded.identity))

The gate, before anything serves:

0. order: a candidate older than the serving policy is refused
   (`UpdateOlderError`, kind "older"): a fleet publication whose revision is
   lower than the serving one's (a stale replica, a Redis restarted from an old
   dump), or files whose newest modification time (of the `.wasm`, the
   configuration and the shipped vectors) is before the serving files' (the
   same time is not older: the same files may be reloaded). `rollback()` is not
   an update and is never refused;
1. integrity: the `.wasm`'s SHA-256 equals a pinned digest, or, under an
   Ed25519 key, the signed manifest (`manifest.py`: `<wasm>.manifest`, or the
   fleet's `{prefix}:manifest`) covers exactly what was read (the `.wasm`, the
   configuration, the vectors or none, the fleet's revision or none) and its
   signature verifies; an unsigned publication, and a signature over the
   `.wasm` alone (before 0.7), are refused (needs the `cryptography` package:
   the `signed` extra);
2. the component compiles, speaks this host's contract version and imports
   nothing outside the contract (`PolicyComponent`); a `.wasm` byte-identical
   to the serving one is not compiled again;
3. the configuration loads in it;
4. the gate's vectors: the invariants every live update must keep, as data
   (tests/vectors/gate.json, shipped with the package: a keyed write's
   transient failure is retried with the same key within the configured delay,
   an unkeyed write that timed out is not resent without a status check, a 403
   escalates, a persistent failure escalates within the step budget, ...),
   then the operator's own gate vector files, if any (`gate_vectors=[...]`
   on `PolicySource` or `LivePolicy.open_redis`), then the vectors the update
   ships with, if any (`PolicySource(..., vectors=path)`, or `{prefix}:vectors`
   for a fleet). Every case must pass against the candidate, each on a fresh
   instance, run by this host's conformance runner (`conformance.run_case`); a
   case without `config` runs in the candidate's configuration. A file that is
   not JSON or not in the format, or a case that fails (a trap included),
   refuses the update (`UpdateSelfTestError`, naming the file, the case and its
   first mismatch).

One update at a time: `reload()` (read, gate, swap) and `rollback()` hold one
lock, so of two reloads at once (the watcher's and the channel's, or a caller's)
the second reads after the first has swapped, and the newest files or
publication serve.

Runs in flight finish on the policy they started with: a host takes
`LivePolicy.current()` when it starts a run (or a worker) and keeps that `Loaded`
policy for the run; an update changes what new runs get. Every decision can be
attributed to exactly one policy version (`PolicyIdentity`).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import logging
import os
import string
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from . import otel
from ._telemetry import Telemetry
from .accounts import EmbeddedAccounts
from .component import PolicyComponent, _repo_root
from .conformance import CaseResult, HarnessError, check_vector_file, run_case
from .entropy import SplitMix64
from .errors import (
    ComponentLoadError,
    ConfigError,
    NothingToRollBackTo,
    UpdateConfigError,
    UpdateError,
    UpdateFleetError,
    UpdateIntegrityError,
    UpdateLoadError,
    UpdateOlderError,
    UpdateReadError,
    UpdateSelfTestError,
)
from .events import PolicyUpdateEvent
from .fleet import DEFAULT_PREFIX, FleetSource, FleetUnavailable
from .hooks import Hooks
from .manifest import ManifestError, verify_publication
from .metrics import RetryMetrics

logger = logging.getLogger("agent_retry_policy.live")

_HEX = frozenset(string.hexdigits)
SIGNATURE_SUFFIX = ".sig"  # a signature over the .wasm alone (before 0.7): named when found, never accepted
MANIFEST_SUFFIX = ".manifest"
# The gate's own vectors: package data next to this module in a wheel (copied in
# by `make dist`, as the component is), else the repository's (an editable install).
GATE_VECTORS = "gate.json"
REPO_GATE_VECTORS = Path("tests/vectors/gate.json")


@dataclass(frozen=True)
class PolicyIdentity:
    """Which policy made a decision: the component's digest and the configuration's."""

    wasm_sha256: str  # SHA-256 of the .wasm, hex
    config_sha256: str  # SHA-256 of the configuration text, hex
    generation: int  # 1 for the policy the host started with, then one more per accepted update, never reused

    def __str__(self) -> str:
        return f"generation {self.generation} (wasm {self.wasm_sha256[:12]}, config {self.config_sha256[:12]})"


@dataclass(frozen=True)
class UpdateMetrics:
    """Counters of what happened to updates since the host started (for a metrics
    endpoint), as the Rust host's `UpdateMetrics` and the Node host's `metrics`:
    updates accepted, refused (a `reload()`, or a poll that found a change, whose
    candidate the gate refused) and rollbacks made. A snapshot: `LivePolicy.metrics`."""

    accepted: int = 0
    refused: int = 0
    rolled_back: int = 0


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
    a `.wasm` with this SHA-256) or `Integrity.ed25519(public_key)` (only a
    publication whose signed manifest, `<wasm>.manifest` or the fleet's
    `{prefix}:manifest`, covers it all and verifies under this 32-byte key)."""

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
    """Where the policy comes from, and how it is trusted. `vectors`: optionally,
    conformance vectors (a JSON file in the format of tests/vectors) shipped
    with the update, that it must pass; read with the other files on every
    reload, and watched. `gate_vectors`: the operator's own vector files, run by
    the gate on every candidate after the package's gate.json."""

    wasm: Path
    config: Path
    integrity: Integrity = field(default_factory=Integrity.unchecked)
    vectors: Path | None = None
    gate_vectors: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "wasm", Path(self.wasm))
        object.__setattr__(self, "config", Path(self.config))
        if self.vectors is not None:
            object.__setattr__(self, "vectors", Path(self.vectors))
        object.__setattr__(self, "gate_vectors", _paths(self.gate_vectors))


def _paths(paths: Any) -> tuple[Path, ...]:
    if isinstance(paths, (str, os.PathLike)):
        raise TypeError("gate_vectors is a list of paths, not one path")
    return tuple(Path(p) for p in paths)


# What was last read, to notice a change when polling: the files' state (mtime
# in ns, size), or the fleet's revision.
_Stamp = tuple[int, int] | None
_Seen = tuple[Any, ...]


def _stamp(path: Path) -> _Stamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


def _seen(source: PolicySource) -> tuple[_Stamp, ...]:
    vectors = () if source.vectors is None else (_stamp(source.vectors),)
    # Under a key the manifest too: one written after the files is an update.
    manifest = (_stamp(manifest_path(source.wasm)),) if source.integrity.kind == "ed25519" else ()
    return (_stamp(source.wasm), _stamp(source.config), *vectors, *manifest)


@dataclass(frozen=True)
class _Read:
    """An update as read, before the gate."""

    wasm: bytes
    config: bytes
    manifest: bytes | None  # the signed manifest, if one came with it (read only under a key)
    manifest_at: str  # where it was looked for, for messages
    wasm_name: str  # where the .wasm came from, for messages
    integrity: Integrity
    seen: _Seen
    vectors: bytes | None = None  # the vectors shipped with it, if any
    vectors_name: str = ""  # where they came from, for messages
    gate_vectors: tuple[Path, ...] = ()  # the operator's gate vector files
    # What orders candidates (a lower one is older than the serving policy):
    # the fleet's revision, or the newest mtime of the files, in ns.
    stamp: int = 0
    revision: int | None = None  # the fleet's revision it was read under; None for files
    legacy_signature_at: str | None = None  # where a signature over the .wasm alone was found (before 0.7)


def _newest_mtime_ns(seen: _Seen) -> int:
    """The newest modification time among the files' stamps (`_seen`), in ns."""
    return max((stamp[0] for stamp in seen[1:] if stamp is not None), default=0)


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _not_older(read: _Read, serving: int) -> None:
    """Refuses a candidate older than the serving policy (`UpdateOlderError`):
    a lower revision, or files last modified before the serving files were
    (the same time is not older)."""
    if read.stamp >= serving:
        return
    if read.seen[0] == "revision":
        reason = (
            f"the publication at {read.wasm_name} is older than the serving policy's, revision {serving} "
            "(a stale replica, or Redis restored from an old dump?)"
        )
    else:
        reason = (
            f"the files' newest modification time, {_utc(read.stamp)}, is before the serving policy's, {_utc(serving)} "
            "(to return to an earlier policy, use rollback())"
        )
    raise UpdateOlderError(reason, read.stamp, serving)


class _Files:
    """Updates from two files (the vectors, and `<wasm>.manifest` under a key)."""

    def __init__(self, source: PolicySource) -> None:
        self.source = source

    def seen_now(self) -> _Seen:
        return ("files", *_seen(self.source))

    def read(self) -> _Read:
        source = self.source
        seen = self.seen_now()
        wasm = _read(source.wasm)
        config = _read(source.config)
        at = manifest_path(source.wasm)
        vectors = None if source.vectors is None else _read(source.vectors)
        manifest = legacy = None
        if source.integrity.kind == "ed25519":
            try:
                manifest = at.read_bytes()
            except OSError:
                manifest = None
            if signature_path(source.wasm).exists():
                legacy = str(signature_path(source.wasm))
        return _Read(
            wasm,
            config,
            manifest,
            str(at),
            str(source.wasm),
            source.integrity,
            seen,
            vectors,
            str(source.vectors or ""),
            source.gate_vectors,
            _newest_mtime_ns(seen),
            revision=None,
            legacy_signature_at=legacy,
        )


class _Fleet:
    """Updates published in Redis for a fleet (`fleet.py`)."""

    def __init__(self, source: FleetSource, integrity: Integrity, gate_vectors: tuple[Path, ...] = ()) -> None:
        self.source = source
        self.integrity = integrity
        self.gate_vectors = gate_vectors
        self.client = source.client()

    def seen_now(self) -> _Seen:
        try:
            return ("revision", self.source.revision(self.client))
        except FleetUnavailable as e:
            raise UpdateFleetError(str(e)) from e

    def read(self) -> _Read:
        try:
            publication = self.source.read(self.client)
        except FleetUnavailable as e:
            raise UpdateFleetError(str(e)) from e
        name = f"{self.source.key('wasm')} (revision {publication.revision})"
        return _Read(
            publication.wasm,
            publication.config,
            publication.manifest,
            self.source.key("manifest"),
            name,
            self.integrity,
            ("revision", publication.revision),
            publication.vectors,
            f"{self.source.key('vectors')} (revision {publication.revision})",
            self.gate_vectors,
            publication.revision,
            # Always a revision: 0 ("none stored") is "revision 0", which no manifest covers (a files one says "none").
            revision=publication.revision,
            legacy_signature_at=self.source.key("wasm.sig") if publication.legacy_signature else None,
        )


class LivePolicy:
    """The serving policy, the previous good one, and what counts as an update.
    Thread-safe: `current()` from any thread; updates are serialised."""

    def __init__(
        self,
        origin: _Files | _Fleet,
        first: Loaded,
        seen: _Seen,
        log: logging.Logger = logger,
        stamp: int = 0,
        *,
        hooks: Hooks | None = None,
        metrics: RetryMetrics | None = None,
    ) -> None:
        """Use `LivePolicy.open` (files) or `LivePolicy.open_redis` (a fleet).
        `hooks.on_policy_update` and `metrics` (`agent_retry_policy_updates_total`)
        see every update accepted, refused or rolled back (docs/events.md)."""
        self._origin = origin
        self.source: PolicySource | FleetSource = origin.source
        self.log = log
        # The policy-update events' fan-out: the log line (unchanged), the hook, the metrics, OpenTelemetry's counter.
        self._telemetry = Telemetry(log, hooks=hooks, metrics=metrics, otel_recorder=otel.recorder())
        self._lock = threading.Lock()  # guards the fields below; held only to read or swap them
        self._update_lock = threading.Lock()  # one update (reload, rollback) at a time
        self._current = first
        self._previous: Loaded | None = None
        # The serving and previous policies' stamps (`_Read.stamp`), swapped with them.
        self._stamp = stamp
        self._previous_stamp = 0
        self._seen = seen
        self._last_refusal: str | None = None
        self._metrics = UpdateMetrics()
        # Accepted updates are numbered from 2, never reusing a number after a rollback (as the Rust and Node hosts).
        self._next_generation = 2
        self._closed = threading.Event()

    @classmethod
    def open(
        cls, source: PolicySource, *, log: logging.Logger = logger, hooks: Hooks | None = None, metrics: RetryMetrics | None = None
    ) -> LivePolicy:
        """Loads the first policy from files through the same gate as every update. Raises `UpdateError`."""
        return cls._open(_Files(source), log, hooks, metrics)

    @classmethod
    def open_redis(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        integrity: Integrity | None = None,
        gate_vectors: Any = (),
        log: logging.Logger = logger,
        hooks: Hooks | None = None,
        metrics: RetryMetrics | None = None,
    ) -> LivePolicy:
        """Loads the first policy published in Redis for the fleet (`fleet.py`;
        `publish_policy` writes it), through the same gate as every update: a
        worker started after a publication takes it here. `gate_vectors`: the
        operator's own vector files the gate runs on every publication. Raises
        `UpdateError` (`UpdateFleetError` when Redis cannot be read or nothing is
        published)."""
        return cls._open(_Fleet(FleetSource(url, prefix), integrity or Integrity.unchecked(), _paths(gate_vectors)), log, hooks, metrics)

    @classmethod
    def _open(
        cls, origin: _Files | _Fleet, log: logging.Logger, hooks: Hooks | None = None, metrics: RetryMetrics | None = None
    ) -> LivePolicy:
        read = origin.read()
        first = _candidate(read, 1, None)
        return cls(origin, first, read.seen, log, read.stamp, hooks=hooks, metrics=metrics)

    def current(self) -> Loaded:
        """The policy new runs get. Keep it for the run: an update does not change it."""
        with self._lock:
            return self._current

    @property
    def last_refusal(self) -> str | None:
        """Why the last update was refused, if the last attempt was refused."""
        with self._lock:
            return self._last_refusal

    @property
    def metrics(self) -> UpdateMetrics:
        """Updates accepted, refused and rolled back since the host started (a snapshot)."""
        with self._lock:
            return self._metrics

    def reload(self) -> PolicyIdentity:
        """Reads the files (or the fleet's publication) again, gates the candidate
        off the hot path, and swaps it in. On refusal raises `UpdateError`, logs
        the reason and counts it (`metrics`), and the serving policy is unchanged;
        a candidate older than the serving policy (a lower revision, or files
        modified before the serving ones) is refused as `UpdateOlderError`. One
        update at a time: a second `reload()` waits for the first to swap, then
        reads."""
        with self._update_lock:
            with self._lock:
                serving, serving_stamp = self._current, self._stamp
            try:
                # Noted first, so that an update that cannot even be read is tried
                # once, not at every poll (a Redis that cannot be reached changes nothing).
                try:
                    seen = self._origin.seen_now()
                    with self._lock:
                        self._seen = seen
                except UpdateFleetError:
                    pass
                read = self._origin.read()
                with self._lock:
                    self._seen = read.seen
                _not_older(read, serving_stamp)
                loaded = _candidate(read, self._next_generation, serving)
            except UpdateError as e:
                with self._lock:
                    self._last_refusal = str(e)
                    self._metrics = replace(self._metrics, refused=self._metrics.refused + 1)
                self._update_event(
                    "refused", logging.WARNING, "policy update refused", serving=str(serving.identity), kind=e.kind, reason=str(e)
                )
                raise
            with self._lock:
                self._previous, self._current = self._current, loaded
                self._previous_stamp, self._stamp = self._stamp, read.stamp
                self._last_refusal = None
                self._next_generation += 1
                self._metrics = replace(self._metrics, accepted=self._metrics.accepted + 1)
            identity = loaded.identity
            self._update_event("accepted", logging.INFO, "policy update accepted", **_identity_fields(identity))
            return identity

    def rollback(self) -> PolicyIdentity:
        """Returns to the previous good policy (it passed the gate when it served);
        a second rollback returns to the one rolled back from. Not an update:
        never refused as older. Raises `NothingToRollBackTo` if there is none."""
        with self._update_lock:
            with self._lock:
                if self._previous is None:
                    raise NothingToRollBackTo()
                self._previous, self._current = self._current, self._previous
                self._previous_stamp, self._stamp = self._stamp, self._previous_stamp
                identity = self._current.identity
                self._metrics = replace(self._metrics, rolled_back=self._metrics.rolled_back + 1)
            self._update_event("rolled-back", logging.INFO, "policy rolled back", **_identity_fields(identity))
            return identity

    def poll(self) -> PolicyIdentity | None:
        """Reloads if either file changed since it was last read (size or mtime),
        or the fleet's revision is one not tried yet: the new identity, or None if
        nothing changed (or the fleet's Redis cannot be reached: logged, the serving
        policy stays, the next poll tries again). Raises `UpdateError` on refusal."""
        try:
            now = self._origin.seen_now()
        except UpdateFleetError as e:
            self._log(logging.WARNING, "cannot check for a policy update", serving=str(self.current().identity), reason=str(e))
            return None
        with self._lock:
            if now == self._seen:
                return None
        return self.reload()

    def watch(self, interval_s: float) -> threading.Thread:
        """Polls every `interval_s` seconds on a daemon thread (a file watcher that
        works on every filesystem, network ones included); for a fleet, a second
        daemon thread listens on the update channel, so a publication is taken at
        once, and the polling catches a missed message. Refusals and Redis errors
        are logged (refusals kept in `last_refusal`) and never stop the threads.
        They end with `close()` or when this object is garbage-collected. Returns
        the polling thread."""
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
        if isinstance(self._origin, _Fleet):
            listener = threading.Thread(
                target=_listen, args=(live, self._origin, closed, interval_s), name="agent-retry-policy-listen", daemon=True
            )
            listener.start()
        return thread

    def close(self) -> None:
        """Stops the watcher threads. The serving policy stays usable."""
        self._closed.set()

    def __enter__(self) -> LivePolicy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _log(self, level: int, message: str, **fields: Any) -> None:
        line = {"event": "agent_retry.policy_update", "ts": round(time.time(), 3), "message": message, **fields}
        self.log.log(level, json.dumps(line, ensure_ascii=False))

    def _update_event(self, outcome: str, level: int, message: str, **fields: Any) -> None:
        """An update accepted, refused or rolled back: its log line (the same as
        `_log` writes), its hook, its count."""
        event = PolicyUpdateEvent(
            outcome,
            message,
            identity=fields.get("policy"),
            serving=fields.get("serving"),
            kind=fields.get("kind"),
            reason=fields.get("reason"),
            fields=fields,
        )
        self._telemetry.emit(event, level=level)


def _listen(live: weakref.ref[LivePolicy], fleet: _Fleet, closed: threading.Event, interval_s: float) -> None:
    """Subscribes to the fleet's channel and polls on every message; on a Redis
    error logs it, waits `interval_s` and subscribes again."""
    wait = max(interval_s, 0.05)
    while not closed.is_set():
        pubsub = None
        try:
            pubsub = fleet.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(fleet.source.channel)
            while not closed.is_set():
                message = pubsub.get_message(timeout=min(wait, 1.0))
                if message is None or message.get("type") != "message":
                    continue
                target = live()
                if target is None:
                    return
                try:
                    target.poll()
                except UpdateError:
                    pass  # logged by reload
                del target
        except Exception as e:  # Redis away or restarted: the polling thread carries on
            target = live()
            if target is None:
                return
            target._log(logging.WARNING, "policy update channel lost; subscribing again", channel=fleet.source.channel, reason=repr(e))
            del target
            if closed.wait(wait):
                return
        finally:
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - a broken connection cannot be closed cleanly
                    pass


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


def _candidate(read: _Read, generation: int, serving: Loaded | None) -> Loaded:
    """Checks and compiles a candidate; runs the gate's vectors."""
    wasm, config_bytes = read.wasm, read.config
    integrity = read.integrity
    if integrity.kind == "ed25519":
        assert integrity.public_key is not None
        # Before anything of the publication is used: the manifest covers the bytes as read.
        _verify_manifest(read, integrity.public_key)
    try:
        config_json = config_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UpdateConfigError("the configuration is not UTF-8") from e
    wasm_sha256 = hashlib.sha256(wasm).hexdigest()
    if integrity.kind == "pinned-sha256" and integrity.sha256 != wasm_sha256:
        raise UpdateIntegrityError(f"the .wasm's SHA-256 is {wasm_sha256}, the pinned digest {integrity.sha256}")
    if serving is not None and serving.identity.wasm_sha256 == wasm_sha256:
        component = serving.component  # the same bytes passed the load check already
    else:
        try:
            component = PolicyComponent(wasm, source=read.wasm_name)
        except ComponentLoadError as e:
            raise UpdateLoadError(e) from e
        except Exception as e:  # anything else wasmtime says about a bad component
            raise UpdateLoadError(ComponentLoadError(f"{read.wasm_name} cannot be loaded: {e}")) from e
    _config_loads(component, config_json)
    gate, gate_name = gate_vectors()
    _gate_vectors_pass(component, config_json, gate, gate_name, "the gate's vectors")
    for path in read.gate_vectors:
        _gate_vectors_pass(component, config_json, _read(path), str(path), "the operator's gate vectors")
    if read.vectors is not None:
        _gate_vectors_pass(component, config_json, read.vectors, read.vectors_name, "the update's vectors")
    config_sha256 = hashlib.sha256(config_bytes).hexdigest()
    return Loaded(component, config_json, PolicyIdentity(wasm_sha256, config_sha256, generation))


def manifest_path(wasm: Path) -> Path:
    """Where the signed manifest of `wasm` is: `<wasm>.manifest`."""
    wasm = Path(wasm)
    return wasm.with_name(wasm.name + MANIFEST_SUFFIX)


def signature_path(wasm: Path) -> Path:
    """Where a signature over `wasm` alone was kept before 0.7 (`<wasm>.sig`):
    no longer accepted, only named when found."""
    wasm = Path(wasm)
    return wasm.with_name(wasm.name + SIGNATURE_SUFFIX)


def _verify_manifest(read: _Read, public_key: bytes) -> None:
    try:
        verify_publication(
            public_key,
            read.manifest,
            read.manifest_at,
            read.wasm,
            read.config,
            read.vectors,
            read.revision,
            legacy_signature_at=read.legacy_signature_at,
        )
    except ManifestError as e:
        raise UpdateIntegrityError(str(e)) from None
    except ImportError as e:
        raise UpdateIntegrityError(str(e)) from e


def gate_vectors() -> tuple[bytes, str]:
    """The gate's own vectors (gate.json: the package's, else the repository's)
    and where they were read. Raises `UpdateSelfTestError` if there are none:
    an installation without them cannot gate an update."""
    resource = importlib.resources.files(__package__ or "agent_retry_policy") / GATE_VECTORS
    try:
        return resource.read_bytes(), GATE_VECTORS
    except OSError:
        pass
    path = _repo_root() / REPO_GATE_VECTORS
    try:
        return path.read_bytes(), str(path)
    except OSError as e:
        raise UpdateSelfTestError(f"the gate's vectors ({GATE_VECTORS}) are missing from the package and from {path}: {e}") from e


def _config_loads(component: PolicyComponent, config_json: str) -> None:
    """The configuration loads in the candidate (its own error, named, if not)."""
    try:
        instance = component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(1))
    except ComponentLoadError as e:
        raise UpdateSelfTestError(f"instantiation failed: {e}") from e
    except Exception as e:  # the candidate is untrusted: whatever goes wrong refuses it
        raise UpdateSelfTestError(f"instantiation failed: {type(e).__name__}: {e}") from e
    try:
        instance.load_policy(config_json).close()
    except ConfigError as e:
        raise UpdateConfigError(f"{e.field}: {e.message}") from e
    except Exception as e:
        raise UpdateSelfTestError(f"loading the configuration: {type(e).__name__}: {e}") from e


def _gate_vectors_pass(component: PolicyComponent, config_json: str, data: bytes, name: str, what: str) -> None:
    """Every case of a vector file passes against the candidate (the host's
    conformance runner, a fresh instance per case; a case without `config` in
    the candidate's configuration), else the update is refused naming the case."""
    try:
        cases = check_vector_file(json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UpdateSelfTestError(f"{what} ({name}) are not JSON: {e}") from e
    except HarnessError as e:
        raise UpdateSelfTestError(f"{what} ({name}) are not in the vector format: {e}") from e
    for case in cases:
        try:
            result = run_case(component, name, case, config_text=config_json)
        except Exception as e:  # the runner reports a case's failures; anything else refuses too
            result = CaseResult(name, case["description"], failure=f"{type(e).__name__}: {e}", error=e)
        if result.failure is not None:
            description = json.dumps(result.description, ensure_ascii=False)
            # A trap of the candidate is the cause (`PolicyOutOfFuel`, `PolicyBoundaryViolation`, ...).
            raise UpdateSelfTestError(f"{what} ({name}) fail: {description} {result.failure}") from result.error


__all__ = [
    "Integrity",
    "LivePolicy",
    "Loaded",
    "PolicyIdentity",
    "PolicySource",
    "UpdateMetrics",
    "manifest_path",
    "signature_path",
]
