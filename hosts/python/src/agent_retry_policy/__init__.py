"""agent-retry for Python: the policy component in wasmtime, its imports, typed
wrappers, and a retrying wrapper around the MCP SDK's `ClientSession.call_tool`
(`McpConnection`, `RetryingToolCaller`; the `mcp` extra).

    from agent_retry_policy import PolicyComponent, now_ms
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy({"tools": {"lookup_order": {"effect": "read"}}})
    run = policy.start_run("CASE-5016")
    start = run.begin_call("lookup_order", None, None, now_ms())
    verdict = run.record_failure(start.call_id, 1, types.http_failure(503), None, now_ms(), entropy)
    decision = run.last_decision(start.call_id)   # the words, when needed
"""

from . import limits, limits_generated, types, wit_types
from .accounts import PROCESS_ACCOUNTS, PROCESS_SHARED_STATE, AccountBudgetBackend, Bucket, EmbeddedAccounts, Reservation, gcra
from .component import (
    CONTRACT_VERSION,
    FUEL_PER_CALL,
    FUEL_PER_CONFIG_BYTE,
    MAX_MEMORY_BYTES,
    Policy,
    PolicyComponent,
    PolicyInstance,
    Run,
    check_contract_version,
    locate_component,
    now_ms,
)
from .entropy import EntropySource, OsEntropy, SplitMix64
from .errors import (
    AgentRetryError,
    CallCancelled,
    CallTimedOut,
    ComponentImportRefused,
    ComponentLoadError,
    ComponentNotFound,
    ConfigError,
    ConnectionConfigError,
    ContractVersionMismatch,
    Escalated,
    InstanceUnusable,
    NothingToRollBackTo,
    ObservedFailure,
    PolicyBoundaryViolation,
    PolicyInputTooLarge,
    PolicyMemoryExceeded,
    PolicyOutOfFuel,
    PolicyTrap,
    ReplanNeeded,
    RunMisuse,
    SessionLost,
    SnapshotError,
    Stopped,
    UpdateConfigError,
    UpdateError,
    UpdateFleetError,
    UpdateIntegrityError,
    UpdateLoadError,
    UpdateOlderError,
    UpdateReadError,
    UpdateSelfTestError,
    WrongThread,
)
from .events import (
    AttemptEvent,
    BreakerEvent,
    CallScope,
    EscalationEvent,
    PolicyUpdateEvent,
    ReplanEvent,
    ResumeEvent,
    StatusCheckEvent,
    TaskPollEvent,
    WaitEvent,
)
from .fleet import FleetSource, publish_policy
from .hooks import Hooks
from .live import Integrity, LivePolicy, Loaded, PolicyIdentity, PolicySource
from .manifest import ManifestError, sign_publication
from .metrics import RetryMetrics
from .redis_accounts import AccountsError, RedisAccounts, SharedAccounts
from .redis_shared_state import FallbackSharedState, RedisSharedState, SharedStateError
from .shared_state import EmbeddedSharedState, SharedStateBackend
from .types import ResumeAnswer

# The MCP wrapper needs the `mcp` extra: imported when first asked for (and so
# left out of `__all__`, which a star import without the extra would fail on).
_MCP_NAMES = ("McpConnection", "RetryingToolCaller")
# The any-call helper loads OpenTelemetry's API when it is installed: imported when first asked for.
_ANY_CALL_NAMES = ("Attempt", "call_with_policy")


def __getattr__(name: str) -> object:
    if name in _MCP_NAMES:
        from . import mcp_client

        return getattr(mcp_client, name)
    if name in _ANY_CALL_NAMES:
        from . import any_call

        return getattr(any_call, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AccountBudgetBackend",
    "AccountsError",
    "AgentRetryError",
    "AttemptEvent",
    "BreakerEvent",
    "Bucket",
    "CallCancelled",
    "CallScope",
    "CallTimedOut",
    "ComponentImportRefused",
    "ComponentLoadError",
    "ComponentNotFound",
    "CONTRACT_VERSION",
    "ConfigError",
    "ConnectionConfigError",
    "ContractVersionMismatch",
    "EmbeddedAccounts",
    "EmbeddedSharedState",
    "EntropySource",
    "EscalationEvent",
    "FleetSource",
    "Escalated",
    "FUEL_PER_CALL",
    "FUEL_PER_CONFIG_BYTE",
    "FallbackSharedState",
    "Hooks",
    "InstanceUnusable",
    "Integrity",
    "LivePolicy",
    "Loaded",
    "ManifestError",
    "MAX_MEMORY_BYTES",
    "NothingToRollBackTo",
    "ObservedFailure",
    "OsEntropy",
    "PROCESS_ACCOUNTS",
    "PROCESS_SHARED_STATE",
    "Policy",
    "PolicyComponent",
    "PolicyBoundaryViolation",
    "PolicyIdentity",
    "PolicyInputTooLarge",
    "PolicyInstance",
    "PolicyMemoryExceeded",
    "PolicyOutOfFuel",
    "PolicySource",
    "PolicyTrap",
    "PolicyUpdateEvent",
    "RedisAccounts",
    "RedisSharedState",
    "ReplanEvent",
    "ReplanNeeded",
    "ResumeAnswer",
    "ResumeEvent",
    "Reservation",
    "RetryMetrics",
    "Run",
    "RunMisuse",
    "SessionLost",
    "SharedAccounts",
    "SharedStateBackend",
    "SharedStateError",
    "SnapshotError",
    "SplitMix64",
    "StatusCheckEvent",
    "Stopped",
    "TaskPollEvent",
    "UpdateConfigError",
    "UpdateError",
    "UpdateFleetError",
    "UpdateIntegrityError",
    "UpdateLoadError",
    "UpdateOlderError",
    "UpdateReadError",
    "UpdateSelfTestError",
    "WaitEvent",
    "WrongThread",
    "check_contract_version",
    "gcra",
    "limits",
    "limits_generated",
    "locate_component",
    "now_ms",
    "publish_policy",
    "sign_publication",
    "types",
    "wit_types",
]
