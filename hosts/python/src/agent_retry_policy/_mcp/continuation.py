"""Continuations (MCP 2026-07-28 `input_required`, SEP-2322): a request the
server answers with input requests (an elicitation, a sampling request, the
client's roots) instead of its result. The application's own SDK handlers
(`elicitation_callback`, `sampling_callback`, `list_roots_callback` of the
session) answer them and the request is sent again with the answers, in the
same attempt. When a request has no handler, nobody can answer: the wrapper
reports failure kind `input-required` with the server's questions, and the
policy decides (it escalates `input-required`). Whether a handler exists is
read the way the SDK reads it when it builds the client's capabilities: a
callback that is not the SDK's default."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from mcp.client import session as sdk_session
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CreateMessageRequest,
    ElicitRequest,
    ErrorData,
    InputRequest,
    InputRequiredResult,
    InputResponse,
    InputResponses,
    ListRootsRequest,
    TextContent,
)

# The SDK's cap on rounds (`Client.input_required_max_rounds`' default).
MAX_ROUNDS = 10
# A round that carries only `requestState` is sent again after this wait (the SDK waits 50 ms, up to 250 ms).
STATE_ONLY_WAIT_S = 0.05

# Per input request's method: the session's attribute holding its handler, and the SDK's default (no handler).
_HANDLERS: dict[str, tuple[str, Any]] = {
    "elicitation/create": ("_elicitation_callback", sdk_session._default_elicitation_callback),
    "sampling/createMessage": ("_sampling_callback", sdk_session._default_sampling_callback),
    "roots/list": ("_list_roots_callback", sdk_session._default_list_roots_callback),
}


@dataclass(frozen=True)
class InputNeeded:
    """A request answered `input_required` that no handler of the application
    can answer: the server's questions, one a line."""

    questions: str


def answerable(session: Any, requests: Mapping[str, InputRequest]) -> bool:
    """Whether the application gave `session` a handler for every input request."""
    for request in requests.values():
        attribute, default = _HANDLERS.get(request.method, ("", None))
        handler = getattr(session, attribute, None) if attribute else None
        if handler is None or handler is default:
            return False
    return True


def questions(requests: Mapping[str, InputRequest]) -> str:
    """The server's questions: each elicitation's message, each sampling
    request's text, and what a roots request asks for."""
    lines = []
    for key, request in requests.items():
        if isinstance(request, ElicitRequest):
            lines.append(request.params.message)
        elif isinstance(request, CreateMessageRequest):
            texts = [m.content.text for m in request.params.messages if isinstance(m.content, TextContent)]
            lines.append(f"sampling request ({key}): " + " ".join(texts))
        elif isinstance(request, ListRootsRequest):
            lines.append(f"the client's roots ({key})")
        else:
            lines.append(f"{request.method} ({key})")
    return "\n".join(lines)


async def answer(session: Any, requests: Mapping[str, InputRequest]) -> InputResponses:
    """The application's handlers' answers (run together, as the SDK does); a
    handler's refusal (`ErrorData`) raises `MCPError`, as in the SDK."""

    async def one(key: str, request: InputRequest) -> tuple[str, InputResponse | ErrorData]:
        meta = request.params.meta if request.params is not None else None
        context = sdk_session.ClientRequestContext(session=session, request_id=key, meta=meta)
        return key, await session.dispatch_input_request(context, request)

    answered = await asyncio.gather(*(one(key, request) for key, request in requests.items()))
    responses: InputResponses = {}
    for key, response in answered:
        if isinstance(response, ErrorData):
            raise MCPError.from_error_data(response)
        responses[key] = response
    return responses


async def settle(
    session: Any,
    first: Any,
    resend: Callable[[InputResponses | None, str | None], Awaitable[Any]],
    waiting_on_a_person: Callable[[], AbstractAsyncContextManager[None]],
) -> Any:
    """The request's final answer: `first` as it is if it is not
    `input_required`; else the rounds answered by the application's handlers
    (while they run, `waiting_on_a_person` holds the attempt's idle timeout),
    each sent again with `resend(responses, request_state)`. `InputNeeded` when
    a round asks what no handler answers, or after `MAX_ROUNDS` rounds."""
    current, rounds = first, 0
    while isinstance(current, InputRequiredResult):
        requests = current.input_requests or {}
        rounds += 1
        if rounds > MAX_ROUNDS:
            return InputNeeded(questions(requests) or f"the server asked for input more than {MAX_ROUNDS} times")
        if requests and not answerable(session, requests):
            return InputNeeded(questions(requests))
        responses: InputResponses | None = None
        if requests:
            async with waiting_on_a_person():
                responses = await answer(session, requests)
        else:
            await asyncio.sleep(STATE_ONLY_WAIT_S)
        current = await resend(responses, current.request_state)
    return current
