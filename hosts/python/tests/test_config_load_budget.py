"""The configuration load's own fuel budget: `policy.from-json` runs on
`fuel_per_call + fuel_per_config_byte * <the text's UTF-8 bytes>` (a
configuration's cost is linear in its bytes, and it is loaded off the decision
path); every other call keeps `fuel_per_call`. As the Rust and Node hosts.

`pytest -s tests/test_config_load_budget.py` prints the figures the README quotes:
the fuel of 10,000 MCP tools and the fuel a byte of the worst shapes."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_retry_policy import (
    FUEL_PER_CALL,
    FUEL_PER_CONFIG_BYTE,
    ConfigError,
    InstanceUnusable,
    Integrity,
    LivePolicy,
    PolicyComponent,
    PolicyOutOfFuel,
    PolicySource,
    limits,
    locate_component,
)
from agent_retry_policy.types import Observation, http_failure

TOOLS = 10_000
TOOL = "mcp__github__create_pull_request_review_{:05d}"


def many_tools() -> str:
    return json.dumps({"tools": {TOOL.format(i): {"effect": "write"} for i in range(TOOLS)}})


FAILURE: Observation = http_failure(503)


def hostile(name: str) -> PolicyComponent:
    """A hostile component of tests/hostile/build.mjs (`make hostile`), as in test_sandbox.py."""
    folder = os.environ.get("AGENT_RETRY_HOSTILE_DIR") or Path(__file__).resolve().parents[3] / "target" / "hostile"
    path = Path(folder) / f"{name}.wasm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make hostile` in the repository root")
    return PolicyComponent(path.read_bytes(), source=f"{name}.wasm")


def load_tank(text: str, fuel_per_call: int = FUEL_PER_CALL, fuel_per_config_byte: int = FUEL_PER_CONFIG_BYTE) -> int:
    return fuel_per_call + fuel_per_config_byte * len(text.encode("utf-8"))


def just_under_the_limit(prefix: str, item: Callable[[int], str], suffix: str) -> str:
    """`prefix item(0),item(1),... suffix` with as many items as fit in 1 MiB - 1 byte."""
    items: list[str] = []
    size = len(prefix) + len(suffix) - 1  # the first item has no comma
    while True:
        next_item = item(len(items))
        if size + len(next_item) + 1 >= limits.MAX_CONFIG_BYTES:
            break
        items.append(next_item)
        size += len(next_item) + 1
    text = prefix + ",".join(items) + suffix
    assert len(text) == size < limits.MAX_CONFIG_BYTES
    return text


def test_ten_thousand_namespaced_tools_load_within_the_default_budget() -> None:
    config = many_tools()
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy(config)
    load_fuel = instance.fuel_used_by_last_call()
    tank = load_tank(config)
    print(
        f"\n{TOOLS} tools ({len(config)} bytes): from-json {load_fuel} fuel ({load_fuel / len(config):.1f} a byte), "
        f"tank {tank} ({FUEL_PER_CALL} + {FUEL_PER_CONFIG_BYTE} x {len(config)})"
    )
    assert 0 < load_fuel < tank
    run = policy.start_run("many-tools")
    assert instance.fuel_used_by_last_call() < FUEL_PER_CALL, "start-run is back on the call's tank"
    start = run.begin_call(TOOL.format(TOOLS - 1), None, None, 1)
    begin_fuel = instance.fuel_used_by_last_call()
    print(f"begin-call of the last tool: {begin_fuel} fuel")
    assert begin_fuel < 20_000, "the tool is found by its hash, not a scan"
    assert start.admitted, start
    assert start.safe_to_repeat is False, "the tool's entry (a write) applies"
    assert start.effect == "write"


def test_effective_config_of_ten_thousand_tools_runs_on_the_loads_tank() -> None:
    # It serialises the whole configuration: its cost is linear in it too.
    config = many_tools()
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy(config)
    assert policy.config_bytes == len(config.encode("utf-8"))
    effective = json.loads(policy.effective_config())
    fuel = instance.fuel_used_by_last_call()
    print(f"\n{TOOLS} tools: effective-config {fuel} fuel (tank {load_tank(config)})")
    assert FUEL_PER_CALL < fuel < load_tank(config), "more than a call's tank, within the load's"
    assert len(effective["tools"]) == TOOLS
    assert effective["tools"][TOOL.format(0)] == {"effect": "write", "idempotent": False}
    assert policy.classify(FAILURE, 0)["class"] == "transient", "the next call is back on the call's tank"
    # The raw path (the conformance runner's) finds the handle's size too.
    raw = instance.call("[static]policy.from-json", config)["ok"]
    assert len(json.loads(instance.call("[method]policy.effective-config", raw))["tools"]) == TOOLS
    # It costs less than the load (71M against 83M for 10,000 tools), so a tank the
    # load fits in fits it too: a budget that admits a configuration admits its export.


def test_the_live_gate_accepts_ten_thousand_tools(tmp_path: Path) -> None:
    shutil.copy(locate_component(), tmp_path / "policy.wasm")
    (tmp_path / "policy.json").write_text(many_tools())
    source = PolicySource(tmp_path / "policy.wasm", tmp_path / "policy.json", Integrity.unchecked())
    with LivePolicy.open(source) as live:
        assert live.current().identity.generation == 1
        assert live.last_refusal is None
    # And as an update of a small configuration.
    (tmp_path / "policy.json").write_text('{"default-effect": "read"}')
    with LivePolicy.open(source) as live:
        (tmp_path / "policy.json").write_text(many_tools())
        assert live.reload().generation == 2
        assert live.current().config_json == many_tools()


def test_the_raw_from_json_call_gets_the_same_budget() -> None:
    # The conformance runner (and with it the live gate's shipped vectors) calls the export by name.
    config = many_tools()
    instance = PolicyComponent.load().instantiate()
    result = instance.call("[static]policy.from-json", config)
    assert "ok" in result, result
    assert 0 < instance.fuel_used_by_last_call() < load_tank(config)
    with pytest.raises(PolicyOutOfFuel, match=rf"\(\d+ units: {FUEL_PER_CALL} a call \+ 1 a configuration byte x {len(config)} bytes\)"):
        PolicyComponent.load().instantiate(fuel_per_config_byte=1).call("[static]policy.from-json", config)


WORST_SHAPES: dict[str, tuple[str, Callable[[int], str], str, str]] = {
    # name: (prefix, item, suffix, the field the policy names)
    '{"k0":0,"k1":1,...}': ("{", lambda i: f'"k{i}":{i}', "}", "k0"),
    '{"x":[0,0,...]}': ('{"x":[', lambda _: "0", "]}", "x"),
    '{"x":["","",...]}': ('{"x":[', lambda _: '""', "]}", "x"),
    '{"x":[1,1,...]}': ('{"x":[', lambda _: "1", "]}", "x"),
}


@pytest.mark.parametrize("shape", list(WORST_SHAPES))
def test_the_worst_shapes_just_under_1_mib_answer_a_configuration_error_not_out_of_fuel(shape: str) -> None:
    prefix, item, suffix, field = WORST_SHAPES[shape]
    text = just_under_the_limit(prefix, item, suffix)
    instance = PolicyComponent.load().instantiate()
    with pytest.raises(ConfigError) as refused:
        instance.load_policy(text)
    fuel = instance.fuel_used_by_last_call()
    print(f"\n{shape}: {len(text)} bytes, from-json {fuel} fuel, {fuel / len(text):.1f} a byte")
    assert (refused.value.kind, refused.value.field) == ("unknown-field", field), refused.value
    assert fuel < FUEL_PER_CONFIG_BYTE * len(text), f"{fuel / len(text):.1f} fuel a byte, over the {FUEL_PER_CONFIG_BYTE} budgeted"
    assert instance.load_policy({}).classify(FAILURE, 0)["class"] == "transient", "a refusal, not a fault"


def test_a_smaller_per_byte_budget_stops_the_load_naming_the_tank_it_gave() -> None:
    config = many_tools()
    size = len(config.encode("utf-8"))
    starved = PolicyComponent.load().instantiate(fuel_per_config_byte=1)
    with pytest.raises(PolicyOutOfFuel) as raised:
        starved.load_policy(config)
    tank = load_tank(config, fuel_per_config_byte=1)
    assert str(raised.value) == (
        f"[static]policy.from-json ran out of fuel ({tank} units: {FUEL_PER_CALL} a call + 1 a configuration byte x {size} bytes)"
        " and was stopped"
    )
    assert raised.value.kind == "out-of-fuel" and raised.value.call == "[static]policy.from-json"
    assert starved.fuel_used_by_last_call() == tank, "the whole tank it was given"
    with pytest.raises(InstanceUnusable, match="failed earlier .*instantiate a new one"):
        starved.load_policy({})
    fresh = PolicyComponent.load().instantiate()
    assert fresh.load_policy(config).start_run("fresh").begin_call(TOOL.format(0), None, None, 1).effect == "write"


def test_other_calls_keep_the_call_budget_after_a_large_load() -> None:
    # endless-loop: the real from-json, a classify that never returns.
    instance = hostile("endless-loop").instantiate()
    policy = instance.load_policy(many_tools())
    assert instance.fuel_used_by_last_call() > 0
    with pytest.raises(PolicyOutOfFuel, match=rf"classify ran out of fuel \({FUEL_PER_CALL} units a call\) and was stopped"):
        policy.classify(FAILURE, 0)
    assert instance.fuel_used_by_last_call() == FUEL_PER_CALL, "the call's tank, not the load's"
    # A per-call tank of 100,000: the load gets its bytes' worth on top, classify only the 100,000.
    small = hostile("endless-loop").instantiate(fuel_per_call=100_000)
    policy = small.load_policy(many_tools())
    with pytest.raises(PolicyOutOfFuel, match=r"\(100000 units a call\)"):
        policy.classify(FAILURE, 0)


def test_unmetered_stays_unmetered() -> None:
    instance = PolicyComponent.load().instantiate(fuel_per_call=None)
    policy = instance.load_policy(many_tools())
    assert instance.fuel_used_by_last_call() == 0
    assert policy.classify(FAILURE, 0)["class"] == "transient"


def test_fuel_per_config_byte_is_validated() -> None:
    component = PolicyComponent.load()
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="fuel_per_config_byte"):
            component.instantiate(fuel_per_config_byte=bad)  # type: ignore[arg-type]
    assert FUEL_PER_CONFIG_BYTE == 2_000
