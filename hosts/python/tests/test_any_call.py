"""`call_with_policy` against a local faulty HTTP server (tests/faulty_http.py)
through httpx and requests: what each failure leads to, the key of a keyed
write, the limits, the guard, the status check, and the counts against the
run report."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from faulty_http import Answer, FaultyServer, closed_port_url
from log_lines import HELPER_LOGGER, logged
from test_sandbox import hostile_bytes

from agent_retry_policy import CallTimedOut, PolicyBoundaryViolation, PolicyComponent
from agent_retry_policy.any_call import Attempt, call_with_policy
from agent_retry_policy.errors import CallCancelled, Escalated, ObservedFailure, ReplanNeeded
from agent_retry_policy.hooks import Hooks
from agent_retry_policy.metrics import RetryMetrics
from agent_retry_policy.testing import FakeClock, fixed_entropy
from agent_retry_policy.types import http_failure

CONFIG = {
    "tools": {
        "get_quote": {"effect": "read"},
        "update_address": {"effect": "write", "idempotent": True},
        "send_payment": {"effect": "write"},
    }
}


def new_run(config: Any = CONFIG, run_id: str = "RUN-ANY") -> Any:
    return PolicyComponent.load().instantiate().load_policy(config).start_run(run_id)


@pytest.fixture
def server() -> Iterator[Any]:
    started: list[FaultyServer] = []

    def start(*answers: Answer) -> FaultyServer:
        started.append(FaultyServer(*answers))
        return started[-1]

    yield start
    for s in started:
        s.close()


def lines(caplog: pytest.LogCaptureFixture, event: str = "agent_retry.attempt") -> list[dict[str, Any]]:
    return logged(caplog, HELPER_LOGGER, event)


def httpx_post(client: httpx.AsyncClient, url: str) -> Any:
    async def attempt(a: Attempt) -> httpx.Response:
        headers = {"idempotency-key": a.idempotency_key} if a.idempotency_key else {}
        return (await client.post(url, headers=headers, content=b"{}")).raise_for_status()

    return attempt


def test_a_429_with_retry_after_waits_what_the_server_said(server: Any, caplog: pytest.LogCaptureFixture) -> None:
    s = server(Answer(429, [("Retry-After", "2")], "slow down"), Answer(200, body='{"ok":true}'))
    clock, run, metrics = FakeClock(0), new_run(), RetryMetrics()

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(run, "get_quote", httpx_post(client, s.url + "/quote"), clock=clock, metrics=metrics)

    with caplog.at_level(logging.INFO, logger="agent_retry_policy.calls"):
        response = asyncio.run(go())
    assert response.json() == {"ok": True}
    assert clock.sleeps_ms == [2000]
    first = lines(caplog)[0]
    assert (first["outcome"], first["class"], first["action"], first["hint_ms"], first["delay_ms"]) == (
        "http 429",
        "throttled",
        "retry",
        2000,
        2000,
    )
    assert len(s.seen) == 2
    assert metrics.attempts == run.report()["attempts"] == 2


def test_a_503_the_server_says_not_to_retry_is_sent_once(server: Any) -> None:
    s = server(Answer(503, [("x-should-retry", "false")], "busy"), Answer(200))
    run = new_run()

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(run, "get_quote", httpx_post(client, s.url), clock=FakeClock(0))

    with pytest.raises(Escalated) as escalated:
        asyncio.run(go())
    assert escalated.value.reason == "retry-forbidden"
    assert len(s.seen) == 1


def test_a_503_is_retried_and_a_401_escalates_without_a_retry(server: Any) -> None:
    s = server(Answer(503, body="busy"), Answer(401, [("www-authenticate", "Bearer")], "bad key"))
    run, clock = new_run(), FakeClock(0)

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(run, "get_quote", httpx_post(client, s.url), clock=clock)

    with pytest.raises(Escalated) as escalated:
        asyncio.run(go())
    assert escalated.value.reason == "permission-denied"
    assert "HTTP 401: bad key" in escalated.value.note
    assert len(s.seen) == 2 and len(clock.sleeps_ms) == 1


def test_a_refused_connection_is_retried_within_the_attempts_allowed(caplog: pytest.LogCaptureFixture) -> None:
    run, clock = new_run(), FakeClock(0)
    url = closed_port_url()

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(run, "get_quote", httpx_post(client, url), clock=clock)

    with caplog.at_level(logging.INFO, logger="agent_retry_policy.calls"), pytest.raises(Escalated) as escalated:
        asyncio.run(go())
    assert escalated.value.reason == "call-attempts-spent"
    assert {line["outcome"] for line in lines(caplog)} == {"transport connection-refused"}
    assert len(clock.sleeps_ms) == len(lines(caplog)) - 1 == run.report()["attempts"] - 1


def test_a_read_timeout_of_an_unkeyed_write_asks_the_status_check(server: Any, caplog: pytest.LogCaptureFixture) -> None:
    s = server(Answer(200, body="{}", delay_s=0.5), Answer(200, body='{"paid":1}'))
    run, clock = new_run(), FakeClock(0)
    asked: list[Attempt] = []

    async def payment_made(attempt: Attempt) -> str:
        asked.append(attempt)
        return "absent"

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=0.1) as client:
            return await call_with_policy(run, "send_payment", httpx_post(client, s.url), clock=clock, status_check=payment_made)

    with caplog.at_level(logging.INFO, logger="agent_retry_policy.calls"):
        response = asyncio.run(go())
    assert response.json() == {"paid": 1}
    assert [a.number for a in asked] == [1]
    checks = lines(caplog, "agent_retry.status_check")
    assert [(c["attempt"], c["check_tool"], c["result"]) for c in checks] == [(1, "payment_made", "absent")]
    assert [line["outcome"] for line in lines(caplog)] == ["transport timeout", "status check absent", "success"]
    assert run.report()["status-checks"] == 1


def test_an_unkeyed_write_nobody_can_check_escalates_status_unknown(server: Any) -> None:
    s = server(Answer(200, body="{}", delay_s=0.5))
    run = new_run()

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=0.1) as client:
            return await call_with_policy(run, "send_payment", httpx_post(client, s.url), clock=FakeClock(0))

    with pytest.raises(Escalated) as escalated:
        asyncio.run(go())
    assert escalated.value.reason == "status-unknown"
    assert len(s.seen) == 1  # never sent again


def test_a_keyed_write_carries_one_key_in_every_attempt(server: Any) -> None:
    s = server(Answer(503), Answer(502), Answer(200, body="{}"))
    run = new_run()
    keys: list[str | None] = []

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            send = httpx_post(client, s.url)

            async def attempt(a: Attempt) -> Any:
                keys.append(a.idempotency_key)
                return await send(a)

            return await call_with_policy(run, "update_address", attempt, clock=FakeClock(0), action_id="address-1")

    asyncio.run(go())
    expected = run.instance.derive_idempotency_key("RUN-ANY", "address-1")
    assert keys == [expected] * 3
    assert [seen.headers.get("idempotency-key") for seen in s.seen] == [expected] * 3


def test_the_default_action_id_counts_the_runs_calls() -> None:
    run = new_run()
    keys: list[Any] = []

    async def attempt(a: Attempt) -> str:
        keys.append(a.idempotency_key)
        return "ok"

    async def go() -> None:
        await call_with_policy(run, "get_quote", attempt, clock=FakeClock(0))
        await call_with_policy(run, "update_address", attempt, clock=FakeClock(0))
        await call_with_policy(run, "get_quote", attempt, clock=FakeClock(0), hints={"idempotent": True}, keyed=False)

    asyncio.run(go())
    assert keys == [None, run.instance.derive_idempotency_key("RUN-ANY", "step-2"), None]


def test_a_returned_error_response_is_a_failure(server: Any) -> None:
    s = server(Answer(503, body="busy"), Answer(200, body='{"n":1}'))
    run, clock = new_run(), FakeClock(0)

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(run, "get_quote", lambda _a: client.get(s.url), clock=clock)

    assert asyncio.run(go()).json() == {"n": 1}
    assert run.report()["statuses"] == [{"status": 503, "count": 1}]


def test_requests_errors_are_mapped_too(server: Any) -> None:
    s = server(Answer(503, body="busy"), Answer(200, body='{"n":2}'))
    run, clock = new_run(), FakeClock(0)

    async def attempt(_a: Attempt) -> Any:
        response = await asyncio.to_thread(requests.get, s.url, timeout=5)
        response.raise_for_status()
        return response.json()

    assert asyncio.run(call_with_policy(run, "get_quote", attempt, clock=clock)) == {"n": 2}
    assert run.report()["statuses"] == [{"status": 503, "count": 1}]


def test_an_exception_no_mapping_knows_is_re_raised_unchanged_and_the_call_abandoned() -> None:
    run = new_run()
    bug = KeyError("price")

    async def attempt(_a: Attempt) -> Any:
        raise bug

    with pytest.raises(KeyError) as raised:
        asyncio.run(call_with_policy(run, "get_quote", attempt, clock=FakeClock(0)))
    assert raised.value is bug
    report = run.report()
    assert (report["abandoned-calls"], report["attempts"]) == (1, 1)
    # The run goes on: the next call is admitted.
    assert asyncio.run(call_with_policy(run, "get_quote", lambda _a: asyncio.sleep(0, "ok"), clock=FakeClock(0))) == "ok"


def test_a_replan_raises_replan_needed_with_the_message_and_rule() -> None:
    run = new_run()
    with pytest.raises(ReplanNeeded) as replan:
        asyncio.run(call_with_policy(run, "get_quote", _raising(http_failure(422, (), "sku unknown")), clock=FakeClock(0)))
    assert "sku unknown" in replan.value.message
    assert replan.value.rule == "http-status"
    assert run.report()["replans"] == 1


def test_the_call_timeout_stops_an_attempt_in_flight() -> None:
    run = new_run()

    async def slow(_a: Attempt) -> Any:
        await asyncio.sleep(5)

    metrics = RetryMetrics()
    with pytest.raises(CallTimedOut) as stopped:
        asyncio.run(call_with_policy(run, "send_payment", slow, call_timeout_s=0.1, metrics=metrics))
    assert stopped.value.cause == "call-timeout"
    assert stopped.value.may_have_applied is True
    assert run.report()["abandoned-calls"] == 1
    assert metrics.attempts == run.report()["attempts"] == 1
    assert metrics.snapshot()["agent_retry_attempts_total"] == [{"labels": {"class": "none", "action": "stop"}, "value": 1}]


def test_a_wait_past_the_call_timeout_is_not_slept() -> None:
    run, clock = new_run(), FakeClock(0)
    answers = [http_failure(429, [("retry-after", "30")]), "never"]

    async def attempt(_a: Attempt) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, dict):
            raise ObservedFailure(answer)
        return answer

    with pytest.raises((CallTimedOut, Escalated)):
        asyncio.run(call_with_policy(run, "get_quote", attempt, clock=clock, call_timeout_s=5))
    assert clock.sleeps_ms == []  # the server's 30 s are past the 5 s left: not slept
    assert answers == ["never"]


def test_a_cancelled_call_is_abandoned() -> None:
    run = new_run()

    async def go() -> None:
        started = asyncio.Event()

        async def slow(_a: Attempt) -> Any:
            started.set()
            await asyncio.sleep(5)

        task = asyncio.ensure_future(call_with_policy(run, "get_quote", slow))
        await started.wait()
        task.cancel()
        await task

    with pytest.raises(CallCancelled):
        asyncio.run(go())
    assert run.report()["abandoned-calls"] == 1


def test_a_verdict_that_breaks_an_invariant_ends_the_run_nothing_sent_after(caplog: pytest.LogCaptureFixture) -> None:
    # The liar component (target/hostile/liar.wasm) retries a 403: the guard, not the policy, stops it.
    component = PolicyComponent(hostile_bytes("liar"), source="liar.wasm")
    run = component.instantiate().load_policy({"base-delay-ms": 20, "x-liar": {"retry": True, "tools": ["get_quote"]}}).start_run("LIAR")
    sent: list[str] = []

    def forbidden(tool: str) -> Any:
        async def attempt(_a: Attempt) -> Any:
            sent.append(tool)
            raise ObservedFailure(http_failure(403, (), "forbidden"))

        return attempt

    metrics = RetryMetrics()
    with caplog.at_level(logging.INFO, logger="agent_retry_policy.calls"):
        with pytest.raises(Escalated) as first:
            asyncio.run(call_with_policy(run, "get_quote", forbidden("get_quote"), clock=FakeClock(0), metrics=metrics))
        with pytest.raises(Escalated) as later:
            asyncio.run(call_with_policy(run, "lookup", forbidden("lookup"), clock=FakeClock(0), metrics=metrics))
    assert metrics.attempts == run.report()["attempts"] == 1
    assert sent == ["get_quote"]  # the 403 was not sent again, and nothing after it
    assert isinstance(first.value.policy_failure, PolicyBoundaryViolation)
    assert "invariant client-error-repeated" in first.value.note
    assert later.value.note == first.value.note and later.value.tool == "lookup"
    assert [line["invariant"] for line in lines(caplog) if "invariant" in line] == ["client-error-repeated"] * 2
    assert [e["reason"] for e in lines(caplog, "agent_retry.escalation")] == ["unclassified-failure"] * 2


def test_a_raising_hook_does_not_change_the_call(server: Any) -> None:
    s = server(Answer(503), Answer(200, body="{}"))
    run = new_run()

    def boom(_e: Any) -> None:
        raise ValueError("observer bug")

    async def go() -> Any:
        async with httpx.AsyncClient() as client:
            return await call_with_policy(
                run, "get_quote", httpx_post(client, s.url), clock=FakeClock(0), hooks=Hooks(on_retry=boom, on_wait=boom)
            )

    assert asyncio.run(go()).status_code == 200
    assert len(s.seen) == 2


def test_an_empty_result_is_reported_as_empty() -> None:
    run = new_run()
    results = [[], [], [], [], [1]]

    async def attempt(_a: Attempt) -> Any:
        return results.pop(0)

    try:
        value = asyncio.run(
            call_with_policy(run, "get_quote", attempt, clock=FakeClock(0), is_empty=lambda v: "no rows" if v == [] else None)
        )
    except (ReplanNeeded, Escalated) as e:
        value = e
    # Whatever the policy decided, it was told the result was empty.
    assert run.report()["attempts"] >= 1
    assert value == [1] or isinstance(value, (ReplanNeeded, Escalated))
    if isinstance(value, ReplanNeeded):
        assert "no rows" in value.message


def _raising(observation: Any) -> Any:
    async def attempt(_a: Attempt) -> Any:
        raise ObservedFailure(observation)

    return attempt


def test_the_same_seed_replays_the_same_delays() -> None:
    def delays() -> list[int]:
        run, clock = new_run(), FakeClock(0)
        answers = [http_failure(503), http_failure(503), "ok"]

        async def attempt(_a: Attempt) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, dict):
                raise ObservedFailure(answer)
            return answer

        asyncio.run(call_with_policy(run, "get_quote", attempt, clock=clock, entropy=fixed_entropy(11)))
        return clock.sleeps_ms

    assert delays() == delays()


def test_a_broken_translation_is_the_callers_bug_re_raised() -> None:
    run = new_run()

    def observe(_e: BaseException) -> Any:
        return "HTTP 503"  # not an observation

    async def fails(_a: Attempt) -> Any:
        raise RuntimeError("x")

    with pytest.raises(TypeError, match="observe must return"):
        asyncio.run(call_with_policy(run, "get_quote", fails, observe=observe, clock=FakeClock(0)))
    with pytest.raises(ZeroDivisionError):
        asyncio.run(call_with_policy(run, "get_quote", lambda _a: asyncio.sleep(0, []), is_empty=lambda v: 1 / 0, clock=FakeClock(0)))
    # Each call was abandoned: none is left open, and the run goes on.
    assert run.report()["abandoned-calls"] == 2
    assert asyncio.run(call_with_policy(run, "get_quote", lambda _a: asyncio.sleep(0, "ok"), clock=FakeClock(0))) == "ok"


def test_a_huge_observation_is_bounded_before_it_reaches_the_policy() -> None:
    run = new_run()
    huge = http_failure(503, [(f"x-{i}", "v" * 5000) for i in range(500)], "b" * 10_000_000)
    answers: list[Any] = [huge, "ok"]

    async def attempt(_a: Attempt) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, dict):
            raise ObservedFailure(answer)
        return answer

    assert asyncio.run(call_with_policy(run, "get_quote", attempt, clock=FakeClock(0))) == "ok"


def test_an_account_budget_wait_and_refusal_are_counted() -> None:
    from agent_retry_policy import EmbeddedAccounts

    accounts = EmbeddedAccounts()
    budget = {"account-budget": {"account-id": "acme-any", "capacity": 1, "refill-interval-ms": 400, "max-wait-ms": 1000}}
    run = PolicyComponent.load().instantiate(accounts=accounts).load_policy({**CONFIG, **budget}).start_run("BUDGET")
    clock, metrics, waits = FakeClock(1_000_000), RetryMetrics(), []
    hooks = Hooks(on_wait=waits.append)

    async def go() -> list[Any]:
        out = []
        for _ in range(2):  # the second call waits for a token (the clock only moves when slept on)
            out.append(
                await call_with_policy(run, "get_quote", lambda _a: asyncio.sleep(0, "ok"), clock=clock, metrics=metrics, hooks=hooks)
            )
        return out

    assert asyncio.run(go()) == ["ok", "ok"]
    assert [(w.why, w.attempt) for w in waits] == [("admission", 1)]
    snapshot = metrics.snapshot()
    assert snapshot["agent_retry_account_waits_total"] == [{"labels": {}, "value": 1}]
    assert snapshot["agent_retry_waits_total"] == [{"labels": {"why": "admission"}, "value": 1}]
    assert clock.sleeps_ms == [waits[0].wait_ms] and waits[0].wait_ms > 0
    assert metrics.attempts == run.report()["attempts"] == 2
    # A budget that cannot wait long enough refuses the call: counted, nothing sent.
    tight = {"account-budget": {"account-id": "acme-tight", "capacity": 1, "refill-interval-ms": 60_000, "max-wait-ms": 10}}
    run = PolicyComponent.load().instantiate(accounts=accounts).load_policy({**CONFIG, **tight}).start_run("TIGHT")
    sent: list[int] = []

    async def attempt(a: Attempt) -> str:
        sent.append(a.number)
        return "ok"

    async def refused() -> None:
        await call_with_policy(run, "get_quote", attempt, clock=clock, metrics=metrics)
        await call_with_policy(run, "get_quote", attempt, clock=clock, metrics=metrics)

    with pytest.raises(Escalated) as escalated:
        asyncio.run(refused())
    assert escalated.value.reason == "account-budget-exhausted"
    assert sent == [1]
    assert metrics.snapshot()["agent_retry_account_refusals_total"] == [{"labels": {}, "value": 1}]
