"""In-process counters and histograms of the events (docs/events.md, "Metrics"),
the same instruments in every host, printed as Prometheus text (format 0.0.4).

    metrics = RetryMetrics()
    caller = RetryingToolCaller(connection, run, metrics=metrics)
    ...
    body = metrics.to_prometheus()     # serve it at /metrics

Counts come from the events, so `agent_retry_attempts_total` summed over its
labels equals the run report's `attempts` (one `RetryMetrics` may serve many
runs: it is then the sum of their reports). Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from .events import AttemptEvent, BreakerEvent, EscalationEvent, PolicyUpdateEvent, ReplanEvent, StatusCheckEvent, WaitEvent

# The wait histogram's upper bounds, in ms (exact integers, so a wait is placed
# the same in every host) and as Prometheus prints them (in seconds).
WAIT_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
WAIT_BUCKET_LABELS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60")

# Prometheus name -> (help, type, label names), in exposition order.
INSTRUMENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "agent_retry_attempts_total": ("Attempts whose verdict was read, by outcome class and action.", "counter", ("class", "action")),
    "agent_retry_replans_total": ("Calls that ended with a message for the model.", "counter", ()),
    "agent_retry_escalations_total": ("Calls that ended with an escalation, by reason.", "counter", ("reason",)),
    "agent_retry_status_checks_total": ("Status checks, by result.", "counter", ("result",)),
    "agent_retry_waits_total": ("Waits before a retry, a poll or an admission.", "counter", ("why",)),
    "agent_retry_wait_seconds": ("How long the wrapper waited.", "histogram", ("why",)),
    "agent_retry_account_waits_total": ("Admission waits of the account budget.", "counter", ()),
    "agent_retry_account_refusals_total": ("Calls the account budget did not admit.", "counter", ()),
    "agent_retry_policy_updates_total": ("Live policy updates, by outcome.", "counter", ("outcome",)),
    "agent_retry_breaker_changes_total": ("Circuit breaker state changes, by scope and new state.", "counter", ("scope", "to")),
}

_Labels = tuple[str, ...]


class _Histogram:
    __slots__ = ("buckets", "count", "sum_ms")

    def __init__(self) -> None:
        self.buckets = [0] * len(WAIT_BUCKETS_MS)
        self.count = 0
        self.sum_ms = 0

    def observe(self, ms: int) -> None:
        self.count += 1
        self.sum_ms += ms
        for i, bound in enumerate(WAIT_BUCKETS_MS):
            if ms <= bound:
                self.buckets[i] += 1


class RetryMetrics:
    """The instruments of docs/events.md, fed by the wrappers' events (pass it as
    `metrics=` to `RetryingToolCaller`, `call_with_policy` or `LivePolicy`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[_Labels, int]] = {name: {} for name, spec in INSTRUMENTS.items() if spec[1] == "counter"}
        self._waits: dict[_Labels, _Histogram] = {}
        for name, (_, kind, labels) in INSTRUMENTS.items():
            if kind == "counter" and not labels:
                self._counters[name][()] = 0  # an unlabelled counter is printed from 0

    def _add(self, name: str, labels: _Labels = ()) -> None:
        series = self._counters[name]
        series[labels] = series.get(labels, 0) + 1

    def record(self, event: Any) -> None:
        """Counts one event (the wrappers call this; a user need not)."""
        with self._lock:
            if isinstance(event, AttemptEvent):
                if event.counted:
                    self._add("agent_retry_attempts_total", (event.klass or "none", event.action))
                elif event.attempt == 0 and event.escalation == "account-budget-exhausted":
                    self._add("agent_retry_account_refusals_total")
            elif isinstance(event, WaitEvent):
                self._add("agent_retry_waits_total", (event.why,))
                self._waits.setdefault((event.why,), _Histogram()).observe(event.wait_ms)
                if event.why == "admission":
                    self._add("agent_retry_account_waits_total")
            elif isinstance(event, ReplanEvent):
                self._add("agent_retry_replans_total")
            elif isinstance(event, EscalationEvent):
                self._add("agent_retry_escalations_total", (event.reason,))
            elif isinstance(event, StatusCheckEvent):
                self._add("agent_retry_status_checks_total", (event.result,))
            elif isinstance(event, PolicyUpdateEvent):
                self._add("agent_retry_policy_updates_total", (event.outcome,))
            elif isinstance(event, BreakerEvent):
                self._add("agent_retry_breaker_changes_total", (event.breaker_scope, event.to_state))

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Every instrument by its Prometheus name: a list of series sorted by
        their label values, each `{"labels": {...}, "value": n}`, or for the
        wait histogram `{"labels", "count", "sum" (seconds), "buckets"
        (cumulative, by upper bound in seconds, "+Inf" last)}`. The same shape
        in every host (the shared scenario compares it)."""
        with self._lock:
            out: dict[str, list[dict[str, Any]]] = {}
            for name, (_, kind, label_names) in INSTRUMENTS.items():
                if kind == "counter":
                    out[name] = [
                        {"labels": dict(zip(label_names, labels, strict=True)), "value": value}
                        for labels, value in sorted(self._counters[name].items())
                    ]
                else:
                    out[name] = [
                        {
                            "labels": dict(zip(label_names, labels, strict=True)),
                            "count": h.count,
                            "sum": h.sum_ms / 1000,
                            "buckets": {**dict(zip(WAIT_BUCKET_LABELS, h.buckets, strict=True)), "+Inf": h.count},
                        }
                        for labels, h in sorted(self._waits.items())
                    ]
            return out

    @property
    def attempts(self) -> int:
        """All attempts counted, over every label (equals the run reports' `attempts`)."""
        with self._lock:
            return sum(self._counters["agent_retry_attempts_total"].values())

    def to_prometheus(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every instrument."""
        snapshot = self.snapshot()
        lines: list[str] = []
        for name, (help_text, kind, _) in INSTRUMENTS.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for series in snapshot[name]:
                labels = series["labels"]
                if kind == "counter":
                    lines.append(f"{name}{_label_text(labels.items())} {series['value']}")
                    continue
                for bound, count in series["buckets"].items():
                    lines.append(f"{name}_bucket{_label_text([*labels.items(), ('le', bound)])} {count}")
                lines.append(f"{name}_sum{_label_text(labels.items())} {_number(series['sum'])}")
                lines.append(f"{name}_count{_label_text(labels.items())} {series['count']}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(labels: Iterable[tuple[str, str]]) -> str:
    pairs = [f'{name}="{_escape(str(value))}"' for name, value in labels]
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


__all__ = ["INSTRUMENTS", "RetryMetrics", "WAIT_BUCKETS_MS"]
