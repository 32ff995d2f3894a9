"""The events every wrapper emits (docs/events.md): one dataclass per event, the
same fields in every host. The log lines, the hooks, the metrics and the
OpenTelemetry spans are all made from these, so they cannot disagree.

`to_log(ts)` gives the log line's JSON fields in the documented order (a field
that does not apply is None, `null` in the line); `ts` is Unix seconds with 3
decimals, or None to leave it out (the shared scenario's dumps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .types import Decision, Observation

ATTEMPT = "agent_retry.attempt"
WAIT = "agent_retry.wait"
REPLAN = "agent_retry.replan"
ESCALATION = "agent_retry.escalation"
STATUS_CHECK = "agent_retry.status_check"
TASK_POLL = "agent_retry.task_poll"
POLICY_UPDATE = "agent_retry.policy_update"
BREAKER = "agent_retry.breaker"
RESUME = "agent_retry.resume"
HOOK_FAILED = "agent_retry.hook_failed"


def outcome_words(observation: Observation) -> str:
    """What a failed attempt observed, in the words of docs/events.md that do not
    change: `http 503`, `transport timeout`, `json-rpc -32603`, `tool error`,
    `input required`."""
    kind = observation.get("kind")
    if isinstance(kind, dict):
        if "http-status" in kind:
            return f"http {kind['http-status']}"
        if "transport" in kind:
            return f"transport {kind['transport']}"
        if "protocol-error" in kind:
            return f"json-rpc {kind['protocol-error']}"
        if "tool-error" in kind:
            return "tool error"
    if kind == "input-required":
        return "input required"
    return "failure"


@dataclass(frozen=True)
class CallScope:
    """What every event of one call carries: the run, the policy that decides,
    the step (None for the MCP pseudo-calls), the contract's call id (None
    before the policy admitted the call) and the tool."""

    run: str
    policy: str
    step: int | None
    call: int | None
    tool: str

    def head(self, event: str, ts: float | None) -> dict[str, Any]:
        line: dict[str, Any] = {"event": event}
        if ts is not None:
            line["ts"] = ts
        line.update(run=self.run, policy=self.policy, step=self.step, call=self.call, tool=self.tool)
        return line


class _Scoped:
    """The scope's fields read on the event itself (`event.tool`, `event.policy`, ...)."""

    scope: CallScope

    @property
    def run(self) -> str:
        return self.scope.run

    @property
    def policy(self) -> str:
        return self.scope.policy

    @property
    def step(self) -> int | None:
        return self.scope.step

    @property
    def call(self) -> int | None:
        return self.scope.call

    @property
    def tool(self) -> str:
        return self.scope.tool


@dataclass(frozen=True)
class AttemptEvent(_Scoped):
    """A report's verdict was read: one per attempt, one per status check's
    verdict, one for a call refused before it was sent (attempt 0). `action`
    is the verdict's (`retry`, `replan`, `check-status`, `succeed`, `escalate`,
    `poll`) or `stop` for a call the host stopped. `decision` is the policy's
    words for the verdict, when they were read (a log line at INFO, an
    `on_retry` hook); `reason` is its reason then."""

    scope: CallScope
    attempt: int
    key: str | None
    outcome: str
    klass: str | None
    rule: str | None
    action: str
    delay_ms: int | None
    hint_ms: int | None
    escalation: str | None
    reason: str | None
    invariant: str | None = None
    decision: Decision | None = field(default=None, compare=False, repr=False)
    # Whether the run's report counts it in `attempts`: a sent attempt's verdict,
    # or a stop of an admitted call (its current attempt has no verdict); not a
    # status check's verdict, a task poll's or a refusal. The metrics' count
    # (class "none" for a stop).
    counted: bool = field(default=True, compare=False)

    name = ATTEMPT

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(ATTEMPT, ts)
        line.update(
            attempt=self.attempt,
            key=self.key,
            outcome=self.outcome,
            **{"class": self.klass},
            rule=self.rule,
            action=self.action,
            delay_ms=self.delay_ms,
            hint_ms=self.hint_ms,
            escalation=self.escalation,
            reason=self.reason,
        )
        if self.invariant is not None:  # only on the lines of a broken invariant
            line["invariant"] = self.invariant
        return line


@dataclass(frozen=True)
class WaitEvent(_Scoped):
    """Before the wrapper sleeps: `attempt` is the attempt the wait comes
    before (1 for the admission wait), `why` is `retry`, `poll` or `admission`."""

    scope: CallScope
    attempt: int
    why: str
    wait_ms: int
    hint_ms: int | None
    decision: Decision | None = field(default=None, compare=False, repr=False)

    name = WAIT

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(WAIT, ts)
        line.update(attempt=self.attempt, why=self.why, wait_ms=self.wait_ms, hint_ms=self.hint_ms)
        return line


@dataclass(frozen=True)
class ReplanEvent(_Scoped):
    """A call ends with a message for the model."""

    scope: CallScope
    attempt: int
    rule: str | None
    message: str
    decision: Decision | None = field(default=None, compare=False, repr=False)

    name = REPLAN

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(REPLAN, ts)
        line.update(attempt=self.attempt, rule=self.rule, message=self.message)
        return line


@dataclass(frozen=True)
class EscalationEvent(_Scoped):
    """A call ends with an escalation: `reason` is the contract's escalation
    reason (e.g. `permission-denied`), `note` the hand-off for a person."""

    scope: CallScope
    attempt: int
    rule: str | None
    reason: str
    note: str
    decision: Decision | None = field(default=None, compare=False, repr=False)

    name = ESCALATION

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(ESCALATION, ts)
        line.update(attempt=self.attempt, rule=self.rule, reason=self.reason, note=self.note)
        return line


@dataclass(frozen=True)
class StatusCheckEvent(_Scoped):
    """A status check answered: `result` is `found`, `absent` or `unknown`;
    `check_tool` names what checked (None when nothing could: then `unknown`)."""

    scope: CallScope
    attempt: int
    check_tool: str | None
    result: str

    name = STATUS_CHECK

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(STATUS_CHECK, ts)
        line.update(attempt=self.attempt, check_tool=self.check_tool, result=self.result)
        return line


@dataclass(frozen=True)
class TaskPollEvent(_Scoped):
    """A task's status was read (`status`: the status reported, or `failed poll`)."""

    scope: CallScope
    attempt: int
    task_id: str
    status: str

    name = TASK_POLL

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(TASK_POLL, ts)
        line.update(attempt=self.attempt, task_id=self.task_id, status=self.status)
        return line


@dataclass(frozen=True)
class BreakerEvent(_Scoped):
    """A circuit breaker changed state (`Run.take_breaker_changes`), seen by
    the call whose `begin-call` or report changed it: `server` is the server
    the breaker guards, `breaker_scope` `server` for the server's breaker or
    `tool` for the breaker of one tool on it (the log line's `scope`),
    `from_state` and `to_state` are `closed`, `open` or `half-open` (the
    line's `from` and `to`), `until_ms` until when (the store's clock, ms since
    the Unix epoch) an open breaker sends nothing or a half-open one waits for
    its probe (None when closed), `why` says why in words."""

    scope: CallScope
    server: str
    breaker_scope: str
    from_state: str
    to_state: str
    until_ms: int | None
    why: str

    name = BREAKER

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line = self.scope.head(BREAKER, ts)
        line.update(
            {
                "server": self.server,
                "scope": self.breaker_scope,
                "from": self.from_state,
                "to": self.to_state,
                "until_ms": self.until_ms,
                "why": self.why,
            }
        )
        return line


@dataclass(frozen=True)
class ResumeEvent(_Scoped):
    """An escalated run was resumed from its snapshot with a person's answer
    (`RetryingToolCaller.resume`, contract 0.9.0), once per resume: `answer`
    is `retry`, `done`, `skip` or `abort`; `action` what the run said to do
    with the call that stopped it (`send`, `succeed`, `replan`, `escalate`);
    `attempt` the call's attempt (the one sent, for `send`). The line carries
    `event`, `ts`, `run`, `policy`, `call`, `tool`, `answer`, `action`,
    `attempt` (no step: the call's step was the run's before the snapshot)."""

    scope: CallScope
    answer: str
    action: str
    attempt: int

    name = RESUME

    def to_log(self, ts: float | None) -> dict[str, Any]:
        line: dict[str, Any] = {"event": RESUME}
        if ts is not None:
            line["ts"] = ts
        line.update(
            run=self.scope.run,
            policy=self.scope.policy,
            call=self.scope.call,
            tool=self.scope.tool,
            answer=self.answer,
            action=self.action,
            attempt=self.attempt,
        )
        return line


@dataclass(frozen=True)
class PolicyUpdateEvent:
    """A live update was accepted, refused or rolled back (`outcome`: `accepted`,
    `refused`, `rolled-back`). The log line is the one of 0.7, unchanged:
    `message`, then the new policy's identity fields (`fields`) or the serving
    policy, the refusal's kind and reason."""

    outcome: str
    message: str
    identity: str | None = None
    serving: str | None = None
    kind: str | None = None
    reason: str | None = None
    fields: dict[str, Any] = field(default_factory=dict, compare=False)

    name = POLICY_UPDATE

    def to_log(self, ts: float | None = None) -> dict[str, Any]:
        return {"event": POLICY_UPDATE, "message": self.message, **self.fields}


Event = (
    AttemptEvent
    | WaitEvent
    | ReplanEvent
    | EscalationEvent
    | StatusCheckEvent
    | TaskPollEvent
    | BreakerEvent
    | ResumeEvent
    | PolicyUpdateEvent
)

__all__ = [
    "AttemptEvent",
    "BreakerEvent",
    "CallScope",
    "EscalationEvent",
    "Event",
    "PolicyUpdateEvent",
    "ReplanEvent",
    "ResumeEvent",
    "StatusCheckEvent",
    "TaskPollEvent",
    "WaitEvent",
    "outcome_words",
]
