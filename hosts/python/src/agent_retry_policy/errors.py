"""The errors a host sees. Each says what went wrong and what to do about it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


class AgentRetryError(Exception):
    """Base class of every error this package raises."""


class ComponentNotFound(AgentRetryError, FileNotFoundError):
    """The policy component (.wasm) is not where it was looked for."""

    def __init__(self, path: Path, how_found: str, *, bundled: bool = False) -> None:
        self.path = path
        if how_found == "the repository's build output":
            # An editable install from the repository, whose component is not built.
            fix = (
                "This installation carries no component of its own (an editable install): build it with "
                "`make wasm` in the repository root, or point AGENT_RETRY_WASM (or the `path` argument) at an "
                "agent_retry_policy.wasm. The agent-retry-policy wheel carries one."
            )
        else:
            fix = f"Point {how_found} at an existing agent_retry_policy.wasm"
            if how_found.startswith("$"):
                fix += " or unset it" + (" to use the component bundled with this package" if bundled else "")
            fix += "."
        super().__init__(f"the agent-retry policy component was not found at {path} ({how_found}). {fix}")


class ComponentLoadError(AgentRetryError):
    """The file is not a valid component, or not an agent-retry policy this host can run."""


class ContractVersionMismatch(ComponentLoadError):
    """The component speaks another major version of the contract than this host
    (for 0.x, another 0.minor). Rebuild one of the two from the same `wit/`."""

    def __init__(self, source: str, component_version: str, host_version: str) -> None:
        self.source = source
        self.component_version = component_version
        self.host_version = host_version
        super().__init__(
            f"{source}: the component speaks agent-retry:policy@{component_version} but this host speaks "
            f"@{host_version}; use a component and a host built from the same major version of the contract"
        )


class ComponentImportRefused(ComponentLoadError):
    """The component imports something outside the contract (`import_name`, e.g.
    `wasi:filesystem/preopens@0.2.6`): refused at load, nothing was run."""

    def __init__(self, source: str, import_name: str, imports: list[str]) -> None:
        self.source = source
        self.import_name = import_name
        self.imports = imports
        others = f" (all foreign imports: {', '.join(imports)})" if len(imports) > 1 else ""
        super().__init__(
            f"{source} is not an agent-retry policy this host can run: it imports {import_name}, which is outside the "
            f"agent-retry contract (only agent-retry:policy/account-budget, agent-retry:policy/types and wasi:random/random){others}"
        )


class PolicyTrap(AgentRetryError):
    """The component trapped (a bug, or a sandbox limit: the subclasses). The
    instance is unusable afterwards: make a new one with
    `PolicyComponent.instantiate`. `call` is the export that was running; `kind`
    is "trap", "out-of-fuel", "memory-exceeded" or "boundary-violation". When a
    host import (an account backend's `reserve`/`refund`) raised, that exception
    is the `__cause__`."""

    kind: str = "trap"

    def __init__(self, message: str, *, call: str = "") -> None:
        self.call = call
        super().__init__(message)


class PolicyOutOfFuel(PolicyTrap):
    """A call burned its fuel (`fuel_per_call`, about one unit per wasm
    instruction): the guest was stopped there, the host goes on."""

    kind = "out-of-fuel"


class PolicyMemoryExceeded(PolicyTrap):
    """The guest asked for more linear memory than the cap (`max_memory_bytes`)."""

    kind = "memory-exceeded"


class PolicyBoundaryViolation(PolicyTrap):
    """The guest returned a value the contract does not allow (an enum or variant
    case that does not exist, a string that is not UTF-8, a pointer outside its
    memory)."""

    kind = "boundary-violation"


class PolicyInputTooLarge(AgentRetryError, ValueError):
    """An input over its limit (`agent_retry_policy.limits`: a run id or action id
    over 256 bytes for `derive_idempotency_key`), refused before it crossed the
    boundary: nothing ran, and the instance stays usable. Not a `PolicyTrap`.
    `input` names it (`run-id`, `action-id`); `size_bytes` and `limit_bytes` are
    UTF-8 bytes."""

    kind = "input-too-large"

    def __init__(self, input_name: str, size_bytes: int, limit_bytes: int, *, call: str = "") -> None:
        self.input = input_name
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        self.call = call
        super().__init__(f"{input_name} is {size_bytes} bytes, more than the {limit_bytes} the policy takes; refused before the call")


class InstanceUnusable(AgentRetryError):
    """A call on an instance that trapped before, or on a closed handle."""


class WrongThread(AgentRetryError):
    """An instance was used from a thread other than the one that created it. A
    wasmtime store is not thread-safe, so the call is refused before it reaches
    wasmtime; the instance stays usable from its own thread. Make one instance
    per thread (`PolicyComponent.instantiate` is cheap)."""

    def __init__(self, what: str, owner: str, caller: str) -> None:
        self.owner = owner
        self.caller = caller
        super().__init__(
            f"{what}: this policy instance belongs to thread {owner} and was called from thread {caller}; "
            "instances are not thread-safe: instantiate one per thread"
        )


class ConfigError(AgentRetryError, ValueError):
    """The policy configuration was rejected; nothing was loaded."""

    def __init__(self, kind: str, field: str, message: str) -> None:
        self.kind, self.field, self.message = kind, field, message
        where = f" at {field}" if field else ""
        super().__init__(f"invalid agent-retry configuration ({kind}){where}: {message}")


class ConnectionConfigError(AgentRetryError, ValueError):
    """An `McpConnection` that cannot work as configured: a URL scheme other
    than http or https, `root_certificates_pem` that holds no PEM certificate,
    an unknown `mode`. Raised at construction (never a failure to retry).
    `option` names the argument at fault."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(message)


class RunMisuse(AgentRetryError):
    """The component's `run-error`: the host used a run wrongly (an unknown call id,
    a call already over, an outcome while a status check is due, a run already
    escalated, a report of another attempt than the call's current one:
    `attempt-mismatch`), or an id over 256 bytes (`too-large`, which the host
    answers itself, as the component would, without crossing the boundary).
    Nothing in the run changed. `error` is the canonical run-error, `case` its
    name, `value` its payload."""

    def __init__(self, error: Any) -> None:
        self.error = error  # the canonical run-error, e.g. {"call-finished": 3}
        ((self.case, self.value),) = error.items()
        super().__init__(f"run misuse: {self.case} ({self.value})")


class Escalated(AgentRetryError):
    """The policy stopped the run: a person must act. `note` says why, the last
    error, and which effects were already made."""

    def __init__(
        self, escalation: Any, tool: str | None = None, policy_failure: AgentRetryError | None = None, *, snapshot: str | None = None
    ) -> None:
        self.escalation = escalation
        self.reason: str = escalation["reason"]
        self.note: str = escalation["note"]
        self.tool = tool
        # Set when the policy itself failed (a `PolicyTrap`, or its instance was
        # unusable): the MCP wrapper's safe fallback, no retry and this escalation.
        self.policy_failure = policy_failure
        # The run's snapshot (contract 0.9.0, `Run.snapshot`), taken when the
        # MCP wrapper raised this: store it, and a person's answer resumes the
        # run later in any host (`RetryingToolCaller.resume`). None when the
        # snapshot was refused (another call of the run still open) or the
        # policy itself failed.
        self.snapshot: str | None = snapshot
        super().__init__(self.note)


class SnapshotError(AgentRetryError):
    """A snapshot not taken (`Run.snapshot`) or not resumed
    (`Policy.resume_run`, `RetryingToolCaller.resume`): `kind` is the
    component's `snapshot-error-kind` (`malformed`, `tampered`,
    `other-contract`, `too-large`, `not-escalated`, `calls-open`), `message`
    says what is wrong. Nothing was sent."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"snapshot refused ({kind}): {message}")


class ReplanNeeded(AgentRetryError):
    """The any-call helper's call ended with a message for the model
    (`call_with_policy`): show `message` to the model, which plans again.
    `rule` is the classification rule that decided."""

    def __init__(self, message: str, rule: str | None = None, *, tool: str | None = None) -> None:
        self.message = message
        self.rule = rule
        self.tool = tool
        super().__init__(message)


class ObservedFailure(Exception):
    """Raised by a function run under `call_with_policy` to report what it
    observed directly (a `types.Observation`: `types.http_failure(...)`,
    `types.transport_failure(...)`, ...) instead of an exception to map."""

    def __init__(self, observation: Any) -> None:
        self.observation = observation
        super().__init__(f"observed failure: {observation.get('kind') if isinstance(observation, dict) else observation!r}")


class SessionLost(AgentRetryError):
    """The MCP session is lost and could not be re-established, and the policy
    did not escalate: the caller was built on a bare `ClientSession` (which it
    cannot reconnect), or the policy answered the `initialize` / `tools/list`
    pseudo-call with a replan (e.g. an HTTP 404 on `initialize`). `tool` is the
    model's call it happened in, `reason` what was lost or failed."""

    def __init__(self, reason: str, *, tool: str | None = None) -> None:
        self.reason = reason
        self.tool = tool
        super().__init__(reason)


StopCause = Literal["call-timeout", "run-timeout", "cancelled"]


@dataclass(frozen=True)
class Stopped:
    """What a call stopped by a limit or a cancellation says (`CallTimedOut`,
    `CallCancelled`): `cause` ("call-timeout", "run-timeout" or "cancelled"),
    `tool`, `call_id` (None if the policy had not admitted the call),
    `attempts_sent`, and `may_have_applied`: true when the call is a write or a
    delete (its ticket's `effect`) and either an attempt (or its task) was in
    flight when it stopped or the run's effects list the call as `unknown`.
    `message` is `{tool}: {reason}`, the reason of its stop line
    (docs/events.md, "Stop reasons")."""

    cause: StopCause
    tool: str
    call_id: int | None
    attempts_sent: int
    may_have_applied: bool
    message: str


class _CarriesStopped:
    """The fields of a `Stopped` record as attributes of the error that carries
    it (`CallTimedOut`, `CallCancelled`), and `stopped` as the whole record."""

    def __init__(self, stopped: Stopped) -> None:
        self.stopped = stopped
        self.cause: StopCause = stopped.cause
        self.tool = stopped.tool
        self.call_id = stopped.call_id
        self.attempts_sent = stopped.attempts_sent
        self.may_have_applied = stopped.may_have_applied
        super().__init__(stopped.message)


class CallTimedOut(_CarriesStopped, AgentRetryError, TimeoutError):
    """The call's or the run's wall-clock limit (`call_timeout_s`,
    `run_timeout_s`) passed: the wrapper stopped waiting. The fields of
    `Stopped` are attributes (`cause`, `tool`, `call_id`, `attempts_sent`,
    `may_have_applied`), and `stopped` is the whole record."""


class CallCancelled(_CarriesStopped, asyncio.CancelledError):
    """The task making the call was cancelled: the wrapper stopped waiting at
    once. It is an `asyncio.CancelledError`, so the cancellation propagates as
    one; the attributes are those of `CallTimedOut` (`cause` is "cancelled")."""


class UpdateError(AgentRetryError):
    """A policy update was refused (`agent_retry_policy.live`); the last good
    policy keeps serving. `kind` says which check refused it: "read",
    "integrity", "load", "config", "self-test", "fleet", "older" or
    "nothing-to-roll-back-to"; `reason` says why."""

    kind: str = "update"

    def __init__(self, reason: str, message: str | None = None) -> None:
        self.reason = reason
        super().__init__(message if message is not None else reason)


class UpdateReadError(UpdateError):
    """A file of the update (the .wasm or the configuration) could not be read."""

    kind = "read"

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(reason, f"cannot read {path}: {reason}")


class UpdateIntegrityError(UpdateError):
    """The .wasm's digest does not match the pinned one, or its signature is
    missing or does not verify under the configured key."""

    kind = "integrity"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, f"integrity check failed: {reason}")


class UpdateLoadError(UpdateError):
    """The component cannot run in this host (not a valid component, another
    contract version, foreign imports). `error` is the `ComponentLoadError`."""

    kind = "load"

    def __init__(self, error: ComponentLoadError) -> None:
        self.error = error
        super().__init__(str(error))


class UpdateConfigError(UpdateError):
    """The configuration does not load in the component."""

    kind = "config"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, f"the configuration does not load: {reason}")


class UpdateSelfTestError(UpdateError):
    """The candidate broke an invariant the host relies on, or trapped."""

    kind = "self-test"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, f"the self-test failed: {reason}")


class UpdateFleetError(UpdateError):
    """The fleet's Redis cannot be read, or nothing is published there
    (`LivePolicy.open_redis`)."""

    kind = "fleet"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, f"cannot read the fleet's policy: {reason}")


class UpdateOlderError(UpdateError):
    """The candidate is older than the serving policy: a fleet publication whose
    revision is lower than the serving one's (a stale replica, a Redis restarted
    from an old dump), or files whose newest modification time is before the
    serving files' (the same time is not older: the same files may be reloaded).
    `candidate` and `serving` are the two revisions, or the two times in ns since
    the epoch. A rollback (`LivePolicy.rollback()`) is not an update and is never
    refused as older."""

    kind = "older"

    def __init__(self, reason: str, candidate: int, serving: int) -> None:
        self.candidate, self.serving = candidate, serving
        super().__init__(reason, f"older than the serving policy: {reason}")


class NothingToRollBackTo(UpdateError):
    """`rollback()` with no previous policy."""

    kind = "nothing-to-roll-back-to"

    def __init__(self) -> None:
        super().__init__("there is no previous policy to roll back to")
