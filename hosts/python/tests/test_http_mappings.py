"""The built-in mappings (`http_errors`): each client's exceptions as the
contract's observation, only translated; and the openai and anthropic SDK
clients (their own retries off) against the local faulty HTTP server."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import requests
from faulty_http import Answer, FaultyServer, closed_port_url

from agent_retry_policy import PolicyComponent
from agent_retry_policy.any_call import Attempt, call_with_policy
from agent_retry_policy.errors import Escalated
from agent_retry_policy.http_errors import observe_exception, observe_result
from agent_retry_policy.limits import MAX_BODY_BYTES, MAX_HEADERS
from agent_retry_policy.testing import FakeClock

REQUEST = httpx.Request("POST", "https://api.example/v1/x")


def response(status: int, headers: list[tuple[str, str]] | None = None, body: str = "") -> httpx.Response:
    return httpx.Response(status, headers=headers or [], text=body, request=REQUEST)


def kind_and_delivery(observation: Any) -> tuple[Any, Any]:
    return observation["kind"], observation["delivery"]


def test_an_httpx_status_error_keeps_status_headers_as_received_and_body() -> None:
    error = httpx.HTTPStatusError(
        "429", request=REQUEST, response=response(429, [("Retry-After", "3"), ("set-cookie", "a=1"), ("set-cookie", "b=2")], "slow")
    )
    observation = observe_exception(error)
    assert observation is not None
    assert observation["kind"] == {"http-status": 429}
    assert observation["headers"].split("\n")[:3] == ["retry-after: 3", "set-cookie: a=1", "set-cookie: b=2"]
    assert observation["body"] == "slow"


def test_huge_answers_are_bounded_by_the_limits() -> None:
    headers = [(f"x-h{i}", "v" * 10_000) for i in range(300)]
    observation = observe_result(response(503, headers, "é" * MAX_BODY_BYTES))
    assert observation is not None
    lines = observation["headers"].split("\n")
    assert len(lines) == MAX_HEADERS
    assert all(len(line.split(": ", 1)[1]) <= 4096 for line in lines)
    assert len(observation["body"].encode()) <= MAX_BODY_BYTES


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ConnectTimeout("connect"), ({"transport": "timeout"}, "not-sent")),
        (httpx.PoolTimeout("pool"), ({"transport": "timeout"}, "not-sent")),
        (httpx.ReadTimeout("read"), ({"transport": "timeout"}, "sent")),
        (httpx.WriteTimeout("write"), ({"transport": "timeout"}, "sent")),
        (httpx.ConnectError("refused"), ({"transport": "connection-refused"}, "not-sent")),
        (httpx.RemoteProtocolError("cut"), ({"transport": "stream-closed"}, "sent")),
        (httpx.ReadError("cut"), ({"transport": "stream-closed"}, "sent")),
        (httpx.WriteError("w"), ({"transport": "other"}, "unknown")),
        (requests.exceptions.ConnectTimeout("c"), ({"transport": "timeout"}, "not-sent")),
        (requests.exceptions.ReadTimeout("r"), ({"transport": "timeout"}, "sent")),
        (asyncio.TimeoutError(), ({"transport": "timeout"}, "unknown")),
        (TimeoutError(), ({"transport": "timeout"}, "unknown")),
        (ConnectionRefusedError(111, "refused"), ({"transport": "connection-refused"}, "not-sent")),
        (ConnectionResetError(104, "reset"), ({"transport": "connection-reset"}, "unknown")),
    ],
)
def test_transport_faults_say_how_far_the_request_got(error: BaseException, expected: tuple[Any, Any]) -> None:
    observation = observe_exception(error)
    assert observation is not None
    assert kind_and_delivery(observation) == expected
    assert type(error).__name__ in observation["body"]


def test_a_requests_http_error_and_connection_errors() -> None:
    answer = requests.Response()
    answer.status_code, answer._content = 503, b"busy"
    answer.headers["Retry-After"] = "1"
    observation = observe_exception(requests.exceptions.HTTPError("503", response=answer))
    assert observation is not None and observation["kind"] == {"http-status": 503}
    assert (observation["headers"], observation["body"]) == ("Retry-After: 1", "busy")
    assert observe_result(answer) == observation
    ok = requests.Response()
    ok.status_code, ok._content = 200, b"{}"
    assert observe_result(ok) is None
    # A real refused connection through requests: urllib3's error inside says nothing was sent.
    with pytest.raises(requests.exceptions.ConnectionError) as refused:
        requests.get(closed_port_url(), timeout=2)
    assert kind_and_delivery(observe_exception(refused.value)) == ({"transport": "connection-refused"}, "not-sent")


def test_what_no_mapping_knows_is_none_and_absent_packages_are_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert observe_exception(KeyError("x")) is None
    assert observe_exception(ValueError("x")) is None
    assert observe_result({"status_code": 500}) is None
    # A package never imported cannot have raised: its mapping is skipped, nothing is imported.
    for name in ("httpx", "httpx2", "requests", "openai", "anthropic"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert observe_exception(ConnectionRefusedError()) is not None
    assert observe_exception(KeyError("x")) is None
    assert all(name not in sys.modules for name in ("httpx", "httpx2", "requests", "openai", "anthropic"))


@pytest.fixture
def server() -> Iterator[Any]:
    started: list[FaultyServer] = []

    def start(*answers: Answer) -> FaultyServer:
        started.append(FaultyServer(*answers))
        return started[-1]

    yield start
    for s in started:
        s.close()


def new_run() -> Any:
    return PolicyComponent.load().instantiate().load_policy({"tools": {"models": {"effect": "read"}}}).start_run("RUN-SDK")


OPENAI_MODELS = '{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"x"}]}'
ANTHROPIC_MODELS = '{"data":[],"has_more":false,"first_id":null,"last_id":null}'


def test_the_openai_client_429_with_retry_after_then_success(server: Any, caplog: pytest.LogCaptureFixture) -> None:
    s = server(
        Answer(429, [("retry-after", "2"), ("x-should-retry", "true")], '{"error":{"message":"rate"}}'), Answer(200, body=OPENAI_MODELS)
    )
    client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="test", max_retries=0)
    run, clock = new_run(), FakeClock(0)

    async def attempt(_a: Attempt) -> Any:
        return await client.models.list()

    with caplog.at_level(logging.INFO, logger="agent_retry_policy.calls"):
        page = asyncio.run(call_with_policy(run, "models", attempt, clock=clock))
    assert [m.id for m in page.data] == ["m"]
    assert clock.sleeps_ms == [2000]
    assert len(s.seen) == 2  # the SDK's own retries are off: every request is the policy's
    assert '"outcome": "http 429"' in caplog.text


async def listed(client: Any) -> Any:
    return await client.models.list()


def test_the_openai_client_refused_and_timed_out(server: Any) -> None:
    refused = openai.AsyncOpenAI(base_url=closed_port_url() + "/v1", api_key="test", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as error:
        asyncio.run(listed(refused))
    assert kind_and_delivery(observe_exception(error.value)) == ({"transport": "connection-refused"}, "not-sent")
    s = server(Answer(200, body=OPENAI_MODELS, delay_s=0.5))
    slow = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="test", max_retries=0, timeout=0.1)
    with pytest.raises(openai.APITimeoutError) as timed_out:
        asyncio.run(listed(slow))
    assert kind_and_delivery(observe_exception(timed_out.value)) == ({"transport": "timeout"}, "sent")


def test_the_anthropic_client_503_the_server_says_not_to_retry(server: Any) -> None:
    s = server(
        Answer(503, [("x-should-retry", "false")], '{"type":"error","error":{"type":"overloaded_error"}}'),
        Answer(200, body=ANTHROPIC_MODELS),
    )
    client = anthropic.AsyncAnthropic(base_url=s.url, api_key="test", max_retries=0)
    run = new_run()

    async def attempt(_a: Attempt) -> Any:
        return await client.models.list()

    with pytest.raises(Escalated) as escalated:
        asyncio.run(call_with_policy(run, "models", attempt, clock=FakeClock(0)))
    assert escalated.value.reason == "retry-forbidden"
    assert "overloaded_error" in escalated.value.note
    assert len(s.seen) == 1


def test_the_anthropic_client_recovers_from_a_503(server: Any) -> None:
    s = server(Answer(503, body='{"type":"error"}'), Answer(200, body=ANTHROPIC_MODELS))
    client = anthropic.AsyncAnthropic(base_url=s.url, api_key="test", max_retries=0)
    run, clock = new_run(), FakeClock(0)

    async def attempt(_a: Attempt) -> Any:
        return await client.models.list()

    page = asyncio.run(call_with_policy(run, "models", attempt, clock=clock))
    assert page.data == []
    assert len(clock.sleeps_ms) == 1 and len(s.seen) == 2
    assert run.report()["statuses"] == [{"status": 503, "count": 1}]
