"""One call under the policy, the bookkeeping every wrapper shares (the MCP
`RetryingToolCaller`, its `initialize` and `tools/list` pseudo-calls, and
`call_with_policy`): beginning the call, asking the policy with the safe
fallback when it fails, the run-time guard, reporting an outcome and reading
its verdict, and the events of docs/events.md (attempts, waits, status checks,
replans, escalations, stops) with their spans. The wrappers do the I/O and the
sleeping; what an event says comes from here, so it says the same whichever
wrapper emitted it."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from . import otel
from ._telemetry import Telemetry
from ._verdicts import Answer, bounded, policy_failure, rule_name
from .component import Run
from .entropy import EntropySource
from .errors import Escalated, InstanceUnusable, PolicyBoundaryViolation, PolicyTrap, StopCause, Stopped
from .events import AttemptEvent, BreakerEvent, CallScope, EscalationEvent, ReplanEvent, StatusCheckEvent, WaitEvent, outcome_words
from .guard import CallGuard, RunGuard, Violation
from .limits import cut_lifted_text
from .types import (
    BreakerChange,
    CallStart,
    Decision,
    EscalateAction,
    Escalation,
    Observation,
    ReplanAction,
    ResumedCall,
    StatusCheckResult,
    TaskReport,
    ToolHints,
    Verdict,
    action_name,
)

_T = TypeVar("_T")

StopWhere = Literal["in-flight", "between-attempts", "before-send"]
"""Where a call was when it stopped: an attempt's request out, between attempts, or before any was sent."""

StopApplied = Literal["nothing-sent", "not-a-write", "may-have-applied", "not-applied"]
"""What is known of a stopped call's effect."""

_APPLIED: dict[str, str] = {
    "nothing-sent": "nothing of it was sent",
    "not-a-write": "it is not a write",
    "may-have-applied": "the write may have been applied: check before sending it again",
    "not-applied": "the write was not applied",
}


def stop_reason(
    cause: StopCause,
    limit_ms: int | None,
    where: StopWhere,
    attempt: int | None,
    during: str | None,
    attempts_sent: int,
    applied: StopApplied,
) -> str:
    """The reason of a stop line, the same in every host and wrapper
    (docs/events.md, "Stop reasons"; tests/events/stop_reasons.json):
    `{stopped} {where} ({attempts_sent} sent); {applied}`. `limit_ms` (whole
    ms) is needed for a timeout, `attempt` for `in-flight`; `during` (the
    pseudo-call in progress) is said only `before-send`."""
    if cause == "cancelled":
        stopped = "the call was cancelled"
    elif cause in ("call-timeout", "run-timeout"):
        if limit_ms is None:
            raise ValueError(f"a {cause} stop needs its limit_ms")
        stopped = f"the {'call' if cause == 'call-timeout' else 'run'}'s limit of {limit_ms} ms passed"
    else:
        raise ValueError(f"unknown stop cause {cause!r}")
    if where == "in-flight":
        if attempt is None:
            raise ValueError("an in-flight stop needs its attempt")
        at = f"while attempt {attempt} was in flight"
    elif where == "between-attempts":
        at = "between attempts"
    elif where == "before-send":
        at = "before the call was sent" if during is None else f"while its {during} ran, before the call was sent"
    else:
        raise ValueError(f"unknown stop place {where!r}")
    if applied not in _APPLIED:
        raise ValueError(f"unknown stop effect {applied!r}")
    return f"{stopped} {at} ({attempts_sent} sent); {_APPLIED[applied]}"


class ReplannedBeforeSend(Exception):
    """Internal: `begin-call` did not admit the call, as a replan (a circuit
    breaker of its server is open): nothing was sent. The wrapper does what it
    does for a replan verdict with `message` (for the model) and `rule`; the
    events were emitted already."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.message, self.rule = message, rule


@dataclass
class RunBook:
    """What a wrapper keeps per run across its calls: the guard, the steps, and
    the escalation of a broken invariant (the rest of the run ends with it)."""

    guard: RunGuard
    steps: int = 0
    broken: tuple[Escalated, Violation] | None = None


@dataclass(frozen=True)
class Report:
    """What one report tells the run of an attempt: a success (nothing set), an
    empty result (what is wrong), a failure, a status check's finding, a task's
    status, or a failed poll of the task."""

    failure: Observation | None = None
    empty: str | None = None
    status: StatusCheckResult | None = None
    task: TaskReport | None = None
    poll_failure: Observation | None = None

    @property
    def words(self) -> str:
        """The outcome in the words of docs/events.md, the same in every host:
        `success`, `empty result`, `http 503`, `transport timeout`,
        `json-rpc -32603`, `tool error`, `status check found`, `task working`,
        `poll failed: http 503`."""
        if self.failure is not None:
            return outcome_words(self.failure)
        if self.task is not None:
            return f"task {self.task['status']}"
        if self.poll_failure is not None:
            return f"poll failed: {outcome_words(self.poll_failure)}"
        if self.status is not None:
            return f"status check {self.status}"
        if self.empty is not None:
            return "empty result"
        return "success"


class CallCore:
    """One call in progress: its scope, key, attempt and spans, and every
    event it emits. `now_ms`, `time_left_ms` and `entropy` are the wrapper's
    clock, deadline and jitter; `on_verdict(tool, attempt, verdict)` sees each
    verdict the wrapper acts on."""

    def __init__(
        self,
        run: Run,
        book: RunBook,
        telemetry: Telemetry,
        scope: CallScope,
        *,
        span: otel.CallSpan | None,
        now_ms: Callable[[], int],
        time_left_ms: Callable[[], int | None],
        entropy: EntropySource,
        on_verdict: Callable[[str, int, Verdict], None] | None = None,
        server: str | None = None,
    ) -> None:
        self.run, self.book, self.telemetry, self.scope = run, book, telemetry, scope
        # The server the call goes to, for the circuit breakers (None: no breaker applies).
        self.server = server
        self.span = span
        self.now_ms, self.time_left_ms, self.entropy, self.on_verdict = now_ms, time_left_ms, entropy, on_verdict
        self.key: str | None = None
        self.effect: str | None = None
        self.attempt = 0
        # The last attempt whose verdict an attempt event counted (as the run's report counts it).
        self.reported = 0
        self.attempt_span: otel.AttemptSpan | None = None

    @property
    def tool(self) -> str:
        return self.scope.tool

    @property
    def call_id(self) -> int | None:
        return self.scope.call

    def emit(self, event: Any) -> None:
        self.telemetry.emit(event, self.span)

    # -- the policy, guarded

    def ask(self, last_outcome: str, ask: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Asks the policy; if it fails, the safe fallback (no retry, an escalation saying so)."""
        try:
            return ask(*args, **kwargs)
        except (PolicyTrap, InstanceUnusable) as e:
            raise self.policy_failed(last_outcome, e) from e

    def policy_failed(
        self, last_outcome: str, error: PolicyTrap | InstanceUnusable, invariant: str | None = None, *, before_send: bool = False
    ) -> Escalated:
        """The policy-failure escalation, for a failed policy or a broken
        invariant: the attempt line, then the escalation's. `before_send`: the
        call was begun and refused before its first send (attempt 0, which the
        run counts all the same)."""
        escalation = policy_failure(self.tool, last_outcome, error)
        attempt = 0 if before_send else self.attempt
        event = AttemptEvent(
            self.scope,
            attempt,
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
        self.emit(event)
        self.reported = max(self.reported, self.attempt)
        return self.escalated(escalation, None, policy_failure=error, attempt=attempt)

    def guarded(self, last_outcome: str, violation: Violation | None, *, before_send: bool = False) -> None:
        """A broken invariant ends the call as a failed policy does, and the run with it."""
        if violation is None:
            return
        fault = PolicyBoundaryViolation(str(violation), call="run-time guard")
        escalated = self.policy_failed(last_outcome, fault, invariant=violation.invariant.value, before_send=before_send)
        self.book.broken = (escalated, violation)
        raise escalated

    def unreported(self) -> bool:
        """Whether the run counts the call's current attempt and no attempt event counted it yet."""
        return self.call_id is not None and self.reported < self.attempt

    # -- beginning

    def begin(self, hints: ToolHints | None) -> tuple[CallStart, CallGuard]:
        """Begins the call on the run (after a broken invariant: the same
        escalation, nothing sent); a call not admitted escalates with the run's
        hand-off, or, when a circuit breaker of its server is open, raises
        `ReplannedBeforeSend` (its events emitted; nothing was sent). From here
        the call is at its first attempt."""
        self.refuse_if_broken()
        start = self.ask("not sent", self.run.begin_call, self.tool, self.key, hints, self.now_ms(), server=self.server)
        if start.admitted or start.replan:  # a call id the run knows
            self.scope = CallScope(self.scope.run, self.scope.policy, self.scope.step, start.call_id, self.tool)
        if start.breaker_changed:
            self.breaker_changes("not sent")
        if not start.admitted:
            if start.replan:
                raise self._replanned_before_send(start)
            raise self._not_admitted()
        self.effect, self.attempt = start.effect, 1
        guard, violation = self.book.guard.begin(self.tool, self.key, hints, start.delay_ms)
        self.guarded("not sent", violation, before_send=True)
        return start, guard

    def resumed(self, call: ResumedCall) -> tuple[CallStart, CallGuard]:
        """Takes up the call a resumed run sends (`Run.resumed_call()`, action
        `send`) as `begin` does: its id, key and attempt are the resumed
        call's, its ticket the `begin-call` answer; the guard registers it as
        a new call (hints None, the ticket's delay). From here the call is at
        the resumed attempt."""
        ticket = call["ticket"]
        if ticket is None:  # the contract gives a `send` its ticket: fail safe all the same
            fault = PolicyBoundaryViolation(f"resumed-call {call['call-id']} says send without a ticket", call="[method]run.resumed-call")
            raise self.policy_failed("not sent", fault, before_send=True)
        start = CallStart(
            ticket["admitted"],
            ticket["call-id"],
            ticket["delay-ms"],
            ticket["effect"],
            ticket["safe-to-repeat"],
            ticket["idle-timeout-ms"],
            ticket["attempt-timeout-ms"],
            ticket["replan"],
            ticket["breaker-changed"],
        )
        self.scope = CallScope(self.scope.run, self.scope.policy, self.scope.step, call["call-id"], self.tool)
        self.key = call["idempotency-key"]
        if start.breaker_changed:
            self.breaker_changes("not sent")
        self.effect, self.attempt = start.effect, call["attempt"]
        guard, violation = self.book.guard.begin(self.tool, self.key, None, start.delay_ms)
        self.guarded("not sent", violation, before_send=True)
        return start, guard

    def refuse_if_broken(self) -> None:
        """After a broken invariant every call of the run escalates with it, nothing sent."""
        if self.book.broken is None:
            return
        escalated, violation = self.book.broken
        event = AttemptEvent(
            self.scope, 0, None, "not sent", None, None, "escalate", None, None, escalated.reason, escalated.note,
            invariant=violation.invariant.value, counted=False,
        )  # fmt: skip
        self.emit(event)
        raise self.escalated(escalated.escalation, None, policy_failure=escalated.policy_failure)

    def breaker_changes(self, last_outcome: str) -> None:
        """A `begin-call` or a report changed a circuit breaker: the changes,
        taken from the run right away, each as an `agent_retry.breaker` event."""
        changes: list[BreakerChange] = self.ask(last_outcome, self.run.take_breaker_changes)
        for change in changes:
            tool = change["tool"]
            event = BreakerEvent(
                self.scope,
                change["server"],
                "server" if tool is None else "tool",
                change["old-state"],
                change["new-state"],
                change["until-ms"],
                cut_lifted_text(change["why"]),
            )
            self.emit(event)

    def _replanned_before_send(self, start: CallStart) -> ReplannedBeforeSend:
        """Not admitted as a replan (a circuit breaker of the server is open):
        the refusal's attempt line (attempt 0, `not sent`, action `replan`),
        then the replan's; the message is `last-decision(call-id)`'s."""
        decision = self.ask("not sent", self.run.last_decision, start.call_id)
        if decision is None or action_name(decision["action"]) != "replan":
            said = "none" if decision is None else action_name(decision["action"])
            fault = PolicyBoundaryViolation(
                f"begin-call answered replan, but last-decision({start.call_id}) says {said}", call="[method]run.last-decision"
            )
            raise self.policy_failed("not sent", fault, before_send=True)
        message = cut_lifted_text(cast(ReplanAction, decision["action"])["replan"])
        rule = decision["rule"]  # read before the hooks see the decision: they cannot change it
        event = AttemptEvent(
            self.scope, 0, self.key, "not sent", None, rule, "replan", None, None, None, cut_lifted_text(decision["reason"]),
            decision=decision, counted=False,
        )  # fmt: skip
        self.emit(event)
        self.emit(ReplanEvent(self.scope, 0, rule, message, decision=decision))
        if self.span is not None:
            self.span.end("replan")
        return ReplannedBeforeSend(message, rule)

    def _not_admitted(self) -> Escalated:
        refusal = self.ask("not sent", self.run.escalation)
        if refusal is None:  # the contract says there is one: fail safe all the same
            refusal = policy_failure(
                self.tool, "not sent", PolicyBoundaryViolation("the policy did not admit the call and gave no hand-off")
            )
        refusal = bounded(refusal)
        event = AttemptEvent(
            self.scope, 0, self.key, "not sent", None, None, "escalate", None, None, refusal["reason"], refusal["note"], counted=False
        )
        self.emit(event)
        return self.escalated(refusal, None)

    # -- attempts and reports

    def attempt_started(self, attempt: int, *, mcp: bool) -> otel.AttemptSpan | None:
        """The attempt's span (a child of the call's), ended by its verdict."""
        self.attempt = attempt
        self.attempt_span = self.span.attempt(attempt, mcp=mcp) if self.span is not None else None
        return self.attempt_span

    def attempt_failed(self, error_type: str) -> None:
        """The attempt ended without a verdict: its span ends with the error."""
        if self.attempt_span is not None:
            self.attempt_span.fail(error_type)
            self.attempt_span = None

    def record(self, guard: CallGuard, report: Report, attempt: int, *, counted: bool = True, reason_suffix: str = "") -> Answer:
        """Reports one outcome on the run's single path (a status check's or a
        poll's is not `counted` as an attempt); the verdict passes the guard
        before anything acts on it; then its attempt event."""
        call_id = self.call_id
        assert call_id is not None
        words, run = report.words, self.run
        try:
            if report.failure is not None:
                args: tuple[Any, ...] = (report.failure, self.time_left_ms(), self.now_ms(), self.entropy.next_u64())
                verdict = self.ask(words, run.record_failure, call_id, attempt, *args)
            elif report.task is not None:
                args = (report.task, self.time_left_ms(), self.now_ms(), self.entropy.next_u64())
                verdict = self.ask(words, run.record_task_status, call_id, attempt, *args)
            elif report.poll_failure is not None:
                args = (report.poll_failure, self.time_left_ms(), self.now_ms(), self.entropy.next_u64())
                verdict = self.ask(words, run.record_poll_failure, call_id, attempt, *args)
            elif report.status is not None:
                args = (report.status, self.time_left_ms(), self.now_ms(), self.entropy.next_u64())
                verdict = self.ask(words, run.record_status_check, call_id, attempt, *args)
            elif report.empty is not None:
                verdict = self.ask(words, run.record_empty_result, call_id, attempt, report.empty, self.now_ms())
            else:
                verdict = self.ask(words, run.record_success, call_id, attempt, self.now_ms())
        except Escalated:
            raise
        except Exception as error:  # not the policy failing: what was reported is unusable (a malformed observation)
            reason = f"{type(error).__name__} raised reporting the call's outcome ({words}): re-raised, the call abandoned"
            self.abandon_unknown(error, reason)
            raise
        if verdict.breaker_changed:
            self.breaker_changes(words)
        violation = guard.verdict(verdict.action, verdict.delay_ms, verdict.hint_ms, verdict.reconnect, cancel_task=verdict.cancel_task)
        self.guarded(words, violation)

        def read() -> Decision:
            decision = self.ask(words, self.run.last_decision, call_id)
            if decision is None:  # the contract keeps it until the run's next decision: a broken policy
                fault = PolicyBoundaryViolation(
                    f"last-decision({call_id}) is none right after its verdict", call="[method]run.last-decision"
                )
                raise self.policy_failed(words, fault)
            self.guarded(words, guard.decision(decision))
            return decision

        answer = Answer(verdict, read)
        if self.on_verdict is not None:
            self.on_verdict(self.tool, attempt, verdict)
        kind = answer.kind
        # The words are read only when something needs them: the log line at INFO, an `on_retry` hook.
        decision = answer.decision if self.telemetry.wants_words(kind) else None
        escalation = cast(EscalateAction, decision["action"])["escalate"]["reason"] if decision is not None and kind == "escalate" else None
        event = AttemptEvent(
            self.scope,
            verdict.attempt,
            self.key,
            words,
            verdict.class_,
            decision["rule"] if decision is not None else rule_name(self.run.instance.rule_names(), verdict),
            kind,
            verdict.delay_ms if kind in ("retry", "poll") else None,
            verdict.hint_ms,
            escalation,
            cut_lifted_text(decision["reason"]) + reason_suffix if decision is not None else None,
            decision=decision,
            counted=counted,
        )
        if counted:
            self.reported = max(self.reported, verdict.attempt)
        self.emit(event)
        if self.attempt_span is not None:  # the attempt's verdict: its span ends with it
            self.attempt_span.end(event)
            self.attempt_span = None
        return answer

    def status_checked(self, guard: CallGuard, attempt: int, check_tool: str | None, found: StatusCheckResult) -> Answer:
        """A status check's finding: its event, then its report (under the attempt whose effect was checked)."""
        guard.status_checked(found)
        self.emit(StatusCheckEvent(self.scope, attempt, check_tool, found))
        return self.record(guard, Report(status=found), attempt, counted=False)

    async def check_status(self, check: Callable[[Any], Any], question: Any, within_s: float | None) -> StatusCheckResult | None:
        """Asks `check(question)` whether the write applied, for at most
        `within_s`: `found`, `absent` or `unknown`, or None when the time ran
        out (the check is cancelled, as it is when the call is; a plain one is
        left to finish in its thread). A check may be async or plain (run in a
        thread of its own, off the loop); one that raises anything, or answers
        anything else, knows nothing: logged, and `unknown`."""
        answering = asyncio.ensure_future(run_either(check, question))
        try:
            done, _ = await asyncio.wait({answering}, timeout=within_s)
        finally:
            if not answering.done():
                answering.cancel()
                answering.add_done_callback(forget_task)
        if not done:
            return None
        error = None if answering.cancelled() else answering.exception()
        if answering.cancelled() or error is not None:
            raised = error.error if isinstance(error, Raised) else error
            self.status_check_failed(repr(raised) if raised is not None else "cancelled")
            return "unknown"
        found = answering.result()
        return found if isinstance(found, str) and found in ("found", "absent", "unknown") else "unknown"

    def status_check_failed(self, error: str) -> None:
        """A status check that raised (or was cancelled) knows nothing: logged, and read as `unknown`."""
        failed = {
            "event": "agent_retry.status_check_failed",
            "ts": round(time.time(), 3),
            "run": self.run.run_id,
            "policy": self.scope.policy,
            "tool": self.tool,
            "error": error,
        }
        self.telemetry.log.warning(json.dumps(failed, ensure_ascii=False))

    def waits(self, attempt: int, why: Literal["retry", "poll", "admission"], delay_ms: int, hint_ms: int | None) -> None:
        """Before the wrapper sleeps: the wait's event."""
        self.emit(WaitEvent(self.scope, attempt, why, delay_ms, hint_ms))

    # -- endings

    def succeeded(self) -> None:
        if self.span is not None:
            self.span.end("succeed")

    def replanned(self, answer: Answer) -> tuple[str, str]:
        """The call ends with a message for the model: its event; the message and the rule."""
        decision = answer.decision
        message = cut_lifted_text(cast(ReplanAction, decision["action"])["replan"])
        rule = decision["rule"]  # read before the hooks see the decision: they cannot change it
        self.emit(ReplanEvent(self.scope, answer.verdict.attempt, rule, message, decision=decision))
        if self.span is not None:
            self.span.end("replan")
        return message, rule

    def escalated_by(self, answer: Answer) -> Escalated:
        """The verdict escalates: its hand-off, bounded."""
        decision = answer.decision
        escalation = bounded(cast(EscalateAction, decision["action"])["escalate"])
        return self.escalated(escalation, decision["rule"], decision=decision, attempt=answer.verdict.attempt)

    def escalated(
        self,
        escalation: Escalation,
        rule: str | None,
        *,
        policy_failure: Any = None,
        decision: Decision | None = None,
        attempt: int | None = None,
    ) -> Escalated:
        """The call ends with an escalation: its event, the spans' end, the error to raise."""
        at = self.attempt if attempt is None else attempt
        self.emit(EscalationEvent(self.scope, at, rule, escalation["reason"], escalation["note"], decision=decision))
        self.attempt_failed(escalation["reason"])  # ended without its verdict acted on (a failed policy)
        if self.span is not None:
            self.span.end("escalate", error_type=escalation["reason"])
        return Escalated(escalation, tool=self.tool, policy_failure=policy_failure)

    def no_task_to_poll(self, kind: str, last_outcome: str) -> Escalated:
        """A poll (or an unknown action) answered a report of no task: the policy is broken; the safe fallback."""
        fault = PolicyBoundaryViolation(f"{kind} answered {self.tool}, which has no task", call="[method]run.record-failure")
        return self.policy_failed(last_outcome, fault)

    def abandon(self, cause: StopCause, in_flight: bool) -> bool:
        """Tells the run the call stopped (`abandon_call`): whether the run now
        lists the call's effect as unknown (a write on the wire)."""
        if self.call_id is None:
            return False
        why = "cancelled" if cause == "cancelled" else "deadline"
        try:
            self.run.abandon_call(self.call_id, self.attempt, in_flight, why)
        except Exception:  # noqa: BLE001 - a call a verdict already ended, or a failed policy: the stop goes on
            pass
        try:
            return any(e["call-id"] == self.call_id and e["status"] == "unknown" for e in self.run.all_effects())
        except Exception:  # noqa: BLE001 - a failed policy cannot say: assume the worst (as Node and Rust do)
            return True

    def stop(
        self, cause: StopCause, limit_ms: int | None, *, in_flight: bool, attempt_out: bool, sent: int, during: str | None = None
    ) -> Stopped:
        """The call stopped by its limit (`limit_ms`) or a cancellation: the
        run is told first (`abandon_call`, so a write on the wire, or a live
        task, is listed as possibly applied), then its stop line, whose reason
        is `stop_reason`'s. `in_flight`: an attempt or a task of the call is
        out; `attempt_out`: an attempt's request is (the call's `attempt`);
        `sent`: its attempts sent; `during`: the pseudo-call in progress for a
        call not sent yet. The record's message is `{tool}: {reason}`."""
        unknown = self.abandon(cause, in_flight)
        writes = self.effect in ("write", "delete")
        may_have_applied = writes and (in_flight or unknown)
        where: StopWhere = "in-flight" if attempt_out else "before-send" if sent == 0 else "between-attempts"
        applied: StopApplied = (
            "nothing-sent"
            if self.call_id is None
            else "not-a-write"
            if not writes
            else "may-have-applied"
            if may_have_applied
            else "not-applied"
        )
        reason = stop_reason(
            cause,
            limit_ms if cause != "cancelled" else None,
            where,
            self.attempt if where == "in-flight" else None,
            during if where == "before-send" else None,
            sent,
            applied,
        )
        self.stopped(cause, reason, cause)
        return Stopped(cause, self.tool, self.call_id, sent, may_have_applied, f"{self.tool}: {reason}")

    def stopped(self, outcome: str, message: str, error_type: str) -> None:
        """The call stopped (its limit, a cancellation, an exception nothing
        maps): its event, the spans' end. The report counts the call's current
        attempt (begun, or planned by a retry) with no verdict: so does this,
        unless that attempt's verdict was counted already (a stop during its status check)."""
        event = AttemptEvent(
            self.scope, self.attempt, self.key, outcome, None, None, "stop", None, None, None, message, counted=self.unreported()
        )
        self.emit(event)
        self.reported = max(self.reported, self.attempt)
        self.attempt_failed(error_type)
        if self.span is not None:
            self.span.end("stop", error_type=error_type)

    def abandon_unknown(self, error: BaseException, reason: str) -> None:
        """An exception nothing maps (a bug): the call is abandoned (its attempt
        counts as sent: a write may have left) and ends."""
        if self.call_id is not None:
            try:
                self.run.abandon_call(self.call_id, self.attempt, True, "cancelled")
            except Exception:  # noqa: BLE001 - the exception the caller must see is theirs
                pass
        self.stopped("unmapped error", reason, type(error).__qualname__)


class Raised(Exception):
    """What a plain function raised that no future or task may carry as it is
    (StopIteration, SystemExit, KeyboardInterrupt, ...): `error`, carried whole."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


def _carriable(error: BaseException) -> BaseException:
    """`error`, or `Raised(error)` when a future cannot hold it (StopIteration) or
    a task would let it out of the event loop (SystemExit, KeyboardInterrupt)."""
    if isinstance(error, (StopIteration, StopAsyncIteration)) or not isinstance(error, Exception):
        return Raised(error)
    return error


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is an async function (or an object whose `__call__` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def in_a_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Runs a plain function in a daemon thread of its own, in a copy of the
    current context: its result as a future of the running loop, which always
    settles (what no future may carry comes as `Raised`). Not the loop's
    executor, whose shutdown would wait for a function left running past the limit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # given up on (the limit passed)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = context.run(fn, *args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, _carriable(e)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for it
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="agent-retry plain call", daemon=True).start()
    return future


async def run_either(fn: Callable[[Any], Any], argument: Any) -> Any:
    """What `fn(argument)` gives (a caller's attempt, a status check): an async
    function awaited on the loop, a plain one run in a thread (an awaitable it
    returns awaited on the loop). Whatever it raises comes out as an
    `Exception` (`Raised` for what a task may not carry), so that it never
    leaves the loop."""
    try:
        value = fn(argument) if is_async(fn) else await in_a_thread(fn, argument)
        return await value if inspect.isawaitable(value) else value
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the function's, not the process's
        raise Raised(e) from e


def check_name(check: Any) -> str:
    """What names a status check in its event (`check_tool`): its `__name__`, else its class's."""
    name = getattr(check, "__name__", None)
    return name if isinstance(name, str) else type(check).__name__


def forget_task(task: asyncio.Future[Any]) -> None:
    """Retrieves an abandoned task's exception, so that it is not reported."""
    if not task.cancelled():
        task.exception()


__all__ = [
    "CallCore",
    "ReplannedBeforeSend",
    "Raised",
    "Report",
    "RunBook",
    "StopApplied",
    "StopWhere",
    "run_either",
    "check_name",
    "forget_task",
    "in_a_thread",
    "is_async",
    "stop_reason",
]
