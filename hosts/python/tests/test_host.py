"""The host's own pieces: the GCRA account budget, entropy, loading, the
sandbox, the typed wrappers and the value conversion."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_retry_policy import (
    CONTRACT_VERSION,
    Bucket,
    ComponentLoadError,
    ComponentNotFound,
    ConfigError,
    ContractVersionMismatch,
    EmbeddedAccounts,
    InstanceUnusable,
    OsEntropy,
    PolicyComponent,
    PolicyTrap,
    Reservation,
    RunMisuse,
    SplitMix64,
    check_contract_version,
    gcra,
    locate_component,
)
from agent_retry_policy._codec import ValueConversionError
from agent_retry_policy.accounts import U64_MAX
from agent_retry_policy.component import contract_compatibility
from agent_retry_policy.entropy import random_bytes
from agent_retry_policy.types import http_failure, transport_failure


def test_gcra_admits_a_burst_then_one_per_interval() -> None:
    accounts = EmbeddedAccounts.on_host_clock()
    bucket = Bucket(capacity=3, refill_interval_ms=100)

    def take(now: int) -> Reservation:
        return accounts.reserve("a", 1, bucket, 250, now)

    assert [take(0), take(0), take(0)] == [Reservation(True, 0)] * 3
    assert take(0) == Reservation(True, 100)
    assert take(0) == Reservation(True, 200)
    assert take(0) == Reservation(False, 300)  # over max-wait: nothing taken
    assert take(0) == Reservation(False, 300)
    assert take(300) == Reservation(True, 0)
    assert accounts.reserve("b", 3, bucket, 0, 0) == Reservation(True, 0)  # its own bucket


def test_gcra_saturates_at_u64() -> None:
    bucket = Bucket(capacity=0xFFFF_FFFF, refill_interval_ms=U64_MAX)
    assert gcra(U64_MAX, 0xFFFF_FFFF, bucket, U64_MAX, U64_MAX) == (Reservation(True, 0), U64_MAX)
    # No underflow below zero either: a stored TAT far in the past.
    assert gcra(0, 1, Bucket(1, 10), 0, 5) == (Reservation(True, 0), 15)


def test_splitmix64_is_the_reference_sequence_and_os_entropy_varies() -> None:
    source = SplitMix64(0)
    assert source.next_u64() == 0xE220_A839_7B1D_CDAF
    assert source.next_u64() == 0x6E78_9E6A_A1B9_65F4
    os_entropy = OsEntropy()
    assert os_entropy.next_u64() != os_entropy.next_u64()
    assert random_bytes(SplitMix64(0), 3) == (0xE220_A839_7B1D_CDAF).to_bytes(8, "little")[:3]


def test_a_missing_component_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ComponentNotFound, match=r"\(the path argument\)\. Point the path argument at"):
        locate_component(tmp_path / "nope.wasm")
    monkeypatch.setenv("AGENT_RETRY_WASM", str(tmp_path / "also-missing.wasm"))
    with pytest.raises(ComponentNotFound, match=r"\$AGENT_RETRY_WASM\). Point \$AGENT_RETRY_WASM at .* or unset it"):
        PolicyComponent.load()


def test_an_editable_install_without_a_build_says_make_wasm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent_retry_policy.component as component_module

    monkeypatch.delenv("AGENT_RETRY_WASM", raising=False)
    monkeypatch.setattr(component_module, "bundled_component", lambda: None)
    monkeypatch.setattr(component_module, "_repo_root", lambda: tmp_path)
    with pytest.raises(ComponentNotFound, match="make wasm"):
        locate_component()


def test_the_bundled_component_comes_before_the_repository_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent_retry_policy.component as component_module

    bundled = tmp_path / "agent_retry_policy.wasm"
    bundled.write_bytes(locate_component().read_bytes())
    monkeypatch.delenv("AGENT_RETRY_WASM", raising=False)
    monkeypatch.setattr(component_module, "bundled_component", lambda: bundled)
    assert locate_component() == bundled
    # The environment and the argument still override it.
    monkeypatch.setenv("AGENT_RETRY_WASM", str(tmp_path / "env.wasm"))
    with pytest.raises(ComponentNotFound, match="use the component bundled"):
        locate_component()


def test_an_unsupported_wasmtime_is_refused_with_what_to_install() -> None:
    from agent_retry_policy import _compat

    _compat.check_wasmtime_version(_compat.installed_wasmtime_version())  # the installed one passes
    _compat.check_wasmtime_version("50.0.1")
    _compat.check_wasmtime_version("50.0.7")
    for version in ("49.0.0", "50.0.0", "51.0.0", "60.1.0", "garbage", None):
        with pytest.raises(_compat.UnsupportedWasmtime, match=r"pip install 'wasmtime>=50.0.1,<51'"):
            _compat.check_wasmtime_version(version)
    with pytest.raises(_compat.UnsupportedWasmtime, match="lacks"):
        _compat.check_private_helpers(object())


def test_the_env_var_points_at_the_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_RETRY_WASM", raising=False)
    built = locate_component()
    copy = tmp_path / "policy.wasm"
    copy.write_bytes(built.read_bytes())
    monkeypatch.setenv("AGENT_RETRY_WASM", str(copy))
    assert locate_component() == copy
    assert PolicyComponent.load().instantiate().derive_idempotency_key("r", "1").startswith("ar1-")


def test_a_broken_file_is_a_load_error() -> None:
    with pytest.raises(ComponentLoadError, match="not a valid WebAssembly component"):
        PolicyComponent(b"\0asm garbage")


def test_the_component_imports_only_the_budget_the_shared_state_the_types_and_random() -> None:
    component = PolicyComponent.load()
    assert sorted(component.imports) == [
        "agent-retry:policy/account-budget@0.9.0",
        "agent-retry:policy/shared-state@0.9.0",
        "agent-retry:policy/types@0.9.0",
        "wasi:random/random@0.2.6",
    ]
    assert component.exports == ["agent-retry:policy/policy@0.9.0"]
    assert component.contract_version == CONTRACT_VERSION == "0.9.0"


def test_the_contract_version_is_read_from_the_export_names() -> None:
    assert check_contract_version(["agent-retry:policy/policy@0.9.0"]) == "0.9.0"
    assert check_contract_version(["other:pkg/x@1.0.0", "agent-retry:policy/policy@0.9.7"]) == "0.9.7"  # 0.9.x: compatible
    for theirs in (
        "1.0.0",
        "0.10.0",
        "0.8.0",
        "0.8.9",
        "0.7.0",
        "0.7.9",
        "0.6.0",
        "0.5.0",
        "0.4.0",
        "0.3.0",
        "0.2.0",
        "0.1.0",
        "4.4.0",
        "0.6",
        "banana",
    ):
        with pytest.raises(ContractVersionMismatch) as raised:
            check_contract_version([f"agent-retry:policy/policy@{theirs}"], "policy.wasm")
        message = str(raised.value)
        assert f"agent-retry:policy@{theirs}" in message and "this host speaks @0.9.0" in message, message
        assert (raised.value.component_version, raised.value.host_version) == (theirs, "0.9.0")
        assert isinstance(raised.value, ComponentLoadError)
    with pytest.raises(ComponentLoadError, match="does not export agent-retry:policy/policy@0.9.0"):
        check_contract_version(["agent-retry:policy/types@0.9.0"])
    assert contract_compatibility("1.4.2") == (1,) and contract_compatibility("0.9.0") == (0, 9)
    assert contract_compatibility("0.0.3") == (0, 0, 3)


def _with_version(wasm: bytes, version: str, *, only_policy: bool = False) -> bytes:
    """The built component with its contract names rewritten to `version` (same
    length, so every length prefix in the binary stays right)."""
    assert len(version) == len(CONTRACT_VERSION)
    if only_policy:
        old = f"agent-retry:policy/policy@{CONTRACT_VERSION}".encode()
        return wasm.replace(old, f"agent-retry:policy/policy@{version}".encode())
    return wasm.replace(f"@{CONTRACT_VERSION}".encode(), f"@{version}".encode())


def test_a_component_of_another_major_version_is_refused_naming_both() -> None:
    wasm = locate_component().read_bytes()
    for version in ("1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0"):
        with pytest.raises(ContractVersionMismatch) as raised:
            PolicyComponent(_with_version(wasm, version), source="old.wasm")
        assert str(raised.value).startswith(f"old.wasm: the component speaks agent-retry:policy@{version} but this host speaks @0.9.0"), (
            str(raised.value)
        )
    # Only the export renamed: still refused for its version, not for a missing name.
    with pytest.raises(ContractVersionMismatch, match="speaks agent-retry:policy@1.0.0"):
        PolicyComponent(_with_version(wasm, "1.0.0", only_policy=True))


def test_a_component_of_a_compatible_version_runs_under_its_own_names() -> None:
    component = PolicyComponent(_with_version(locate_component().read_bytes(), "0.9.9"))
    assert component.exports == ["agent-retry:policy/policy@0.9.9"]
    assert component.contract_version == "0.9.9"
    assert component.account_budget_interface == "agent-retry:policy/account-budget@0.9.9"
    assert component.shared_state_interface == "agent-retry:policy/shared-state@0.9.9"
    accounts = EmbeddedAccounts.on_host_clock()  # the clock passed: the wait is exact, not 399 across a millisecond
    config = {"account-budget": {"account-id": "acme", "capacity": 1, "refill-interval-ms": 400}}
    run = component.instantiate(accounts=accounts).load_policy(config).start_run("r")
    assert run.begin_call("lookup", None, None, 0).delay_ms == 0
    assert run.begin_call("lookup", None, None, 0).delay_ms == 400  # the budget import is wired


def test_instances_share_the_process_account_budget() -> None:
    accounts = EmbeddedAccounts.on_host_clock()  # the clock passed: the wait is exact, not 399 across a millisecond
    config = {"account-budget": {"account-id": "acme", "capacity": 1, "refill-interval-ms": 400}}
    component = PolicyComponent.load()
    first = component.instantiate(accounts=accounts).load_policy(config).start_run("w1")
    second = component.instantiate(accounts=accounts).load_policy(config).start_run("w2")
    now = 1_000_000
    assert first.begin_call("lookup", None, None, now).delay_ms == 0
    assert second.begin_call("lookup", None, None, now).delay_ms == 400  # the first took the only token


def test_wasi_random_comes_from_the_host_entropy_source() -> None:
    policy = PolicyComponent.load().instantiate(entropy=SplitMix64(42)).load_policy({"base-delay-ms": 1_000_000, "max-delay-ms": 1_000_000})
    draw = SplitMix64(42).next_u64()
    expected = policy.next_delay(1, None, draw)
    assert policy.next_delay(1) == expected  # the guest drew the same u64 through wasi:random


def test_typed_errors_for_config_and_misuse() -> None:
    instance = PolicyComponent.load().instantiate()
    with pytest.raises(ConfigError) as bad:
        instance.load_policy({"max-attempts-per-call": 0})
    assert bad.value.kind == "out-of-range" and bad.value.field == "max-attempts-per-call"
    run = instance.load_policy({}).start_run("r")
    with pytest.raises(RunMisuse) as misuse:
        run.record_success(7, 1, 1)
    assert misuse.value.error == {"unknown-call": 7}
    with pytest.raises(RunMisuse) as misuse:
        run.record_failure(8, 1, http_failure(503), None, 1, 1)
    assert misuse.value.error == {"unknown-call": 8}


def test_bad_values_are_rejected_before_the_call_and_the_instance_goes_on() -> None:
    instance = PolicyComponent.load().instantiate()
    policy = instance.load_policy({})
    for bad in (
        {"kind": {"http-status": 70000}},
        {"kind": {"nope": 1}},
        {"kind": "http-status"},
        {"kind": {"http-status": 503}, "extra": 1},
    ):
        with pytest.raises(ValueConversionError):
            policy.classify(bad, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueConversionError):
        policy.next_delay(1, None, -1)
    assert policy.classify(http_failure(503, [("Retry-After", "2")]), 0)["hint-ms"] == 2000
    assert policy.classify(transport_failure("timeout"), 0)["class"] == "transient"
    assert policy.next_delay(1, None, "0xffffffffffffffff") == 1000  # type: ignore[arg-type]


def test_a_trap_is_typed_and_the_instance_is_not_reused() -> None:
    instance = PolicyComponent.load().instantiate(fuel_per_call=50, fuel_per_config_byte=0)
    with pytest.raises(PolicyTrap):
        instance.load_policy({})
    with pytest.raises(InstanceUnusable):
        instance.derive_idempotency_key("r", "1")


def test_closed_handles_refuse_calls() -> None:
    run = PolicyComponent.load().instantiate().load_policy({}).start_run("r")
    with run:
        assert run.report()["run-id"] == "r"
    with pytest.raises(InstanceUnusable):
        run.report()


def test_a_failing_account_backend_traps_the_call_with_its_exception() -> None:
    class Down:
        def reserve(self, *_args: object) -> Reservation:
            raise ConnectionError("redis is down")

        def refund(self, *_args: object) -> None:
            raise ConnectionError("redis is down")

    instance = PolicyComponent.load().instantiate(accounts=Down())
    policy = instance.load_policy({"account-budget": {"account-id": "acme", "capacity": 1, "refill-interval-ms": 10}})
    run = policy.start_run("r")
    with pytest.raises(PolicyTrap) as trapped:
        run.begin_call("lookup", None, None, 0)
    assert isinstance(trapped.value.__cause__, ConnectionError)
    with pytest.raises(InstanceUnusable):
        run.report()


def test_a_refund_gives_tokens_back_but_never_past_a_full_bucket() -> None:
    accounts = EmbeddedAccounts.on_host_clock()  # every call passes 0: waits are exact
    bucket = Bucket(3, 100)
    for _ in range(3):
        accounts.reserve("q", 1, bucket, 0, 0)
    assert accounts.reserve("q", 1, bucket, 0, 0) == Reservation(False, 100)
    accounts.refund("q", 1, bucket, 0)
    assert accounts.reserve("q", 1, bucket, 0, 0) == Reservation(True, 0)
    accounts.refund("q", 50, bucket, 0)
    for _ in range(3):
        assert accounts.reserve("q", 1, bucket, 0, 0) == Reservation(True, 0)
    assert accounts.reserve("q", 1, bucket, 0, 0) == Reservation(False, 100)
    assert accounts.reserve("q", 0, bucket, 0, 0) == Reservation(True, 0)


def _process_now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize("bad", ["microseconds", "a year ago", "zero"])
def test_a_bad_clock_cannot_poison_the_account_for_every_worker(bad: str) -> None:
    # One worker passing µs once made every worker of the account escalate "room returns at 57883-07-15".
    now = _process_now_ms()
    bad_now = {"microseconds": now * 1000, "a year ago": now - 400 * 24 * 3_600_000, "zero": 0}[bad]
    bucket = Bucket(capacity=2, refill_interval_ms=1000)
    accounts = EmbeddedAccounts()
    assert accounts.reserve("acct", 1, bucket, 0, bad_now) == Reservation(True, 0)
    # The bad call used the process's clock at that moment, later than `now`:
    # each good call reads the clock afresh (one read before it failed when the
    # millisecond turned in between).
    assert accounts.reserve("acct", 1, bucket, 0, _process_now_ms()) == Reservation(True, 0)
    refused = accounts.reserve("acct", 1, bucket, 0, _process_now_ms())
    assert not refused.granted and refused.wait_ms <= 1000, "room within one interval"
    accounts.refund("acct", 1, bucket, bad_now)
    assert accounts.reserve("acct", 1, bucket, 0, _process_now_ms()) == Reservation(True, 0)


_HOUR_MS = 3_600_000


@pytest.mark.parametrize("offset_ms", [_HOUR_MS, -_HOUR_MS], ids=["an hour ahead", "an hour behind"])
def test_a_clock_an_hour_off_neither_locks_the_account_nor_widens_it(offset_ms: int) -> None:
    # Issue 24, row 7: one worker an hour ahead once refused every worker of the
    # process for the hour ("resets in 3,600,050 ms") and overran the limit itself.
    bucket = Bucket(capacity=40, refill_interval_ms=60_000)

    def take_all(accounts: EmbeddedAccounts, offset: int) -> int:
        return sum(accounts.reserve("acct", 1, bucket, 0, _process_now_ms() + offset).granted for _ in range(100))

    first = EmbeddedAccounts()
    assert take_all(first, offset_ms) == 40, "the skewed worker takes the burst"
    after = first.reserve("acct", 1, bucket, 0, _process_now_ms())
    assert not after.granted and after.wait_ms <= bucket.refill_interval_ms, f"room in one interval, not an hour: {after}"
    second = EmbeddedAccounts()
    assert take_all(second, 0) == 40
    assert take_all(second, offset_ms) == 0, "40 in the window, not 80"


def test_a_step_back_of_the_wall_clock_moves_nothing() -> None:
    # The buckets keep the process's monotonic clock: every caller's time jumping
    # back an hour halfway leaves the account as it was.
    bucket = Bucket(capacity=40, refill_interval_ms=60_000)
    accounts = EmbeddedAccounts()
    before = sum(accounts.reserve("acct", 1, bucket, 0, _process_now_ms()).granted for _ in range(20))
    after = sum(accounts.reserve("acct", 1, bucket, 0, _process_now_ms() - _HOUR_MS).granted for _ in range(100))
    assert (before, after) == (20, 20), "the burst is 40 across the step"
    refused = accounts.reserve("acct", 1, bucket, 0, _process_now_ms() - _HOUR_MS)
    assert not refused.granted and refused.wait_ms <= bucket.refill_interval_ms


def test_a_backend_on_the_host_clock_is_poisoned_by_a_microsecond_clock() -> None:
    # Why the default keeps the process's time.
    bucket = Bucket(capacity=2, refill_interval_ms=1000)
    trusting = EmbeddedAccounts.on_host_clock()
    trusting.reserve("acct", 2, bucket, 0, _process_now_ms() * 1000)
    refused = trusting.reserve("acct", 1, bucket, 0, _process_now_ms())
    assert not refused.granted and refused.wait_ms > 1_000_000_000
