"""OpenTelemetry spans, span events and metric instruments of the events
(docs/events.md, "Traces" and "Metrics"), through `opentelemetry-api` only (the
`otel` extra). Without it installed, `AVAILABLE` is False, `recorder()` gives
None and nothing is recorded; nothing fails either.

The providers are the global ones unless a wrapper is given its own
(`tracer_provider=`, `meter_provider=`): with no SDK configured the API's
no-op providers make this nearly free.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:  # the optional dependency: everything below works without it
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised by simulating the import failing
    AVAILABLE = False

from .events import AttemptEvent, BreakerEvent, EscalationEvent, PolicyUpdateEvent, ReplanEvent, StatusCheckEvent, TaskPollEvent, WaitEvent

SCOPE = "agent_retry_policy"
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The events that are span events on the call span (the replan is the call span's action).
_SPAN_EVENTS = (WaitEvent, StatusCheckEvent, TaskPollEvent, EscalationEvent, BreakerEvent)
# Fields of an event that are not its own (the call span carries them).
_SCOPE_FIELDS = frozenset(["event", "ts", "run", "policy", "step", "call", "tool"])


def _sdk_failed(error: BaseException) -> None:
    """An OpenTelemetry SDK, span processor or exporter raised: logged once per
    process (as `agent_retry.hook_failed`, hook `opentelemetry`), never raised:
    tracing cannot change a call's result, nor replace the caller's exception."""
    try:
        import json
        import logging
        import time

        from ._telemetry import _OTEL_FAILED
        from .events import HOOK_FAILED

        if _OTEL_FAILED:
            return
        _OTEL_FAILED.append(True)
        line = {"event": HOOK_FAILED, "ts": round(time.time(), 3), "hook": "opentelemetry", "error": f"{type(error).__name__}: {error}"}
        logging.getLogger("agent_retry_policy.calls").warning(json.dumps(line, ensure_ascii=False, default=str))
    except Exception:  # noqa: BLE001 - the failure's own report must not fail the call
        pass


def _invalid_span() -> Any:
    """A span that records nothing: what a span whose start failed becomes."""
    return _trace.INVALID_SPAN


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes: a None value is left out (an attribute cannot be null)."""
    return {name: value for name, value in values.items() if value is not None}


class AttemptSpan:
    """One attempt's span, child of its call's."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def trace_meta(self) -> dict[str, str]:
        """The attempt span's W3C `traceparent` (and `tracestate`), for the
        request's `params._meta` (MCP SEP-414); empty when it is not recording."""
        try:
            if not self.span.get_span_context().is_valid:
                return {}
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier, context=_trace.set_span_in_context(self.span))
            return carrier
        except Exception as e:  # noqa: BLE001 - a failing SDK must not end the call
            _sdk_failed(e)
            return {}

    @contextmanager
    def current(self) -> Iterator[None]:
        """The attempt span as the current span (what the attempt's own code traces nests under it)."""
        token = None
        try:
            token = _context.attach(_trace.set_span_in_context(self.span))
        except Exception as e:  # noqa: BLE001 - a failing SDK must not end the call
            _sdk_failed(e)
        try:
            yield
        finally:
            if token is not None:
                try:
                    _context.detach(token)
                except Exception as e:  # noqa: BLE001 - a failing SDK must not end the call
                    _sdk_failed(e)

    def end(self, event: AttemptEvent) -> None:
        try:
            self._end(event)
        except Exception as e:  # noqa: BLE001 - a failing SDK or exporter must not end the call
            _sdk_failed(e)

    def _end(self, event: AttemptEvent) -> None:
        attempt = event.attempt
        self.span.set_attributes(
            _attributes(
                {
                    "agent_retry.attempt": attempt,
                    "http.request.resend_count": attempt - 1 if attempt > 1 else None,
                    "agent_retry.class": event.klass,
                    "agent_retry.action": event.action,
                    "agent_retry.rule": event.rule,
                }
            )
        )
        if event.outcome != "success":  # a failure, or an empty result
            self.span.set_attribute("error.type", event.outcome)
            self.span.set_status(Status(StatusCode.ERROR, event.outcome))
        self.span.end()

    def fail(self, error_type: str) -> None:
        """The attempt ended with no verdict (stopped, or an exception nothing maps)."""
        try:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, error_type))
            self.span.end()
        except Exception as e:  # noqa: BLE001 - a failing SDK or exporter must not end the call
            _sdk_failed(e)


class CallSpan:
    """One call's span (`execute_tool {tool}`), parent of its attempts'."""

    def __init__(self, recorder: OtelRecorder, span: Any, tool: str) -> None:
        self._recorder = recorder
        self.span = span
        self.tool = tool
        self.attempts = 0
        self._ended = False

    def attempt(self, number: int, *, mcp: bool) -> AttemptSpan:
        """Starts the span of attempt `number`: over MCP a client span
        `tools/call {tool}`, for the any-call helper an internal `attempt {tool}`."""
        self.attempts += 1
        try:
            parent = _trace.set_span_in_context(self.span)
            if mcp:
                name, kind = f"tools/call {self.tool}", SpanKind.CLIENT
                attributes = {"mcp.method.name": "tools/call", "gen_ai.tool.name": self.tool}
            else:
                name, kind, attributes = f"attempt {self.tool}", SpanKind.INTERNAL, {}
            span = self._recorder.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        except Exception as e:  # noqa: BLE001 - a failing SDK or span processor must not end the call
            _sdk_failed(e)
            span = _invalid_span()
        return AttemptSpan(span)

    def add_event(self, event: Any) -> None:
        if not isinstance(event, _SPAN_EVENTS) or self._ended:
            return
        try:
            fields = {f"agent_retry.{name}": value for name, value in event.to_log(None).items() if name not in _SCOPE_FIELDS}
            self.span.add_event(event.name, attributes=_attributes(fields))
        except Exception as e:  # noqa: BLE001 - a failing SDK must not end the call
            _sdk_failed(e)

    def end(self, action: str, *, error_type: str | None = None) -> None:
        """Ends the call: `action` is `succeed`, `replan`, `escalate` (then
        `error_type` is the escalation reason) or `stop` (the host stopped it)."""
        if self._ended:
            return
        self._ended = True
        try:
            self.span.set_attribute("agent_retry.action", action)
            self.span.set_attribute("agent_retry.attempts", self.attempts)
            if error_type is not None:
                self.span.set_attribute("error.type", error_type)
                self.span.set_status(Status(StatusCode.ERROR, error_type))
            self.span.end()
        except Exception as e:  # noqa: BLE001 - a failing SDK or exporter must not end the call
            _sdk_failed(e)


class OtelRecorder:
    """The tracer and the metric instruments of one pair of providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from . import __name__ as package

        version = _package_version()
        self.tracer = (tracer_provider or _trace.get_tracer_provider()).get_tracer(package, version)
        meter = (meter_provider or _metrics.get_meter_provider()).get_meter(package, version)
        self.attempts = meter.create_counter("agent_retry.attempts", unit="{attempt}", description="Attempts whose verdict was read")
        self.replans = meter.create_counter("agent_retry.replans", unit="{call}", description="Calls that ended with a replan")
        self.escalations = meter.create_counter("agent_retry.escalations", unit="{call}", description="Calls that ended with an escalation")
        self.status_checks = meter.create_counter("agent_retry.status_checks", unit="{check}", description="Status checks")
        self.waits = meter.create_counter("agent_retry.waits", unit="{wait}", description="Waits before a retry, a poll or an admission")
        self.wait_duration = meter.create_histogram(
            "agent_retry.wait.duration",
            unit="s",
            description="How long the wrapper waited",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S,
        )
        self.account_waits = meter.create_counter("agent_retry.account.waits", unit="{wait}", description="Admission waits")
        self.account_refusals = meter.create_counter("agent_retry.account.refusals", unit="{call}", description="Calls not admitted")
        self.policy_updates = meter.create_counter("agent_retry.policy_updates", unit="{update}", description="Live policy updates")
        self.breaker_changes = meter.create_counter(
            "agent_retry.breaker.changes", unit="{change}", description="Circuit breaker state changes"
        )

    def call(self, tool: str, run: str, policy: str, step: int | None) -> CallSpan:
        attributes = _attributes(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "agent_retry.run": run,
                "agent_retry.policy": policy,
                "agent_retry.step": step,
            }
        )
        try:
            span = self.tracer.start_span(f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes)
        except Exception as e:  # noqa: BLE001 - a failing SDK or span processor must not end the call
            _sdk_failed(e)
            span = _invalid_span()
        return CallSpan(self, span, tool)

    def record(self, event: Any) -> None:
        """The metric instruments, counted from the events as `RetryMetrics` counts them."""
        if isinstance(event, AttemptEvent):
            if event.counted:
                self.attempts.add(1, {"class": event.klass or "none", "action": event.action})
            elif event.attempt == 0 and event.escalation == "account-budget-exhausted":
                self.account_refusals.add(1)
        elif isinstance(event, WaitEvent):
            self.waits.add(1, {"why": event.why})
            self.wait_duration.record(event.wait_ms / 1000, {"why": event.why})
            if event.why == "admission":
                self.account_waits.add(1)
        elif isinstance(event, ReplanEvent):
            self.replans.add(1)
        elif isinstance(event, EscalationEvent):
            self.escalations.add(1, {"reason": event.reason})
        elif isinstance(event, StatusCheckEvent):
            self.status_checks.add(1, {"result": event.result})
        elif isinstance(event, PolicyUpdateEvent):
            self.policy_updates.add(1, {"outcome": event.outcome})
        elif isinstance(event, BreakerEvent):
            self.breaker_changes.add(1, {"scope": event.breaker_scope, "to": event.to_state})


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("agent-retry-policy")
    except Exception:  # noqa: BLE001 - not installed as a distribution: no version on the scope
        return None


# One recorder per pair of providers: instruments are made once, not per call.
_RECORDERS: dict[tuple[int, int], tuple[Any, Any, OtelRecorder]] = {}


def recorder(tracer_provider: Any = None, meter_provider: Any = None) -> OtelRecorder | None:
    """The recorder of these providers (the global ones by default: the API's
    proxies, which follow a provider set later), or None without
    `opentelemetry-api`."""
    if not AVAILABLE:
        return None
    key = (id(tracer_provider), id(meter_provider))
    held = _RECORDERS.get(key)
    if held is None or held[0] is not tracer_provider or held[1] is not meter_provider:
        held = (tracer_provider, meter_provider, OtelRecorder(tracer_provider, meter_provider))
        _RECORDERS[key] = held
    return held[2]


__all__ = ["AVAILABLE", "AttemptSpan", "CallSpan", "OtelRecorder", "recorder"]
