"""Contract 0.8.0's additions in this host (0.9.0 keeps them; the version
test is test_contract_090.py, which refuses a 0.8 component): the `shared-state` import, `begin-call`'s server, `call-start`'s
`replan` and `breaker-changed`, the verdict's `breaker-changed`,
`take-breaker-changes`, and the reason and rule `circuit-open`."""

from __future__ import annotations

from agent_retry_policy import CONTRACT_VERSION, EmbeddedAccounts, PolicyComponent
from agent_retry_policy.component import SHARED_STATE_INTERFACE
from agent_retry_policy.types import CallStart, http_failure

NOW = 1_764_460_800_000
BREAKERS = {"circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60_000}, "tools": {"q": {"effect": "read"}}}


def test_the_component_imports_the_shared_state_and_the_host_provides_it() -> None:
    component = PolicyComponent.load()
    assert SHARED_STATE_INTERFACE == f"agent-retry:policy/shared-state@{CONTRACT_VERSION}"
    assert component.shared_state_interface == SHARED_STATE_INTERFACE
    assert SHARED_STATE_INTERFACE in component.imports


def _opened(config: dict[str, object]) -> tuple[object, object]:
    """A run whose two failed calls of `q` on `srv` opened its breakers, and its instance."""
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    run = instance.load_policy(config).start_run("r")
    first = run.begin_call("q", None, None, NOW, server="srv")
    assert (first.admitted, first.replan, first.breaker_changed) == (True, False, False)
    verdict = run.record_failure(first.call_id, 1, http_failure(503), None, NOW, 1)
    assert (verdict.action, verdict.breaker_changed) == ("retry", False)
    assert run.take_breaker_changes() == []
    verdict = run.record_failure(first.call_id, 2, http_failure(503), None, NOW + 1, 1)
    assert verdict.breaker_changed
    return instance, run


def test_breakers_open_after_the_failures_and_the_changes_are_taken_once() -> None:
    _, run = _opened(BREAKERS)
    changes = run.take_breaker_changes()  # type: ignore[attr-defined]
    assert [(c["server"], c["tool"], c["old-state"], c["new-state"]) for c in changes] == [
        ("srv", None, "closed", "open"),
        ("srv", "q", "closed", "open"),
    ]
    assert all(isinstance(c["until-ms"], int) and c["until-ms"] > NOW for c in changes)
    assert all("2 failures in a row" in c["why"] for c in changes)
    assert run.take_breaker_changes() == []  # type: ignore[attr-defined]  # forgotten once taken


def test_a_call_while_the_breaker_is_open_is_a_replan_before_send_on_both_paths() -> None:
    instance, run = _opened(BREAKERS)
    run.take_breaker_changes()  # type: ignore[attr-defined]
    rule_names = instance.rule_names()  # type: ignore[attr-defined]
    assert rule_names[24] == "circuit-open"

    class Hints(dict):  # type: ignore[type-arg]  # not a plain dict: the generic path
        pass

    for hints in (None, Hints({"read-only": True})):
        # A run of its own each (a run's replans are budgeted), on the same store.
        run = instance.load_policy(BREAKERS).start_run("next")  # type: ignore[attr-defined]
        start = run.begin_call("q", None, hints, NOW + 2, server="srv")
        assert isinstance(start, CallStart)
        assert (start.admitted, start.replan) == (False, True)
        assert start.call_id != 0
        decision = run.last_decision(start.call_id)  # type: ignore[attr-defined]
        assert decision["rule"] == "circuit-open"
        assert decision["attempt"] == 0
        message = decision["action"]["replan"]
        assert "circuit breaker open" in message and "srv" in message
    # Another server's calls go on.
    assert run.begin_call("q", None, None, NOW + 3, server="other").admitted  # type: ignore[attr-defined]
    assert run.escalation() is None  # type: ignore[attr-defined]


def test_when_open_escalate_refuses_the_call_with_the_reason_circuit_open() -> None:
    config = {**BREAKERS, "circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60_000, "when-open": "escalate"}}
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts())
    opener = instance.load_policy(config).start_run("opener")
    for n in range(2):
        start = opener.begin_call("q", None, None, NOW + n, server="srv")
        opener.record_failure(start.call_id, 1, http_failure(503), None, NOW + n, 1)
    run = instance.load_policy(config).start_run("r")
    start = run.begin_call("q", None, None, NOW + 5, server="srv")
    assert (start.admitted, start.replan, start.call_id) == (False, False, 0)
    escalation = run.escalation()
    assert escalation is not None and escalation["reason"] == "circuit-open"
    assert isinstance(escalation["resets-in-ms"], int) and 0 < escalation["resets-in-ms"] <= 60_000
