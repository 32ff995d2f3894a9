"""Loading the policy component in wasmtime and calling it.

    component = PolicyComponent.load()          # compile once per process
    instance = component.instantiate()          # one per worker (thread / task)
    policy = instance.load_policy({"max-attempts-per-call": 3})
    run = policy.start_run("CASE-5016")

One run path (contract 0.8.0, kept by 0.9.0): a call is begun, each attempt reported, and
every report answers with a small tuple (`Verdict`); the prose is built only
when asked for:

    start = run.begin_call("lookup_order", None, None, now_ms(), server="https://mcp.example.com/mcp")  # CallStart
    observation = types.http_failure(503, [("retry-after", "1")])
    verdict = run.record_failure(start.call_id, 1, observation, None, now_ms(), entropy)
    verdict.action, verdict.delay_ms, verdict.reconnect                  # "retry", 1000, False
    run.record_success(start.call_id, verdict.attempt + 1, now_ms())
    run.last_decision(start.call_id)                                     # the full decision, when words are needed

`server` names the MCP server for the circuit breakers (None: no breaker
applies). A call whose server's breaker is open is not admitted, with
`start.replan` set: `run.last_decision(start.call_id)` has the message for the
model, and nothing is sent. When a `CallStart` or a `Verdict` says
`breaker_changed`, `run.take_breaker_changes()` says how (for the log).

A call answered by a task (MCP Tasks) is reported with `record_task_status`
(each poll's `working` / `input-required` / ...), a failed poll with
`record_poll_failure`; the verdict's `poll` says when to poll again.

An escalated run is resumable (contract 0.9.0): `run.snapshot(arguments_json,
now_ms)` is a versioned JSON document with a digest that any host resumes with
a person's answer, `policy.resume_run(snapshot, ResumeAnswer.retry(), now_ms)`;
`resumed.resumed_call()` says what to do with the call that stopped it (a
refusal raises `SnapshotError`, its `kind` the contract's).

The sandbox matches the Rust and Node hosts': the component gets only the
account budget, the shared state (`shared_state.py`: the circuit breakers'
store) and `wasi:random/random` (no WASI, so no file, socket, clock or
environment; another import is refused at load with `ComponentImportRefused`),
each call runs on a fuel budget (`fuel_per_call`; `policy.from-json` also gets
`fuel_per_config_byte` for each byte of its text), and the instance's memory is
capped (`max_memory_bytes`). A call that fails raises `PolicyTrap`, or the
subclass naming its cause (`PolicyOutOfFuel`, `PolicyMemoryExceeded`,
`PolicyBoundaryViolation`), and leaves that instance unusable
(`InstanceUnusable`); the host goes on with a fresh one. An instance belongs to
the thread that created it: a call from another thread raises `WrongThread`
before it reaches wasmtime.

What the host passes is bounded before it crosses (`limits.py`): an
observation's body cut to 64 KiB, at most 128 headers of 4 KiB, structured
content over 64 KiB dropped; ids over 256 bytes and a configuration over 1 MiB
are refused with the answer the component would give, without a call.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.resources
import itertools
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from ctypes import byref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from wasmtime import Config, Engine, Store, WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import Component, ComponentInstanceType, FuncType, Linker, ResourceAny

from . import (
    _codec,  # first: refuses an unsupported wasmtime-py with a clear message
    _sandbox,
    limits,
)
from .accounts import PROCESS_ACCOUNTS, PROCESS_SHARED_STATE, AccountBudgetBackend, Bucket
from .entropy import EntropySource, OsEntropy, random_bytes
from .errors import (
    ComponentImportRefused,
    ComponentLoadError,
    ComponentNotFound,
    ConfigError,
    ContractVersionMismatch,
    InstanceUnusable,
    PolicyBoundaryViolation,
    PolicyInputTooLarge,
    PolicyMemoryExceeded,
    PolicyOutOfFuel,
    PolicyTrap,
    RunMisuse,
    SnapshotError,
    WrongThread,
)
from .shared_state import MAX_VALUE_BYTES, EmbeddedSharedState, SharedStateBackend
from .types import (
    AbandonReason,
    BreakerChange,
    CallStart,
    Classification,
    Decision,
    EffectRecord,
    Escalation,
    Observation,
    ProbeAnswer,
    ResumeAnswer,
    ResumedCall,
    RunReport,
    StatusCheckResult,
    TaskReport,
    ToolHints,
    Verdict,
)

# The contract this host speaks (wit/). A component of another major version
# (for 0.x, another 0.minor: semver's caret rule) is refused at load time; one of
# a compatible version is run under its own interface names.
CONTRACT_PACKAGE = "agent-retry:policy"
CONTRACT_VERSION = "0.9.0"
POLICY_INTERFACE = f"{CONTRACT_PACKAGE}/policy@{CONTRACT_VERSION}"
ACCOUNT_BUDGET_INTERFACE = f"{CONTRACT_PACKAGE}/account-budget@{CONTRACT_VERSION}"
SHARED_STATE_INTERFACE = f"{CONTRACT_PACKAGE}/shared-state@{CONTRACT_VERSION}"
TYPES_INTERFACE = f"{CONTRACT_PACKAGE}/types@{CONTRACT_VERSION}"
RANDOM_INTERFACE_PREFIX = "wasi:random/random@0.2."
_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:[-+][0-9A-Za-z.+-]*)?")

# Fuel for one call (about one unit per wasm instruction): ~1000x what a decision
# needs, so a policy stuck in a loop traps instead of hanging the host.
FUEL_PER_CALL = 20_000_000
# Fuel `policy.from-json` gets on top of FUEL_PER_CALL for each byte of the
# configuration text: a configuration's cost is linear in its bytes (435 units a
# byte for the costliest shape measured, 904 in the Node host's upper-bound
# count; 10,000 MCP tools take about 83 million) and it is loaded off the
# decision path, once per update. The same in every host.
FUEL_PER_CONFIG_BYTE = 2_000
# The most linear memory one instance may grow to.
MAX_MEMORY_BYTES = 64 << 20

# Where `make wasm` puts the component, relative to the repository root.
REPO_WASM_PATH = Path("target/component/agent_retry_policy.wasm")
WASM_ENV_VAR = "AGENT_RETRY_WASM"
# The component the wheel carries (package data, next to this file).
BUNDLED_WASM = "agent_retry_policy.wasm"

EXPORTED_FUNCTIONS = (
    "derive-idempotency-key",
    "rule-names",
    "read-probe-answer",
    "[static]policy.from-json",
    "[method]policy.effective-config",
    "[method]policy.classify",
    "[method]policy.next-delay",
    "[method]policy.start-run",
    "[method]policy.resume-run",
    "[method]run.begin-call",
    "[method]run.record-success",
    "[method]run.record-empty-result",
    "[method]run.record-failure",
    "[method]run.record-status-check",
    "[method]run.record-task-status",
    "[method]run.record-poll-failure",
    "[method]run.abandon-call",
    "[method]run.last-decision",
    "[method]run.escalation",
    "[method]run.take-breaker-changes",
    "[method]run.report",
    "[method]run.snapshot",
    "[method]run.resumed-call",
    "[method]run.effects",
)

# The run's calls: the parameters each export must take (checked at load, as
# the fast path writes `begin-call` and `record-success` by kind) and the
# records of their answers, read in place.
_BEGIN_CALL = "[method]run.begin-call"
_RECORD_SUCCESS = "[method]run.record-success"
_RECORD_EMPTY = "[method]run.record-empty-result"
_RECORD_FAILURE = "[method]run.record-failure"
_RECORD_STATUS = "[method]run.record-status-check"
_RECORD_TASK = "[method]run.record-task-status"
_RECORD_POLL_FAILURE = "[method]run.record-poll-failure"
_FLAT_PARAMS = {
    _BEGIN_CALL: ("borrow", "option<string>", "string", "option<string>", "option<record>", "u64"),
    _RECORD_SUCCESS: ("borrow", "u32", "u32", "u64"),
    _RECORD_EMPTY: ("borrow", "u32", "u32", "string", "u64"),
    _RECORD_FAILURE: ("borrow", "u32", "u32", "record", "option<u64>", "u64", "u64"),
    _RECORD_STATUS: ("borrow", "u32", "u32", "enum", "option<u64>", "u64", "u64"),
    _RECORD_TASK: ("borrow", "u32", "u32", "record", "option<u64>", "u64", "u64"),
    _RECORD_POLL_FAILURE: ("borrow", "u32", "u32", "record", "option<u64>", "u64", "u64"),
}
_VERDICT_EXPORTS = (_RECORD_SUCCESS, _RECORD_EMPTY, _RECORD_FAILURE, _RECORD_STATUS, _RECORD_TASK, _RECORD_POLL_FAILURE)
_VERDICT = _codec.FlatRecord(
    [
        ("action", "enum"),
        ("class", "enum"),
        ("attempt", "u32"),
        ("delay-ms", "u64"),
        ("hint-ms", "option<u64>"),
        ("rule-index", "u16"),
        ("has-note", "bool"),
        ("reconnect", "bool"),
        ("cancel-task", "bool"),
        ("breaker-changed", "bool"),
    ]
)
_CALL_START = _codec.FlatRecord(
    [
        ("admitted", "bool"),
        ("call-id", "u32"),
        ("delay-ms", "u64"),
        ("effect", "enum"),
        ("safe-to-repeat", "bool"),
        ("idle-timeout-ms", "u64"),
        ("attempt-timeout-ms", "u64"),
        ("replan", "bool"),
        ("breaker-changed", "bool"),
    ]
)

# The export that loads a configuration (on its own fuel budget, `fuel_per_config_byte`).
_FROM_JSON = "[static]policy.from-json"
_EFFECTIVE_CONFIG = "[method]policy.effective-config"
# Resuming a snapshot runs on a load's tank too (linear in the document's bytes).
_RESUME_RUN = "[method]policy.resume-run"

# The most effects one `run.effects` call returns (the contract's page).
EFFECTS_PAGE = 1_000


def now_ms() -> int:
    """Milliseconds since the Unix epoch, from the wall clock (what `now-ms` means)."""
    return time.time_ns() // 1_000_000


def contract_compatibility(version: str) -> tuple[int, ...]:
    """What must be equal for two contract versions to be compatible: the major
    (`1.4.2` -> `(1,)`), or for 0.x the minor (`0.2.0` -> `(0, 2)`), or for 0.0.x
    the patch: semver's caret rule. Raises ValueError for a version that is not
    semver."""
    matched = _SEMVER.fullmatch(version)
    if matched is None:
        raise ValueError(f"{version!r} is not a semantic version")
    major, minor, patch = (int(part) for part in matched.groups())
    if major:
        return (major,)
    return (0, minor) if minor else (0, 0, patch)


def component_identity(contract_version: str, wasm_sha256: str) -> str:
    """`agent-retry:policy@<version> wasm <first 12 hex digits of the SHA-256>`."""
    return f"{CONTRACT_PACKAGE}@{contract_version} wasm {wasm_sha256[:12]}"


def policy_interface_versions(export_names: Iterable[str]) -> list[str]:
    """The versions of `agent-retry:policy/policy@X.Y.Z` among a component's export names."""
    prefix = f"{CONTRACT_PACKAGE}/policy@"
    return [name[len(prefix) :] for name in export_names if name.startswith(prefix)]


def check_contract_version(export_names: Iterable[str], source: str = "<bytes>") -> str:
    """The contract version a component speaks, read from its export names.
    Raises `ContractVersionMismatch` (a `ComponentLoadError`) naming both versions
    if it is not compatible with this host's, `ComponentLoadError` if it exports
    no policy interface at all."""
    names = list(export_names)
    versions = policy_interface_versions(names)
    if not versions:
        raise ComponentLoadError(
            f"{source} is not an agent-retry policy: it does not export {CONTRACT_PACKAGE}/policy@{CONTRACT_VERSION} "
            f"(it is of another world: it exports [{', '.join(names)}])"
        )
    ours = contract_compatibility(CONTRACT_VERSION)
    for version in versions:
        try:
            compatible = contract_compatibility(version) == ours
        except ValueError:
            compatible = False
        if compatible:
            return version
    raise ContractVersionMismatch(source, versions[0], CONTRACT_VERSION)


def _contract_interface(name: str) -> str | None:
    """`account-budget` for `agent-retry:policy/account-budget@V` (and
    `shared-state` for `.../shared-state@V`, ...) with V
    compatible with this host's contract; None for any other name."""
    prefix = f"{CONTRACT_PACKAGE}/"
    interface, at, version = name.partition("@")
    if not interface.startswith(prefix) or not at:
        return None
    try:
        compatible = contract_compatibility(version) == contract_compatibility(CONTRACT_VERSION)
    except ValueError:
        return None
    return interface[len(prefix) :] if compatible else None


def _repo_root() -> Path:
    # src/agent_retry_policy/component.py -> hosts/python/src/agent_retry_policy: four
    # levels up is the repository when the package is installed editable (`pip install -e`).
    return Path(__file__).resolve().parents[4]


def bundled_component() -> Path | None:
    """The .wasm the installed package carries (the wheel's package data), or
    None (an editable install from the repository carries none)."""
    resource = importlib.resources.files(__package__ or "agent_retry_policy") / BUNDLED_WASM
    if not resource.is_file():
        return None
    path = Path(str(resource))
    return path if path.is_file() else None


def locate_component(path: str | os.PathLike[str] | None = None) -> Path:
    """The .wasm to load: `path`, else $AGENT_RETRY_WASM, else the component
    bundled in the package, else the repository's build output (an editable
    install). Raises `ComponentNotFound` naming the fix if it is missing."""
    if path is not None:
        candidate, how = Path(path), "the path argument"
    elif os.environ.get(WASM_ENV_VAR):
        candidate, how = Path(os.environ[WASM_ENV_VAR]), f"${WASM_ENV_VAR}"
    else:
        bundled = bundled_component()
        if bundled is not None:
            return bundled
        candidate, how = _repo_root() / REPO_WASM_PATH, "the repository's build output"
    if not candidate.is_file():
        raise ComponentNotFound(candidate, how, bundled=bundled_component() is not None)
    return candidate


# Raw C entry points, looked up once (the wasmtime-py wrappers add a Python frame each).
_func_call = ffi.wasmtime_component_func_call
_set_fuel = ffi.wasmtime_context_set_fuel
_val_delete = ffi.wasmtime_component_val_delete
_Val = ffi.wasmtime_component_val_t
# The ctypes functions themselves, for the flat hot path (same prototypes, no wrapper frame).
_raw_func_call = ffi.dll.wasmtime_component_func_call
_raw_set_fuel = ffi.dll.wasmtime_context_set_fuel
_raw_val_delete = ffi.dll.wasmtime_component_val_delete
_VAL_SIZE = ctypes.sizeof(_Val)
_BOOL_KIND = ffi.WASMTIME_COMPONENT_BOOL.value
# char arrays by length, for reading an enum case's name in place (`_chars`).
_CHAR_ARRAYS = [ctypes.c_char * size for size in range(64)]


def _chars(address: int, size: int) -> bytes:
    """The `size` bytes at `address` (an enum case's name), read in place."""
    if size < len(_CHAR_ARRAYS):
        return _CHAR_ARRAYS[size].from_address(address).raw
    return ctypes.string_at(address, size)


_result_head = _codec._RESULT_HEAD.unpack_from
_RECORD_DATA = _codec._RECORD_DATA
_PTR_AT = _codec._PTR_AT
_U64_AT = _codec._U64_AT
_UNION = _codec._UNION
_new_tuple = tuple.__new__
_U32_MAX = 0xFFFF_FFFF
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_RESOURCE_KIND = ffi.WASMTIME_COMPONENT_RESOURCE.value
_STRING_KIND = ffi.WASMTIME_COMPONENT_STRING.value
_OPTION_KIND = ffi.WASMTIME_COMPONENT_OPTION.value
_U32_KIND = ffi.WASMTIME_COMPONENT_U32.value
_U64_KIND = ffi.WASMTIME_COMPONENT_U64.value
# The most lowered tool hints a component keeps (`_lowered_value`).
_LOWERED_MAX = 4_096
_HINT_NAMES = frozenset(("read-only", "destructive", "idempotent"))


@dataclass(frozen=True)
class _ExportSpec:
    """One exported function: its index and its codecs, read once per component."""

    name: str
    index: Any
    params: tuple[_codec.Codec, ...]
    result: _codec.Codec | None


class PolicyComponent:
    """A compiled, checked policy component, ready to instantiate many times."""

    _cache: dict[tuple[str, int, int], PolicyComponent] = {}
    _cache_lock = threading.Lock()

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> PolicyComponent:
        """The component at `locate_component(path)`, compiled once per process
        (and again only if the file changes)."""
        located = locate_component(path).resolve()
        stat = located.stat()
        key = (str(located), stat.st_mtime_ns, stat.st_size)
        with cls._cache_lock:
            component = cls._cache.get(key)
            if component is None:
                component = cls(located.read_bytes(), source=str(located))
                cls._cache[key] = component
            return component

    def __init__(self, wasm: bytes, *, source: str = "<bytes>") -> None:
        """Compiles and checks a component from its bytes."""
        config = Config()
        config.consume_fuel = True
        _sandbox.configure(config)  # the memory cap, with its refusals seen (_sandbox.py)
        self.engine = Engine(config)
        self.source = source
        # The SHA-256 of the bytes compiled (hex): with the contract version, the
        # component's identity (`identity`), which every decision log line names.
        self.wasm_sha256 = hashlib.sha256(wasm).hexdigest()
        try:
            self.component = Component(self.engine, wasm)
        except WasmtimeError as e:
            raise ComponentLoadError(f"{source} is not a valid WebAssembly component: {e}") from e
        component_type = self.component.type
        self.imports = list(component_type.imports(self.engine))
        self.exports = list(component_type.exports(self.engine))
        # The version first, so that a component of another contract says so
        # rather than failing on a name further down.
        self.contract_version = check_contract_version(self.exports, source)
        self.policy_interface = f"{CONTRACT_PACKAGE}/policy@{self.contract_version}"
        # The contract's imports, at whatever compatible version the component names them.
        contract_imports = {name for name in self.imports if _contract_interface(name) in ("account-budget", "shared-state", "types")}
        unknown = [name for name in self.imports if name not in contract_imports and not name.startswith(RANDOM_INTERFACE_PREFIX)]
        if unknown:
            raise ComponentImportRefused(source, unknown[0], unknown)
        budgets = [name for name in contract_imports if _contract_interface(name) == "account-budget"]
        if len(budgets) > 1:
            raise ComponentLoadError(f"{source} must import {ACCOUNT_BUDGET_INTERFACE} at most once, imports {budgets}")
        # None: the component never consults the account budget (its toolchain
        # left the unused import out, as for the benchmark's no-op component);
        # the Rust host links the import whether or not it is used, too.
        self.account_budget_interface: str | None = budgets[0] if budgets else None
        states = [name for name in contract_imports if _contract_interface(name) == "shared-state"]
        if len(states) > 1:
            raise ComponentLoadError(f"{source} must import {SHARED_STATE_INTERFACE} at most once, imports {states}")
        # None: the component never consults the shared state (no circuit breakers).
        self.shared_state_interface: str | None = states[0] if states else None
        self.random_imports = [name for name in self.imports if name.startswith(RANDOM_INTERFACE_PREFIX)]
        import_types = component_type.imports(self.engine)
        if self.shared_state_interface is not None:
            state = _import_codecs(self.engine, import_types[self.shared_state_interface].ty)
            if "load" not in state or "store-if" not in state:
                raise ComponentLoadError(f"{source}: {self.shared_state_interface} lacks load or store-if")
            self._load_codecs = state["load"]
            self._store_if_codecs = state["store-if"]
        if self.account_budget_interface is not None:
            budget = _import_codecs(self.engine, import_types[self.account_budget_interface].ty)
            if "reserve" not in budget or "refund" not in budget:
                raise ComponentLoadError(f"{source}: {self.account_budget_interface} lacks reserve or refund")
            self._reserve_codecs = budget["reserve"]
            self._refund_codecs = budget["refund"]
        # Per wasi:random interface, the functions it imports (get-random-u64, get-random-bytes).
        self._random_codecs = {name: _import_codecs(self.engine, import_types[name].ty) for name in self.random_imports}
        interface_index = self.component.get_export_index(self.policy_interface)
        if interface_index is None:
            raise ComponentLoadError(f"{source} does not export {self.policy_interface}")
        interface_type = component_type.exports(self.engine)[self.policy_interface].ty
        assert isinstance(interface_type, ComponentInstanceType)
        functions: dict[str, Any] = interface_type.exports(self.engine)
        specs = {}
        for name in EXPORTED_FUNCTIONS:
            index = self.component.get_export_index(name, interface_index)
            if index is None or name not in functions:
                raise ComponentLoadError(f"{source} does not export {self.policy_interface} function {name}")
            func_type = functions[name].ty
            assert isinstance(func_type, FuncType)
            result = func_type.result
            specs[name] = _ExportSpec(
                name=name,
                index=index,
                params=tuple(_codec.build(ty) for _, ty in func_type.params),
                result=_codec.build(result) if result is not None else None,
            )
        self._specs = specs
        # The flat hot path reads and writes its values by kind: their types must be the contract's.
        for name, expected in _FLAT_PARAMS.items():
            have = tuple(_codec.shape(codec) for codec in specs[name].params)
            if have != expected:
                raise ComponentLoadError(f"{source}: {name} takes ({', '.join(have)}), not the contract's ({', '.join(expected)})")
        for name, record in (*((name, _VERDICT) for name in _VERDICT_EXPORTS), (_BEGIN_CALL, _CALL_START)):
            problem = record.check(specs[name].result)
            if problem is not None:
                raise ComponentLoadError(f"{source}: {name} does not answer the contract's record: {problem}")
        verdict_type = specs[_RECORD_SUCCESS].result
        self._actions = _codec.enum_names(_codec.record_field(verdict_type, "action"))
        self._classes = _codec.enum_names(_codec.record_field(verdict_type, "class"))
        self._effect_names = _codec.enum_names(_codec.record_field(specs[_BEGIN_CALL].result, "effect"))
        # Lowered `option<tool-hints>` values, by value: `begin-call` copies
        # them into its arguments instead of lowering each time (a few at
        # most; they live as long as the component).
        self._lowered: dict[Any, Any] = {}

    def _lowered_value(self, key: Any, codec: _codec.Codec, value: Any) -> Any:
        """`value` lowered by `codec` into a C value kept for the component's
        life (a flat call copies it into its arguments and never frees it), or
        None once `_LOWERED_MAX` values are kept. Raises ValueConversionError."""
        cached = self._lowered.get(key)
        if cached is None:
            if len(self._lowered) >= _LOWERED_MAX:
                return None
            value_c = _Val()
            codec.lower(value, value_c)
            cached = self._lowered.setdefault(key, value_c)
            if cached is not value_c:  # another thread kept the same value first
                _val_delete(byref(value_c))
        return cached

    @property
    def identity(self) -> str:
        """Which policy this is: the contract version it speaks and the first 12
        hex digits of its .wasm's SHA-256, e.g. `agent-retry:policy@0.9.0 wasm
        1a2b3c4d5e6f` (the same string in the Rust and Node hosts)."""
        return component_identity(self.contract_version, self.wasm_sha256)

    def instantiate(
        self,
        *,
        accounts: AccountBudgetBackend = PROCESS_ACCOUNTS,
        entropy: EntropySource | None = None,
        fuel_per_call: int | None = FUEL_PER_CALL,
        fuel_per_config_byte: int = FUEL_PER_CONFIG_BYTE,
        max_memory_bytes: int = MAX_MEMORY_BYTES,
        shared_state: SharedStateBackend | None = None,
    ) -> PolicyInstance:
        """A fresh instance with its own memory. `accounts` defaults to the buckets
        shared by the whole process; `shared_state` (the circuit breakers'
        store) to the one beside `accounts` (`EmbeddedAccounts.shared_state`),
        else the process's (`PROCESS_SHARED_STATE`); across machines,
        `FallbackSharedState.open(url)` (Redis, redis_shared_state.py); `entropy` (for `wasi:random`, used only when
        a call passes no entropy) to the OS. `fuel_per_call` (None: unmetered),
        `fuel_per_config_byte` and `max_memory_bytes` are the sandbox's limits:
        every call runs on `fuel_per_call`, except `policy.from-json`, which runs
        on `fuel_per_call + fuel_per_config_byte * <the text's UTF-8 bytes>` (a
        configuration's cost is linear in its bytes, and it is loaded off the
        decision path). One instance serves one thread: the one that calls this."""
        if fuel_per_call is not None and (isinstance(fuel_per_call, bool) or not isinstance(fuel_per_call, int) or fuel_per_call <= 0):
            raise ValueError(f"fuel_per_call must be a positive integer or None, got {fuel_per_call!r}")
        _check_fuel_per_config_byte(fuel_per_config_byte)
        if isinstance(max_memory_bytes, bool) or not isinstance(max_memory_bytes, int) or max_memory_bytes <= 0:
            raise ValueError(f"max_memory_bytes must be a positive integer, got {max_memory_bytes!r}")
        if shared_state is None:
            beside = getattr(accounts, "shared_state", None)
            shared_state = beside if isinstance(beside, EmbeddedSharedState) else PROCESS_SHARED_STATE
        return PolicyInstance(
            self,
            accounts,
            entropy if entropy is not None else OsEntropy(),
            fuel_per_call,
            max_memory_bytes,
            fuel_per_config_byte=fuel_per_config_byte,
            shared_state=shared_state,
        )


def _check_fuel_per_config_byte(fuel_per_config_byte: int) -> None:
    if isinstance(fuel_per_config_byte, bool) or not isinstance(fuel_per_config_byte, int) or fuel_per_config_byte < 0:
        raise ValueError(f"fuel_per_config_byte must be a whole number of units (0: none more than a call's), got {fuel_per_config_byte!r}")


class _BoundExport:
    __slots__ = ("spec", "func", "func_ref")

    def __init__(self, spec: _ExportSpec, func: Any) -> None:
        self.spec = spec
        self.func = func
        self.func_ref = ctypes.pointer(func)  # made once: the flat hot path passes it as is


def _one_line(message: str) -> str:
    """wasmtime's "context\n\nCaused by:\n    cause" as "cause (context)"."""
    context, caused_by, cause = message.strip().partition("Caused by:")
    context = " ".join(context.split())
    if not caused_by:
        return context
    cause = " ".join(cause.split())
    return f"{cause} ({context})" if context else cause


class _CallState:
    """What the host imports of one instance saw during its current call: the
    exception one of them raised. Per instance, so a trap carries the exception of
    its own call, whichever thread another instance runs on."""

    __slots__ = ("exception",)

    def __init__(self) -> None:
        self.exception: BaseException | None = None


class PolicyInstance:
    """One store and one instance of the component. Not thread-safe: it belongs to
    the thread that created it, and a call from another thread raises
    `WrongThread` (before it reaches wasmtime). Use one per worker thread (or per
    asyncio loop; calls never block)."""

    def __init__(
        self,
        component: PolicyComponent,
        accounts: AccountBudgetBackend,
        entropy: EntropySource,
        fuel_per_call: int | None,
        max_memory_bytes: int = MAX_MEMORY_BYTES,
        *,
        fuel_per_config_byte: int = FUEL_PER_CONFIG_BYTE,
        shared_state: SharedStateBackend | None = None,
    ) -> None:
        _check_fuel_per_config_byte(fuel_per_config_byte)
        self.component = component
        self.accounts = accounts
        self.shared_state: SharedStateBackend = shared_state if shared_state is not None else PROCESS_SHARED_STATE
        self.entropy = entropy
        self._fuel = fuel_per_call
        # `policy.from-json` runs on fuel_per_call plus this per byte of its text:
        # a configuration's cost is linear in its bytes, and it is loaded off the
        # decision path.
        self.fuel_per_config_byte = fuel_per_config_byte
        # The tank the last call was given (fuel_per_call, or from-json's), and the
        # configuration bytes it was sized for (None: not from-json).
        self._tank = fuel_per_call
        self._config_bytes: int | None = None
        # The configuration bytes each policy handle was loaded from:
        # effective-config serialises the whole configuration, so it runs on the
        # same tank as the load (the raw `call` path finds it here).
        self._policy_config_bytes: weakref.WeakKeyDictionary[ResourceAny, int] = weakref.WeakKeyDictionary()
        self.max_memory_bytes = max_memory_bytes
        self._broken: str | None = None
        self._owner = threading.get_ident()
        self._owner_name = threading.current_thread().name
        self._calls = _CallState()
        self._memory = _sandbox.MemoryLimits(max_memory_bytes)
        engine = component.engine
        self._store = Store(engine)
        self._context = self._store._context()
        if not _sandbox.AVAILABLE:  # pragma: no cover - not POSIX: wasmtime's limiter, refusals unseen
            self._store.set_limits(memory_size=max_memory_bytes)
        # The engine always meters fuel; "no limit" is a tank that never runs dry.
        # Instantiation (start functions; the data segments, copied in since the
        # memories are the host's, which wasmtime meters too: ~15,000 units for
        # this component) gets at least the default call's fuel; calls refuel.
        self._store.set_fuel(max(fuel_per_call, FUEL_PER_CALL) if fuel_per_call is not None else _codec.U64_MAX)
        linker = Linker(engine)
        calls = self._calls
        with linker.root() as root:
            if component.account_budget_interface is not None:
                with root.add_instance(component.account_budget_interface) as budget:
                    _add_import(budget, "reserve", component._reserve_codecs, _reserve_import(accounts), calls)
                    _add_import(budget, "refund", component._refund_codecs, _refund_import(accounts), calls)
            if component.shared_state_interface is not None:
                with root.add_instance(component.shared_state_interface) as state:
                    _add_import(state, "load", component._load_codecs, _load_import(self.shared_state), calls)
                    _add_import(state, "store-if", component._store_if_codecs, self.shared_state.store_if, calls)
            for name in component.random_imports:
                functions = component._random_codecs[name]
                with root.add_instance(name) as random:
                    if "get-random-u64" in functions:
                        _add_import(random, "get-random-u64", functions["get-random-u64"], entropy.next_u64, calls)
                    if "get-random-bytes" in functions:
                        _add_import(random, "get-random-bytes", functions["get-random-bytes"], _random_bytes_import(entropy), calls)
        try:
            # The memory cap is enforced by the memories themselves (_sandbox.py),
            # which need to know the instance they are created for.
            with _sandbox.creating(self._memory):
                instance = linker.instantiate(self._store, component.component)
            if fuel_per_call is not None:
                self._store.set_fuel(fuel_per_call)
        except WasmtimeError as e:
            raise ComponentLoadError(f"{component.source} cannot be instantiated by this host: {e}") from e
        self._exports: dict[str, _BoundExport] = {}
        for name, spec in component._specs.items():
            func = instance.get_func(self._store, spec.index)
            if func is None:
                raise ComponentLoadError(f"{component.source}: {name} is not a function")
            self._exports[name] = _BoundExport(spec, func._func)
        self._rule_names: tuple[str, ...] | None = None

    @property
    def policy_identity(self) -> str:
        """The identity of the component this instance runs (`PolicyComponent.identity`)."""
        return self.component.identity

    def memory_bytes(self) -> int:
        """The size of the instance's largest linear memory, in bytes."""
        return self._memory.largest

    def fuel_used_by_last_call(self) -> int:
        """The fuel the last call burned (0 when unmetered): the tank it was given
        (from-json's larger one for a configuration) minus what was left."""
        if self._tank is None:
            return 0
        return self._tank - self._store.get_fuel()

    def _check_thread(self, what: str) -> None:
        if threading.get_ident() != self._owner:
            current = threading.current_thread()
            raise WrongThread(what, f"{self._owner_name!r} (id {self._owner})", f"{current.name!r} (id {current.ident})")

    # The low-level call: canonical values in, canonical values out.

    def call(self, name: str, *args: Any) -> Any:
        """Calls the policy interface's export `name` (its WIT name, e.g.
        `[method]run.begin-call`) with canonical-JSON arguments (resources as
        `ResourceAny`) and returns the canonical-JSON result."""
        bound = self._exports.get(name)
        if bound is None:
            raise KeyError(f"{self.component.policy_interface} has no function {name!r}")
        if name == _FROM_JSON and len(args) == 1 and isinstance(args[0], str):
            # Its load budget, counting bytes up to the 1 MiB limit (over it the
            # policy refuses the text before parsing it).
            size = min(limits.utf8_size(args[0]), limits.MAX_CONFIG_BYTES)
            result = self._invoke(bound, args, size)
            if isinstance(result, dict) and isinstance(result.get("ok"), ResourceAny):
                self._policy_config_bytes[result["ok"]] = size
            return result
        if name == _RESUME_RUN and len(args) == 4 and isinstance(args[1], str):
            # A load's tank for the snapshot's bytes, up to the 2 MiB limit (over it the policy refuses before reading).
            return self._invoke(bound, args, min(limits.utf8_size(args[1]), limits.MAX_SNAPSHOT_BYTES))
        if name == _EFFECTIVE_CONFIG and len(args) == 1 and isinstance(args[0], ResourceAny):
            # The load's tank, for a handle this instance's from-json returned.
            return self._invoke(bound, args, self._policy_config_bytes.get(args[0]))
        return self._invoke(bound, args)

    def _invoke(self, bound: _BoundExport, args: tuple[Any, ...], config_bytes: int | None = None, into: _FlatArgs | None = None) -> Any:
        """Calls an export on a full tank: `fuel_per_call`, plus
        `fuel_per_config_byte` for each of `config_bytes` (from-json's text, or
        for effective-config the text its policy was loaded from). With `into`,
        the result is left unlifted in `into.result` (the caller reads, frees
        and resets it) and that is returned."""
        spec = bound.spec
        if threading.get_ident() != self._owner:  # before anything touches the store
            self._check_thread(spec.name)
        if self._broken is not None:
            raise InstanceUnusable(f"this policy instance failed earlier ({self._broken}); instantiate a new one")
        codecs = spec.params
        if len(args) != len(codecs):
            raise TypeError(f"{spec.name} takes {len(codecs)} arguments, got {len(args)}")
        context = self._store._context()
        if self._fuel is not None:
            tank = self._fuel if config_bytes is None else self._fuel + self.fuel_per_config_byte * config_bytes
            self._tank, self._config_bytes = tank, config_bytes
            error = _set_fuel(context, tank)
            if error:
                raise WasmtimeError._from_ptr(error)
        self._memory.refused = None
        self._calls.exception = None
        params = (_Val * len(codecs))()
        lowered = 0
        try:
            for codec, arg in zip(codecs, args, strict=False):
                try:
                    codec.lower(arg, params[lowered])
                except _codec.ValueConversionError as e:
                    raise _codec.ValueConversionError(f"{spec.name}: argument {lowered + 1}: {e}") from None
                lowered += 1
            result = _Val() if into is None else into.result
            error = _func_call(byref(bound.func), context, params, lowered, byref(result), 1 if spec.result else 0)
            if error:
                self._fail(spec.name, WasmtimeError._from_ptr(error))
            if into is not None:
                return result
            return spec.result.lift(result) if spec.result is not None else None
        finally:
            for i in range(lowered):
                _val_delete(byref(params[i]))

    def _fail(self, name: str, error: WasmtimeError) -> None:
        """Marks the instance broken (the component model forbids re-entering an
        instance after a trap) and raises the most specific `PolicyTrap`."""
        host_exception, self._calls.exception = self._calls.exception, None
        message = _one_line(str(error))
        trap: PolicyTrap
        if host_exception is not None:
            trap = PolicyTrap(f"{name} trapped: a host import raised {host_exception!r}", call=name)
            cause: BaseException = host_exception
        elif self._memory.refused is not None:
            trap = PolicyMemoryExceeded(
                f"{name} asked for more memory than the cap of {self.max_memory_bytes} bytes "
                f"(a growth to {self._memory.refused} bytes was refused; then {message})",
                call=name,
            )
            cause = error
        elif self._fuel is not None and self._store.get_fuel() == 0:
            if self._config_bytes is None:
                tank = f"{self._tank} units a call"
            else:
                tank = (
                    f"{self._tank} units: {self._fuel} a call + {self.fuel_per_config_byte} a configuration byte"
                    f" x {self._config_bytes} bytes"
                )
            trap = PolicyOutOfFuel(f"{name} ran out of fuel ({tank}) and was stopped", call=name)
            cause = error
        elif "wasm trap:" not in message and "wasm backtrace" not in message:
            # Not a trap of the guest's code: wasmtime refused to lift the guest's
            # answer (an enum case that does not exist, a string that is not UTF-8,
            # a pointer outside its memory).
            trap = PolicyBoundaryViolation(f"{name} returned a value the contract does not allow: {message}", call=name)
            cause = error
        else:
            trap = PolicyTrap(f"{name} trapped: {message}", call=name)
            cause = error
        self._broken = f"{name}: {trap}"
        raise trap from cause

    def drop(self, resource: ResourceAny) -> None:
        """Frees a policy or run in the instance."""
        self._check_thread("drop")
        if self._broken is None:
            resource.drop(self._store)

    def _flat_call(self, bound: _BoundExport, params: Any, count: int, flat: _FlatArgs) -> Any:
        """`_invoke` for the flat hot path: the same checks, tank and trap
        handling, with arguments already lowered into `params`. Returns the
        result's C value (`flat.result`), which the caller reads, frees and
        resets."""
        if threading.get_ident() != self._owner:  # before anything touches the store
            self._check_thread(bound.spec.name)
        if self._broken is not None:
            raise InstanceUnusable(f"this policy instance failed earlier ({self._broken}); instantiate a new one")
        context = self._context
        fuel = self._fuel
        if fuel is not None:
            self._tank, self._config_bytes = fuel, None
            error = _raw_set_fuel(context, fuel)
            if error:
                raise WasmtimeError._from_ptr(error)
        self._memory.refused = None
        self._calls.exception = None
        error = _raw_func_call(bound.func_ref, context, params, count, flat.result_ref, 1)
        if error:
            self._fail(bound.spec.name, WasmtimeError._from_ptr(error))
        return flat.result

    # Typed wrappers.

    def rule_names(self) -> tuple[str, ...]:
        """The names of the rules a decision can name, in the contract's fixed
        order: `Verdict.rule_index` indexes it (`rule_names()[v.rule_index]` is
        the `rule` of `Run.last_decision`). Read once per instance."""
        names = self._rule_names
        if names is None:
            names = self._rule_names = tuple(cast(list[str], self._invoke(self._exports["rule-names"], ())))
        return names

    def read_probe_answer(self, http_status: int | None, json_rpc_code: int | None) -> ProbeAnswer:
        """What an answer to a negotiating client's `server/discover` probe that
        is not a discovery result means (the contract's one rule, so no host
        keeps its own): "failure" (the connect attempt failed: 401, 403, 408,
        429, 5xx) or "older-server" (any other 4xx, or a JSON-RPC error: fall
        back to the `initialize` handshake). `http_status` is None over stdio."""
        return cast(ProbeAnswer, self._invoke(self._exports["read-probe-answer"], (http_status, json_rpc_code)))

    def derive_idempotency_key(self, run_id: str, action_id: str) -> str:
        """`ar1-` + 32 hex digits of FNV-1a-128 over run-id, 0x00, action-id.
        Raises `PolicyInputTooLarge` (before the call; the instance stays usable)
        for an id over 256 bytes."""
        for name, value in (("run-id", run_id), ("action-id", action_id)):
            if isinstance(value, str) and not limits.within(value, limits.MAX_ID_BYTES):
                raise PolicyInputTooLarge(name, limits.utf8_size(value), limits.MAX_ID_BYTES, call="derive-idempotency-key")
        return cast(str, self._invoke(self._exports["derive-idempotency-key"], (run_id, action_id)))

    def load_policy(self, config: str | Mapping[str, Any] = "{}") -> Policy:
        """`policy.from-json`: a JSON text or a mapping. Raises `ConfigError`
        (kind `too-large`, without a call, for a text over 1 MiB). Runs on
        `fuel_per_call + fuel_per_config_byte * <the text's UTF-8 bytes>`: a
        configuration's cost is linear in its bytes, and it is loaded off the
        decision path."""
        text = config if isinstance(config, str) else json.dumps(config)
        size = limits.utf8_size(text) if isinstance(text, str) else 0  # the value conversion refuses what is not a string
        if size > limits.MAX_CONFIG_BYTES:
            raise ConfigError("too-large", "", f"the configuration is {size} bytes, more than the {limits.MAX_CONFIG_BYTES}-byte limit")
        result = self._invoke(self._exports[_FROM_JSON], (text,), size)
        if "err" in result:
            error = result["err"]
            raise ConfigError(error["kind"], error["field"], error["message"])
        self._policy_config_bytes[result["ok"]] = size
        return Policy(self, result["ok"], size, text)


class _Handle:
    """A resource in an instance; `close()` (or `with`) frees it."""

    def __init__(self, instance: PolicyInstance, resource: ResourceAny) -> None:
        self.instance = instance
        self._resource: ResourceAny | None = resource

    @property
    def resource(self) -> ResourceAny:
        if self._resource is None:
            raise InstanceUnusable(f"this {type(self).__name__.lower()} was closed")
        return self._resource

    def close(self) -> None:
        if self._resource is not None:
            self.instance._check_thread(f"close {type(self).__name__.lower()}")  # before the handle changes
            resource, self._resource = self._resource, None
            self.instance.drop(resource)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Policy(_Handle):
    """A validated configuration; start many runs from it."""

    def __init__(self, instance: PolicyInstance, resource: ResourceAny, config_bytes: int, config_text: str = "{}") -> None:
        super().__init__(instance, resource)
        # The UTF-8 bytes of the configuration text it was loaded from.
        self.config_bytes = config_bytes
        # That text, as the host holds it: the wrapper's guard reads its caps from it, not from the component.
        self.config_text = config_text

    def effective_config(self) -> str:
        """The configuration in force, every default filled in, as JSON text.
        It serialises the whole configuration, so it runs on the tank of the
        load: `fuel_per_call + fuel_per_config_byte * config_bytes`."""
        return cast(
            str,
            self.instance._invoke(self.instance._exports[_EFFECTIVE_CONFIG], (self.resource,), self.config_bytes),
        )

    def classify(self, observation: Observation, now_ms: int) -> Classification:
        """The class of one observed failure (bounded first: `limits.bounded_observation`)."""
        bounded = limits.bounded_observation(observation)
        return cast(
            Classification, self.instance._invoke(self.instance._exports["[method]policy.classify"], (self.resource, bounded, now_ms))
        )

    def next_delay(self, retry: int, hint_ms: int | None = None, entropy: int | None = None) -> int:
        """The delay before retry number `retry` (1 for the first); no entropy: wasi:random."""
        return cast(
            int, self.instance._invoke(self.instance._exports["[method]policy.next-delay"], (self.resource, retry, hint_ms, entropy))
        )

    def start_run(self, run_id: str) -> Run:
        """Starts a run with fresh budgets. Raises `RunMisuse` (`too-large`,
        without a call) for a run id over 256 bytes."""
        refused = limits.too_large("run-id", run_id)
        if refused is not None:
            raise RunMisuse(refused)
        result = self.instance._invoke(self.instance._exports["[method]policy.start-run"], (self.resource, run_id))
        if "err" in result:
            raise RunMisuse(result["err"])
        return Run(self.instance, result["ok"], run_id, self.config_text, policy=self)

    def resume_run(self, snapshot: str, answer: ResumeAnswer, now_ms: int) -> Run:
        """Resumes an escalated run from its snapshot (`Run.snapshot`, taken in
        any host) with a person's answer, under this configuration (contract
        0.9.0). The run keeps its id, calls, keys, effects and every budget
        spent; `Run.resumed_call()` says what to do with the call that stopped
        it. Raises `SnapshotError` (its `kind`: `malformed`, `tampered`,
        `other-contract`, `too-large`) for a snapshot refused: a text past 2
        MiB, or a `done` result past 1 MiB, without a call. Runs on the tank
        of a configuration load of the snapshot's size (linear in the
        document, off the decision path)."""
        if not isinstance(answer, ResumeAnswer):
            raise TypeError(f"answer must be a ResumeAnswer (ResumeAnswer.retry(), ...), got {answer!r}")
        size = limits.utf8_size(snapshot) if isinstance(snapshot, str) else 0
        if size > limits.MAX_SNAPSHOT_BYTES:
            raise SnapshotError("too-large", f"the snapshot is {size} bytes, more than the {limits.MAX_SNAPSHOT_BYTES}-byte limit")
        if answer.result is not None and limits.utf8_size(answer.result) > limits.MAX_ARGUMENTS_BYTES:
            raise SnapshotError(
                "too-large",
                f"the done answer's result is {limits.utf8_size(answer.result)} bytes, more than the {limits.MAX_ARGUMENTS_BYTES}-byte limit",
            )
        result = self.instance._invoke(self.instance._exports[_RESUME_RUN], (self.resource, snapshot, answer.canonical(), now_ms), size)
        if "err" in result:
            raise SnapshotError(result["err"]["kind"], result["err"]["message"])
        run = Run(self.instance, result["ok"], "", self.config_text, policy=self)
        run.run_id = run.report()["run-id"]
        return run


class _Text(ctypes.Structure):
    """A string value's payload (`wasm_name_t`: size, data) seen with `data` as
    `c_char_p`: assigning a `bytes` stores the address of its own buffer (and
    keeps it alive), so a string argument is passed without a C copy. The C side
    only reads arguments (`wasmtime_component_func_call` takes them `const`);
    these slots are never freed with `wasm_byte_vec_delete`."""

    _fields_ = (("size", ctypes.c_size_t), ("data", ctypes.c_char_p))


class _FlatArgs:
    """The argument arrays of one run's `begin-call` and `record-success`,
    made on its first such call and reused: the run's handle (a clone, made
    once), the integers written in place, strings pointed at their `bytes`
    (`_Text`), the key's option payload in a box of its own here, tool hints
    copied from the component's lowered values; and the result value every
    report's verdict is read from, reused (reset after it is freed).
    `release` frees the handle clones (at `Run.close`, or when the run is
    collected): nothing else here is owned by the C side between calls."""

    __slots__ = (
        "success",
        "begin",
        "s_call",
        "s_attempt",
        "s_now",
        "b_server",
        "b_server_text",
        "b_server_box",
        "b_tool",
        "b_key",
        "b_key_text",
        "b_key_box",
        "b_now",
        "result",
        "result_ref",
        "boxes",
        "release",
        "__weakref__",
    )

    def __init__(self, resource: ResourceAny) -> None:
        self.success = (_Val * 4)()
        self.begin = (_Val * 6)()
        kinds = (
            (self.success, {1: _U32_KIND, 2: _U32_KIND, 3: _U64_KIND}),
            (self.begin, {1: _OPTION_KIND, 2: _STRING_KIND, 3: _OPTION_KIND, 5: _U64_KIND}),
        )
        for params, slots in kinds:
            for index, kind in slots.items():
                params[index].kind = kind
            params[0].of.resource = ffi.wasmtime_component_resource_any_clone(resource.ptr())
            params[0].kind = _RESOURCE_KIND
        success, begin = self.success, self.begin
        self.s_call, self.s_attempt, self.s_now = success[1].of, success[2].of, success[3].of
        self.b_tool, self.b_now = _text_at(begin, 2), begin[5].of
        # option<string>: each option slot points at a string value kept here.
        boxes = self.boxes = (_Val * 2)()
        boxes[0].kind = boxes[1].kind = _STRING_KIND
        self.b_key, self.b_key_text, self.b_key_box = begin[3].of, _text_at(boxes, 0), ctypes.pointer(boxes[0])
        self.b_server, self.b_server_text, self.b_server_box = begin[1].of, _text_at(boxes, 1), ctypes.pointer(boxes[1])
        self.result = _Val()
        self.result_ref = byref(self.result)
        self.release = weakref.finalize(self, _release_flat_args, (success, begin))


def _text_at(array: Any, index: int) -> _Text:
    """The `_Text` view of the string value at `array[index]`."""
    return _Text.from_buffer(array, index * _VAL_SIZE + _UNION)


def _release_flat_args(arrays: tuple[Any, ...]) -> None:
    for params in arrays:
        _raw_val_delete(byref(params[0]))  # the run's handle clone: the only slot the C side owns


class Run(_Handle):
    """One agent run: its calls, budgets and effects. The host begins each call
    (`begin_call`), reports each attempt (`record_success`,
    `record_empty_result`, `record_failure`), each status check
    (`record_status_check`) and each word of a call's task
    (`record_task_status`, `record_poll_failure`), and does what the `Verdict`
    says. Every report
    names the attempt it reports: 1 for the first, then `verdict.attempt + 1`
    after a retry; for a status check, the attempt whose effect was checked."""

    def __init__(
        self, instance: PolicyInstance, resource: ResourceAny, run_id: str, config_text: str = "{}", *, policy: Policy | None = None
    ) -> None:
        super().__init__(instance, resource)
        self.run_id = run_id
        # The policy it was started (or resumed) from: `RetryingToolCaller.resume` resumes a snapshot on it.
        self.policy = policy
        # The configuration text of the policy it was started from (`Policy.config_text`).
        self.config_text = config_text
        exports = instance._exports
        self._begin = exports[_BEGIN_CALL]
        self._success = exports[_RECORD_SUCCESS]
        self._empty = exports[_RECORD_EMPTY]
        self._failure = exports[_RECORD_FAILURE]
        self._status = exports[_RECORD_STATUS]
        self._task = exports[_RECORD_TASK]
        self._poll_failure = exports[_RECORD_POLL_FAILURE]
        self._report = exports["[method]run.report"]
        self._effects = exports["[method]run.effects"]
        self._last = exports["[method]run.last-decision"]
        self._escalation = exports["[method]run.escalation"]
        self._breaker_changes = exports["[method]run.take-breaker-changes"]
        self._abandon = exports["[method]run.abandon-call"]
        self._snapshot = exports["[method]run.snapshot"]
        self._resumed_call = exports["[method]run.resumed-call"]
        component = instance.component
        self._actions, self._classes, self._effect_names = component._actions, component._classes, component._effect_names
        self._flat: _FlatArgs | None = None

    def close(self) -> None:
        flat = self._flat
        if flat is not None and self._resource is not None:
            self.instance._check_thread("close run")
            self._flat = None
            flat.release()
        super().close()

    def _flat_args(self) -> _FlatArgs:
        flat = self._flat = _FlatArgs(self.resource)  # `resource` raises for a closed run
        return flat

    def begin_call(
        self, tool: str, idempotency_key: str | None, hints: ToolHints | None, now_ms: int, *, server: str | None = None
    ) -> CallStart:
        """Asks to begin a call of `tool` on `server`, with the idempotency key every
        attempt carries (`PolicyInstance.derive_idempotency_key`) and the tool's
        MCP annotations if known. `server` names the MCP server for the circuit
        breakers (the same name in every worker: a URL without its query, or
        the name the operator gave); None, no breaker applies. Not admitted
        (`admitted` False) when the run escalated instead: `escalation()`
        gives the hand-off; or, with `replan` set, when a breaker of the server
        is open: `last_decision(call_id)` has the message for the model, and
        nothing may be sent. Raises `RunMisuse` for the component's run-error
        (and, without a call, `too-large` for a server name, tool name or key
        over 256 bytes)."""
        refused = limits.too_large("server", server, limits.MAX_SERVER_BYTES) if server is not None else None
        if refused is None:
            refused = limits.too_large("tool", tool)
        if refused is None and idempotency_key is not None:
            refused = limits.too_large("idempotency-key", idempotency_key)
        if refused is not None:
            raise RunMisuse(refused)
        fast = (
            type(tool) is str
            and (idempotency_key is None or type(idempotency_key) is str)
            and (server is None or type(server) is str)
            and type(now_ms) is int
            and 0 <= now_ms <= _U64_MAX
        )
        hints_c = None
        if fast and hints is not None:
            if type(hints) is dict and hints.keys() <= _HINT_NAMES:
                key = ("hints", *((type(v), v) for v in (hints.get("read-only"), hints.get("destructive"), hints.get("idempotent"))))
                try:
                    hints_c = self.instance.component._lowered_value(key, self._begin.spec.params[4], hints)
                except _codec.ValueConversionError:
                    hints_c = None  # the generic path raises it, with the argument's place
            fast = hints_c is not None
        if not fast:
            lifted = self.instance._invoke(self._begin, (self.resource, server, tool, idempotency_key, hints, now_ms))
            if "err" in lifted:
                raise RunMisuse(lifted["err"])
            ok = lifted["ok"]
            values = (
                ok["admitted"],
                ok["call-id"],
                ok["delay-ms"],
                ok["effect"],
                ok["safe-to-repeat"],
                ok["idle-timeout-ms"],
                ok["attempt-timeout-ms"],
                ok["replan"],
                ok["breaker-changed"],
            )
            return _new_tuple(CallStart, values)  # type: ignore[no-any-return]
        flat = self._flat or self._flat_args()
        params = flat.begin
        if hints_c is None:
            params[4].kind, params[4].of.option = _OPTION_KIND, None
        else:
            params[4] = hints_c  # a copy of the component's value: never freed here
        flat.b_now.u64 = now_ms
        text = flat.b_tool
        text.data = data = tool.encode("utf-8")
        text.size = len(data)
        if idempotency_key is None:
            flat.b_key.option = None
        else:
            text = flat.b_key_text
            text.data = data = idempotency_key.encode("utf-8")
            text.size = len(data)
            flat.b_key.option = flat.b_key_box
        if server is None:
            flat.b_server.option = None
        else:
            text = flat.b_server_text
            text.data = data = server.encode("utf-8")
            text.size = len(data)
            flat.b_server.option = flat.b_server_box
        result = self.instance._flat_call(self._begin, params, 6, flat)
        try:
            is_ok, box = _result_head(result)
            if not is_ok:
                raise RunMisuse(self._begin.spec.result.lift(result)["err"])  # type: ignore[union-attr]  # lifting frees it
            admitted, call_id, delay, effect_size, effect_data, safe, idle, whole, replan, changed = _CALL_START.struct.unpack_from(
                _CALL_START.block.from_address(_PTR_AT(box + _RECORD_DATA).value)
            )
            effect = self._effect_names[_chars(effect_data, effect_size)]
            values = (admitted, call_id, delay, effect, safe, idle, whole, replan, changed)
            _raw_val_delete(flat.result_ref)
        finally:
            result.kind = _BOOL_KIND  # freed (or lifted): empty again for the next call
        return _new_tuple(CallStart, values)  # type: ignore[no-any-return]

    def record_success(self, call_id: int, attempt: int, now_ms: int) -> Verdict:
        """Reports an attempt that returned a usable result. Raises `RunMisuse`
        for the component's run-error: `attempt-mismatch` for any other
        attempt than the call's current one (a second report of one attempt),
        which changes nothing."""
        if (
            type(call_id) is int
            and type(attempt) is int
            and type(now_ms) is int
            and 0 <= call_id <= _U32_MAX
            and 0 <= attempt <= _U32_MAX
            and 0 <= now_ms <= _U64_MAX
        ):
            flat = self._flat or self._flat_args()
            flat.s_call.u32, flat.s_attempt.u32, flat.s_now.u64 = call_id, attempt, now_ms
            return self._verdict(self._success, self.instance._flat_call(self._success, flat.success, 4, flat), flat)
        return self._verdict_of(self.instance._invoke(self._success, (self.resource, call_id, attempt, now_ms)))

    def record_empty_result(self, call_id: int, attempt: int, detail: str, now_ms: int) -> Verdict:
        """Reports an attempt that returned a result that is empty, partial or
        wrong; `detail` (cut to 64 KiB) says what was wrong, for the model.
        Raises `RunMisuse` for the component's run-error."""
        if isinstance(detail, str):
            detail = limits.cut(detail, limits.MAX_BODY_BYTES)
        return self._report_verdict(self._empty, (self.resource, call_id, attempt, detail, now_ms))

    def record_failure(
        self, call_id: int, attempt: int, observation: Observation, time_left_ms: int | None, now_ms: int, entropy: int
    ) -> Verdict:
        """Reports a failed attempt, as observed (`types.Observation`: bounded
        first, `limits.bounded_observation`). `time_left_ms` is the time to the
        call's or the run's deadline, if the host has one (a retry's delay is
        cut to it; a server that asks to wait longer fails the call now);
        `entropy` is the jitter of a retry's delay. Raises `RunMisuse` for the
        component's run-error."""
        bounded = limits.bounded_observation(observation)
        return self._report_verdict(self._failure, (self.resource, call_id, attempt, bounded, time_left_ms, now_ms, entropy))

    def record_status_check(
        self, call_id: int, attempt: int, result: StatusCheckResult, time_left_ms: int | None, now_ms: int, entropy: int
    ) -> Verdict:
        """Reports what the status check a `check-status` verdict asked for
        found ("found", "absent" or "unknown"), under the attempt whose effect
        was checked. `time_left_ms` and `entropy` as for `record_failure`."""
        return self._report_verdict(self._status, (self.resource, call_id, attempt, result, time_left_ms, now_ms, entropy))

    def record_task_status(
        self, call_id: int, attempt: int, task: TaskReport, time_left_ms: int | None, now_ms: int, entropy: int
    ) -> Verdict:
        """Reports what the server said of the call's task (`types.TaskReport`:
        the `tools/call` answered by a task, or a `tasks/get` whose status is
        working, input-required or cancelled; `message` cut to 64 KiB), under
        the attempt the task answered. The verdict is `poll` (wait `delay_ms`,
        then `tasks/get`), or it stops waiting with `cancel_task` set. A task
        that completed or failed is reported with `record_success`,
        `record_empty_result` or `record_failure`, as an attempt is."""
        return self._report_verdict(self._task, (self.resource, call_id, attempt, limits.bounded_task(task), time_left_ms, now_ms, entropy))

    def record_poll_failure(
        self, call_id: int, attempt: int, observation: Observation, time_left_ms: int | None, now_ms: int, entropy: int
    ) -> Verdict:
        """Reports a `tasks/get` of the call's task that failed, as observed
        (bounded like `record_failure`'s). Raises `RunMisuse` (`no-task`) for a
        call that has no task."""
        bounded = limits.bounded_observation(observation)
        return self._report_verdict(self._poll_failure, (self.resource, call_id, attempt, bounded, time_left_ms, now_ms, entropy))

    def _report_verdict(self, bound: _BoundExport, args: tuple[Any, ...]) -> Verdict:
        """A report through the generic conversion, its verdict read in place."""
        flat = self._flat or self._flat_args()
        return self._verdict(bound, self.instance._invoke(bound, args, into=flat), flat)

    def _verdict(self, bound: _BoundExport, result: Any, flat: _FlatArgs) -> Verdict:
        """The `Verdict` in a `result<verdict, run-error>` C value, which it
        frees (and resets for the next call)."""
        try:
            is_ok, box = _result_head(result)
            if not is_ok:
                raise RunMisuse(bound.spec.result.lift(result)["err"])  # type: ignore[union-attr]  # lifting frees it
            action_size, action_data, class_size, class_data, attempt, delay, hint_box, rule, note, reconnect, cancel, changed = (
                _VERDICT.struct.unpack_from(_VERDICT.block.from_address(_PTR_AT(box + _RECORD_DATA).value))
            )
            values = (
                self._actions[_chars(action_data, action_size)],
                self._classes[_chars(class_data, class_size)],
                attempt,
                delay,
                _U64_AT(hint_box + _UNION).value if hint_box else None,
                rule,
                note,
                reconnect,
                cancel,
                changed,
            )
            _raw_val_delete(flat.result_ref)
        finally:
            result.kind = _BOOL_KIND  # freed (or lifted): empty again for the next call
        return _new_tuple(Verdict, values)  # type: ignore[no-any-return]

    @staticmethod
    def _verdict_of(lifted: Any) -> Verdict:
        """The `Verdict` of the generic path's canonical value."""
        if "err" in lifted:
            raise RunMisuse(lifted["err"])
        ok = lifted["ok"]
        values = (
            ok["action"],
            ok["class"],
            ok["attempt"],
            ok["delay-ms"],
            ok["hint-ms"],
            ok["rule-index"],
            ok["has-note"],
            ok["reconnect"],
            ok["cancel-task"],
            ok["breaker-changed"],
        )
        return _new_tuple(Verdict, values)  # type: ignore[no-any-return]

    def abandon_call(self, call_id: int, attempt: int, sent: bool, why: AbandonReason) -> None:
        """Ends a call the host stopped before a verdict ended it (`why`:
        "cancelled" by the caller, or its "deadline" passed), so that it no
        longer counts as open. `sent`: whether `attempt` had left without an
        answer (then a write is listed as an `unknown` effect). Raises
        `RunMisuse` for the component's run-error (a call that is over,
        another attempt)."""
        answer = self.instance._invoke(self._abandon, (self.resource, call_id, attempt, sent, why))
        if "err" in answer:
            raise RunMisuse(answer["err"])

    def last_decision(self, call_id: int) -> Decision | None:
        """The run's last decision (of any report) in full, if it was about call `call_id`: the reason,
        a replan's message, a note, an escalation. None if the run's last
        decision was about another call, or there was none yet. The guest
        builds the prose only now."""
        return cast("Decision | None", self.instance._invoke(self._last, (self.resource, call_id)))

    def escalation(self) -> Escalation | None:
        """The hand-off, if the run has escalated (by any call)."""
        return cast("Escalation | None", self.instance._invoke(self._escalation, (self.resource,)))

    def take_breaker_changes(self) -> list[BreakerChange]:
        """The circuit breakers' changes the run's last `begin_call` or report
        made, oldest first, and forgets them. Ask only when a `CallStart` or a
        `Verdict` says `breaker_changed`."""
        return cast(list[BreakerChange], self.instance._invoke(self._breaker_changes, (self.resource,)))

    def report(self) -> RunReport:
        """What happened in the run so far. Its `effects` are all of them up to
        20, else the first 10 and the last 10; `effects-total` counts them all
        (`all_effects` gives every one)."""
        return cast(RunReport, self.instance._invoke(self._report, (self.resource,)))

    def snapshot(self, arguments_json: str | None, now_ms: int) -> str:
        """A snapshot of the escalated run (contract 0.9.0): a versioned JSON
        document with a digest, for a person to answer and any host to resume
        (`Policy.resume_run`). `arguments_json` is the stopped call's arguments
        as JSON text, kept as given so that a retry sends the same call.
        Raises `SnapshotError`: `not-escalated` (the run has not escalated),
        `calls-open` (a call other than the stopped one is open: abandon it
        first), `too-large`."""
        if isinstance(arguments_json, str) and limits.utf8_size(arguments_json) > limits.MAX_ARGUMENTS_BYTES:
            size = limits.utf8_size(arguments_json)
            raise SnapshotError("too-large", f"arguments-json is {size} bytes, more than the {limits.MAX_ARGUMENTS_BYTES}-byte limit")
        result = self.instance._invoke(self._snapshot, (self.resource, arguments_json, now_ms))
        if "err" in result:
            raise SnapshotError(result["err"]["kind"], result["err"]["message"])
        text = cast(str, result["ok"])
        size = limits.utf8_size(text)
        if size > limits.MAX_SNAPSHOT_BYTES:
            raise SnapshotError(
                "too-large", f"the component's snapshot is {size} bytes, more than the {limits.MAX_SNAPSHOT_BYTES}-byte limit"
            )
        return text

    def resumed_call(self) -> ResumedCall | None:
        """After `Policy.resume_run`: the call that stopped the run and what to
        do with it (`action`: send, succeed, replan, escalate). None for a run
        that was not resumed, or whose escalation stopped no call. Its texts
        are bounded as every text the guest hands out (arguments past 1 MiB
        are dropped: cut JSON is not JSON)."""
        call = cast("ResumedCall | None", self.instance._invoke(self._resumed_call, (self.resource,)))
        if call is not None:
            call["tool"] = limits.cut(call["tool"], limits.MAX_ID_BYTES)
            if call["idempotency-key"] is not None:
                call["idempotency-key"] = limits.cut(call["idempotency-key"], limits.MAX_ID_BYTES)
            if call["server"] is not None:
                call["server"] = limits.cut(call["server"], limits.MAX_SERVER_BYTES)
            arguments = call["arguments-json"]
            if arguments is not None and limits.utf8_size(arguments) > limits.MAX_ARGUMENTS_BYTES:
                call["arguments-json"] = None
            if call["result-text"] is not None:
                call["result-text"] = limits.cut(call["result-text"], limits.MAX_ARGUMENTS_BYTES)
        return call

    def effects(self, start: int, max_count: int = EFFECTS_PAGE) -> list[EffectRecord]:
        """The run's effects in order from the `start`-th (0 for the first), at
        most `max_count`, never more than 1,000 a call."""
        return cast(list[EffectRecord], self.instance._invoke(self._effects, (self.resource, start, max_count)))

    def all_effects(self) -> list[EffectRecord]:
        """Every effect of the run, in order, page by page."""
        every: list[EffectRecord] = []
        while len(every) <= limits.U32_MAX:
            page = self.effects(len(every), EFFECTS_PAGE)
            if not page:
                break
            every.extend(page)
        return every


def _reserve_import(accounts: AccountBudgetBackend) -> Callable[..., Any]:
    """`account-budget.reserve` with canonical values (the codec's form)."""

    def reserve(account_id: str, tokens: int, bucket: dict[str, int], max_wait_ms: int, now_ms: int) -> dict[str, int]:
        shape = Bucket(bucket["capacity"], bucket["refill-interval-ms"])
        reservation = accounts.reserve(account_id, tokens, shape, max_wait_ms, now_ms)
        return {"granted" if reservation.granted else "refused": reservation.wait_ms}

    return reserve


def _refund_import(accounts: AccountBudgetBackend) -> Callable[..., Any]:
    """`account-budget.refund` with canonical values (the codec's form)."""

    def refund(account_id: str, tokens: int, bucket: dict[str, int], now_ms: int) -> None:
        accounts.refund(account_id, tokens, Bucket(bucket["capacity"], bucket["refill-interval-ms"]), now_ms)

    return refund


def _random_bytes_import(entropy: EntropySource) -> Callable[..., Any]:
    def get_random_bytes(length: int) -> list[int]:
        return list(random_bytes(entropy, length))

    return get_random_bytes


def _import_codecs(engine: Engine, instance_type: Any) -> dict[str, tuple[tuple[_codec.Codec, ...], _codec.Codec | None]]:
    """The codecs of every function of an imported interface, by name."""
    assert isinstance(instance_type, ComponentInstanceType)
    codecs = {}
    for name, item in instance_type.exports(engine).items():
        func_type = item.ty
        if isinstance(func_type, FuncType):
            result = func_type.result
            codecs[name] = (tuple(_codec.build(ty) for _, ty in func_type.params), _codec.build(result) if result is not None else None)
    return codecs


# Host functions called by the guest. wasmtime-py's stock `add_func` converts
# arguments with the stock conversion (~85 µs for `reserve`); this registers the
# same C callback shape with the cached codecs instead (~15 µs). It also keeps an
# exception a host function raises with the instance it was called for
# (`_CallState`), where wasmtime-py's keeps it in one global shared by every
# thread (so a trap could carry another thread's exception, or none).
_IMPORTS: dict[int, tuple[tuple[_codec.Codec, ...], _codec.Codec | None, Callable[..., Any], _CallState]] = {}
_import_ids = itertools.count(1)


@ffi.wasmtime_component_func_callback_t  # type: ignore[untyped-decorator]
def _import_trampoline(data: Any, _context: Any, _ty: Any, args: Any, nargs: int, results: Any, nresults: int) -> Any:
    entry = _IMPORTS.get(data or 0)
    if entry is None:  # pragma: no cover - the finalizer runs only when the linker is gone
        return _new_error("agent_retry_policy: unknown host import")
    params, result, function, calls = entry
    try:
        values = [codec.lift(args[i]) for i, codec in enumerate(params)]
        answer = function(*values)
        if result is not None:  # `refund` returns nothing
            result.lower(answer, results[0])
    except BaseException as e:  # nothing may cross into wasmtime: the call traps, the instance keeps the exception
        calls.exception = e
        return _new_error(f"a host import raised {type(e).__name__}")
    return 0


def _new_error(message: str) -> int:
    return ctypes.cast(ffi.wasmtime_error_new(message.encode("utf-8")), ctypes.c_void_p).value or 0


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # type: ignore[untyped-decorator]
def _import_finalizer(data: Any) -> None:
    _IMPORTS.pop(data or 0, None)


def _load_import(store: Any) -> Callable[[str, int], Any]:
    """The shared state's `load`, never copying into the guest a text past the
    longest any store keeps (1,024 bytes), whatever backend read it."""

    def load(key: str, now_ms: int) -> Any:
        loaded = store.load(key, now_ms)
        value = loaded.get("value") if isinstance(loaded, dict) else None
        if isinstance(value, str) and len(value.encode("utf-8")) > MAX_VALUE_BYTES:
            return {**loaded, "value": None}
        return loaded

    return load


def _add_import(
    linker_instance: Any,
    name: str,
    codecs: tuple[tuple[_codec.Codec, ...], _codec.Codec | None],
    function: Callable[..., Any],
    calls: _CallState,
) -> None:
    key = next(_import_ids)
    _IMPORTS[key] = (codecs[0], codecs[1], function, calls)
    encoded = name.encode("utf-8")
    error = ffi.wasmtime_component_linker_instance_add_func(
        linker_instance.ptr(), ctypes.create_string_buffer(encoded), len(encoded), _import_trampoline, key, _import_finalizer
    )
    if error:
        raise WasmtimeError._from_ptr(error)


__all__ = [
    "CONTRACT_VERSION",
    "EFFECTS_PAGE",
    "check_contract_version",
    "component_identity",
    "contract_compatibility",
    "FUEL_PER_CALL",
    "FUEL_PER_CONFIG_BYTE",
    "MAX_MEMORY_BYTES",
    "Policy",
    "PolicyComponent",
    "PolicyInstance",
    "Run",
    "bundled_component",
    "locate_component",
    "now_ms",
]
