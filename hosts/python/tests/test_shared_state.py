"""The embedded shared state (contract 0.8.0's `shared-state` import, the
circuit breakers' store): compare-and-set by version, expiry on the store's
own clock, the 1,024-byte value and 10,000-key bounds; one beside each
embedded account budget, given to the component."""

from __future__ import annotations

import threading

import pytest

from agent_retry_policy import PROCESS_ACCOUNTS, PROCESS_SHARED_STATE, EmbeddedAccounts, EmbeddedSharedState, PolicyComponent
from agent_retry_policy.shared_state import MAX_KEYS, MAX_VALUE_BYTES


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


def test_an_absent_key_loads_as_none_at_version_0_with_the_time_it_was_passed() -> None:
    state = EmbeddedSharedState(clock=Clock())
    assert state.load("k", 42) == {"value": None, "version": 0, "now-ms": 42}


def test_store_if_compares_the_version_and_raises_it_on_every_store() -> None:
    state = EmbeddedSharedState(clock=Clock())
    assert state.store_if("k", 0, "a", 1_000)
    assert state.load("k", 7) == {"value": "a", "version": 1, "now-ms": 7}
    assert not state.store_if("k", 0, "b", 1_000)  # another writer stored first
    assert not state.store_if("k", 2, "b", 1_000)
    assert state.load("k", 7)["value"] == "a"
    assert state.store_if("k", 1, "b", 1_000)
    assert state.load("k", 7) == {"value": "b", "version": 2, "now-ms": 7}
    assert not state.store_if("other", 1, "x", 1_000)  # absent is version 0
    assert state.load("other", 7)["version"] == 0


def test_an_entry_expires_at_its_ttl_on_the_stores_clock_not_the_callers() -> None:
    clock = Clock(5_000)
    state = EmbeddedSharedState(clock=clock)
    assert state.store_if("k", 0, "open", 100)  # expires at 5,100
    clock.now = 5_099
    assert state.load("k", 0)["value"] == "open"  # the caller's now-ms (0) does not expire it
    clock.now = 5_100
    assert state.load("k", 9_999_999) == {"value": None, "version": 0, "now-ms": 9_999_999}
    assert len(state) == 0  # deleted when found expired
    # Expired is absent: the next store expects version 0, and the ttl counts from the store.
    assert not state.store_if("k", 1, "again", 100)
    assert state.store_if("k", 0, "again", 100)
    assert state.load("k", 0)["version"] == 1
    clock.now = 5_199
    assert state.load("k", 0)["value"] == "again"


def test_a_value_over_1024_bytes_is_refused() -> None:
    state = EmbeddedSharedState(clock=Clock())
    assert MAX_VALUE_BYTES == 1_024
    assert state.store_if("k", 0, "x" * 1_024, 1_000)
    assert not state.store_if("k", 1, "x" * 1_025, 1_000)
    assert not state.store_if("k", 1, "é" * 513, 1_000)  # 1,026 bytes in UTF-8, 513 characters
    assert state.load("k", 0)["version"] == 1


def test_a_new_key_is_refused_while_10000_are_held_after_dropping_the_expired() -> None:
    clock = Clock(0)
    state = EmbeddedSharedState(clock=clock)
    assert MAX_KEYS == 10_000
    for i in range(MAX_KEYS - 1):
        assert state.store_if(f"long-{i}", 0, "v", 1_000_000)
    assert state.store_if("short", 0, "v", 10)
    assert len(state) == MAX_KEYS
    assert not state.store_if("new", 0, "v", 1_000)  # full
    assert state.store_if("long-0", 1, "w", 1_000_000)  # a key held may still change
    clock.now = 10  # "short" has expired: dropped, which makes room for one
    assert state.store_if("new", 0, "v", 1_000)
    assert not state.store_if("newer", 0, "v", 1_000)
    assert len(state) == MAX_KEYS


def test_compare_and_set_is_atomic_across_threads() -> None:
    state = EmbeddedSharedState()
    wins: list[int] = []

    def writer(n: int) -> None:
        for _ in range(200):
            loaded = state.load("counter", 0)
            value = int(loaded["value"] or "0")
            if state.store_if("counter", loaded["version"], str(value + 1), 60_000):
                wins.append(n)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = state.load("counter", 0)
    # Every successful store saw the version before it: no increment was lost.
    assert int(loaded["value"] or "0") == len(wins) == loaded["version"]


def test_one_store_lives_beside_each_embedded_account_budget() -> None:
    assert isinstance(PROCESS_SHARED_STATE, EmbeddedSharedState)
    assert PROCESS_ACCOUNTS.shared_state is PROCESS_SHARED_STATE
    accounts = EmbeddedAccounts()
    assert isinstance(accounts.shared_state, EmbeddedSharedState)
    assert accounts.shared_state is not PROCESS_SHARED_STATE
    component = PolicyComponent.load()
    assert component.instantiate(accounts=accounts).shared_state is accounts.shared_state
    assert component.instantiate(accounts=accounts).shared_state is component.instantiate(accounts=accounts).shared_state
    assert component.instantiate().shared_state is PROCESS_SHARED_STATE
    own = EmbeddedSharedState()
    assert component.instantiate(accounts=accounts, shared_state=own).shared_state is own


BREAKERS = {"circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60_000}, "tools": {"q": {"effect": "read"}}}
NOW = 1_764_460_800_000


def _open_breaker(instance: object, server: str) -> None:
    from agent_retry_policy.types import http_failure

    run = instance.load_policy(BREAKERS).start_run("opener")  # type: ignore[attr-defined]
    for _ in range(2):
        start = run.begin_call("q", None, None, NOW, server=server)
        assert start.admitted
        run.record_failure(start.call_id, 1, http_failure(503), None, NOW, 1)


def test_the_component_keeps_its_breakers_in_the_store_it_is_given() -> None:
    """Runs on instances sharing one store share the breakers; a run on another store does not see them."""
    component = PolicyComponent.load()
    accounts = EmbeddedAccounts()
    _open_breaker(component.instantiate(accounts=accounts), "srv")
    assert len(accounts.shared_state) >= 1  # the breaker's state is in the store beside the accounts
    other = component.instantiate(accounts=accounts).load_policy(BREAKERS).start_run("other")
    refused = other.begin_call("q", None, None, NOW + 1, server="srv")
    assert (refused.admitted, refused.replan) == (False, True)
    decision = other.last_decision(refused.call_id)
    assert decision is not None and "circuit breaker open" in decision["action"]["replan"]  # type: ignore[index]
    # Another store (another account budget): no breaker is open there.
    elsewhere = component.instantiate(accounts=EmbeddedAccounts()).load_policy(BREAKERS).start_run("elsewhere")
    assert elsewhere.begin_call("q", None, None, NOW + 1, server="srv").admitted
    # No server named: no breaker applies, even where it is open.
    assert other.begin_call("q", None, None, NOW + 2).admitted


def test_a_store_that_refuses_every_store_leaves_the_breakers_closed() -> None:
    class Refusing(EmbeddedSharedState):
        def store_if(self, key: str, expected_version: int, value: str, ttl_ms: int) -> bool:
            return False

    component = PolicyComponent.load()
    instance = component.instantiate(accounts=EmbeddedAccounts(), shared_state=Refusing())
    _open_breaker(instance, "srv")
    run = instance.load_policy(BREAKERS).start_run("after")
    assert run.begin_call("q", None, None, NOW + 1, server="srv").admitted


@pytest.mark.parametrize("name", ["", "s" * 4096])
def test_a_server_up_to_4096_bytes_is_taken_and_a_longer_one_refused_without_a_call(name: str) -> None:
    from agent_retry_policy import RunMisuse

    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy(BREAKERS).start_run("r")
    assert run.begin_call("q", None, None, NOW, server=name).admitted
    with pytest.raises(RunMisuse) as raised:
        run.begin_call("q", None, None, NOW, server=name + "s" * 4097)
    assert raised.value.error == {"too-large": {"input": "server", "size-bytes": len(name) + 4097, "limit-bytes": 4096}}
