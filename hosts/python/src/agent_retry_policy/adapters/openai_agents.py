"""OpenAI Agents SDK (openai-agents 0.24): an MCP server whose tool calls go
through the policy (extra `openai-agents`).

    run = PolicyComponent.load().instantiate().load_policy(config).start_run("CASE-5016")
    async with RetryingMCPServer(McpConnection.http(url), run, call_timeout_s=60) as server:
        agent = Agent(name="desk", instructions="...", mcp_servers=[server])
        result = await Runner.run(agent, "refund order A1")   # raises Escalated

- Each tool call is `RetryingToolCaller.call_tool`: the wrapper's capturing
  HTTP client (statuses, headers such as `Retry-After` and `x-should-retry`),
  idempotency keys, status checks and reconnection; its options
  (`status_check=`, `call_timeout_s=`, ...) are passed through.
- A replan is the tool's output: the SDK shows the policy's message to the
  model as the tool's result, and the model may make a new call.
- An escalation stops the run: `Runner.run` raises `EscalatedRun`, an
  `Escalated` (catch that) that is also an `AgentsException`, so the SDK lets it
  through unchanged and fills its `run_data`. The SDK's default
  `failure_error_function` would have shown the model "An error occurred while
  running the tool. Please try again." and finished the run; here the
  function given (default the SDK's) is only used for errors that are not the
  policy's. Any other error of the wrapper (`SessionLost`, `CallTimedOut`)
  also stops the run (the SDK raises it as `UserError` from it).
- Approvals: the SDK asks for them before a tool runs (`require_approval`,
  passed through: the run pauses with `result.interruptions`, and resumes from
  `result.to_state()` once approved). Nothing the policy decides is turned
  into an approval: an escalation ends the policy's run, so approving it could
  not resume the call (docs/cookbook/openai-agents-python.md).
"""

from __future__ import annotations

from typing import Any

from agents.exceptions import AgentsException
from agents.mcp import MCPServer
from agents.run_context import RunContextWrapper
from agents.tool import ToolErrorFunction, default_tool_error_function
from mcp.types import CallToolResult, GetPromptResult, ListPromptsResult, Tool

from .._mcp.caller import RetryingToolCaller
from .._mcp.connection import McpConnection
from ..component import Run
from ..errors import AgentRetryError, Escalated


class EscalatedRun(Escalated, AgentsException):
    """The policy's escalation, raised out of `Runner.run`: an `Escalated` (its
    `reason`, `note`, `tool`) that the SDK passes through as one of its own."""

    def __init__(self, escalated: Escalated) -> None:
        super().__init__(escalated.escalation, escalated.tool, escalated.policy_failure)


def _policy_error(error: BaseException | None) -> AgentRetryError | None:
    """The wrapper's error behind what the SDK caught (it wraps the tool's exception), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # a cycle of causes must not hang the run
        if isinstance(error, AgentRetryError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def stop_on_policy_errors(inner: ToolErrorFunction | None) -> ToolErrorFunction:
    """A `failure_error_function` that raises the wrapper's errors (the run
    stops) and gives every other error to `inner` (None: the SDK raises it)."""

    def failure(context: RunContextWrapper[Any], error: Exception) -> Any:
        policy_error = _policy_error(error)
        if isinstance(policy_error, Escalated) and not isinstance(policy_error, EscalatedRun):
            raise EscalatedRun(policy_error) from policy_error
        if policy_error is not None:
            raise policy_error
        return inner(context, error) if inner is not None else None

    return failure


class RetryingMCPServer(MCPServer):
    """An `MCPServer` for `Agent(mcp_servers=[...])` whose `call_tool` is
    `RetryingToolCaller.call_tool` over `connection` (an `McpConnection`, or a
    URL for `McpConnection.http(url)`, which the server then owns and closes)
    in the policy's `run`. `caller_options` go to `RetryingToolCaller`.
    `failure_error_function` handles the errors that are not the policy's
    (default: the SDK's); `require_approval` and `use_structured_content` are
    the SDK's. One server per policy run, as one caller per run."""

    def __init__(
        self,
        connection: McpConnection | str,
        run: Run,
        *,
        name: str | None = None,
        require_approval: Any = None,
        failure_error_function: ToolErrorFunction | None = default_tool_error_function,
        use_structured_content: bool = False,
        **caller_options: Any,
    ) -> None:
        super().__init__(
            use_structured_content=use_structured_content,
            require_approval=require_approval,
            failure_error_function=stop_on_policy_errors(failure_error_function),
        )
        self._owns_connection = isinstance(connection, str)
        self.connection = McpConnection.http(connection) if isinstance(connection, str) else connection
        self.caller = RetryingToolCaller(self.connection, run, **caller_options)
        self._name = name if name is not None else f"agent-retry {self.connection!r}"

    @property
    def name(self) -> str:
        return self._name

    async def connect(self) -> None:
        """Connects and lists the tools, both through the policy (`initialize`, `tools/list`)."""
        await self.caller.list_tools()

    async def cleanup(self) -> None:
        if self._owns_connection:
            await self.connection.close()

    async def __aenter__(self) -> RetryingMCPServer:
        await self.connect()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.cleanup()

    async def list_tools(self, run_context: RunContextWrapper[Any] | None = None, agent: Any = None) -> list[Tool]:
        return await self.caller.list_tools()

    @property
    def cached_tools(self) -> list[Tool] | None:
        return self.caller.listed_tools

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None) -> CallToolResult:
        """The model's call through the policy. `meta` is not sent: the wrapper
        owns the request (its key, its progress token)."""
        try:
            return await self.caller.call_tool(tool_name, arguments or {})
        except Escalated as escalated:
            # An AgentsException passes the SDK's tool pipeline as it is.
            raise EscalatedRun(escalated) from escalated

    async def list_prompts(self) -> ListPromptsResult:
        return await self._session().list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> GetPromptResult:
        return await self._session().get_prompt(name, arguments)

    def _session(self) -> Any:
        # Prompts are not tool calls: sent on the current session, not through the policy.
        session = self.connection.session
        if session is None:
            raise RuntimeError(f"{self.name} is not connected: `await server.connect()` (or `async with server`) first")
        return session


__all__ = ["EscalatedRun", "RetryingMCPServer", "stop_on_policy_errors"]
