"""The run-time guard (issue 24): the few invariants no policy may break,
enforced by the wrapper from what it knows itself. The component decides; the
guard does not trust it for these. Pure and I/O-free; its specification is
tests/vectors/guard/guard.json, replayed by every host.

`RunGuard` is built from the configuration text the host holds (never the
component's `effective-config`); a field left out takes its `preset`'s value,
else the default, both generated from the guest (`config_defaults`). Each
check returns a `Violation` or None; the first one is kept
(`RunGuard.violation`): the run sends nothing after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import config_defaults as defaults
from .types import Decision, Observation, StatusCheckResult, ToolHints, action_name

U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
# An answer with one of these is repeated as it was only by a broken policy.
CLIENT_ERROR_STATUSES = frozenset([400, 401, 403, 404, 409, 422])
CLIENT_ERROR_CODES = frozenset([-32600, -32601, -32602])
# After one of these a `reconnect` retry may be what the server asked for: a
# session it refused (with a session id sent) or a revision it did not know.
RECONNECT_STATUSES = frozenset([400, 404])
# The classes a `status-overrides` entry may give a status that make it retryable.
_RETRYABLE_CLASSES = frozenset(["transient", "throttled"])
# Headers in which a server speaks about retrying (lower case): a 4xx that
# carries one is the component's to read. `x-should-retry` only when "true".
_RETRY_WORD_HEADERS = frozenset(["x-envoy-overloaded", "grpc-status", "x-amzn-errortype"])


def speaks_about_retrying(headers: str) -> bool:
    """Whether response headers (one `name: value` line each, as an observation
    carries them) hold a server's own word on retrying."""
    for line in headers.split("\n"):
        name, colon, value = line.partition(":")
        if not colon:
            continue
        name = name.strip().lower()
        if name in _RETRY_WORD_HEADERS or (name == "x-should-retry" and value.strip().lower() == "true"):
            return True
    return False


class Invariant(str, Enum):
    """What a policy broke; the value is the name in the vectors and logs."""

    CLIENT_ERROR_REPEATED = "client-error-repeated"
    UNKNOWN_WRITE_RESENT = "unknown-write-resent"
    TASK_RESENT = "task-resent"
    KEY_CHANGED = "key-changed"
    DELAY_OVER_CAP = "delay-over-cap"
    ATTEMPTS_OVER_BUDGET = "attempts-over-budget"
    VERDICT_DISAGREES = "verdict-disagrees"


@dataclass(frozen=True)
class Violation:
    invariant: Invariant
    detail: str

    def __str__(self) -> str:
        return f"invariant {self.invariant.value}: {self.detail}"


@dataclass(frozen=True)
class Outcome:
    """The facts of one attempt's outcome the guard keeps."""

    http_status: int | None = None
    json_rpc_code: int | None = None
    # An HTTP status, a JSON-RPC error or a tool result came back.
    answered: bool = True
    delivery: str = "unknown"
    transport: str | None = None
    session_id_sent: bool = False
    # The answer carries a server's own word on retrying (`speaks_about_retrying`).
    retry_word: bool = False
    # The answer is a task in this status (`working`, `cancelled`, ...).
    task_status: str | None = None

    @classmethod
    def of(cls, observation: Observation | None) -> Outcome:
        """The facts of a failure's observation; None is an answer (a success, an empty result)."""
        if observation is None:
            return cls()
        kind = observation.get("kind")
        sent = observation.get("session-id-sent") is True
        delivery = observation.get("delivery", "unknown")
        if isinstance(kind, dict) and "transport" in kind:
            return cls(answered=False, delivery=str(delivery), transport=str(kind["transport"]), session_id_sent=sent)
        status = kind.get("http-status") if isinstance(kind, dict) else None
        code = kind.get("protocol-error") if isinstance(kind, dict) else None
        headers = observation.get("headers")
        word = isinstance(headers, str) and speaks_about_retrying(headers)
        return cls(http_status=status, json_rpc_code=code, delivery=str(delivery), session_id_sent=sent, retry_word=word)

    @classmethod
    def task(cls, status: str) -> Outcome:
        """The server answered with (or a poll read) the call's task in `status`."""
        return cls(task_status=status)

    @property
    def unknown(self) -> bool:
        """The request may have left and no answer came back."""
        return not self.answered and self.delivery != "not-sent" and self.transport != "connection-refused"


def _number(section: Mapping[str, Any], name: str, default: int) -> int:
    value = section.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX:
        return value
    return default  # absent or unusable: the policy's own parser refuses the latter anyway


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# What a configuration's `preset` fills in when it leaves a field out, among
# the caps the guard reads: the generated mirror of the guest's
# `Preset::fields` (config_defaults). "default" fills nothing.
_PRESET_CAPS: dict[str, dict[str, int]] = {
    "aws-2026": {
        "max-delay-ms": defaults.AWS_2026_MAX_DELAY_MS,
        "max-attempts-per-call": defaults.AWS_2026_MAX_ATTEMPTS_PER_CALL,
        "hint-cap-over-backoff-ms": defaults.AWS_2026_HINT_CAP_OVER_BACKOFF_MS,
    },
}


def _field(config: Mapping[str, Any], name: str, default: int) -> int:
    """A top-level field the configuration gives, else its preset's, else the default."""
    preset = config.get("preset")
    caps = _PRESET_CAPS.get(preset, {}) if isinstance(preset, str) else {}
    return _number(config, name, caps.get(name, default))


class RunGuard:
    """One run's guard: its caps from the configuration, its step and retry counts, its calls."""

    def __init__(self, config: str | Mapping[str, Any] | None = None) -> None:
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError:
                config = None
        c = _object(config)
        self.max_delay_ms = _field(c, "max-delay-ms", defaults.MAX_DELAY_MS)
        self.max_hint_ms = _number(c, "max-hint-ms", defaults.MAX_HINT_MS)
        # With a hint cap a hinted wait is at most max-delay-ms plus it (0: none, max-hint-ms caps it).
        self.hint_cap_ms = _field(c, "hint-cap-over-backoff-ms", defaults.HINT_CAP_OVER_BACKOFF_MS)
        self.max_attempts_per_call = _field(c, "max-attempts-per-call", defaults.MAX_ATTEMPTS_PER_CALL)
        self.max_retries_per_run = _number(c, "max-retries-per-run", defaults.MAX_RETRIES_PER_RUN)
        self.max_steps_per_run = _number(c, "max-steps-per-run", defaults.MAX_STEPS_PER_RUN)
        self.task_poll_max_delay_ms = _number(c, "task-poll-max-delay-ms", defaults.TASK_POLL_MAX_DELAY_MS)
        self.max_polls_per_task = _number(c, "max-polls-per-task", defaults.MAX_POLLS_PER_TASK)
        account = c.get("account-budget")
        self.account_wait_ms = _number(account, "max-wait-ms", defaults.MAX_WAIT_MS) if isinstance(account, Mapping) else 0
        overrides = _object(c.get("status-overrides"))
        self.retryable_statuses = frozenset(status for status in CLIENT_ERROR_STATUSES if overrides.get(str(status)) in _RETRYABLE_CLASSES)
        effect = c.get("default-effect")
        self.default_effect = effect if effect in ("read", "write", "delete") else defaults.DEFAULT_EFFECT
        self.tools = _object(c.get("tools"))
        self.steps = 0
        self.retries = 0
        self.violation: Violation | None = None

    def cap(self, field: str) -> int:
        """A cap by its configuration name, as this guard read it (the gate's
        `{"$config": field}` matcher); `retry-wait-cap-ms` is the longest wait of
        a retry without a hint: `max-delay-ms` or the account's `max-wait-ms`.
        Raises `KeyError` for a field it does not read."""
        caps = {
            "max-delay-ms": self.max_delay_ms,
            "max-hint-ms": self.max_hint_ms,
            "max-attempts-per-call": self.max_attempts_per_call,
            "max-retries-per-run": self.max_retries_per_run,
            "max-steps-per-run": self.max_steps_per_run,
            "task-poll-max-delay-ms": self.task_poll_max_delay_ms,
            "max-polls-per-task": self.max_polls_per_task,
            "retry-wait-cap-ms": max(self.max_delay_ms, self.account_wait_ms),
        }
        if field not in caps:
            raise KeyError(f"$config names {field!r}; the host reads {', '.join(caps)}")
        return caps[field]

    def _refuse(self, invariant: Invariant, detail: str) -> Violation:
        violation = Violation(invariant, detail)
        if self.violation is None:
            self.violation = violation
        return violation

    def unkeyed_write(self, tool: str, key: str | None, hints: ToolHints | None) -> bool:
        """Whether the call is a write that is not idempotent and carries no key
        (the guest's `tool_policy`, from the configuration and the hints)."""
        entry = _object(self.tools.get(tool))
        hint_names = ("readOnlyHint", "destructiveHint", "idempotentHint")
        if "effect" in entry:
            effect, idempotent = entry["effect"], entry.get("idempotent") is True
        elif any(name in entry for name in hint_names):
            read = entry.get("readOnlyHint") is True
            effect, idempotent = ("read", True) if read else ("write", entry.get("idempotentHint") is True)
        elif hints is not None:
            if hints.get("read-only") is True:
                effect, idempotent = "read", True
            else:
                effect = "write" if self.default_effect == "read" else self.default_effect
                idempotent = hints.get("idempotent") is True
        else:
            effect, idempotent = self.default_effect, False
        return effect == "write" and not idempotent and key is None

    def begin(self, tool: str, key: str | None, hints: ToolHints | None, delay_ms: int) -> tuple[CallGuard, Violation | None]:
        """The policy admitted a call whose first send waits `delay_ms`."""
        call = CallGuard(self, tool, key, self.unkeyed_write(tool, key, hints))
        if delay_ms > self.account_wait_ms:
            return call, self._refuse(
                Invariant.DELAY_OVER_CAP, f"a first send after {delay_ms} ms; the account's wait cap is {self.account_wait_ms} ms"
            )
        if self.steps + 1 > self.max_steps_per_run:
            return call, self._refuse(
                Invariant.ATTEMPTS_OVER_BUDGET, f"a new call after {self.steps} steps; the run allows {self.max_steps_per_run}"
            )
        return call, None


class CallGuard:
    """One call's facts: its key, whether it is an unkeyed write, its attempts,
    its task and the last verdict."""

    def __init__(self, run: RunGuard, tool: str, key: str | None, unkeyed_write: bool) -> None:
        self.run, self.tool, self.key, self.unkeyed_write = run, tool, key, unkeyed_write
        self.attempts = 0
        self.last: Outcome | None = None
        # An attempt of the unkeyed write whose outcome is unknown, or its task cancelled: cleared by `absent`.
        self.maybe_applied = False
        self.found = False
        self.client_error_reconnects = 0
        # A task of the call lives (a status other than `cancelled` seen, no end, no cancel since).
        self.task_live = False
        # The unkeyed write's live task may apply it: cleared by the task's end.
        self.task_unknown = False
        # Poll verdicts for the call's current task.
        self.polls = 0
        # The last verdict's action, delay and reconnect (what `decision` is compared with).
        self.verdict_seen: tuple[str, int, bool] | None = None

    def attempted(self, outcome: Outcome) -> None:
        """An attempt was sent and its outcome observed (a task: the task the server made of it): one step."""
        self.run.steps += 1
        self.attempts += 1
        if outcome.task_status is not None:
            self.polls = 0
        self._facts(outcome)

    def polled(self, outcome: Outcome) -> None:
        """A poll of the call's task read a status (`Outcome.task`) or the
        task's end (its result or error: the call's last facts). Not a step."""
        if outcome.task_status is None:
            self._task_over(cancelled=False)
        self._facts(outcome)

    def poll_failed(self) -> None:
        """A poll of the call's task failed: the task still lives. Not a step."""

    def _facts(self, outcome: Outcome) -> None:
        self.last = outcome
        if outcome.task_status == "cancelled":
            self._task_over(cancelled=True)
        elif outcome.task_status is not None:
            self.task_live = True
            self.task_unknown = self.task_unknown or self.unkeyed_write
        elif self.unkeyed_write and outcome.unknown:
            self.maybe_applied = True

    def _task_over(self, *, cancelled: bool) -> None:
        """The task ended (with its result or error) or was cancelled: it no
        longer lives. A cancelled task of an unkeyed write leaves it unknown."""
        if cancelled and self.unkeyed_write:
            self.maybe_applied = True
        self.task_live = self.task_unknown = False

    def status_checked(self, result: StatusCheckResult) -> None:
        """A status check ran: one step."""
        self.run.steps += 1
        if result == "absent":
            self.maybe_applied = False
        elif result == "found":
            self.found = True

    def verdict(self, action: str, delay_ms: int, hint_ms: int | None, reconnect: bool, *, cancel_task: bool = False) -> Violation | None:
        """Before the wrapper acts on a verdict (`cancel_task`: it cancels the call's task first)."""
        self.verdict_seen = (action, delay_ms, reconnect)
        run = self.run
        if cancel_task and self.task_live:
            self._task_over(cancelled=True)
        if action == "retry":
            violation = self._client_error(reconnect) or self._task_resent() or self._resent() or self._over_budget()
            if violation is not None:
                return violation
            # A hint is waited up to max-hint-ms, or with a hint cap up to the backoff's cap plus it.
            hinted = run.max_delay_ms + run.hint_cap_ms if run.hint_cap_ms else run.max_hint_ms
            cap = max(run.max_delay_ms, hinted if hint_ms is not None else 0, run.account_wait_ms)
            if delay_ms > cap:
                return run._refuse(Invariant.DELAY_OVER_CAP, f"a retry after {delay_ms} ms; the cap is {cap} ms")
            run.retries += 1
        elif action == "poll":
            cap = max(run.task_poll_max_delay_ms, run.max_hint_ms)
            if delay_ms > cap:
                return run._refuse(Invariant.DELAY_OVER_CAP, f"a poll after {delay_ms} ms; the cap is {cap} ms")
            self.polls += 1
            if self.polls > run.max_polls_per_task:
                return run._refuse(
                    Invariant.ATTEMPTS_OVER_BUDGET, f"poll {self.polls} of {self.tool}'s task; a task allows {run.max_polls_per_task}"
                )
        elif action == "check-status" and run.steps + 1 > run.max_steps_per_run:
            return run._refuse(
                Invariant.ATTEMPTS_OVER_BUDGET, f"a status check after {run.steps} steps; the run allows {run.max_steps_per_run}"
            )
        return None

    def _client_error(self, reconnect: bool) -> Violation | None:
        last = self.last
        if last is None:
            return None
        status = last.http_status if last.http_status in CLIENT_ERROR_STATUSES else None
        if status in self.run.retryable_statuses or last.retry_word:
            status = None  # the configuration, or the server itself, says it may be retried
        code = last.json_rpc_code if last.json_rpc_code in CLIENT_ERROR_CODES else None
        if status is None and code is None:
            return None
        what = f"a {status} answer" if status is not None else f"JSON-RPC error {code}"
        if not reconnect:
            return self.run._refuse(Invariant.CLIENT_ERROR_REPEATED, f"the policy asked to retry {what} as it was")
        if status not in RECONNECT_STATUSES:  # no session or revision of this one to renew
            return self.run._refuse(Invariant.CLIENT_ERROR_REPEATED, f"the policy asked to retry {what} on a new connection")
        if last.session_id_sent:
            return None  # the session may be what the server refused
        self.client_error_reconnects += 1
        if self.client_error_reconnects > 1:
            return self.run._refuse(
                Invariant.CLIENT_ERROR_REPEATED, f"the policy asked to retry {what} on a new connection again, with no session to renew"
            )
        return None

    def _task_resent(self) -> Violation | None:
        if self.task_live:
            return self.run._refuse(Invariant.TASK_RESENT, f"a retry of {self.tool} while its task lives (neither ended nor cancelled)")
        return None

    def _resent(self) -> Violation | None:
        if self.found:
            return self.run._refuse(Invariant.UNKNOWN_WRITE_RESENT, f"a retry of {self.tool}, which a status check found applied")
        if self.maybe_applied or self.task_unknown:
            return self.run._refuse(
                Invariant.UNKNOWN_WRITE_RESENT,
                f"a retry of the unkeyed write {self.tool}, which may have been applied, without a status check",
            )
        return None

    def _over_budget(self) -> Violation | None:
        run = self.run
        if self.attempts + 1 > run.max_attempts_per_call:
            detail = f"attempt {self.attempts + 1} of {self.tool}; the call allows {run.max_attempts_per_call}"
        elif run.steps + 1 > run.max_steps_per_run:
            detail = f"a retry after {run.steps} steps; the run allows {run.max_steps_per_run}"
        elif run.retries + 1 > run.max_retries_per_run:
            detail = f"retry {run.retries + 1} of the run; it allows {run.max_retries_per_run}"
        else:
            return None
        return run._refuse(Invariant.ATTEMPTS_OVER_BUDGET, detail)

    def decision(self, decision: Decision) -> Violation | None:
        """When the wrapper reads `last-decision`'s words: they must say what the verdict said."""
        action = decision["action"]
        kind = action_name(action)
        plan: Mapping[str, Any] = action[kind] if kind in ("retry", "poll") else {}  # type: ignore[index,literal-required]
        said = (kind, plan.get("delay-ms", 0), plan.get("reconnect", False))
        seen = self.verdict_seen
        if seen is None or (said[0] != seen[0]) or (kind in ("retry", "poll") and said[1:] != seen[1:]):
            verdict = "no verdict" if seen is None else f"{seen[0]} (delay {seen[1]} ms, reconnect {str(seen[2]).lower()})"
            return self.run._refuse(
                Invariant.VERDICT_DISAGREES,
                f"last-decision says {said[0]} (delay {said[1]} ms, reconnect {str(said[2]).lower()}); the verdict said {verdict}",
            )
        if kind == "retry" and plan.get("idempotency-key") != self.key:
            return self.run._refuse(
                Invariant.KEY_CHANGED, f"the retry plan names key {plan.get('idempotency-key')!r}; the call's is {self.key!r}"
            )
        return None


__all__ = ["CallGuard", "Invariant", "Outcome", "RunGuard", "Violation", "speaks_about_retrying"]
