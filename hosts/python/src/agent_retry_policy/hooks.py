"""Typed callbacks for what a user acts on (docs/events.md, "Hooks").

    hooks = Hooks(on_retry=lambda e: print("retrying", e.tool, e.delay_ms),
                  on_escalate=lambda e: page_someone(e.reason, e.note))
    caller = RetryingToolCaller(connection, run, hooks=hooks)

A hook is an observer: it runs before the wrapper acts on the decision, it
cannot change it, and an exception it raises is caught and logged once per
hook as `agent_retry.hook_failed` (fields `hook`, `error`); the call goes on as
if the hook were absent. Hooks run on the caller's task: keep them short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .events import AttemptEvent, BreakerEvent, EscalationEvent, PolicyUpdateEvent, ReplanEvent, StatusCheckEvent, WaitEvent


@dataclass(frozen=True)
class Hooks:
    """`on_wait` before every wait (a retry's, a poll's, an admission's);
    `on_retry` with an attempt whose verdict is `retry` (its `decision` read);
    `on_replan` and `on_escalate` when a call ends so; `on_status_check` when a
    status check answered; `on_breaker` when a circuit breaker changed
    state (`agent_retry.breaker`); `on_policy_update` when a live update was accepted,
    refused or rolled back (`LivePolicy.open(..., hooks=...)`)."""

    on_wait: Callable[[WaitEvent], object] | None = None
    on_retry: Callable[[AttemptEvent], object] | None = None
    on_replan: Callable[[ReplanEvent], object] | None = None
    on_escalate: Callable[[EscalationEvent], object] | None = None
    on_status_check: Callable[[StatusCheckEvent], object] | None = None
    on_policy_update: Callable[[PolicyUpdateEvent], object] | None = None
    on_breaker: Callable[[BreakerEvent], object] | None = None


__all__ = ["Hooks"]
