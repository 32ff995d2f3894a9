"""The errors a host sees. Each says what went wrong and what to do about it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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


class PolicyTrap(AgentRetryError):
    """The component trapped (a bug, fuel or memory exhausted). The instance is
    unusable afterwards: make a new one with `PolicyComponent.instantiate`."""


class InstanceUnusable(AgentRetryError):
    """A call on an instance that trapped before, or on a closed handle."""


class ConfigError(AgentRetryError, ValueError):
    """The policy configuration was rejected; nothing was loaded."""

    def __init__(self, kind: str, field: str, message: str) -> None:
        self.kind, self.field, self.message = kind, field, message
        where = f" at {field}" if field else ""
        super().__init__(f"invalid agent-retry configuration ({kind}){where}: {message}")


class RunMisuse(AgentRetryError):
    """The component's `run-error`: the host used a run wrongly (an unknown call id,
    a call already over, an outcome while a status check is due, a run already
    escalated). Nothing in the run changed."""

    def __init__(self, error: Any) -> None:
        self.error = error  # the canonical run-error, e.g. {"call-finished": 3}
        ((self.case, self.value),) = error.items()
        super().__init__(f"run misuse: {self.case} ({self.value})")


class Escalated(AgentRetryError):
    """The policy stopped the run: a person must act. `note` says why, the last
    error, and which effects were already made."""

    def __init__(self, escalation: Any, tool: str | None = None) -> None:
        self.escalation = escalation
        self.reason: str = escalation["reason"]
        self.note: str = escalation["note"]
        self.tool = tool
        super().__init__(self.note)


class UpdateError(AgentRetryError):
    """A policy update was refused (`agent_retry_policy.live`); the last good
    policy keeps serving. `kind` says which check refused it: "read",
    "integrity", "load", "config", "self-test" or "nothing-to-roll-back-to";
    `reason` says why."""

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


class NothingToRollBackTo(UpdateError):
    """`rollback()` with no previous policy."""

    kind = "nothing-to-roll-back-to"

    def __init__(self) -> None:
        super().__init__("there is no previous policy to roll back to")
