"""The one fan-out every emitter uses: an event becomes its log line (when the
logger is enabled), its metrics (`RetryMetrics`, OpenTelemetry), its span
event, and its hook. A hook that raises is logged once per hook as
`agent_retry.hook_failed` and changes nothing."""

from __future__ import annotations

import json
import logging
import time
import weakref
from typing import Any

from . import otel
from .events import (
    HOOK_FAILED,
    AttemptEvent,
    BreakerEvent,
    EscalationEvent,
    PolicyUpdateEvent,
    ReplanEvent,
    StatusCheckEvent,
    WaitEvent,
)
from .hooks import Hooks
from .metrics import RetryMetrics

# The hook each event goes to (an attempt only when its action is `retry`).
_HOOK_OF: dict[type, str] = {
    WaitEvent: "on_wait",
    AttemptEvent: "on_retry",
    ReplanEvent: "on_replan",
    EscalationEvent: "on_escalate",
    StatusCheckEvent: "on_status_check",
    PolicyUpdateEvent: "on_policy_update",
    BreakerEvent: "on_breaker",
}
# The hooks already reported as failing, per `Hooks` object (by its id: a hook
# need not be hashable, so neither is the `Hooks` holding it): each is logged
# once. The entry goes when the `Hooks` object does.
_FAILED: dict[int, set[str]] = {}
# Whether OpenTelemetry already failed in this process (logged once, as a hook).
_OTEL_FAILED: list[bool] = []


class Telemetry:
    """Where one wrapper's events go. `otel_recorder` is None without
    opentelemetry-api (or when the wrapper turned it off)."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        events_log: logging.Logger | None = None,
        hooks: Hooks | None = None,
        metrics: RetryMetrics | None = None,
        otel_recorder: otel.OtelRecorder | None = None,
    ) -> None:
        if hooks is not None and not isinstance(hooks, Hooks):
            raise TypeError(f"hooks must be an agent_retry_policy.Hooks, got {type(hooks).__name__}")
        if metrics is not None and not isinstance(metrics, RetryMetrics):
            raise TypeError(f"metrics must be an agent_retry_policy.RetryMetrics, got {type(metrics).__name__}")
        self.log = log
        # Where the events other than the attempt go (the MCP wrapper keeps its
        # attempt lines alone on their logger, as before 0.8); `log` by default.
        self.events_log = events_log if events_log is not None else log
        self.hooks = hooks
        self.metrics = metrics
        self.otel = otel_recorder

    def wants_words(self, action: str) -> bool:
        """Whether an attempt event with this action needs the decision's words
        (its reason for the log line at INFO, its decision for `on_retry`)."""
        if self.log.isEnabledFor(logging.INFO):
            return True
        return action == "retry" and self.hooks is not None and self.hooks.on_retry is not None

    def emit(self, event: Any, span: otel.CallSpan | None = None, *, level: int = logging.INFO) -> None:
        """The event's log line, metrics, span event and hook, in that order;
        all before the wrapper acts on it."""
        log = self.log if isinstance(event, AttemptEvent) else self.events_log
        if log.isEnabledFor(level):
            log.log(level, json.dumps(event.to_log(round(time.time(), 3)), ensure_ascii=False))
        if self.metrics is not None:
            self.metrics.record(event)
        if self.otel is not None:
            try:
                self.otel.record(event)
                if span is not None:
                    span.add_event(event)
            except Exception as e:  # noqa: BLE001 - a failing SDK or exporter must not end the call
                if not _OTEL_FAILED:
                    _OTEL_FAILED.append(True)
                    self._failed("opentelemetry", e)
        if self.hooks is not None:
            self._hook(event)

    def _hook(self, event: Any) -> None:
        assert self.hooks is not None
        name = _HOOK_OF.get(type(event))
        if name is None or (isinstance(event, AttemptEvent) and event.action != "retry"):
            return
        hook = getattr(self.hooks, name)
        if hook is None:
            return
        try:
            hook(event)
        except Exception as e:  # noqa: BLE001 - an observer cannot change the call
            try:
                if _first_failure(self.hooks, name):
                    self._failed(name, e)
            except Exception:  # noqa: BLE001 - reporting the failure must not fail the call either
                pass

    def _failed(self, hook: str, error: BaseException) -> None:
        try:
            text = f"{type(error).__name__}: {error}"
        except Exception:  # noqa: BLE001 - an exception whose str() raises
            text = type(error).__name__
        line = {"event": HOOK_FAILED, "ts": round(time.time(), 3), "hook": hook, "error": text}
        self.events_log.warning(json.dumps(line, ensure_ascii=False, default=str))


def _first_failure(hooks: Hooks, name: str) -> bool:
    """Whether this is the first failure of hook `name` of this `Hooks` object."""
    key = id(hooks)
    seen = _FAILED.get(key)
    if seen is None:
        seen = _FAILED[key] = set()
        try:
            weakref.finalize(hooks, _FAILED.pop, key, None)
        except TypeError:  # not weakly referenceable: the entry stays
            pass
    if name in seen:
        return False
    seen.add(name)
    return True


__all__ = ["Telemetry"]
