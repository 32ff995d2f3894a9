"""Any async call under the policy: an HTTP request, a model API call, a
database write (`call_with_policy`).

    async def fetch(attempt: Attempt) -> httpx.Response:
        return (await client.get(url)).raise_for_status()

    response = await call_with_policy(run, "get_quote", fetch, hints={"read-only": True})

`fn(attempt)` runs once per attempt; its exception (or a returned httpx or
requests response of status >= 400) is translated into the contract's
observation (`observe`, then the built-in mappings of `http_errors`, or an
`ObservedFailure` it raised), reported on the run, and the verdict is done:
a retry waits its delay (through `clock`) and calls `fn` again, a replan
raises `ReplanNeeded` (its message is for the model), a status check asks
`status_check`, an escalation raises `Escalated`. An exception no mapping
knows is a bug in the caller's code: the call is abandoned and the exception
re-raised unchanged.

The run's guard (`agent_retry_policy.guard`) sees every begin, attempt,
verdict, status check and read of the words, as in the MCP wrapper: a verdict
that breaks an invariant ends the call with the policy-failure escalation, and
every later call of the run with it, nothing sent. The events (docs/events.md)
go to the `agent_retry_policy.calls` logger at INFO, the hooks, the metrics
and OpenTelemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from . import http_errors
from . import otel as _otel
from ._telemetry import Telemetry
from ._verdicts import Answer, bounded, policy_failure, rule_name
from .component import Run, now_ms
from .entropy import EntropySource, OsEntropy
from .errors import (
    CallCancelled,
    CallTimedOut,
    Escalated,
    InstanceUnusable,
    ObservedFailure,
    PolicyBoundaryViolation,
    PolicyTrap,
    ReplanNeeded,
    StopCause,
    Stopped,
)
from .events import AttemptEvent, CallScope, EscalationEvent, ReplanEvent, StatusCheckEvent, WaitEvent, outcome_words
from .guard import CallGuard, Outcome, RunGuard, Violation
from .hooks import Hooks
from .limits import cut_lifted_text
from .metrics import RetryMetrics
from .types import Decision, EscalateAction, Observation, ReplanAction, StatusCheckResult, ToolHints, Verdict

logger = logging.getLogger("agent_retry_policy.calls")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Attempt:
    """What `fn` is given: the attempt's number (1, 2, ...) and the call's
    idempotency key (the same in every attempt; None for a call without one)."""

    number: int
    idempotency_key: str | None


class Clock(Protocol):
    """Anything with `now_ms()` and `async sleep(seconds)` (`testing.FakeClock`)."""

    def now_ms(self) -> int: ...

    async def sleep(self, seconds: float) -> None: ...


class _RealClock:
    @staticmethod
    def now_ms() -> int:
        return now_ms()

    @staticmethod
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL_CLOCK: Clock = _RealClock()

Observe = Callable[[BaseException], "Observation | None"]
ObserveResult = Callable[[Any], "Observation | None"]
IsEmpty = Callable[[Any], "str | bool | None"]
StatusCheck = Callable[[Attempt], "StatusCheckResult | Awaitable[StatusCheckResult]"]


@dataclass
class _RunState:
    """What the helper keeps per run across its calls: the guard, the steps, and
    the escalation of a broken invariant (the rest of the run ends with it)."""

    guard: RunGuard
    steps: int = 0
    broken: tuple[Escalated, Violation] | None = None


_RUNS: weakref.WeakKeyDictionary[Run, _RunState] = weakref.WeakKeyDictionary()


def _run_state(run: Run) -> _RunState:
    state = _RUNS.get(run)
    if state is None:
        state = _RUNS[run] = _RunState(RunGuard(run.config_text))
    return state


class _DeadlinePassed(Exception):
    """Internal: `call_timeout_s` passed (or a wait would end past it)."""


def _takes_key(guard: RunGuard, tool: str, hints: ToolHints | None) -> bool:
    """Whether the tool is an idempotent write (configured so, or hinted so
    where the configuration says nothing): its attempts carry one key."""
    entry = guard.tools.get(tool)
    if isinstance(entry, Mapping):
        if "effect" in entry:
            return entry["effect"] != "read" and entry.get("idempotent") is True
        if "readOnlyHint" in entry or "idempotentHint" in entry:
            return entry.get("readOnlyHint") is not True and entry.get("idempotentHint") is True
    return hints is not None and hints.get("read-only") is not True and hints.get("idempotent") is True


class _Call:
    """One call in progress (the helper's state between its steps)."""

    def __init__(
        self,
        run: Run,
        state: _RunState,
        tool: str,
        telemetry: Telemetry,
        policy: str,
        step: int,
        clock: Clock,
        entropy: EntropySource,
        deadline_ms: int | None,
        limit_s: float | None,
    ) -> None:
        self.run, self.state, self.tool, self.telemetry = run, state, tool, telemetry
        self.clock, self.entropy = clock, entropy
        self.deadline_ms, self.limit_s = deadline_ms, limit_s
        self.scope = CallScope(run.run_id, policy, step, None, tool)
        self.key: str | None = None
        self.call_id: int | None = None
        self.effect: str | None = None
        self.attempt = 0
        # The last attempt whose verdict an attempt event counted (as the run's report counts it).
        self.reported = 0
        self.sent = 0
        self.in_flight = False
        self.span = telemetry.otel.call(tool, run.run_id, policy, step) if telemetry.otel is not None else None
        self.attempt_span: _otel.AttemptSpan | None = None

    # -- the policy, guarded

    def ask(self, last_outcome: str, ask: Callable[..., _T], *args: Any) -> _T:
        """Asks the policy; if it fails, the safe fallback (no retry, an escalation saying so)."""
        try:
            return ask(*args)
        except (PolicyTrap, InstanceUnusable) as e:
            raise self.policy_failed(last_outcome, e) from e

    def policy_failed(self, last_outcome: str, error: PolicyTrap | InstanceUnusable, invariant: str | None = None) -> Escalated:
        escalation = policy_failure(self.tool, last_outcome, error)
        event = AttemptEvent(
            self.scope,
            self.attempt,
            self.key,
            last_outcome,
            None,
            None,
            "escalate",
            None,
            None,
            "unclassified-failure",
            escalation["note"],
            invariant=invariant,
            # The run counted the call's current attempt, which this ends without a verdict acted on
            # (unless its verdict was already counted: a status check's failed).
            counted=self.unreported(),
        )
        self.telemetry.emit(event, self.span)
        return self.escalated(escalation, None, policy_failure=error)

    def guarded(self, last_outcome: str, violation: Violation | None) -> None:
        if violation is None:
            return
        fault = PolicyBoundaryViolation(str(violation), call="run-time guard")
        escalated = self.policy_failed(last_outcome, fault, invariant=violation.invariant.value)
        self.state.broken = (escalated, violation)
        raise escalated

    def unreported(self) -> bool:
        """Whether the run counts the call's current attempt and no attempt event counted it yet."""
        return self.call_id is not None and self.reported < self.attempt

    def escalated(self, escalation: Any, rule: str | None, *, policy_failure: Any = None, decision: Decision | None = None) -> Escalated:
        """The call ends with an escalation: its event, the call span's end, the error to raise."""
        event = EscalationEvent(self.scope, self.attempt, rule, escalation["reason"], escalation["note"], decision=decision)
        self.telemetry.emit(event, self.span)
        if self.attempt_span is not None:  # ended without its verdict acted on (a failed policy)
            self.attempt_span.fail(escalation["reason"])
            self.attempt_span = None
        if self.span is not None:
            self.span.end("escalate", error_type=escalation["reason"])
        return Escalated(escalation, tool=self.tool, policy_failure=policy_failure)

    # -- time

    def remaining_s(self) -> float | None:
        if self.deadline_ms is None:
            return None
        return max(0.0, (self.deadline_ms - self.clock.now_ms()) / 1000)

    def time_left_ms(self) -> int | None:
        return None if self.deadline_ms is None else max(0, self.deadline_ms - self.clock.now_ms())

    async def wait(self, attempt: int, why: str, delay_ms: int, hint_ms: int | None) -> None:
        """A wait the policy asked for: its event first; one that would end past
        the call's limit is not slept."""
        self.telemetry.emit(WaitEvent(self.scope, attempt, why, delay_ms, hint_ms), self.span)
        remaining = self.remaining_s()
        if remaining is not None and delay_ms / 1000 >= remaining:
            raise _DeadlinePassed
        if delay_ms > 0:
            await self.clock.sleep(delay_ms / 1000)

    def stop(self, cause: StopCause) -> Stopped:
        """The call stopped by its limit or a cancellation: the run is told
        (`abandon_call`), the stop is logged, the span ends."""
        unknown = False
        if self.call_id is not None:
            why = "cancelled" if cause == "cancelled" else "deadline"
            try:
                self.run.abandon_call(self.call_id, self.attempt, self.in_flight, why)
                unknown = any(e["call-id"] == self.call_id and e["status"] == "unknown" for e in self.run.all_effects())
            except Exception:  # noqa: BLE001 - a call a verdict already ended, or a failed policy: the stop goes on
                pass
        writes = self.effect in ("write", "delete")
        may_have_applied = writes and (self.in_flight or unknown)
        what = "the call was cancelled" if cause == "cancelled" else f"the call's time limit ({self.limit_s:g} s) passed"
        effect = (
            f"{self.tool} ({self.effect}) may have been applied: check before sending it again" if may_have_applied else "nothing is out"
        )
        message = f"{what} after {self.sent} attempt(s) sent; stopped waiting. {effect}."
        # The report counts the call's current attempt (begun, or planned by a retry) with no verdict: so does
        # this, unless that attempt's verdict was counted already (a stop during its status check).
        counted = self.unreported()
        event = AttemptEvent(self.scope, self.attempt, self.key, cause, None, None, "stop", None, None, None, message, counted=counted)
        self.telemetry.emit(event, self.span)
        if self.span is not None:
            self.span.end("stop", error_type=cause)
        return Stopped(cause, self.tool, self.call_id, self.sent, may_have_applied, message)

    # -- reports

    def record(
        self, guard: CallGuard, outcome: str, report: Callable[..., Verdict], *args: Any, counted: bool = True
    ) -> tuple[Answer, AttemptEvent]:
        """Reports one outcome on the run's single path; the verdict passes the
        guard before anything acts on it; then its attempt event."""
        assert self.call_id is not None
        try:
            verdict = self.ask(outcome, report, *args)
        except Escalated:
            raise
        except Exception as error:  # not the policy failing: what was reported is unusable (a malformed observation)
            _end_span(self, type(error).__qualname__)
            reason = f"{type(error).__name__} raised reporting the call's outcome ({outcome}): re-raised, the call abandoned"
            _abandon_unknown(self, error, reason)
            raise
        violation = guard.verdict(verdict.action, verdict.delay_ms, verdict.hint_ms, verdict.reconnect, cancel_task=verdict.cancel_task)
        self.guarded(outcome, violation)
        call_id = self.call_id

        def read() -> Decision:
            decision = self.ask(outcome, self.run.last_decision, call_id)
            if decision is None:  # the contract keeps it until the run's next decision: a broken policy
                fault = PolicyBoundaryViolation(
                    f"last-decision({call_id}) is none right after its verdict", call="[method]run.last-decision"
                )
                raise self.policy_failed(outcome, fault)
            self.guarded(outcome, guard.decision(decision))
            return decision

        answer = Answer(verdict, read)
        kind = answer.kind
        decision = answer.decision if self.telemetry.wants_words(kind) else None
        escalation = cast(EscalateAction, decision["action"])["escalate"]["reason"] if decision is not None and kind == "escalate" else None
        event = AttemptEvent(
            self.scope,
            verdict.attempt,
            self.key,
            outcome,
            verdict.class_,
            decision["rule"] if decision is not None else rule_name(self.run.instance.rule_names(), verdict),
            kind,
            verdict.delay_ms if kind in ("retry", "poll") else None,
            verdict.hint_ms,
            escalation,
            cut_lifted_text(decision["reason"]) if decision is not None else None,
            decision=decision,
            counted=counted,
        )
        if counted:
            self.reported = max(self.reported, verdict.attempt)
        self.telemetry.emit(event, self.span)
        return answer, event


async def call_with_policy(
    run: Run,
    tool: str,
    fn: Callable[[Attempt], Awaitable[_T]],
    *,
    hints: ToolHints | None = None,
    action_id: str | None = None,
    keyed: bool | None = None,
    observe: Observe | None = None,
    observe_result: ObserveResult | None = None,
    is_empty: IsEmpty | None = None,
    status_check: StatusCheck | None = None,
    hooks: Hooks | None = None,
    metrics: RetryMetrics | None = None,
    clock: Clock | None = None,
    entropy: EntropySource | None = None,
    policy_identity: str | None = None,
    call_timeout_s: float | None = None,
    log: logging.Logger = logger,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> _T | None:
    """Runs `fn` under the run's policy as one call of `tool` and returns its
    value (None when the policy ends the call in success without one: a
    failure it reads as done). Raises `ReplanNeeded` (a message for the model),
    `Escalated` (a person must act), `CallTimedOut` when `call_timeout_s`
    passes, `CallCancelled` when the task is cancelled, and any exception of
    `fn` that no mapping knows, unchanged.

    `hints` are the tool's MCP-style hints (`read-only`, `destructive`,
    `idempotent`). A tool configured or hinted as an idempotent write gets an
    idempotency key, derived once from the run id and `action_id` (default
    `step-N`, N counting this run's calls through the helper from 1), the same
    in every attempt (`keyed` forces it on or off). `observe(exc)` translates
    an exception the built-in mappings do not know (None: not a failure it
    knows); `observe_result(value)` says whether a returned value is a failure
    (default: an httpx or requests response of status >= 400); `is_empty(value)`
    says what is wrong with a returned value that is empty (a text, or True).
    `status_check(attempt)` answers `found`, `absent` or `unknown` when the
    policy asks whether a write was applied (without one: `unknown`).
    `clock` has `now_ms()` and `async sleep(s)` (default real time), `entropy`
    the retry jitter (default the OS)."""
    state = _run_state(run)
    state.steps += 1
    step = state.steps
    clock = clock if clock is not None else REAL_CLOCK
    if policy_identity is not None and not isinstance(policy_identity, str):
        raise TypeError(f"policy_identity must be a string (e.g. str(loaded.identity)), got {type(policy_identity).__name__}")
    if call_timeout_s is not None and (isinstance(call_timeout_s, bool) or not call_timeout_s > 0):
        raise ValueError(f"call_timeout_s must be a positive number of seconds or None, got {call_timeout_s!r}")
    telemetry = Telemetry(log, hooks=hooks, metrics=metrics, otel_recorder=_otel.recorder(tracer_provider, meter_provider))
    policy = policy_identity if policy_identity is not None else run.instance.policy_identity
    deadline_ms = clock.now_ms() + int(call_timeout_s * 1000) if call_timeout_s is not None else None
    call = _Call(run, state, tool, telemetry, policy, step, clock, entropy or OsEntropy(), deadline_ms, call_timeout_s)
    try:
        return await _call(call, fn, hints, action_id, keyed, observe, observe_result, is_empty, status_check)
    except _DeadlinePassed:
        raise CallTimedOut(call.stop("call-timeout")) from None
    except asyncio.CancelledError as e:
        if isinstance(e, CallCancelled):
            raise
        raise CallCancelled(call.stop("cancelled")) from e


async def _call(
    call: _Call,
    fn: Callable[[Attempt], Awaitable[_T]],
    hints: ToolHints | None,
    action_id: str | None,
    keyed: bool | None,
    observe: Observe | None,
    observe_result: ObserveResult | None,
    is_empty: IsEmpty | None,
    status_check: StatusCheck | None,
) -> _T | None:
    run, state, tool = call.run, call.state, call.tool
    if state.broken is not None:
        escalated, violation = state.broken
        note = escalated.note
        event = AttemptEvent(
            call.scope,
            0,
            None,
            "not sent",
            None,
            None,
            "escalate",
            None,
            None,
            escalated.reason,
            note,
            invariant=violation.invariant.value,
            counted=False,
        )
        call.telemetry.emit(event, call.span)
        raise call.escalated(escalated.escalation, None, policy_failure=escalated.policy_failure)
    if keyed if keyed is not None else _takes_key(state.guard, tool, hints):
        call.key = call.ask("not sent", run.instance.derive_idempotency_key, run.run_id, action_id or f"step-{call.scope.step}")
    start = call.ask("not sent", run.begin_call, tool, call.key, hints, call.clock.now_ms())
    if not start.admitted:
        refusal = call.ask("not sent", run.escalation) or policy_failure(tool, "not sent", PolicyBoundaryViolation("no hand-off"))
        refusal = bounded(refusal)
        event = AttemptEvent(
            call.scope, 0, call.key, "not sent", None, None, "escalate", None, None, refusal["reason"], refusal["note"], counted=False
        )
        call.telemetry.emit(event, call.span)
        raise call.escalated(refusal, None)
    call.call_id, call.effect, call.attempt = start.call_id, start.effect, 1
    call.scope = CallScope(call.scope.run, call.scope.policy, call.scope.step, start.call_id, tool)
    guard, violation = state.guard.begin(tool, call.key, hints, start.delay_ms)
    call.guarded("not sent", violation)
    if start.delay_ms:
        await call.wait(1, "admission", start.delay_ms, None)
    attempt = 1
    while True:
        call.attempt = attempt
        if call.deadline_ms is not None and call.clock.now_ms() >= call.deadline_ms:
            raise _DeadlinePassed
        value, observation, empty = await _one_attempt(call, fn, attempt, observe, observe_result, is_empty)
        guard.attempted(Outcome.of(observation))
        if observation is not None:
            outcome = outcome_words(observation)
            answer, event = call.record(
                guard,
                outcome,
                run.record_failure,
                call.call_id,
                attempt,
                observation,
                call.time_left_ms(),
                call.clock.now_ms(),
                call.entropy.next_u64(),
            )
        elif empty is not None:
            outcome = "empty result"
            answer, event = call.record(guard, outcome, run.record_empty_result, call.call_id, attempt, empty, call.clock.now_ms())
        else:
            outcome = "success"
            answer, event = call.record(guard, outcome, run.record_success, call.call_id, attempt, call.clock.now_ms())
        if call.attempt_span is not None:
            call.attempt_span.end(event)
            call.attempt_span = None
        while answer.kind == "check-status":
            found = await _check_status(call, status_check, attempt)
            guard.status_checked(found)
            name = getattr(status_check, "__name__", None) if status_check is not None else None
            call.telemetry.emit(StatusCheckEvent(call.scope, attempt, name, found), call.span)
            answer, _ = call.record(
                guard,
                f"status check {found}",
                run.record_status_check,
                call.call_id,
                attempt,
                found,
                call.time_left_ms(),
                call.clock.now_ms(),
                call.entropy.next_u64(),
                counted=False,
            )
        kind = answer.kind
        if kind == "retry":
            attempt = answer.next_attempt
            call.attempt = attempt  # the call's attempt now, for a stop during the wait
            await call.wait(attempt, "retry", answer.delay_ms, answer.verdict.hint_ms)
            continue
        if kind == "replan":
            decision = answer.decision
            message = cut_lifted_text(cast(ReplanAction, decision["action"])["replan"])
            rule = decision["rule"]  # read before the hooks see the decision: they cannot change it
            call.telemetry.emit(ReplanEvent(call.scope, answer.verdict.attempt, rule, message, decision=decision), call.span)
            if call.span is not None:
                call.span.end("replan")
            raise ReplanNeeded(message, rule, tool=tool)
        if kind == "succeed":
            if call.span is not None:
                call.span.end("succeed")
            return value
        if kind == "escalate":
            decision = answer.decision
            escalation = bounded(cast(EscalateAction, decision["action"])["escalate"])
            raise call.escalated(escalation, decision["rule"], decision=decision)
        # A poll answers a call with no task: the policy is broken (the safe fallback).
        fault = PolicyBoundaryViolation(f"{kind} answered {tool}, which has no task", call="[method]run.record-failure")
        raise call.policy_failed(outcome, fault)


async def _one_attempt(
    call: _Call,
    fn: Callable[[Attempt], Awaitable[_T]],
    attempt: int,
    observe: Observe | None,
    observe_result: ObserveResult | None,
    is_empty: IsEmpty | None,
) -> tuple[_T | None, Observation | None, str | None]:
    """Runs `fn` once (in a task of its own, with its attempt span current,
    within the call's limit): its value, or what it observed, or an empty
    result's detail. An exception nothing maps abandons the call and is re-raised."""
    span = call.span.attempt(attempt, mcp=False) if call.span is not None else None
    call.attempt_span = span
    call.sent += 1
    call.in_flight = True
    try:
        # The task copies the context now: what fn traces nests under the attempt span.
        with span.current() if span is not None else contextlib.nullcontext():
            running = fn(Attempt(attempt, call.key))
            if not inspect.isawaitable(running):
                raise TypeError(f"call_with_policy runs an async function; fn returned {type(running).__name__}")
            task = asyncio.ensure_future(running)
    except Exception as error:  # fn is not async, or raised before its first await: not an attempt's outcome
        _end_span(call, type(error).__qualname__)
        _abandon_unknown(call, error)
        raise
    try:
        done, _ = await asyncio.wait({task}, timeout=call.remaining_s())
    except asyncio.CancelledError:
        task.cancel()
        _end_span(call, "cancelled")
        raise
    if not done:  # the call's limit passed with the attempt out: it may have applied
        task.cancel()
        task.add_done_callback(_consume)
        _end_span(call, "call-timeout")
        raise _DeadlinePassed
    error = task.exception() if not task.cancelled() else asyncio.CancelledError()
    try:
        if error is not None:
            observation = _observed(error, observe)
            if observation is None:
                raise error
            call.in_flight = False
            return None, observation, None
        value = task.result()
        call.in_flight = False
        failure = _checked((observe_result or http_errors.observe_result)(value), "observe_result")
        if failure is not None:
            return value, failure, None
        empty = is_empty(value) if is_empty is not None else None
    except Exception as unknown:  # nothing maps it, or the caller's own translation failed: re-raised
        _end_span(call, type(unknown).__qualname__)
        _abandon_unknown(call, unknown)
        raise
    if empty:
        return value, None, empty if isinstance(empty, str) else "the call returned an empty result"
    return value, None, None


def _checked(observation: Any, source: str) -> Observation | None:
    """An observation from the caller's translation: None, or a mapping with a `kind`."""
    if observation is None or (isinstance(observation, Mapping) and "kind" in observation):
        return cast("Observation | None", observation)
    raise TypeError(f"{source} must return an agent_retry_policy.types.Observation or None, got {type(observation).__name__}")


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieves an abandoned task's exception, so that it is not reported."""
    if not task.cancelled():
        task.exception()


def _end_span(call: _Call, error_type: str) -> None:
    if call.attempt_span is not None:
        call.attempt_span.fail(error_type)
        call.attempt_span = None


def _abandon_unknown(call: _Call, error: BaseException, reason: str | None = None) -> None:
    """An exception nothing maps: a bug in the caller's code. The call is
    abandoned (the attempt counts as sent: a write may have left) and ends."""
    if call.call_id is not None:
        try:
            call.run.abandon_call(call.call_id, call.attempt, True, "cancelled")
        except Exception:  # noqa: BLE001 - the exception the caller must see is theirs
            pass
    if reason is None:
        reason = f"{type(error).__name__} raised by the call, which no mapping knows: re-raised, the call abandoned"
    counted = call.unreported()  # as the report counts it
    event = AttemptEvent(call.scope, call.attempt, call.key, "exception", None, None, "stop", None, None, None, reason, counted=counted)
    call.telemetry.emit(event, call.span)
    if call.span is not None:
        call.span.end("stop", error_type=type(error).__qualname__)


def _observed(error: BaseException, observe: Observe | None) -> Observation | None:
    if isinstance(error, ObservedFailure):
        return _checked(error.observation, "ObservedFailure")
    if isinstance(error, (Escalated, ReplanNeeded, CallTimedOut)):
        return None  # another helper's ending: never an observation of this call
    if observe is not None:
        observation = _checked(observe(error), "observe")
        if observation is not None:
            return observation
    return http_errors.observe_exception(error)


async def _check_status(call: _Call, status_check: StatusCheck | None, attempt: int) -> StatusCheckResult:
    """The status check's answer; without one, or one that fails, `unknown`."""
    if status_check is None:
        return "unknown"
    remaining = call.remaining_s()
    if remaining is not None and remaining <= 0:
        raise _DeadlinePassed
    try:
        found: Any = status_check(Attempt(attempt, call.key))
        if inspect.isawaitable(found):
            task = asyncio.ensure_future(found)
            done, _ = await asyncio.wait({task}, timeout=remaining)
            if not done:
                task.cancel()
                task.add_done_callback(_consume)
                raise _DeadlinePassed
            found = task.result()
    except _DeadlinePassed:
        raise
    except Exception as e:  # noqa: BLE001 - a failed check knows nothing
        failed = {
            "event": "agent_retry.status_check_failed",
            "ts": round(time.time(), 3),
            "run": call.run.run_id,
            "tool": call.tool,
            "error": repr(e),
        }
        call.telemetry.log.warning(json.dumps(failed, ensure_ascii=False))
        return "unknown"
    return found if found in ("found", "absent", "unknown") else "unknown"


__all__ = ["Attempt", "Clock", "REAL_CLOCK", "call_with_policy"]
