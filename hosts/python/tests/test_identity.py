"""Every decision log line says which policy made it (issue 8): the component's
identity (contract version and the SHA-256 of its .wasm), on the component and
each instance, and the `policy` field of every attempt line the MCP wrapper
logs: the instance's identity by default, or the `policy_identity` it was given
(a LivePolicy's `str(loaded.identity)`)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from demo_server import Desk, http
from mcp import ClientSession
from test_host import _with_version
from test_live import deployed, reads, with_custom_section
from test_mcp_e2e import CONFIG, attempt_lines, new_caller, run_with_session

from agent_retry_policy import CONTRACT_VERSION, EmbeddedAccounts, Escalated, LivePolicy, PolicyComponent, SplitMix64, locate_component
from agent_retry_policy.mcp_client import RetryingToolCaller

IDENTITY = re.compile(r"agent-retry:policy@(\d+\.\d+\.\d+) wasm ([0-9a-f]{12})")


def expected_identity(wasm: bytes, version: str = CONTRACT_VERSION) -> str:
    return f"agent-retry:policy@{version} wasm {hashlib.sha256(wasm).hexdigest()[:12]}"


def test_the_component_and_each_instance_know_their_identity() -> None:
    wasm = locate_component().read_bytes()
    component = PolicyComponent.load()
    assert component.identity == expected_identity(wasm)
    matched = IDENTITY.fullmatch(component.identity)
    assert matched is not None and matched.group(1) == "0.9.0", component.identity
    assert component.wasm_sha256 == hashlib.sha256(wasm).hexdigest()
    first, second = component.instantiate(), component.instantiate()
    assert first.policy_identity == second.policy_identity == component.identity


def test_the_identity_follows_the_bytes_and_the_version_the_component_speaks() -> None:
    wasm = locate_component().read_bytes()
    other_bytes = with_custom_section(wasm, b"v2")  # the same policy, another digest
    other = PolicyComponent(other_bytes)
    assert other.identity == expected_identity(other_bytes)
    assert other.identity != PolicyComponent.load().identity
    compatible_bytes = _with_version(wasm, "0.9.9")
    compatible = PolicyComponent(compatible_bytes)
    assert compatible.identity == expected_identity(compatible_bytes, "0.9.9")
    assert compatible.instantiate().policy_identity.startswith("agent-retry:policy@0.9.9 wasm ")


def test_the_wrapper_logs_the_components_identity_by_default(serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})

    async def body(session: ClientSession) -> str:
        caller = new_caller(session)
        await caller.call_tool("lookup_order", {"order_id": "A1"})
        return caller.policy_identity

    identity = run_with_session(desk, body)
    assert identity == expected_identity(locate_component().read_bytes())
    lines = attempt_lines(caplog)
    assert [line["action"] for line in lines] == ["retry", "succeed"]
    assert [line["policy"] for line in lines] == [identity, identity]


def test_a_wrapper_given_a_policy_identity_logs_it_on_every_attempt_line(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})
    given = "generation 7 (wasm 1a2b3c4d5e6f, config 0f0e0d0c0b0a)"

    async def body(session: ClientSession) -> None:
        instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        # Three steps: the tools/list pseudo-call and the two attempts of the first lookup.
        run = instance.load_policy({**CONFIG, "max-steps-per-run": 3}).start_run("CASE-8")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3), policy_identity=given)
        assert caller.policy_identity == given
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error
        await caller.call_tool("lookup_order", {"order_id": "A2"})  # refused: the run's steps are spent

    with pytest.raises(Escalated):
        run_with_session(desk, body)
    lines = attempt_lines(caplog)
    # A retry, a success and a refusal before sending: every kind of line.
    assert [(line["action"], line["outcome"]) for line in lines] == [
        ("retry", "http 503"),
        ("succeed", "success"),
        ("escalate", "not sent"),
    ]
    assert all(line["policy"] == given for line in attempt_lines(caplog, pseudo=True)), lines


def test_a_wrapper_logs_the_policy_identity_when_the_policy_itself_fails(
    serve: Callable[..., Desk], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve()

    async def body(session: ClientSession) -> None:
        caller = new_caller(session, policy_identity="generation 2 (wasm aaaaaaaaaaaa, config bbbbbbbbbbbb)")
        caller.run.instance._broken = "a trap earlier"  # the instance is unusable: the safe fallback escalates
        await caller.call_tool("lookup_order", {"order_id": "A1"})

    with pytest.raises(Escalated) as raised:
        run_with_session(desk, body)
    assert raised.value.policy_failure is not None
    (line,) = attempt_lines(caplog, pseudo=True)  # the first call of the policy: listing the tools
    assert (line["tool"], line["action"], line["escalation"]) == ("tools/list", "escalate", "unclassified-failure")
    assert line["policy"] == "generation 2 (wasm aaaaaaaaaaaa, config bbbbbbbbbbbb)"


def test_a_wrapper_built_with_a_live_policys_identity_logs_it(
    serve: Callable[..., Desk], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = deployed(tmp_path)
    live = LivePolicy.open(source)
    source.config.write_text(reads(3))
    source.wasm.write_bytes(with_custom_section(source.wasm.read_bytes(), b"v2"))
    live.reload()
    loaded = live.current()
    wasm, config = source.wasm.read_bytes(), source.config.read_bytes()
    served = f"generation 2 (wasm {hashlib.sha256(wasm).hexdigest()[:12]}, config {hashlib.sha256(config).hexdigest()[:12]})"
    assert str(loaded.identity) == served
    # The Loaded's component knows the same bytes.
    assert loaded.component.identity == expected_identity(wasm)
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    desk = serve({"tool": "lookup_order", "call": 1, "fault": http(503, "upstream unavailable")})

    async def body(session: ClientSession) -> None:
        instance = loaded.component.instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
        run = instance.load_policy(loaded.config_json).start_run("CASE-8-live")
        caller = RetryingToolCaller(session, run, entropy=SplitMix64(3), policy_identity=str(loaded.identity))
        assert not (await caller.call_tool("lookup_order", {"order_id": "A1"})).is_error

    run_with_session(desk, body)
    lines = attempt_lines(caplog)
    assert [line["action"] for line in lines] == ["retry", "succeed"]
    assert [line["policy"] for line in lines] == [served, served]


def test_a_policy_identity_that_is_not_a_string_is_refused() -> None:
    run = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts()).load_policy({}).start_run("r")
    with pytest.raises(TypeError, match=r"str\(loaded.identity\)"):
        RetryingToolCaller(None, run, policy_identity=3)  # type: ignore[arg-type]
