"""LangChain / LangGraph (langchain-mcp-adapters 0.3.2): a tool-call
interceptor that runs each MCP tool call under the policy (extra `langchain`).

langchain-mcp-adapters 0.3.2 needs `mcp<2`, the MCP wrapper (`mcp_client`)
`mcp>=2.3`: they cannot share an environment. So this adapter does not use the
MCP wrapper: it is built on the any-call helper (`call_with_policy`), which
needs no `mcp`, and keeps what the wrapper gives: the HTTP status and headers
as received (a capturing httpx client for the adapters' connections), the
idempotency key (derived once, the same in every attempt), status checks, and
the invariants the run's guard enforces. Install it without the `mcp` extra
(`pip install 'agent-retry-policy[langchain]'`, its own venv).

    run = PolicyComponent.load().instantiate().load_policy(config).start_run("CASE-5016")
    tools = await load_retrying_mcp_tools(run, {"desk": {"transport": "streamable_http", "url": url}})
    agent = create_react_agent(model, tools)
    await agent.ainvoke({"messages": [...]})              # raises Escalated

- Each call of the adapters' tool is one call of the policy: every attempt is
  the adapters' own handler (a new MCP session per call, their default), its
  HTTP failure seen by the capturing client (`capturing_httpx_client_factory`),
  its JSON-RPC error or `isError` result reported as such.
- A replan reaches the model as an `isError` result, which the adapters turn
  into a `ToolMessage` with `status="error"` (keep `handle_tool_errors=True`,
  their default).
- An escalation raises `Escalated` out of the graph with its note.
- Approvals: LangGraph's own (`interrupt_before=["tools"]`, or an `interrupt`
  in a node or middleware) pause the graph before the call is made, and the
  resumed call goes through the policy. Nothing the policy decides is turned
  into an interrupt: an escalation ends the policy's run, so resuming could not
  make the call (docs/cookbook/langchain.md).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.interceptors import MCPToolCallRequest
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, TextContent

from .. import http_errors
from ..any_call import Attempt, call_with_policy
from ..component import Run
from ..errors import ObservedFailure, ReplanNeeded
from ..limits import MAX_BODY_BYTES, bounded_headers_text, cut
from ..types import Observation, StatusCheckResult, ToolHints, http_failure, json_text, protocol_failure, tool_error, transport_failure

try:  # mcp 1.x's own defaults for its HTTP clients (a private module: the same numbers if it moves)
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
except ImportError:  # pragma: no cover
    MCP_DEFAULT_TIMEOUT, MCP_DEFAULT_SSE_READ_TIMEOUT = 30.0, 300.0

Handler = Callable[[MCPToolCallRequest], Awaitable[Any]]
# A status check: the call (its tool and arguments) and the attempt whose write may have been applied.
StatusCheck = Callable[[MCPToolCallRequest, Attempt], Awaitable[StatusCheckResult]]
_SESSION_HEADER = "mcp-session-id"


@dataclass
class _Capture:
    """What the capturing client saw during one attempt: the first HTTP answer
    of status >= 400 (status, headers as received, body text), whether the
    failed request carried a session id; `failed` is set when it came."""

    failure: Observation | None = None
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    # Whether a `tools/call` POST left: a timeout after it may have been applied.
    call_sent: bool = False


# The attempt in progress: the adapters' per-call session (and its POST tasks)
# is made inside the attempt, so its tasks carry this context variable.
_current: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("agent_retry_langchain_capture", default=None)


class _CapturingTransport(httpx.AsyncBaseTransport):
    """httpx's transport, recording for the attempt in progress the first
    answer of status >= 400 with its headers and (bounded) body. It only
    records: the answer goes on to the MCP client as it came."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        capture = _current.get()
        if capture is not None and request.method == "POST" and b'"tools/call"' in request.content:
            capture.call_sent = True
        response = await self._inner.handle_async_request(request)
        # POSTs only: a session's GET stream or closing DELETE is not the call.
        if capture is None or capture.failure is not None or request.method != "POST" or response.status_code < 400:
            return response
        body = await response.aread()  # an error answer is small; bounded below all the same
        # `raw` keeps the names as the server spelled them (multi_items() lower-cases them).
        headers = bounded_headers_text([(name.decode("latin-1"), value.decode("latin-1")) for name, value in response.headers.raw])
        text = cut(body.decode("utf-8", errors="replace"), MAX_BODY_BYTES)
        capture.failure = http_failure(response.status_code, headers, text, session_id_sent=_SESSION_HEADER in request.headers)
        capture.failed.set()
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request, extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


def capturing_httpx_client_factory(
    headers: dict[str, str] | None = None, timeout: httpx.Timeout | None = None, auth: httpx.Auth | None = None
) -> httpx.AsyncClient:
    """An `httpx_client_factory` for the adapters' HTTP connections (mcp 1.x's
    `McpHttpClientFactory`, with its default timeouts): its client records each
    attempt's HTTP failure for the policy. `load_retrying_mcp_tools` puts it in
    every `streamable_http` / `sse` connection that has no factory."""
    return httpx.AsyncClient(
        headers=headers,
        timeout=timeout if timeout is not None else httpx.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        auth=auth,
        transport=_CapturingTransport(httpx.AsyncHTTPTransport()),
    )


def _leaves(error: BaseException, depth: int = 0) -> Iterable[BaseException]:
    """The exceptions inside exception groups (mcp's task groups raise them;
    on 3.10 the `exceptiongroup` backport's, hence no isinstance), in order."""
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (tuple, list)) and depth < 16:
        for each in inner:
            if isinstance(each, BaseException):
                yield from _leaves(each, depth + 1)
    else:
        yield error


def observe_mcp_error(error: BaseException) -> Observation | None:
    """An exception out of the adapters' handler as an observation: a JSON-RPC
    error (`McpError`: its code, message and data), else what the built-in
    mappings (httpx, the standard library) know, looked for inside exception
    groups. None: nothing known (the helper re-raises it)."""
    for leaf in _leaves(error):
        if isinstance(leaf, McpError):
            return protocol_failure(leaf.error.code, leaf.error.message, data=json_text(leaf.error.data))
        observation = http_errors.observe_exception(leaf)
        if observation is not None:
            return observation
    return None


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def empty_result(value: Any) -> str | None:
    """What is wrong with a successful result, or None: no content blocks (or
    only blank text) and no structured content is empty (the MCP wrapper's rule)."""
    if not isinstance(value, CallToolResult):
        return None  # a ToolMessage or Command another interceptor made: not ours to judge
    blank = all(isinstance(block, TextContent) and not block.text.strip() for block in value.content)
    return "the tool returned an empty result" if blank and not value.structuredContent else None


@dataclass(frozen=True)
class _Described:
    hints: ToolHints | None
    takes_key: bool


class PolicyInterceptor:
    """A langchain-mcp-adapters tool-call interceptor: each call is
    `call_with_policy(run, tool, ...)`, each attempt the adapters' handler.
    `describe(tools)` gives it the tools' MCP annotations (their hints) and
    which take the key argument (`key_argument`, default `idempotency_key`):
    a keyed tool gets the key derived once, put in every attempt's arguments.
    `status_check` (one, or a mapping by tool) answers whether a write whose
    outcome is unknown was applied. `attempt_timeout_s` (default None: none)
    ends an attempt that has no answer by then, reported as a transport
    timeout (as the MCP wrapper's). `helper_options` go to `call_with_policy`
    (`call_timeout_s`, `hooks`, `metrics`, `clock`, `entropy`, ...)."""

    def __init__(
        self,
        run: Run,
        *,
        key_argument: str = "idempotency_key",
        status_check: StatusCheck | Mapping[str, StatusCheck] | None = None,
        attempt_timeout_s: float | None = None,
        **helper_options: Any,
    ) -> None:
        if attempt_timeout_s is not None and (isinstance(attempt_timeout_s, bool) or not attempt_timeout_s > 0):
            raise ValueError(f"attempt_timeout_s must be a positive number of seconds or None, got {attempt_timeout_s!r}")
        self.attempt_timeout_s = attempt_timeout_s
        self.run = run
        self.key_argument = key_argument
        self.status_check = status_check
        self.helper_options = helper_options
        self._tools: dict[str, _Described] = {}

    def describe(self, tools: Iterable[BaseTool]) -> None:
        """Learns the hints and key argument of the adapters' tools (their
        `metadata` holds the MCP annotations, `args_schema` the input schema)."""
        for tool in tools:
            metadata = tool.metadata or {}
            hints: ToolHints | None = None
            if any(name in metadata for name in ("readOnlyHint", "destructiveHint", "idempotentHint")):
                hints = {
                    "read-only": metadata.get("readOnlyHint"),
                    "destructive": metadata.get("destructiveHint"),
                    "idempotent": metadata.get("idempotentHint"),
                }
            schema = tool.args_schema if isinstance(tool.args_schema, dict) else {}
            properties = schema.get("properties")
            self._tools[tool.name] = _Described(hints, isinstance(properties, dict) and self.key_argument in properties)

    def _described(self, request: MCPToolCallRequest) -> _Described | None:
        return self._tools.get(request.name) or self._tools.get(f"{request.server_name}_{request.name}")

    def _check_for(
        self, request: MCPToolCallRequest, answers: list[StatusCheckResult]
    ) -> Callable[[Attempt], Awaitable[StatusCheckResult]] | None:
        check = self.status_check.get(request.name) if isinstance(self.status_check, Mapping) else self.status_check
        if check is None:
            return None
        bound = check

        async def status_check(attempt: Attempt) -> StatusCheckResult:
            answers.append(answer := await bound(request, attempt))
            return answer

        return status_check

    async def __call__(self, request: MCPToolCallRequest, handler: Handler) -> Any:
        described = self._described(request)
        takes_key = described is not None and described.takes_key

        async def attempt(this: Attempt) -> Any:
            arguments = dict(request.args)
            if takes_key and this.idempotency_key is not None:
                arguments[self.key_argument] = this.idempotency_key
            return await _one_attempt(handler, request.override(args=arguments), self.attempt_timeout_s)

        checked: list[StatusCheckResult] = []
        try:
            value = await call_with_policy(
                self.run,
                request.name,
                attempt,
                hints=described.hints if described is not None else None,
                # A key only where it is sent (the MCP wrapper's rule): one the server never sees dedups nothing.
                keyed=takes_key,
                observe=observe_mcp_error,
                is_empty=empty_result,
                status_check=self._check_for(request, checked),
                **self.helper_options,
            )
        except ReplanNeeded as replan:
            # The adapters turn an isError result into ToolMessage(status="error"): the model's retry signal.
            return CallToolResult(content=[TextContent(type="text", text=replan.message)], isError=True)
        if value is None:  # the policy ended the call in success with no result to give (e.g. a lost answer found applied)
            what = "a status check found it applied; its answer was lost" if "found" in checked else "it gave no result"
            return CallToolResult(content=[TextContent(type="text", text=f"{request.name} succeeded: {what}")])
        return value


async def _one_attempt(handler: Handler, request: MCPToolCallRequest, timeout_s: float | None) -> Any:
    """One attempt: the handler, raced with the capture, since an HTTP failure
    may never reach the caller through mcp 1.x (raised in its transport's task).
    The first of: the result, the captured HTTP failure, the handler's error,
    the attempt's timeout."""
    capture = _Capture()
    token = _current.set(capture)
    try:
        call = asyncio.ensure_future(handler(request))
    finally:
        _current.reset(token)
    failed = asyncio.ensure_future(capture.failed.wait())
    try:
        await asyncio.wait({call, failed}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not call.done() and capture.failure is None
    finally:
        failed.cancel()
        if not call.done():
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
    if timed_out:
        detail = f"no answer within attempt_timeout_s ({timeout_s:g} s)"
        raise ObservedFailure(transport_failure("timeout", detail, delivery="sent" if capture.call_sent else "unknown"))
    if capture.failure is not None:
        if not call.cancelled() and call.exception() is None and not _is_error(call.result()):
            return call.result()  # an answer came after all (a failed request the SDK recovered from)
        raise ObservedFailure(capture.failure)
    result = call.result()  # the handler's exception, if any, goes to the helper's mappings
    if _is_error(result):
        raise ObservedFailure(tool_error(_text(result), json_text(result.structuredContent)))
    return result


def _is_error(value: Any) -> bool:
    return isinstance(value, CallToolResult) and bool(value.isError)


def _with_capture(connection: Mapping[str, Any]) -> dict[str, Any]:
    config = dict(connection)
    if config.get("transport") in ("streamable_http", "streamable-http", "http", "sse") and config.get("httpx_client_factory") is None:
        config["httpx_client_factory"] = capturing_httpx_client_factory
    return config


async def load_retrying_mcp_tools(
    run: Run,
    connections: Mapping[str, Mapping[str, Any]],
    *,
    tool_name_prefix: bool = False,
    **interceptor_options: Any,
) -> list[BaseTool]:
    """The servers' tools as LangChain tools whose every call goes through the
    policy: a `MultiServerMCPClient` with the capturing client in each HTTP
    connection and a `PolicyInterceptor` (given `interceptor_options`) that
    knows the tools. Listing the tools is not a call of the policy here (the
    adapters list them once, before the agent runs)."""
    interceptor = PolicyInterceptor(run, **interceptor_options)
    client = MultiServerMCPClient(
        {name: _with_capture(connection) for name, connection in connections.items()},  # type: ignore[misc]
        tool_interceptors=[interceptor],
        tool_name_prefix=tool_name_prefix,
    )
    tools = await client.get_tools()
    interceptor.describe(tools)
    return tools


__all__ = [
    "PolicyInterceptor",
    "StatusCheck",
    "capturing_httpx_client_factory",
    "empty_result",
    "load_retrying_mcp_tools",
    "observe_mcp_error",
]
