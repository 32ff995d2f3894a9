"""The contract's types (wit/types.wit), typed for Python.

Every value crosses the boundary in the canonical JSON form that the
conformance vectors use (tests/vectors/README.md), so these are `TypedDict`s
and `Literal`s over plain dicts, strings and ints: what the component returns is
already the typed value, with no conversion layer. Keys are the WIT
(kebab-case) names. A variant case without a payload is its name
(`"check-status"`); one with a payload is a one-key dict
(`{"retry": {...}}`), which reads well with `match`:

    match decision["action"]:
        case {"retry": plan}: ...
        case "check-status": ...

Input records may leave out optional fields (options, lists, strings); output
records always carry every field.

The answers of the run's reports (`verdict`, `call-start`: integers, booleans
and enum cases only) are `NamedTuple`s instead, with the WIT names in
snake_case (`class` is `class_`): `Run.record_failure` and friends build them
with no dict at all.
"""

# No `from __future__ import annotations`: the NamedTuples' field types stay
# objects, which the documentation (pdoc) can read off their generated
# `__new__` (as strings they name types of this module it cannot resolve there).
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Union

from typing_extensions import NotRequired, TypedDict

TransportError = Literal["timeout", "connection-reset", "connection-refused", "stream-closed", "tls", "name-resolution", "other"]
# How far a failed request got, as the host's transport saw it.
Delivery = Literal["unknown", "not-sent", "sent", "answer-started"]
OutcomeClass = Literal[
    "success", "transient", "throttled", "deterministic", "permission", "semantic", "misconfigured", "needs-input", "unclassified"
]
Effect = Literal["read", "write", "delete"]
EscalationReason = Literal[
    "permission-denied",
    "replans-spent",
    "call-attempts-spent",
    "run-retries-spent",
    "run-steps-spent",
    "server-wait-too-long",
    "retry-forbidden",
    "account-budget-exhausted",
    "retry-quota-exhausted",
    "unclassified-failure",
    "status-unknown",
    "connection-misconfigured",
    "deadline-too-near",
    "protocol-version-unsupported",
    "input-required",
    "task-expired",
    "task-polls-spent",
    "task-cancelled",
    "circuit-open",
    "retry-budget-exhausted",
    "aborted",
]
EffectStatus = Literal["applied", "unknown"]
# What a task's latest report says (`record_task_status`); a task that completed
# or failed is reported like an attempt (`record_success`, `record_failure`, ...).
TaskStatus = Literal["working", "input-answered", "input-required", "cancelled"]
StatusCheckResult = Literal["found", "absent", "unknown"]
# Why the host stopped a call before a verdict ended it (`Run.abandon_call`).
AbandonReason = Literal["cancelled", "deadline"]
ConfigErrorKind = Literal["syntax", "unknown-field", "wrong-type", "out-of-range", "too-large"]
# What the reports tell the host to do: the case of `action`, without its payload.
ActionKind = Literal["retry", "replan", "check-status", "succeed", "escalate", "poll"]
# What an answer to the `server/discover` probe that is not a discovery result means (`read_probe_answer`).
ProbeAnswer = Literal["older-server", "failure"]

HttpStatusKind = TypedDict("HttpStatusKind", {"http-status": int})


class TransportKind(TypedDict):
    transport: TransportError


ProtocolErrorKind = TypedDict("ProtocolErrorKind", {"protocol-error": int})
ToolErrorKind = TypedDict("ToolErrorKind", {"tool-error": int | None})
# "input-required": the server asked for input no handler of the application
# answered (the observation's `body` carries its questions).
FailureKind = Union[HttpStatusKind, TransportKind, ProtocolErrorKind, ToolErrorKind, Literal["input-required"]]

# One failed attempt as the host observed it: raw facts; the policy decides what they mean.
Observation = TypedDict(
    "Observation",
    {
        "kind": FailureKind,
        # Response headers as received: one `name: value` line each, joined with "\n".
        "headers": NotRequired[str],
        # The body as received, the JSON-RPC error message, or the tool's error text.
        "body": NotRequired[str],
        # The tool result's structuredContent (or a JSON-RPC error's data) as JSON text.
        "structured-content": NotRequired[str | None],
        # Whether the request carried an Mcp-Session-Id header.
        "session-id-sent": NotRequired[bool],
        # How far the request got (default "unknown").
        "delivery": NotRequired[Delivery],
    },
)


class HeaderProblem(TypedDict):
    name: str
    value: str
    problem: str


Classification = TypedDict(
    "Classification",
    {
        "class": OutcomeClass,
        "hint-ms": int | None,
        "hint-source": str | None,
        "server-says-retry": bool | None,
        "rule": str,
        "reason": str,
        "header-problems": list[HeaderProblem],
    },
)

ToolHints = TypedDict(
    "ToolHints",
    {"read-only": NotRequired[bool | None], "destructive": NotRequired[bool | None], "idempotent": NotRequired[bool | None]},
)
EffectRecord = TypedDict("EffectRecord", {"call-id": int, "tool": str, "idempotency-key": str | None, "status": EffectStatus})
Escalation = TypedDict(
    "Escalation",
    {
        "reason": EscalationReason,
        "last-error": str | None,
        "resets-in-ms": int | None,
        # All effects up to 20, else the first 10 and the last 10 (`Run.effects` pages through all).
        "effects": list[EffectRecord],
        "effects-total": int,
        "note": str,
    },
)
# `reconnect`: open a new session (negotiating again) before sending the retry.
RetryPlan = TypedDict("RetryPlan", {"delay-ms": int, "attempt": int, "idempotency-key": str | None, "reconnect": bool})


# What the server said of the call's task (MCP 2026-07-28 Tasks extension).
TaskReport = TypedDict(
    "TaskReport",
    {
        "task-id": str,
        "status": TaskStatus,
        # The server's pollIntervalMs: the shortest wait between polls.
        "poll-interval-ms": NotRequired[int | None],
        # The server's ttlMs.
        "ttl-ms": NotRequired[int | None],
        # now - createdAt, read against the host's clock; None without createdAt.
        "age-ms": NotRequired[int | None],
        # The task's statusMessage, or the questions of "input-required".
        "message": NotRequired[str],
    },
)
# Wait `delay-ms`, then send `tasks/get` for `task-id` (`reconnect`: a new session first).
PollPlan = TypedDict("PollPlan", {"delay-ms": int, "task-id": str, "reconnect": bool})


class RetryAction(TypedDict):
    retry: RetryPlan


class ReplanAction(TypedDict):
    replan: str


class SucceedAction(TypedDict):
    succeed: str | None


class EscalateAction(TypedDict):
    escalate: Escalation


class PollAction(TypedDict):
    poll: PollPlan


Action = Union[RetryAction, ReplanAction, Literal["check-status"], SucceedAction, EscalateAction, PollAction]

Decision = TypedDict(
    "Decision",
    {
        "action": Action,
        "class": OutcomeClass,
        "attempt": int,
        "hint-ms": int | None,
        "rule": str,
        "reason": str,
        "cancel-task": bool,
    },
)


class Verdict(NamedTuple):
    """The answer of every report (`Run.record_success`, `record_empty_result`,
    `record_failure`, `record_status_check`, `record_task_status`,
    `record_poll_failure`), without its prose
    (`Run.last_decision(call_id)` has the reason, a replan's message, a note,
    an escalation)."""

    # What to do.
    action: ActionKind
    # How the outcome was classified (the WIT's `class`).
    class_: OutcomeClass
    # The attempt this verdict answers; a retry sends `attempt + 1`.
    attempt: int
    # A retry's or a poll's wait before sending, in ms; 0 for any other action.
    delay_ms: int
    # The server's wait hint, in ms, if any.
    hint_ms: int | None
    # The rule that decided, as an index into `PolicyInstance.rule_names()`.
    rule_index: int
    # Whether the action carries text for the model or a person (a replan's
    # message, a success's note, an escalation): `Run.last_decision` has it.
    has_note: bool
    # Whether the retry or the poll needs a new session first (the server lost
    # the session, or refused the client's MCP revision). Only with "retry" and "poll".
    reconnect: bool
    # Whether the host must cancel the call's task (`tasks/cancel`) before it
    # acts: the policy stops waiting for a task that is still alive.
    cancel_task: bool
    # Whether this report changed a circuit breaker (`Run.take_breaker_changes` says how).
    breaker_changed: bool


class CallStart(NamedTuple):
    """The answer of `Run.begin_call`."""

    # Whether the first attempt may be sent; False when the run escalated
    # instead (`Run.escalation()` gives the hand-off).
    admitted: bool
    # The call's id in this run (0 when not admitted).
    call_id: int
    # How long to wait before sending, in ms (the account budget's wait).
    delay_ms: int
    # The effect the policy resolved for the tool.
    effect: Effect
    # Whether a failed attempt may be repeated without a status check.
    safe_to_repeat: bool
    # How long an attempt may go without an answer or a progress notification,
    # in ms (each progress notification starts it again).
    idle_timeout_ms: int
    # The longest an attempt may take in all, progress or not, in ms.
    attempt_timeout_ms: int
    # Whether the call is over before it was sent, as a replan: a circuit
    # breaker of its server is open. `Run.last_decision(call_id)` has the
    # message for the model; `admitted` is False, and no attempt was spent.
    replan: bool
    # Whether `begin_call` changed a circuit breaker (a probe was let through):
    # `Run.take_breaker_changes` says how.
    breaker_changed: bool


# A circuit breaker's state.
BreakerState = Literal["closed", "open", "half-open"]

# One change of a circuit breaker's state (`Run.take_breaker_changes`): the
# server it guards, the tool for a tool's breaker (None for the server's), the
# states before and after, until when (store clock, ms since the Unix epoch) an
# open breaker sends nothing or a half-open one waits for its probe (None when
# closed), and why, in words.
BreakerChange = TypedDict(
    "BreakerChange",
    {
        "server": str,
        "tool": str | None,
        "old-state": BreakerState,
        "new-state": BreakerState,
        "until-ms": int | None,
        "why": str,
    },
)

# What the `shared-state` import's `load` found under a key: the text (None
# when nothing is stored, or it expired), its version (0 when nothing is
# stored) and the store's clock (an embedded store gives the `now-ms` it was passed).
Loaded = TypedDict("Loaded", {"value": str | None, "version": int, "now-ms": int})


class StatusCount(TypedDict):
    status: int
    count: int


RunReport = TypedDict(
    "RunReport",
    {
        "run-id": str,
        "calls": int,
        "attempts": int,
        "retries": int,
        "status-checks": int,
        "replans": int,
        # Calls answered by a task, and task polls decided (not attempts, not steps).
        "tasks": int,
        "polls": int,
        "succeeded-calls": int,
        # Calls the host stopped (`Run.abandon_call`).
        "abandoned-calls": int,
        "waits": int,
        "waited-ms": int,
        "escalation": EscalationReason | None,
        "statuses": list[StatusCount],
        # All effects up to 20, else the first 10 and the last 10 (`Run.effects` pages through all).
        "effects": list[EffectRecord],
        "effects-total": int,
    },
)

# Resuming an escalated run (contract 0.9.0: `Run.snapshot`, `Policy.resume_run`, `Run.resumed_call`).

# What the host does with the call a resumed run names.
ResumedAction = Literal["send", "succeed", "replan", "escalate"]
# Why a snapshot was not taken or not resumed (`errors.SnapshotError.kind`).
SnapshotErrorKind = Literal["malformed", "tampered", "other-contract", "too-large", "not-escalated", "calls-open"]


# A refused snapshot or resume, as the component answers it.
class SnapshotErrorValue(TypedDict):
    kind: SnapshotErrorKind
    message: str


# A `call-start` as the generic path lifts it (the `ticket` of a resumed call).
CallStartValue = TypedDict(
    "CallStartValue",
    {
        "admitted": bool,
        "call-id": int,
        "delay-ms": int,
        "effect": Effect,
        "safe-to-repeat": bool,
        "idle-timeout-ms": int,
        "attempt-timeout-ms": int,
        "replan": bool,
        "breaker-changed": bool,
    },
)
# The call that stopped a run, after `Policy.resume_run` (`Run.resumed_call`):
# its key and arguments unchanged, what to do now (`action`), and for `send`
# the attempt to send (`ticket`, as `begin_call` answers it; report it as
# attempt `attempt`); for `succeed`, the person's result (`result-text`).
ResumedCall = TypedDict(
    "ResumedCall",
    {
        "call-id": int,
        "tool": str,
        "server": str | None,
        "idempotency-key": str | None,
        "arguments-json": str | None,
        "action": ResumedAction,
        "ticket": CallStartValue | None,
        "attempt": int,
        "result-text": str | None,
    },
)
ResumeAnswerKind = Literal["retry", "done", "skip", "abort"]


@dataclass(frozen=True)
class ResumeAnswer:
    """A person's answer to an escalation (`Policy.resume_run`,
    `RetryingToolCaller.resume`): `ResumeAnswer.retry()` sends the stopped
    call again with the same key; `ResumeAnswer.done(result)` treats it as
    succeeded (`result` is what the model gets); `ResumeAnswer.skip()` tells
    the model it was skipped; `ResumeAnswer.abort()` ends the run. The
    escalation's note and the snapshot's `answers` say which are safe."""

    kind: ResumeAnswerKind
    result: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("retry", "done", "skip", "abort"):
            raise ValueError(f"a resume answer is retry, done, skip or abort, not {self.kind!r}")
        if self.result is not None and (self.kind != "done" or not isinstance(self.result, str)):
            raise ValueError("only `done` carries a result, and it is a string")

    @classmethod
    def retry(cls) -> "ResumeAnswer":
        return cls("retry")

    @classmethod
    def done(cls, result: str | None = None) -> "ResumeAnswer":
        return cls("done", result)

    @classmethod
    def skip(cls) -> "ResumeAnswer":
        return cls("skip")

    @classmethod
    def abort(cls) -> "ResumeAnswer":
        return cls("abort")

    def canonical(self) -> "str | dict[str, str | None]":
        """The `resume-answer` variant in canonical JSON: `"retry"`, `{"done": text}`, `"skip"`, `"abort"`."""
        return {"done": self.result} if self.kind == "done" else self.kind


# run-error: a host's misuse of a run. Every case carries a payload.
UnknownCall = TypedDict("UnknownCall", {"unknown-call": int})
CallFinished = TypedDict("CallFinished", {"call-finished": int})
StatusCheckPending = TypedDict("StatusCheckPending", {"status-check-pending": int})
NoStatusCheckPending = TypedDict("NoStatusCheckPending", {"no-status-check-pending": int})
RunEnded = TypedDict("RunEnded", {"run-ended": EscalationReason})
# A poll's failure reported for a call that has no task.
NoTask = TypedDict("NoTask", {"no-task": int})
# An attempt reported that is not the call's current one.
AttemptMismatch = TypedDict("AttemptMismatch", {"call-id": int, "expected": int, "reported": int})
AttemptMismatchError = TypedDict("AttemptMismatchError", {"attempt-mismatch": AttemptMismatch})
# An input over its limit: `run-id`, `tool`, `idempotency-key` or `task-id`, in UTF-8 bytes.
SizeLimit = TypedDict("SizeLimit", {"input": str, "size-bytes": int, "limit-bytes": int})
TooLarge = TypedDict("TooLarge", {"too-large": SizeLimit})
RunError = Union[UnknownCall, CallFinished, StatusCheckPending, NoStatusCheckPending, RunEnded, NoTask, AttemptMismatchError, TooLarge]


class ConfigErrorValue(TypedDict):
    kind: ConfigErrorKind
    field: str
    message: str


# Constructors for the observations a host builds most often.


def join_headers(headers: Sequence[Sequence[str]]) -> str:
    """Header pairs as an observation carries them: one `name: value` line each,
    joined with "\n"; a CR or LF inside a name or value becomes a space."""
    from .limits import join_headers as join

    return join(headers)


def http_failure(status: int, headers: Sequence[Sequence[str]] | str = (), body: str = "", *, session_id_sent: bool = False) -> Observation:
    """An attempt answered with a non-2xx HTTP status (`headers` as pairs or as
    joined lines)."""
    return {
        "kind": {"http-status": status},
        "headers": headers if isinstance(headers, str) else join_headers(headers),
        "body": body,
        "structured-content": None,
        "session-id-sent": session_id_sent,
        "delivery": "answer-started",
    }


def transport_failure(
    error: TransportError, body: str = "", *, delivery: Delivery = "unknown", session_id_sent: bool = False
) -> Observation:
    """An attempt that got no response; `delivery` says how far it got."""
    return {
        "kind": {"transport": error},
        "headers": "",
        "body": body,
        "structured-content": None,
        "session-id-sent": session_id_sent,
        "delivery": delivery,
    }


def protocol_failure(
    code: int, message: str = "", headers: Sequence[Sequence[str]] | str = (), data: str | None = None, *, session_id_sent: bool = False
) -> Observation:
    """A JSON-RPC error object with this code; `data` is its `data` member as JSON text."""
    return {
        "kind": {"protocol-error": code},
        "headers": headers if isinstance(headers, str) else join_headers(headers),
        "body": message,
        "structured-content": data,
        "session-id-sent": session_id_sent,
        "delivery": "answer-started",
    }


def json_text(value: object) -> str | None:
    """A value as the JSON text an observation carries (a tool's structured
    content, a JSON-RPC error's data); None for None or a value that is not JSON."""
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON: nothing the policy could read
        return None


def tool_error(
    text: str, structured_content: str | None = None, *, upstream_status: int | None = None, session_id_sent: bool = False
) -> Observation:
    """A tool result with `isError: true`: its text content blocks joined with
    "\n", its `structuredContent` as JSON text. The policy reads the upstream
    failure from both; pass `upstream_status` only if the host knows it from a
    place it trusts (its own convention with the server)."""
    return {
        "kind": {"tool-error": upstream_status},
        "headers": "",
        "body": text,
        "structured-content": structured_content,
        "session-id-sent": session_id_sent,
        "delivery": "answer-started",
    }


def input_required(questions: str, *, session_id_sent: bool = False) -> Observation:
    """A request answered `input_required` that no handler of the application
    answered: `questions` are the server's (its input requests' messages)."""
    return {
        "kind": "input-required",
        "headers": "",
        "body": questions,
        "structured-content": None,
        "session-id-sent": session_id_sent,
        "delivery": "answer-started",
    }


def action_name(action: Action) -> str:
    """The action's case name: "retry", "replan", "check-status", "succeed", "escalate" or "poll"."""
    return action if isinstance(action, str) else next(iter(action))
