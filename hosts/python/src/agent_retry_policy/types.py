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
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence, Union

from typing_extensions import NotRequired, TypedDict

TransportError = Literal["timeout", "connection-reset", "connection-refused", "stream-closed", "other"]
OutcomeClass = Literal["success", "transient", "throttled", "deterministic", "permission", "semantic", "unclassified"]
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
]
EffectStatus = Literal["applied", "unknown"]
StatusCheckResult = Literal["found", "absent", "unknown"]
ConfigErrorKind = Literal["syntax", "unknown-field", "wrong-type", "out-of-range"]

HttpStatusKind = TypedDict("HttpStatusKind", {"http-status": int})
TransportKind = TypedDict("TransportKind", {"transport": TransportError})
ProtocolErrorKind = TypedDict("ProtocolErrorKind", {"protocol-error": int})
ToolErrorKind = TypedDict("ToolErrorKind", {"tool-error": Optional[int]})
FailureKind = Union[HttpStatusKind, TransportKind, ProtocolErrorKind, ToolErrorKind]

Failure = TypedDict(
    "Failure",
    {
        "kind": FailureKind,
        "headers": NotRequired[Sequence[Sequence[str]]],
        "body": NotRequired[str],
        # The tool result's structuredContent (or a JSON-RPC error's data) as JSON text.
        "structured-content": NotRequired[Optional[str]],
    },
)

EmptyResultOutcome = TypedDict("EmptyResultOutcome", {"empty-result": str})
FailureOutcome = TypedDict("FailureOutcome", {"failure": Failure})
StatusCheckOutcome = TypedDict("StatusCheckOutcome", {"status-check": StatusCheckResult})
Outcome = Union[Literal["success"], EmptyResultOutcome, FailureOutcome, StatusCheckOutcome]

HeaderProblem = TypedDict("HeaderProblem", {"name": str, "value": str, "problem": str})
Classification = TypedDict(
    "Classification",
    {
        "class": OutcomeClass,
        "hint-ms": Optional[int],
        "hint-source": Optional[str],
        "server-says-retry": Optional[bool],
        "rule": str,
        "reason": str,
        "header-problems": list[HeaderProblem],
    },
)

ToolHints = TypedDict(
    "ToolHints",
    {"read-only": NotRequired[Optional[bool]], "destructive": NotRequired[Optional[bool]], "idempotent": NotRequired[Optional[bool]]},
)
CallRequest = TypedDict(
    "CallRequest",
    {"tool": str, "idempotency-key": NotRequired[Optional[str]], "hints": NotRequired[Optional[ToolHints]]},
)
CallTicket = TypedDict("CallTicket", {"call-id": int, "delay-ms": int, "effect": Effect, "safe-to-repeat": bool})
EffectRecord = TypedDict(
    "EffectRecord", {"call-id": int, "tool": str, "idempotency-key": Optional[str], "status": EffectStatus}
)
Escalation = TypedDict(
    "Escalation",
    {
        "reason": EscalationReason,
        "last-error": Optional[str],
        "resets-in-ms": Optional[int],
        "effects": list[EffectRecord],
        "note": str,
    },
)
RetryPlan = TypedDict("RetryPlan", {"delay-ms": int, "attempt": int, "idempotency-key": Optional[str]})

RetryAction = TypedDict("RetryAction", {"retry": RetryPlan})
ReplanAction = TypedDict("ReplanAction", {"replan": str})
SucceedAction = TypedDict("SucceedAction", {"succeed": Optional[str]})
EscalateAction = TypedDict("EscalateAction", {"escalate": Escalation})
Action = Union[RetryAction, ReplanAction, Literal["check-status"], SucceedAction, EscalateAction]

Decision = TypedDict(
    "Decision",
    {"action": Action, "class": OutcomeClass, "attempt": int, "hint-ms": Optional[int], "rule": str, "reason": str},
)

SendAdmission = TypedDict("SendAdmission", {"send": CallTicket})
EscalateAdmission = TypedDict("EscalateAdmission", {"escalate": Escalation})
Admission = Union[SendAdmission, EscalateAdmission]

StatusCount = TypedDict("StatusCount", {"status": int, "count": int})
RunReport = TypedDict(
    "RunReport",
    {
        "run-id": str,
        "calls": int,
        "attempts": int,
        "retries": int,
        "status-checks": int,
        "replans": int,
        "succeeded-calls": int,
        "waits": int,
        "waited-ms": int,
        "escalation": Optional[EscalationReason],
        "statuses": list[StatusCount],
        "effects": list[EffectRecord],
    },
)

# run-error: a host's misuse of a run. Every case carries a payload.
UnknownCall = TypedDict("UnknownCall", {"unknown-call": int})
CallFinished = TypedDict("CallFinished", {"call-finished": int})
StatusCheckPending = TypedDict("StatusCheckPending", {"status-check-pending": int})
NoStatusCheckPending = TypedDict("NoStatusCheckPending", {"no-status-check-pending": int})
RunEnded = TypedDict("RunEnded", {"run-ended": EscalationReason})
RunError = Union[UnknownCall, CallFinished, StatusCheckPending, NoStatusCheckPending, RunEnded]

ConfigErrorValue = TypedDict("ConfigErrorValue", {"kind": ConfigErrorKind, "field": str, "message": str})


# Constructors for the values a host builds most often.


def http_failure(status: int, headers: Sequence[Sequence[str]] = (), body: str = "") -> FailureOutcome:
    """An attempt answered with a non-2xx HTTP status."""
    return {"failure": {"kind": {"http-status": status}, "headers": [tuple(h) for h in headers], "body": body}}


def transport_failure(error: TransportError, body: str = "") -> FailureOutcome:
    """An attempt that got no response."""
    return {"failure": {"kind": {"transport": error}, "body": body}}


def protocol_failure(
    code: int, message: str = "", headers: Sequence[Sequence[str]] = (), data: Optional[str] = None
) -> FailureOutcome:
    """A JSON-RPC error object with this code; `data` is its `data` member as JSON text."""
    return {
        "failure": {
            "kind": {"protocol-error": code},
            "headers": [tuple(h) for h in headers],
            "body": message,
            "structured-content": data,
        }
    }


def tool_error(text: str, structured_content: Optional[str] = None, *, upstream_status: Optional[int] = None) -> FailureOutcome:
    """A tool result with `isError: true`: its text content blocks joined with
    "\n", its `structuredContent` as JSON text. The policy reads the upstream
    failure from both; pass `upstream_status` only if the host knows it from a
    place it trusts (its own convention with the server)."""
    return {"failure": {"kind": {"tool-error": upstream_status}, "body": text, "structured-content": structured_content}}


def empty_result(what: str) -> EmptyResultOutcome:
    """A success whose result is empty or unusable."""
    return {"empty-result": what}


def status_check(result: StatusCheckResult) -> StatusCheckOutcome:
    """What a status check found, after a `check-status` decision."""
    return {"status-check": result}


def action_name(action: Action) -> str:
    """The action's case name: "retry", "replan", "check-status", "succeed" or "escalate"."""
    return action if isinstance(action, str) else next(iter(action))
