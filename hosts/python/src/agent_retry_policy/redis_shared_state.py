"""The shared state (the circuit breakers' store) on Redis, for workers in
several processes or on several machines: the Rust host's `RedisSharedState`
and `FallbackSharedState` (hosts/rust/src/shared_state/redis.rs), with the same
scripts, keys and timeout, so that Rust, Python and Node workers see one set of
breakers per server.

- `RedisSharedState`: every text is a hash `{value, version}` under
  `STATE_PREFIX` and the policy's key, read and compare-and-set by two Lua
  scripts (`redis_scripts.py`, generated from the Rust source), on the
  server's clock. A key of another type, or a hash without a number for its
  version, reads as absent and the next store replaces it. Every exchange,
  connecting included, ends within `REDIS_TIMEOUT_S` (0.5 s), as the account
  budget's (`redis_accounts.py`: the same synchronous redis-py connection, one
  per `RedisSharedState`, behind a lock; a failed exchange drops it).
- `FallbackSharedState`: the backend to instantiate with
  (`PolicyComponent.instantiate(shared_state=...)`). Redis while it answers;
  while it does not, an `EmbeddedSharedState` of its own (this worker's
  breakers alone: it neither sees the fleet's nor shows it its own), logged
  once, Redis tried again every `retry_interval_s`. A change made locally is
  not carried to Redis when it answers again: the fleet's state there is newer.

Needs redis-py: `pip install 'agent-retry-policy[redis]'`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .redis_accounts import AccountsError, _connection_kwargs, _redis, _RedisExchange, _sha1
from .redis_scripts import REDIS_TIMEOUT_S, RETRY_INTERVAL_S, STATE_LOAD_LUA, STATE_PREFIX, STATE_STORE_LUA
from .shared_state import MAX_VALUE_BYTES, EmbeddedSharedState
from .types import Loaded

logger = logging.getLogger("agent_retry_policy.shared_state")


class SharedStateError(AccountsError):
    """Redis cannot be used for the shared state (an `AccountsError`, as in the
    Rust host). `kind`: "bad-url" or "unreachable"."""

    def __init__(self, kind: str, url: str, reason: str) -> None:
        super().__init__(kind, url, reason)
        if kind == "bad-url":
            self.args = (f"shared state: {url!r} is not a redis:// URL: {reason}",)
        else:
            self.args = (f"shared state: Redis at {url} is unusable: {reason}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"the script answered {value!r} for {what}, not a whole number")
    return value


class RedisSharedState(_RedisExchange):
    """A connection to Redis holding the texts: one, shared by the process's
    workers (threads); a failed exchange drops it and the next one reconnects."""

    def __init__(self, url: str, connection_kwargs: dict[str, Any]) -> None:
        self.url = url
        self._kwargs = connection_kwargs
        self._connection: Any = None
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, url: str) -> RedisSharedState:
        """Connects and checks that the server speaks Redis (PING), within
        `REDIS_TIMEOUT_S`: a bad URL, a closed port or a server answering
        garbage raises `SharedStateError` here, not a hang later."""
        try:
            kwargs = _connection_kwargs(url)
        except AccountsError as e:
            raise SharedStateError("bad-url", url, e.reason) from None
        redis = _redis()
        state = cls(url, kwargs)
        try:
            with state._lock:
                pong = state._command(time.monotonic() + REDIS_TIMEOUT_S, "PING")
                if pong not in (b"PONG", "PONG", True):
                    raise SharedStateError("unreachable", url, f"PING answered {pong!r}")
        except (redis.RedisError, OSError) as e:
            state._drop()
            raise SharedStateError("unreachable", url, str(e) or type(e).__name__) from None
        except SharedStateError:
            state._drop()
            raise
        return state

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _script(self, script: str, key: str, *args: Any) -> Any:
        """EVALSHA, or EVAL when the server does not have the script, within one
        `REDIS_TIMEOUT_S` in all, waiting for the lock included. Raises
        `SharedStateError` ("unreachable") when Redis failed (the connection dropped)."""
        redis = _redis()
        deadline = time.monotonic() + REDIS_TIMEOUT_S
        if not self._lock.acquire(timeout=REDIS_TIMEOUT_S):
            raise SharedStateError("unreachable", self.url, f"the connection stayed busy for {REDIS_TIMEOUT_S} s")
        try:
            try:
                try:
                    return self._command(deadline, "EVALSHA", _sha1(script), 1, key, *args)
                except redis.exceptions.NoScriptError:
                    return self._command(deadline, "EVAL", script, 1, key, *args)
            except Exception as e:
                self._drop()  # possibly broken mid-reply: start afresh next time
                if isinstance(e, (redis.RedisError, OSError)):
                    raise SharedStateError("unreachable", self.url, str(e) or type(e).__name__) from None
                raise
        finally:
            self._lock.release()

    def try_load(self, key: str) -> Loaded:
        """Reads a text: absent -> value None, version 0; `now-ms` is the
        server's clock. A text over 1,024 bytes or not UTF-8 reads as absent at
        its version (the next store replaces it). Raises `SharedStateError` when
        Redis failed."""
        reply = self._script(STATE_LOAD_LUA, f"{STATE_PREFIX}{key}", MAX_VALUE_BYTES)
        try:
            present, value, version, now = reply
            present, version, now = _whole(present, "present"), _whole(version, "version"), _whole(now, "now")
        except (TypeError, ValueError) as e:
            raise SharedStateError("unreachable", self.url, f"the load script answered {reply!r}: {e}") from None
        text: str | None = None
        if present == 1:
            try:
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError:
                text = None  # not a text of ours: replaced at the next store
        return {"value": text, "version": max(version, 0), "now-ms": max(now, 0)}

    def try_store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool:
        """Compare-and-set: stores `value` at version + 1, to expire `ttl_ms`
        (at least 1) later, if the version is still `expected_version`; True if
        stored. Raises `SharedStateError` when Redis failed."""
        reply = self._script(STATE_STORE_LUA, f"{STATE_PREFIX}{key}", int(expected_version), value, max(int(ttl_ms), 1))
        try:
            return _whole(reply, "stored") == 1
        except TypeError as e:
            raise SharedStateError("unreachable", self.url, str(e)) from None


class FallbackSharedState:
    """The shared state for workers on many machines (a `SharedStateBackend`
    for `PolicyComponent.instantiate(shared_state=...)`): Redis while it
    answers, this process's own `EmbeddedSharedState` while it does not."""

    def __init__(self, redis: RedisSharedState, *, retry_interval_s: float = RETRY_INTERVAL_S) -> None:
        self.redis = redis
        self.retry_interval_s = retry_interval_s
        self._local = EmbeddedSharedState()
        self._lock = threading.Lock()
        self._down_since: float | None = None  # monotonic time of the latest failure; None: on Redis
        self._fallbacks = 0

    @classmethod
    def open(cls, url: str, *, retry_interval_s: float = RETRY_INTERVAL_S) -> FallbackSharedState:
        """`FallbackSharedState(RedisSharedState.connect(url), retry_interval_s=...)`."""
        return cls(RedisSharedState.connect(url), retry_interval_s=retry_interval_s)

    @property
    def fallbacks(self) -> int:
        """Switches to the local state so far."""
        return self._fallbacks

    def close(self) -> None:
        self.redis.close()

    def _use_redis(self) -> bool:
        """Not while Redis is down, until the retry is due."""
        with self._lock:
            return self._down_since is None or time.monotonic() - self._down_since >= self.retry_interval_s

    def _answered(self) -> None:
        with self._lock:
            back, self._down_since = self._down_since is not None, None
        if back:
            logger.info("shared state: Redis answers again; the breakers are the fleet's again", extra={"redis": self.redis.url})

    def _failed(self, error: SharedStateError) -> None:
        with self._lock:
            first = self._down_since is None
            if first:
                self._fallbacks += 1
            self._down_since = time.monotonic()
        if first:
            logger.warning(
                "shared state: Redis failed; the breakers are this process's own until it answers",
                extra={"redis": self.redis.url, "reason": error.reason},
            )

    def load(self, key: str, now_ms: int) -> Loaded:
        if self._use_redis():
            try:
                loaded = self.redis.try_load(key)
            except SharedStateError as e:
                self._failed(e)
            else:
                self._answered()
                return loaded
        return self._local.load(key, now_ms)

    def store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool:
        if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
            return False
        if self._use_redis():
            try:
                stored = self.redis.try_store_if(key, expected_version, value, ttl_ms)
            except SharedStateError as e:
                self._failed(e)
            else:
                self._answered()
                return stored
        return self._local.store_if(key, expected_version, value, ttl_ms)


__all__ = ["STATE_PREFIX", "FallbackSharedState", "RedisSharedState", "SharedStateError"]
