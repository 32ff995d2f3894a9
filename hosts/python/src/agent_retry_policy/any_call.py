"""Any async call under the policy: an HTTP request, a model API call, a
database write (`call_with_policy`).

    async def fetch(attempt: Attempt) -> httpx.Response:
        return (await client.get(url)).raise_for_status()

    response = await call_with_policy(run, "get_quote", fetch, hints={"read-only": True})

`fn(attempt)` runs once per attempt (an async function on the loop, a plain
one in a thread of its own, so that the call's limit bounds a blocking one
too); its exception (or a returned httpx or
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
and OpenTelemetry; they come from the MCP wrapper's code (`_call_core`), so
they say the same of the same failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast

from . import http_errors
from . import otel as _otel
from ._call_core import CallCore, Raised, ReplannedBeforeSend, Report, RunBook, check_name, forget_task, run_either
from ._telemetry import Telemetry
from .component import Run, now_ms
from .entropy import EntropySource, OsEntropy
from .errors import (
    CallCancelled,
    CallTimedOut,
    Escalated,
    ObservedFailure,
    ReplanNeeded,
    StopCause,
    Stopped,
)
from .events import CallScope
from .guard import Outcome, RunGuard
from .hooks import Hooks
from .metrics import RetryMetrics
from .types import Observation, StatusCheckResult, ToolHints

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
# An attempt: an async function, or a plain one (run in a thread of its own).
AttemptFn = Callable[[Attempt], Awaitable[_T] | _T]


_RUNS: weakref.WeakKeyDictionary[Run, RunBook] = weakref.WeakKeyDictionary()


def _run_book(run: Run) -> RunBook:
    """The helper's book of a run, kept across its calls."""
    book = _RUNS.get(run)
    if book is None:
        book = _RUNS[run] = RunBook(RunGuard(run.config_text))
    return book


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
    """One call in progress: the shared book-keeping (`core`) and what only
    this helper keeps (its clock, its limit, the attempts sent)."""

    def __init__(self, core: CallCore, clock: Clock, deadline_ms: int | None, limit_s: float | None) -> None:
        self.core, self.clock = core, clock
        self.deadline_ms, self.limit_s = deadline_ms, limit_s
        self.sent = 0
        self.in_flight = False

    def remaining_s(self) -> float | None:
        if self.deadline_ms is None:
            return None
        return max(0.0, (self.deadline_ms - self.clock.now_ms()) / 1000)

    def time_left_ms(self) -> int | None:
        return None if self.deadline_ms is None else max(0, self.deadline_ms - self.clock.now_ms())

    async def wait(self, attempt: int, why: Literal["retry", "admission"], delay_ms: int, hint_ms: int | None) -> None:
        """A wait the policy asked for: its event first; one that would end past
        the call's limit is not slept."""
        self.core.waits(attempt, why, delay_ms, hint_ms)
        remaining = self.remaining_s()
        if remaining is not None and delay_ms / 1000 >= remaining:
            raise _DeadlinePassed
        if delay_ms > 0:
            await self.clock.sleep(delay_ms / 1000)

    def stop(self, cause: StopCause) -> Stopped:
        """The call stopped by its limit or a cancellation: the run is told
        (`abandon_call`), the stop is logged (docs/events.md, "Stop reasons"),
        the span ends."""
        limit_ms = round(self.limit_s * 1000) if self.limit_s is not None else None
        return self.core.stop(cause, limit_ms, in_flight=self.in_flight, attempt_out=self.in_flight, sent=self.sent)


async def call_with_policy(
    run: Run,
    tool: str,
    fn: AttemptFn[_T],
    *,
    hints: ToolHints | None = None,
    server: str | None = None,
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
    `idempotent`). `server` names what the call goes to for the circuit
    breakers (the same name in every worker, e.g. its URL; at most 4,096
    bytes, of which the policy keeps 256); None (the default): no breaker applies. While a
    breaker of the server is open the call is not made: `ReplanNeeded`, its
    message saying so, `fn` not called. A tool configured or hinted as an idempotent write gets an
    idempotency key, derived once from the run id and `action_id` (default
    `step-N`, N counting this run's calls through the helper from 1), the same
    in every attempt (`keyed` forces it on or off). `fn` may be async or plain
    (run in a thread: its return value is the attempt's result, what it raises
    is mapped as an async function's would be). `observe(exc)` translates
    an exception the built-in mappings do not know (None: not a failure it
    knows); `observe_result(value)` says whether a returned value is a failure
    (default: an httpx or requests response of status >= 400); `is_empty(value)`
    says what is wrong with a returned value that is empty (a text, or True).
    `status_check(attempt)` answers `found`, `absent` or `unknown` when the
    policy asks whether a write was applied (without one, or one that
    raises or answers anything else: `unknown`); a plain one runs in a thread.
    `clock` has `now_ms()` and `async sleep(s)` (default real time), `entropy`
    the retry jitter (default the OS)."""
    book = _run_book(run)
    book.steps += 1
    step = book.steps
    clock = clock if clock is not None else REAL_CLOCK
    if policy_identity is not None and not isinstance(policy_identity, str):
        raise TypeError(f"policy_identity must be a string (e.g. str(loaded.identity)), got {type(policy_identity).__name__}")
    if server is not None and not isinstance(server, str):
        raise TypeError(f"server must be a string (the name of what the call goes to) or None, got {type(server).__name__}")
    if call_timeout_s is not None and (isinstance(call_timeout_s, bool) or not call_timeout_s > 0):
        raise ValueError(f"call_timeout_s must be a positive number of seconds or None, got {call_timeout_s!r}")
    telemetry = Telemetry(log, hooks=hooks, metrics=metrics, otel_recorder=_otel.recorder(tracer_provider, meter_provider))
    policy = policy_identity if policy_identity is not None else run.instance.policy_identity
    deadline_ms = clock.now_ms() + int(call_timeout_s * 1000) if call_timeout_s is not None else None
    span = telemetry.otel.call(tool, run.run_id, policy, step) if telemetry.otel is not None else None
    call: _Call | None = None
    core = CallCore(
        run,
        book,
        telemetry,
        CallScope(run.run_id, policy, step, None, tool),
        span=span,
        now_ms=clock.now_ms,
        time_left_ms=lambda: call.time_left_ms() if call is not None else None,
        entropy=entropy or OsEntropy(),
        server=server,
    )
    call = _Call(core, clock, deadline_ms, call_timeout_s)
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
    fn: AttemptFn[_T],
    hints: ToolHints | None,
    action_id: str | None,
    keyed: bool | None,
    observe: Observe | None,
    observe_result: ObserveResult | None,
    is_empty: IsEmpty | None,
    status_check: StatusCheck | None,
) -> _T | None:
    core = call.core
    run, tool = core.run, core.tool
    if core.book.broken is None and (keyed if keyed is not None else _takes_key(core.book.guard, tool, hints)):
        core.key = core.ask("not sent", run.instance.derive_idempotency_key, run.run_id, action_id or f"step-{core.scope.step}")
    try:
        start, guard = core.begin(hints)
    except ReplannedBeforeSend as replan:  # a circuit breaker of the server is open: nothing sent
        raise ReplanNeeded(replan.message, replan.rule, tool=tool) from None
    if start.delay_ms:
        await call.wait(1, "admission", start.delay_ms, None)
    attempt = 1
    while True:
        if call.deadline_ms is not None and call.clock.now_ms() >= call.deadline_ms:
            raise _DeadlinePassed
        value, report = await _one_attempt(call, fn, attempt, observe, observe_result, is_empty)
        guard.attempted(Outcome.of(report.failure))
        answer = core.record(guard, report, attempt)
        while answer.kind == "check-status":
            found = await _check_status(call, status_check, attempt)
            answer = core.status_checked(guard, attempt, check_name(status_check) if status_check is not None else None, found)
        kind = answer.kind
        if kind == "retry":
            attempt = answer.next_attempt
            core.attempt = attempt  # the call's attempt now, for a stop during the wait
            await call.wait(attempt, "retry", answer.delay_ms, answer.verdict.hint_ms)
            continue
        if kind == "replan":
            message, rule = core.replanned(answer)
            raise ReplanNeeded(message, rule, tool=tool)
        if kind == "succeed":
            core.succeeded()
            return value
        if kind == "escalate":
            raise core.escalated_by(answer)
        # A poll answers a call with no task: the policy is broken (the safe fallback).
        raise core.no_task_to_poll(kind, report.words)


async def _one_attempt(
    call: _Call,
    fn: AttemptFn[_T],
    attempt: int,
    observe: Observe | None,
    observe_result: ObserveResult | None,
    is_empty: IsEmpty | None,
) -> tuple[_T | None, Report]:
    """Runs `fn` once (in a task of its own, with its attempt span current,
    within the call's limit; a plain `fn` in a thread of its own): its value
    and what it observed (a failure, an empty result, or a success). An
    exception nothing maps abandons the call and is re-raised."""
    core = call.core
    span = core.attempt_started(attempt, mcp=False)
    call.sent += 1
    call.in_flight = True
    # The task (and a plain fn's thread) copies the context now: what fn traces nests under the attempt span.
    with span.current() if span is not None else contextlib.nullcontext():
        task = asyncio.ensure_future(run_either(fn, Attempt(attempt, core.key)))
    try:
        done, _ = await asyncio.wait({task}, timeout=call.remaining_s())
    except asyncio.CancelledError:
        task.cancel()
        core.attempt_failed("cancelled")
        raise
    if not done:  # the call's limit passed with the attempt out: it may have applied
        task.cancel()
        task.add_done_callback(forget_task)
        core.attempt_failed("call-timeout")
        raise _DeadlinePassed
    error = task.exception() if not task.cancelled() else asyncio.CancelledError()
    if isinstance(error, Raised):  # what fn raised that a task may not carry (SystemExit, StopIteration, ...)
        error = error.error
    try:
        if error is not None:
            observation = _observed(error, observe)
            if observation is None:
                raise error
            call.in_flight = False
            return None, Report(failure=observation)
        value = task.result()
        call.in_flight = False
        failure = _checked((observe_result or http_errors.observe_result)(value), "observe_result")
        if failure is not None:
            return value, Report(failure=failure)
        empty = is_empty(value) if is_empty is not None else None
    except asyncio.CancelledError:  # fn's own cancellation: the call stops as cancelled
        raise
    except BaseException as unknown:  # nothing maps it, or the caller's own translation failed: re-raised
        _abandon_unknown(call, unknown)
        raise
    if empty:
        return value, Report(empty=empty if isinstance(empty, str) else "the call returned an empty result")
    return value, Report()


def _checked(observation: Any, source: str) -> Observation | None:
    """An observation from the caller's translation: None, or a mapping with a `kind`."""
    if observation is None or (isinstance(observation, Mapping) and "kind" in observation):
        return cast("Observation | None", observation)
    raise TypeError(f"{source} must return an agent_retry_policy.types.Observation or None, got {type(observation).__name__}")


def _abandon_unknown(call: _Call, error: BaseException) -> None:
    """An exception nothing maps: a bug in the caller's code."""
    reason = f"{type(error).__name__} raised by the call, which no mapping knows: re-raised, the call abandoned"
    call.core.abandon_unknown(error, reason)


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
    """The status check's answer, within the call's limit; without one, or one
    that fails, `unknown`. A plain function runs in a thread of its own, so
    that the limit bounds it too (a check past it is left to finish there)."""
    if status_check is None:
        return "unknown"
    remaining = call.remaining_s()
    if remaining is not None and remaining <= 0:
        raise _DeadlinePassed
    found = await call.core.check_status(status_check, Attempt(attempt, call.core.key), remaining)
    if found is None:
        raise _DeadlinePassed
    return found


__all__ = ["Attempt", "Clock", "REAL_CLOCK", "call_with_policy"]
