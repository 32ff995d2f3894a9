"""The account budget the component imports: an atomic take-or-wait on a token
bucket per account, embedded in this process and shared by every instance.

The algorithm is `gcra` in hosts/rust/src/accounts/embedded.rs, copied exactly,
including saturation at u64 (Python integers do not overflow, so every
saturating operation is written out with `min`/`max`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple, Protocol

from .shared_state import EmbeddedSharedState

U64_MAX = 0xFFFF_FFFF_FFFF_FFFF

# How far a caller's `now_ms` may be from this process's clock before the
# embedded backend warns (once) that the caller's clock is off: a skewed
# worker, a clock stepped back, µs instead of ms, 0. The buckets never use it.
MAX_CLOCK_SKEW_MS = 5_000

logger = logging.getLogger("agent_retry_policy.accounts")


class Bucket(NamedTuple):
    """The bucket's shape, as the policy's configuration gives it on every call."""

    capacity: int
    refill_interval_ms: int


class Reservation(NamedTuple):
    """The answer to `reserve`: granted (taken; wait `wait_ms` before use) or
    refused (nothing taken; room in `wait_ms`)."""

    granted: bool
    wait_ms: int


class AccountBudgetBackend(Protocol):
    """A shared account budget. `reserve` and `refund` must be atomic across every caller."""

    def reserve(self, account_id: str, tokens: int, bucket: Bucket, max_wait_ms: int, now_ms: int) -> Reservation: ...

    def refund(self, account_id: str, tokens: int, bucket: Bucket, now_ms: int) -> None: ...


def gcra(stored_tat_ms: int, tokens: int, bucket: Bucket, max_wait_ms: int, now_ms: int) -> tuple[Reservation, int]:
    """GCRA (the generic cell rate algorithm): the bucket kept as one number per
    account, the theoretical arrival time (TAT) of the next token. Returns the
    reservation and the TAT to store. Taking 0 tokens is granted at once and
    changes nothing."""
    if tokens == 0:
        return Reservation(True, 0), stored_tat_ms
    emission = bucket.refill_interval_ms
    tolerance = min(bucket.capacity * emission, U64_MAX)
    tat = max(stored_tat_ms, now_ms)
    new_tat = min(tat + min(tokens * emission, U64_MAX), U64_MAX)
    allowed_at = max(new_tat - tolerance, 0)
    wait_ms = max(allowed_at - now_ms, 0)
    if wait_ms > max_wait_ms:
        return Reservation(False, wait_ms), stored_tat_ms
    return Reservation(True, wait_ms), new_tat


def gcra_refund(stored_tat_ms: int, tokens: int, bucket: Bucket, now_ms: int) -> int:
    """Gives `tokens` back: the TAT moves back by `tokens` intervals, but not
    before `now` (a TAT at or before now is a full bucket). Returns the TAT to store."""
    back = min(tokens * bucket.refill_interval_ms, U64_MAX)
    return max(max(stored_tat_ms - back, 0), min(now_ms, stored_tat_ms))


class EmbeddedAccounts:
    """One bucket per account in this process, behind a lock: shared by every run
    and every component instance (and thread) that holds this object.

    The buckets are kept on this process's monotonic clock (the wall clock when
    the backend was made, plus the time since), as a Redis backend keeps them on
    the server's. A caller's `now_ms` is not used: a step of the wall clock moves
    nothing, and a worker whose clock is an hour off can neither lock the account
    for the others nor take more than its share (a wait is a duration, the same
    on any clock); one more than `MAX_CLOCK_SKEW_MS` off is warned about once.
    Simulations that run every worker on one simulated clock use
    `EmbeddedAccounts.on_host_clock()`. The same rule as the Rust and Node hosts'.

    `shared_state` is the circuit breakers' store that lives beside the
    buckets (an `EmbeddedSharedState`): every run that shares these buckets
    shares it too."""

    def __init__(self) -> None:
        self.shared_state = EmbeddedSharedState()
        self._tats: dict[str, int] = {}
        self._lock = threading.Lock()
        self._trust_host_clock = False
        self._warned = False
        self._epoch_ms_at_start = time.time_ns() // 1_000_000
        self._started_ns = time.monotonic_ns()

    @classmethod
    def on_host_clock(cls) -> EmbeddedAccounts:
        """Buckets in whatever time the callers pass: for simulations and test
        vectors in which every caller shares one simulated clock."""
        accounts = cls()
        accounts._trust_host_clock = True
        return accounts

    def _now_ms(self, host_now_ms: int) -> int:
        if self._trust_host_clock:
            return host_now_ms
        own = self._epoch_ms_at_start + (time.monotonic_ns() - self._started_ns) // 1_000_000
        if abs(host_now_ms - own) > MAX_CLOCK_SKEW_MS and not self._warned:
            self._warned = True
            logger.warning(
                "the account budget got a time more than %d ms from this process's clock (a skewed or stepped clock? "
                "µs instead of ms?); the buckets keep the process's clock; said once",
                MAX_CLOCK_SKEW_MS,
                extra={"host_now_ms": host_now_ms, "process_now_ms": own},
            )
        return own

    def reserve(self, account_id: str, tokens: int, bucket: Bucket, max_wait_ms: int, now_ms: int) -> Reservation:
        now_ms = self._now_ms(now_ms)
        with self._lock:
            stored = self._tats.get(account_id, 0)
            reservation, new_tat = gcra(stored, tokens, bucket, max_wait_ms, now_ms)
            if new_tat != stored:
                self._tats[account_id] = new_tat
            return reservation

    def refund(self, account_id: str, tokens: int, bucket: Bucket, now_ms: int) -> None:
        now_ms = self._now_ms(now_ms)
        with self._lock:
            if account_id in self._tats:
                self._tats[account_id] = gcra_refund(self._tats[account_id], tokens, bucket, now_ms)


# The default for `PolicyComponent.instantiate`: every instance in the process
# draws on the same buckets, as workers of one account must.
PROCESS_ACCOUNTS = EmbeddedAccounts()
# And the shared state beside it (the circuit breakers of the process).
PROCESS_SHARED_STATE = PROCESS_ACCOUNTS.shared_state
