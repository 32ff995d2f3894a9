"""The shared state the component imports (contract 0.8.0, `shared-state`):
short texts the policy shares across runs, the circuit breakers' states. The
policy alone decides what a text means; the host only stores it, with a
version for compare-and-set and an expiry.

`EmbeddedSharedState` keeps them in this process, behind a lock: one lives
beside each `EmbeddedAccounts` (`accounts.shared_state`), so every run that
shares an embedded account budget shares its breakers too. The same semantics
as the Rust and Node hosts' embedded stores:

- a map key -> (value, version, expires_at_ms), the expiry on this process's
  clock (the wall clock when the store was made, plus the time since);
- `load(key, now_ms)`: an entry whose `expires_at_ms <= now` is absent (and
  deleted): value None, version 0; `now-ms` is the `now_ms` it was passed;
- `store_if(key, expected_version, value, ttl_ms)`: if the current version (0
  when absent) equals `expected_version`, stores `value` with version + 1 and
  `expires_at = now + ttl_ms`, and returns True; else False. A value longer
  than `MAX_VALUE_BYTES` is refused (False), and so is a new key while
  `MAX_KEYS` keys are held after the expired ones are dropped.

Across processes and machines, `FallbackSharedState` (`redis_shared_state.py`)
keeps the texts in Redis, with an `EmbeddedSharedState` of its own while Redis
does not answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from .types import Loaded

# The longest text stored, in UTF-8 bytes.
MAX_VALUE_BYTES = 1_024
# The most keys one embedded store holds.
MAX_KEYS = 10_000
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF


class SharedStateBackend(Protocol):
    """A shared state. `store_if` must be atomic (compare and set) across every caller."""

    def load(self, key: str, now_ms: int) -> Loaded: ...

    def store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool: ...


def _process_clock() -> Callable[[], int]:
    """Ms since the Unix epoch on this process's monotonic clock (a step of the wall clock moves nothing)."""
    epoch_ms = time.time_ns() // 1_000_000
    started = time.monotonic_ns()
    return lambda: epoch_ms + (time.monotonic_ns() - started) // 1_000_000


class EmbeddedSharedState:
    """The shared state in this process: shared by every run and every
    component instance (and thread) that holds this object. `clock` gives the
    store's time in ms (default: this process's clock); tests pass a fake one."""

    def __init__(self, *, clock: Callable[[], int] | None = None) -> None:
        self._entries: dict[str, tuple[str, int, int]] = {}
        self._lock = threading.Lock()
        self._clock = clock if clock is not None else _process_clock()

    def __len__(self) -> int:
        """The keys held, expired ones included until they are dropped."""
        with self._lock:
            return len(self._entries)

    def _live(self, key: str, now: int) -> tuple[str, int, int] | None:
        """The entry under `key` unless it expired (then dropped); the lock is held."""
        entry = self._entries.get(key)
        if entry is not None and entry[2] <= now:
            del self._entries[key]
            return None
        return entry

    def load(self, key: str, now_ms: int) -> Loaded:
        with self._lock:
            entry = self._live(key, self._clock())
        if entry is None:
            return {"value": None, "version": 0, "now-ms": now_ms}
        return {"value": entry[0], "version": entry[1], "now-ms": now_ms}

    def store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool:
        if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
            return False
        now = self._clock()
        with self._lock:
            entry = self._live(key, now)
            version = entry[1] if entry is not None else 0
            if version != expected_version:
                return False
            if entry is None and len(self._entries) >= MAX_KEYS:
                self._drop_expired(now)
                if len(self._entries) >= MAX_KEYS:
                    return False
            self._entries[key] = (value, min(version + 1, U64_MAX), min(now + ttl_ms, U64_MAX))
            return True

    def _drop_expired(self, now: int) -> None:
        for key in [key for key, (_, _, expires_at) in self._entries.items() if expires_at <= now]:
            del self._entries[key]


__all__ = ["MAX_KEYS", "MAX_VALUE_BYTES", "EmbeddedSharedState", "SharedStateBackend"]
