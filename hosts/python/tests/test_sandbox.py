"""The sandbox, with the hostile components of tests/hostile/build.mjs (`make
hostile`, target/hostile/): each is refused at load, or contained at call time
with the typed error of its cause within the limit, its instance refused
afterwards and a fresh instance of the good component serving; and each offered
to `LivePolicy` as an update is refused, the last good policy serving on. As
hosts/typescript/test/sandbox.test.ts and the Rust host's sandbox tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from log_lines import MCP_LOGGER, logged
from mcp.types import CallToolResult, ListToolsResult, TextContent, Tool, ToolAnnotations

from agent_retry_policy import (
    FUEL_PER_CALL,
    MAX_MEMORY_BYTES,
    ComponentImportRefused,
    ComponentLoadError,
    ContractVersionMismatch,
    EmbeddedAccounts,
    Escalated,
    InstanceUnusable,
    Integrity,
    LivePolicy,
    PolicyBoundaryViolation,
    PolicyComponent,
    PolicyInstance,
    PolicyMemoryExceeded,
    PolicyOutOfFuel,
    PolicySource,
    PolicyTrap,
    Reservation,
    UpdateLoadError,
    UpdateSelfTestError,
    locate_component,
    wit_types,
)
from agent_retry_policy.component import CONTRACT_VERSION, contract_compatibility
from agent_retry_policy.mcp_client import RetryingToolCaller
from agent_retry_policy.types import Observation, http_failure

# $AGENT_RETRY_HOSTILE_DIR: the fixtures built elsewhere (e.g. from another component).
FIXTURES = Path(os.environ.get("AGENT_RETRY_HOSTILE_DIR") or Path(__file__).resolve().parents[3] / "target" / "hostile")
FAILURE: Observation = http_failure(503, [("Retry-After", "2")])
CALL_TIME = ("endless-loop", "memory-bomb", "trap", "enum-out-of-range", "invalid-utf8", "pointer-out-of-bounds")
LOAD_TIME = ("extra-import", "extra-import-sockets", "wrong-world", "other-major")
# Loads and answers within the contract, but lies: the wrapper's guard stops it (test_guard_wrapper.py).
RUN_TIME = ("liar",)


def hostile_bytes(name: str) -> bytes:
    path = FIXTURES / f"{name}.wasm"
    if not path.is_file():
        pytest.fail(
            f"the hostile components are missing ({path}): run `make hostile` (node tests/hostile/build.mjs) in the repository root"
        )
    return path.read_bytes()


def hostile(name: str) -> PolicyComponent:
    return PolicyComponent(hostile_bytes(name), source=f"{name}.wasm")


def test_every_hostile_fixture_is_covered() -> None:
    built = sorted(path.stem for path in FIXTURES.glob("*.wasm")) if FIXTURES.is_dir() else []
    if not built:
        pytest.fail(f"no hostile components in {FIXTURES}: run `make hostile` in the repository root")
    assert built == sorted(CALL_TIME + LOAD_TIME + RUN_TIME), "a fixture was added to tests/hostile/build.mjs: cover it here"


def host_keeps_serving() -> None:
    fresh = PolicyComponent.load().instantiate()
    assert fresh.load_policy({}).classify(FAILURE, 0)["class"] == "transient"


def contained(instance: PolicyInstance, call: Callable[[], Any], kind: type[PolicyTrap], what: str) -> tuple[float, PolicyTrap]:
    """The call fails with exactly `kind` matching `what`, the instance refuses the
    next call, a fresh instance of the good component serves. Returns the ms it took."""
    start = time.perf_counter()
    with pytest.raises(PolicyTrap, match=what) as raised:
        call()
    ms = (time.perf_counter() - start) * 1000
    assert type(raised.value) is kind, f"{type(raised.value).__name__}: {raised.value}"
    with pytest.raises(InstanceUnusable, match="failed earlier .*instantiate a new one"):
        instance.derive_idempotency_key("r", "a")
    host_keeps_serving()
    return ms, raised.value


def test_an_endless_loop_runs_out_of_fuel_and_the_host_goes_on() -> None:
    instance = hostile("endless-loop").instantiate()
    policy = instance.load_policy({})
    ms, error = contained(
        instance, lambda: policy.classify(FAILURE, 0), PolicyOutOfFuel, r"classify ran out of fuel \(20000000 units a call\)"
    )
    assert error.kind == "out-of-fuel" and error.call == "[method]policy.classify"
    print(f"endless loop stopped after {ms:.1f} ms ({FUEL_PER_CALL} fuel)")
    assert ms < 5_000


def test_fuel_per_call_is_configurable() -> None:
    component = PolicyComponent.load()
    starved = component.instantiate(fuel_per_call=500, fuel_per_config_byte=0)
    with pytest.raises(PolicyOutOfFuel):
        starved.load_policy({})
    with pytest.raises(InstanceUnusable):
        starved.load_policy({})
    instance = hostile("endless-loop").instantiate(fuel_per_call=100_000)
    policy = instance.load_policy({})
    start = time.perf_counter()
    with pytest.raises(PolicyOutOfFuel, match="100000 units"):
        policy.classify(FAILURE, 0)
    assert time.perf_counter() - start < 1.0
    roomy = component.instantiate(fuel_per_call=None)
    assert roomy.load_policy({}).classify(FAILURE, 0)["class"] == "transient"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="fuel_per_call"):
            component.instantiate(fuel_per_call=bad)  # type: ignore[arg-type]


def test_a_memory_bomb_stops_at_the_64_mib_cap_with_policy_memory_exceeded() -> None:
    instance = hostile("memory-bomb").instantiate()
    policy = instance.load_policy({})
    ms, error = contained(
        instance,
        lambda: policy.classify(FAILURE, 0),
        PolicyMemoryExceeded,
        r"classify asked for more memory than the cap of 67108864 bytes",
    )
    assert error.kind == "memory-exceeded"
    print(f"memory bomb stopped after {ms:.1f} ms at {instance.memory_bytes()} bytes")
    assert instance.memory_bytes() <= MAX_MEMORY_BYTES
    assert instance.memory_bytes() > MAX_MEMORY_BYTES - (1 << 20), "the bomb grew to the cap"


def test_the_memory_cap_is_configurable() -> None:
    instance = hostile("memory-bomb").instantiate(max_memory_bytes=8 << 20)
    policy = instance.load_policy({})
    with pytest.raises(PolicyMemoryExceeded, match="cap of 8388608 bytes"):
        policy.classify(FAILURE, 0)
    assert (8 << 20) - (1 << 20) < instance.memory_bytes() <= 8 << 20
    # A cap below what the module starts with refuses the instance.
    with pytest.raises(ComponentLoadError, match=r"starts at \d+ bytes, over the sandbox's cap of 1048576 bytes"):
        PolicyComponent.load().instantiate(max_memory_bytes=1 << 20)
    # The good policy under a small cap serves (and a trap elsewhere is not called a memory one).
    small = PolicyComponent.load().instantiate(max_memory_bytes=4 << 20)
    assert small.load_policy({}).classify(FAILURE, 0)["class"] == "transient"
    with pytest.raises(ValueError, match="max_memory_bytes"):
        PolicyComponent.load().instantiate(max_memory_bytes=0)


def test_a_trap_is_a_policy_trap_and_the_instance_is_refused_afterwards() -> None:
    instance = hostile("trap").instantiate()
    policy = instance.load_policy({})
    _, error = contained(instance, lambda: policy.classify(FAILURE, 0), PolicyTrap, r"classify trapped: .*unreachable")
    assert error.kind == "trap"


def test_an_enum_case_that_does_not_exist_is_a_boundary_violation() -> None:
    instance = hostile("enum-out-of-range").instantiate()
    policy = instance.load_policy({})
    contained(
        instance,
        lambda: policy.classify(FAILURE, 0),
        PolicyBoundaryViolation,
        r"classify returned a value the contract does not allow: discriminant 42 out of range",
    )


def test_a_string_that_is_not_utf8_is_a_boundary_violation() -> None:
    instance = hostile("invalid-utf8").instantiate()
    contained(
        instance,
        lambda: instance.derive_idempotency_key("r", "step-1"),
        PolicyBoundaryViolation,
        r"derive-idempotency-key returned a value the contract does not allow: invalid utf-8",
    )


def test_a_pointer_outside_the_guest_memory_is_a_boundary_violation() -> None:
    instance = hostile("pointer-out-of-bounds").instantiate()
    contained(
        instance,
        lambda: instance.derive_idempotency_key("r", "step-1"),
        PolicyBoundaryViolation,
        r"derive-idempotency-key returned a value the contract does not allow: .*out of bounds",
    )


@pytest.mark.parametrize(
    ("name", "foreign"),
    [("extra-import", "wasi:filesystem/preopens@0.2.6"), ("extra-import-sockets", "wasi:sockets/instance-network@0.2.6")],
)
def test_an_import_outside_the_contract_is_refused_at_load_naming_it(name: str, foreign: str) -> None:
    with pytest.raises(ComponentImportRefused) as refused:
        hostile(name)
    assert refused.value.import_name == foreign
    assert f"it imports {foreign}, which is outside the agent-retry contract" in str(refused.value)
    assert isinstance(refused.value, ComponentLoadError)
    host_keeps_serving()


def test_a_component_of_another_world_is_refused_at_load_saying_so() -> None:
    with pytest.raises(ComponentLoadError) as refused:
        hostile("wrong-world")
    assert not isinstance(refused.value, ContractVersionMismatch)
    message = str(refused.value)
    assert f"does not export agent-retry:policy/policy@{CONTRACT_VERSION}" in message and "another world" in message, message
    assert "acme:scheduler/policy@" in message, message
    host_keeps_serving()


def test_a_component_of_another_contract_major_is_refused_naming_both_versions() -> None:
    with pytest.raises(ContractVersionMismatch) as refused:
        hostile("other-major")
    # The fixture claims another 0.minor than the host's (build.mjs picks which).
    theirs = refused.value.component_version
    assert refused.value.host_version == CONTRACT_VERSION and contract_compatibility(theirs) != contract_compatibility(CONTRACT_VERSION), (
        theirs
    )
    assert f"speaks agent-retry:policy@{theirs} but this host speaks @{CONTRACT_VERSION}" in str(refused.value)
    host_keeps_serving()


# Offered to a LivePolicy as an update: refused, the last good policy serving on.

READS = '{"default-effect": "read", "max-attempts-per-call": 4}'


@pytest.mark.parametrize("name", CALL_TIME + LOAD_TIME)
def test_a_hostile_update_is_refused_and_the_last_good_policy_keeps_serving(name: str, tmp_path: Path) -> None:
    wasm = hostile_bytes(name)
    shutil.copy(locate_component(), tmp_path / "policy.wasm")
    (tmp_path / "policy.json").write_text(READS)
    live = LivePolicy.open(PolicySource(tmp_path / "policy.wasm", tmp_path / "policy.json", Integrity.unchecked()))
    good = live.current()
    (tmp_path / "policy.wasm").write_bytes(wasm)
    start = time.perf_counter()
    with pytest.raises((UpdateLoadError, UpdateSelfTestError)) as refused:
        live.reload()
    seconds = time.perf_counter() - start
    if name in LOAD_TIME:
        assert isinstance(refused.value, UpdateLoadError) and refused.value.kind == "load"
        expected = {
            "extra-import": ComponentImportRefused,
            "extra-import-sockets": ComponentImportRefused,
            "wrong-world": ComponentLoadError,
            "other-major": ContractVersionMismatch,
        }[name]
        assert type(refused.value.error) is expected, refused.value
    else:
        # The gate's vectors (gate.json) call every export: the hostile one traps
        # there, and the refusal names the gate file and the case it failed.
        assert isinstance(refused.value, UpdateSelfTestError) and refused.value.kind == "self-test"
        assert "gate.json) fail: " in str(refused.value), refused.value
        cause = refused.value.__cause__
        expected_trap = {
            "endless-loop": PolicyOutOfFuel,
            "memory-bomb": PolicyMemoryExceeded,
            "trap": PolicyTrap,
            "enum-out-of-range": PolicyBoundaryViolation,
            "invalid-utf8": PolicyBoundaryViolation,
            "pointer-out-of-bounds": PolicyBoundaryViolation,
        }[name]
        assert type(cause) is expected_trap, f"{type(cause).__name__}: {cause}"
    assert seconds < 10, f"the gate took {seconds:.1f} s"
    assert live.current() is good and live.last_refusal == str(refused.value)
    instance = live.current().component.instantiate()
    assert instance.load_policy(live.current().config_json).classify(FAILURE, 0)["class"] == "transient"


# The MCP wrapper when the policy fails: no retry, an escalation saying so.


class FakeSession:
    """Enough of `ClientSession` for the wrapper: one tool, every call an isError 503."""

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.sent = 0

    async def list_tools(self, params: Any = None) -> ListToolsResult:
        return ListToolsResult(tools=[self.tool])

    async def call_tool(self, name: str, arguments: dict[str, Any], **_options: Any) -> CallToolResult:
        self.sent += 1
        return CallToolResult(content=[TextContent(type="text", text="upstream returned 503, try again")], is_error=True)


def _no_sleep(_seconds: float) -> Any:
    return asyncio.sleep(0)


def test_when_the_policy_fails_the_mcp_wrapper_does_not_retry_and_escalates_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    # The account backend fails on the second reservation (the retry's): record-outcome traps.
    reservations = 0
    inner = EmbeddedAccounts()

    class Flaky:
        def reserve(self, *args: Any) -> Reservation:
            nonlocal reservations
            reservations += 1
            if reservations > 1:
                raise ConnectionError("budget store down")
            return inner.reserve(*args)

        def refund(self, *_args: Any) -> None:
            pass

    instance = PolicyComponent.load().instantiate(accounts=Flaky())
    config = {"account-budget": {"account-id": "acme", "capacity": 10, "refill-interval-ms": 10}}
    run = instance.load_policy(config).start_run("mcp")
    lookup = Tool(name="lookup", input_schema={"type": "object"}, annotations=ToolAnnotations(read_only_hint=True))
    session = FakeSession(lookup)
    # tools= : no tools/list pseudo-call, which would take the first reservation.
    caller = RetryingToolCaller(session, run, sleep=_no_sleep, tools=[lookup])  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="agent_retry_policy.mcp"), pytest.raises(Escalated) as escalated:
        asyncio.run(caller.call_tool("lookup", {}))
    error = escalated.value
    assert isinstance(error.policy_failure, PolicyTrap) and isinstance(error.policy_failure.__cause__, ConnectionError)
    assert error.reason == "unclassified-failure"
    assert set(error.escalation) == set(wit_types.RECORDS["escalation"]), "the fallback escalation has every field"
    # The wrapper reports a failure through the flat hot path (record-failure).
    assert "the retry policy failed (PolicyTrap: [method]run.record-failure trapped: a host import raised ConnectionError" in error.note
    assert "not retried" in error.note
    assert session.sent == 1, "not retried"
    # The attempt line, then the escalation's (docs/events.md: the same order in every host).
    *_, attempt_line, escalation_line = logged(caplog, MCP_LOGGER, children=True)
    assert (attempt_line["event"], escalation_line["event"]) == ("agent_retry.attempt", "agent_retry.escalation")
    assert attempt_line["action"] == "escalate" and "the retry policy failed" in attempt_line["reason"]
    # The broken instance refuses the next call the same way; nothing is sent.
    with pytest.raises(Escalated) as again:
        asyncio.run(caller.call_tool("lookup", {}))
    assert isinstance(again.value.policy_failure, InstanceUnusable)
    assert session.sent == 1
    # A fresh instance serves the next run.
    fresh = PolicyComponent.load().instantiate().load_policy({"max-attempts-per-call": 2}).start_run("mcp-2")
    with pytest.raises(Escalated) as spent:
        asyncio.run(RetryingToolCaller(session, fresh, sleep=_no_sleep).call_tool("lookup", {}))  # type: ignore[arg-type]
    assert spent.value.reason == "call-attempts-spent" and spent.value.policy_failure is None
    assert session.sent == 3, "retried once by a working policy"


def test_a_hostile_policy_in_the_mcp_wrapper_escalates_before_anything_is_sent() -> None:
    # invalid-utf8: derive-idempotency-key answers a key that is not UTF-8.
    run = hostile("invalid-utf8").instantiate().load_policy({}).start_run("hostile")
    refund = Tool(name="issue_refund", input_schema={"type": "object", "properties": {"idempotency_key": {"type": "string"}}})
    session = FakeSession(refund)
    with pytest.raises(Escalated) as escalated:
        asyncio.run(RetryingToolCaller(session, run, sleep=_no_sleep).call_tool("issue_refund", {"order_id": "A1"}))  # type: ignore[arg-type]
    assert isinstance(escalated.value.policy_failure, PolicyBoundaryViolation)
    assert "the retry policy failed (PolicyBoundaryViolation: derive-idempotency-key returned a value" in escalated.value.note
    assert "Last outcome of issue_refund: not sent" in escalated.value.note
    assert session.sent == 0
    host_keeps_serving()
