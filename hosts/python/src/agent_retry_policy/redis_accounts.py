"""The account budget on Redis, for workers in several processes or on several
machines: the Rust host's `RedisAccounts` and `SharedAccounts`
(hosts/rust/src/accounts/redis.rs, shared.rs), with the same script, keys,
timeout, fallback and log fields, so that Rust, Python and Node workers draw on
one bucket per account.

- `RedisAccounts`: the GCRA run atomically on the server by one Lua script, on
  the server's clock (`redis_scripts.py`, generated from the Rust source). A key
  of another type is repaired to an empty bucket and logged; a key that is gone
  while this process last saw a later TAT (a restart without persistence,
  FLUSHALL) is re-created from that TAT. Every exchange, connecting included,
  ends within `REDIS_TIMEOUT_S` (0.5 s).
- `SharedAccounts`: the backend to instantiate with. Redis while it answers;
  while it does not, this worker's share of the allowance (capacity / workers,
  refill / workers), logged once, Redis tried again every `retry_interval_s`,
  and the tokens taken locally charged to Redis when it answers again.

The component calls the account budget synchronously: redis-py's synchronous
connection is used directly, one per `RedisAccounts`, behind a lock (as the
Rust host's mutex), and a failed exchange drops it. Needs redis-py:
`pip install 'agent-retry-policy[redis]'`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import threading
import time
from typing import Any

from .accounts import Bucket, EmbeddedAccounts, Reservation
from .errors import AgentRetryError
from .redis_scripts import ACCOUNT_PREFIX, GCRA_LUA, REDIS_TIMEOUT_S, REFUND_LUA, RETRY_INTERVAL_S

logger = logging.getLogger("agent_retry_policy.accounts")

U64_MAX = 0xFFFF_FFFF_FFFF_FFFF


class AccountsError(AgentRetryError):
    """Redis cannot be used for the account budget. `kind`: "bad-url" (not a
    Redis URL) or "unreachable" (no answer in time, or not Redis)."""

    def __init__(self, kind: str, url: str, reason: str) -> None:
        self.kind, self.url, self.reason = kind, url, reason
        if kind == "bad-url":
            super().__init__(f"account budget: {url!r} is not a redis:// URL: {reason}")
        else:
            super().__init__(f"account budget: Redis at {url} is unusable: {reason}")


def _redis() -> Any:
    try:
        import redis
    except ImportError as e:
        raise ImportError("the account budget on Redis needs redis-py: pip install 'agent-retry-policy[redis]'") from e
    return redis


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _connection_kwargs(url: str) -> dict[str, Any]:
    """redis-py's connection arguments for `url`; `AccountsError` ("bad-url")
    if it is not a Redis URL."""
    redis = _redis()
    try:
        kwargs: dict[str, Any] = redis.connection.parse_url(url)
    except ValueError as e:
        raise AccountsError("bad-url", url, str(e)) from None
    # No retries inside redis-py (a failure is this module's to handle), and
    # no CLIENT SETINFO on connecting: its answers, unread by a paused
    # server, would cost timeouts before the exchange itself began.
    kwargs.update({"driver_info": None} if importlib.util.find_spec("redis.driver_info") else {"lib_name": None, "lib_version": None})
    kwargs["retry"] = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    return kwargs


class _RedisExchange:
    """One redis-py synchronous connection, opened on demand, every exchange
    (connecting included) within a deadline: `RedisAccounts`'s and
    `RedisSharedState`'s (redis_shared_state.py). The subclass sets `_kwargs`
    and `_connection` and holds its lock around `_command`."""

    _kwargs: dict[str, Any]
    _connection: Any

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.disconnect()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._connection = None

    def _command(self, deadline: float, *args: Any) -> Any:
        """One command on the connection (opened first if there is none), the
        connecting and the exchange within `deadline`. Holds `self._lock`."""

        def left(what: str) -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _redis().TimeoutError(f"{what}: no time left of {REDIS_TIMEOUT_S} s")
            return remaining

        connection = self._connection
        if connection is None:
            kwargs = dict(self._kwargs)
            connection_class = kwargs.pop("connection_class", _redis().Connection)
            remaining = left("connect")
            connection = connection_class(**kwargs, socket_connect_timeout=remaining, socket_timeout=remaining)
            self._connection = connection
            connection.connect()
        remaining = left("exchange")
        connection.socket_timeout = remaining
        sock = getattr(connection, "_sock", None)  # redis-py applies socket_timeout only on connecting
        if sock is not None:
            sock.settimeout(remaining)
        connection.send_command(*args)
        return connection.read_response()


class RedisAccounts(_RedisExchange):
    """A connection to Redis holding the buckets: one, shared by the process's
    workers (threads); a failed exchange drops it and the next one reconnects."""

    def __init__(self, url: str, prefix: str, connection_kwargs: dict[str, Any]) -> None:
        self.url = url
        self.prefix = prefix
        self._kwargs = connection_kwargs
        self._connection: Any = None
        self._lock = threading.Lock()
        self._seen_lock = threading.Lock()
        # Per account, the latest TAT this process saw on the server (the floor a
        # lost key is re-created from), and how far the schedule was ahead of the
        # server's clock at the latest exchange (calls granted, still to come).
        self._seen_tats: dict[str, int] = {}
        self._seen_backlogs: dict[str, int] = {}
        self._repairs = 0
        # The server's clock minus this process's wall clock, in ms, as last
        # measured (None before the first): turns a deadline into the server's time.
        self._server_offset_ms: int | None = None

    @classmethod
    def connect(cls, url: str, *, prefix: str = ACCOUNT_PREFIX) -> RedisAccounts:
        """Connects and checks that the server speaks Redis and runs the script:
        a bad URL, a closed port or a server answering garbage raises
        `AccountsError` here, within `REDIS_TIMEOUT_S`, not a hang later."""
        redis = _redis()
        accounts = cls(url, prefix, _connection_kwargs(url))
        try:
            with accounts._lock:
                deadline = time.monotonic() + REDIS_TIMEOUT_S
                pong = accounts._command(deadline, "PING")
                if pong not in (b"PONG", "PONG", True):
                    raise AccountsError("unreachable", url, f"PING answered {pong!r}")
                accounts._command(deadline, "SCRIPT", "LOAD", GCRA_LUA)
                seconds, micros = accounts._command(deadline, "TIME")
                accounts._measured(int(seconds) * 1000 + int(micros) // 1000)
        except (redis.RedisError, OSError) as e:
            accounts._drop()
            raise AccountsError("unreachable", url, str(e) or type(e).__name__) from None
        return accounts

    def close(self) -> None:
        with self._lock:
            self._drop()

    @property
    def repairs(self) -> int:
        """Keys of another type or values not a number repaired so far (each also logged)."""
        return self._repairs

    def _measured(self, server_now_ms: int) -> None:
        """Keeps the server's clock, read at `server_now_ms`, against this process's."""
        self._server_offset_ms = server_now_ms - time.time_ns() // 1_000_000

    def _not_after_ms(self, deadline: float) -> int:
        """The server's time past which an exchange that must end by `deadline`
        (monotonic) is no longer awaited; 0 before the server's clock was measured.
        The same rule as the Rust host's `not_after_ms`."""
        if self._server_offset_ms is None:
            return 0
        left_ms = max(int((deadline - time.monotonic()) * 1000), 0)
        return time.time_ns() // 1_000_000 + self._server_offset_ms + left_ms

    def _script(self, script: str, key: str, *args: Any) -> Any:
        """EVALSHA, or EVAL when the server does not have the script (after a
        restart or SCRIPT FLUSH), within one `REDIS_TIMEOUT_S` in all, waiting
        for the lock included; the last argument is the server's time past which
        the script must take nothing (its client gave up). Raises redis-py's
        errors (the connection dropped)."""
        redis = _redis()
        deadline = time.monotonic() + REDIS_TIMEOUT_S
        args = (*args, self._not_after_ms(deadline))
        if not self._lock.acquire(timeout=REDIS_TIMEOUT_S):
            raise redis.TimeoutError(f"the connection stayed busy for {REDIS_TIMEOUT_S} s")
        try:
            try:
                return self._command(deadline, "EVALSHA", _sha1(script), 1, key, *args)
            except redis.exceptions.NoScriptError:
                return self._command(deadline, "EVAL", script, 1, key, *args)
        except Exception:
            self._drop()  # possibly broken mid-reply: start afresh next time
            raise
        finally:
            self._lock.release()

    def try_reserve(self, account_id: str, tokens: int, bucket: Bucket, max_wait_ms: int) -> Reservation:
        """The take-or-wait, on the server, within `REDIS_TIMEOUT_S` in all.
        Raises `AccountsError` ("unreachable") when Redis failed: the caller
        decides what to do (see `SharedAccounts`)."""
        with self._seen_lock:
            floor = self._seen_tats.get(account_id, 0)
        key = f"{self.prefix}{account_id}"
        try:
            reply = self._script(GCRA_LUA, key, tokens, bucket.capacity, bucket.refill_interval_ms, max_wait_ms, floor)
            granted, wait, repaired, tat, server_now = (int(x) for x in reply)
        except (_redis().RedisError, OSError, TypeError, ValueError) as e:
            raise AccountsError("unreachable", self.url, str(e) or type(e).__name__) from None
        if server_now > 0:  # 0: a take of 0 tokens, answered without reading the clock
            self._measured(server_now)
        if granted == -1:
            raise AccountsError(
                "unreachable", self.url, f"the take reached Redis after its deadline ({REDIS_TIMEOUT_S} s): nothing was taken"
            )
        if repaired == 1:
            with self._seen_lock:
                self._repairs += 1
            logger.error(
                "account budget: the account's key held something other than a number "
                "(another program's key, an operator's mistake); replaced with an empty bucket, so the allowance holds",
                extra={"redis": self.url, "key": key},
            )
        if tat > 0:
            with self._seen_lock:
                self._seen_tats[account_id] = max(self._seen_tats.get(account_id, 0), tat)
                self._seen_backlogs[account_id] = max(tat - server_now, 0)
        return Reservation(granted == 1, max(wait, 0))

    def last_seen_backlog_ms(self, account_id: str) -> int:
        """How far ahead of the server's clock the account's schedule was at this
        process's latest exchange, in ms (0 if never seen)."""
        with self._seen_lock:
            return self._seen_backlogs.get(account_id, 0)

    def try_refund(self, account_id: str, tokens: int, bucket: Bucket) -> None:
        """Gives tokens back, on the server. Raises `AccountsError` when Redis failed."""
        try:
            self._script(REFUND_LUA, f"{self.prefix}{account_id}", tokens, bucket.refill_interval_ms)
        except (_redis().RedisError, OSError) as e:
            raise AccountsError("unreachable", self.url, str(e) or type(e).__name__) from None
        # A refund moves the TAT back: the floor this process remembers moves with it.
        with self._seen_lock:
            if account_id in self._seen_tats:
                self._seen_tats[account_id] = max(self._seen_tats[account_id] - tokens * bucket.refill_interval_ms, 0)


class SharedAccounts:
    """The account budget for workers on many machines (an `AccountBudgetBackend`
    for `PolicyComponent.instantiate(accounts=...)`): Redis while it answers, a
    local share of the allowance while it does not. `workers`: how many workers
    share the account (the local share is 1/workers of it)."""

    def __init__(self, redis: RedisAccounts, workers: int, *, retry_interval_s: float = RETRY_INTERVAL_S) -> None:
        self.redis = redis
        self.workers = max(int(workers), 1)
        self.retry_interval_s = retry_interval_s
        self._local = EmbeddedAccounts()
        self._lock = threading.Lock()  # the mode
        self._retry_at: float | None = None  # None: on Redis; else on the local share until then
        self._taken_lock = threading.Lock()
        # Per account, tokens taken on the local share since the fallback, and the
        # account's (whole) bucket: charged to Redis when it answers again.
        self._taken_locally: dict[str, tuple[int, Bucket]] = {}
        self._fallbacks = 0
        self._recoveries = 0

    @classmethod
    def open(cls, url: str, *, workers: int, prefix: str = ACCOUNT_PREFIX, retry_interval_s: float = RETRY_INTERVAL_S) -> SharedAccounts:
        """`SharedAccounts(RedisAccounts.connect(url, prefix=prefix), workers, retry_interval_s=...)`."""
        return cls(RedisAccounts.connect(url, prefix=prefix), workers, retry_interval_s=retry_interval_s)

    @property
    def fallbacks(self) -> int:
        """Switches to the local share so far."""
        return self._fallbacks

    @property
    def recoveries(self) -> int:
        """Returns to Redis so far."""
        return self._recoveries

    def local_share(self, bucket: Bucket) -> Bucket:
        """This worker's share of the bucket."""
        return Bucket(max(bucket.capacity // self.workers, 1), min(bucket.refill_interval_ms * self.workers, U64_MAX))

    def close(self) -> None:
        self.redis.close()

    def _charge_local_takes(self) -> int:
        """Takes from the shared bucket, whatever the wait, the tokens this worker
        took on its local share while Redis was away. Raises `AccountsError` when
        Redis failed; what was not charged stays owed for the next try."""
        charged = 0
        with self._taken_lock:
            for account_id in list(self._taken_locally):
                tokens, bucket = self._taken_locally[account_id]
                owed = min(tokens, 0xFFFF_FFFF)
                if owed > 0:
                    self.redis.try_reserve(account_id, owed, bucket, U64_MAX)
                # Charged, but kept (at 0) until the return succeeds: the Rust
                # host removes it here, so a failed retry made the next local
                # reservation fill the share again, every retry interval.
                self._taken_locally[account_id] = (0, bucket)
                charged += owed
        return charged

    def reserve(self, account_id: str, tokens: int, bucket: Bucket, max_wait_ms: int, now_ms: int) -> Reservation:
        with self._lock:
            recovering = self._retry_at is not None
            try_redis = self._retry_at is None or time.monotonic() >= self._retry_at
        if try_redis:
            try:
                # Back on Redis, the local takes are charged first, so that this
                # reservation (and the other workers') sees a bucket that holds them.
                charged = self._charge_local_takes() if recovering else 0
                reservation = self.redis.try_reserve(account_id, tokens, bucket, max_wait_ms)
            except AccountsError as e:
                with self._lock:
                    if self._retry_at is None:
                        self._fallbacks += 1
                        logger.warning(
                            "account budget: Redis unavailable; using this worker's local share until it answers",
                            extra={"redis": self.redis.url, "reason": e.reason, "workers": self.workers},
                        )
                    self._retry_at = time.monotonic() + self.retry_interval_s
            else:
                if recovering:
                    with self._taken_lock:  # drop what was charged; what another thread took since stays owed
                        self._taken_locally = {a: e for a, e in self._taken_locally.items() if e[0] > 0}
                    with self._lock:
                        # Counted and logged by the one thread that switches back
                        # (in the Rust host, every thread that was recovering at once).
                        back, self._retry_at = self._retry_at is not None, None
                        self._recoveries += back
                    if back:
                        logger.warning(
                            "account budget: Redis answers again; back to the shared bucket, charged with the tokens taken locally meanwhile",
                            extra={"redis": self.redis.url, "charged": charged},
                        )
                return reservation
        share = self.local_share(bucket)
        with self._taken_lock:
            if account_id not in self._taken_locally:
                # The first local reservation of this account since the fallback.
                # The share starts empty, not full (the shared bucket was being
                # drawn on until now), and behind the shared schedule as last seen:
                # the calls Redis granted before it failed, to any worker, are still to come.
                behind = -(-self.redis.last_seen_backlog_ms(account_id) // max(share.refill_interval_ms, 1))
                self._local.reserve(account_id, max(min(behind, 0xFFFF_FFFF), share.capacity), share, U64_MAX, now_ms)
            reservation = self._local.reserve(account_id, tokens, share, max_wait_ms, now_ms)
            entry = self._taken_locally.setdefault(account_id, (0, bucket))
            if reservation.granted:
                self._taken_locally[account_id] = (entry[0] + tokens, bucket)
        return reservation

    def refund(self, account_id: str, tokens: int, bucket: Bucket, now_ms: int) -> None:
        """A refund goes where reservations go now: to Redis, or to the local share."""
        with self._lock:
            on_redis = self._retry_at is None
        if on_redis:
            try:
                self.redis.try_refund(account_id, tokens, bucket)
                return
            except AccountsError:
                pass
        self._local.refund(account_id, tokens, self.local_share(bucket), now_ms)


__all__ = ["ACCOUNT_PREFIX", "REDIS_TIMEOUT_S", "RETRY_INTERVAL_S", "AccountsError", "RedisAccounts", "SharedAccounts"]
