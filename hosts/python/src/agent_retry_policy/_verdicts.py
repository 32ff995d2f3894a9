"""What the wrappers (the MCP `RetryingToolCaller` and `call_with_policy`) share
about a verdict: its answer with the words read on first use, the safe
fallback's escalation when the policy itself fails, and an escalation bounded
for the host."""

from __future__ import annotations

import copy
from collections.abc import Callable

from .errors import AgentRetryError
from .limits import cut_lifted_text
from .types import Decision, Escalation, Verdict


class Answer:
    """What the policy decided of one report: the verdict's action, delay, next
    attempt and reconnect, and the full decision, read (`last_decision`) when
    first asked for."""

    __slots__ = ("kind", "delay_ms", "next_attempt", "reconnect", "verdict", "_decision", "_read")

    def __init__(self, verdict: Verdict, read: Callable[[], Decision]) -> None:
        self.verdict = verdict
        self._decision: Decision | None = None
        self._read = read
        self.kind: str = verdict.action
        self.delay_ms: int = verdict.delay_ms
        self.next_attempt: int = verdict.attempt + 1
        self.reconnect: bool = verdict.reconnect

    @property
    def decision(self) -> Decision:
        """The full decision (its reason, message, note, escalation)."""
        if self._decision is None:
            self._decision = self._read()
        return self._decision


def policy_failure(tool: str, last_outcome: str, error: AgentRetryError) -> Escalation:
    """The escalation of the safe fallback when the policy failed (a trap, an
    unusable instance, a broken invariant): no retry, and a note saying so."""
    note = cut_lifted_text(
        f"the retry policy failed ({type(error).__name__}: {error}); not retried. Last outcome of {tool}: {last_outcome}. "
        "Effects of this run are not known to the host: check before sending again."
    )
    return {
        "reason": "unclassified-failure",
        "last-error": last_outcome,
        "resets-in-ms": None,
        "effects": [],
        "effects-total": 0,
        "note": note,
    }


def bounded(escalation: Escalation) -> Escalation:
    """An escalation from the policy with its note and last error cut to
    `MAX_LIFTED_TEXT_BYTES`: a deep copy, which a hook given the decision cannot change."""
    escalation = copy.deepcopy(escalation)
    last = escalation.get("last-error")
    return {**escalation, "note": cut_lifted_text(escalation["note"]), "last-error": None if last is None else cut_lifted_text(last)}


def rule_name(rule_names: tuple[str, ...], verdict: Verdict) -> str:
    """The verdict's rule by name (its index into `PolicyInstance.rule_names()`)."""
    index = verdict.rule_index
    return rule_names[index] if index < len(rule_names) else f"rule {index}"
