"""PydanticAI (pydantic-ai-slim 2.68): a toolset whose tool calls go through
the policy (extra `pydantic-ai`).

    run = PolicyComponent.load().instantiate().load_policy(config).start_run("CASE-5016")
    async with McpConnection.http(url) as connection:
        agent = Agent(model, toolsets=[RetryingMCPToolset(connection, run, call_timeout_s=60)])
        result = await agent.run("refund order A1")       # raises Escalated

- The toolset lists the server's tools and calls them through
  `RetryingToolCaller` (not PydanticAI's `MCPToolset`, whose FastMCP client
  would need the capturing HTTP client handed in by hand: without it a 429's
  `Retry-After` is ignored and a 503 with `x-should-retry: false` is retried).
  The wrapper's connection always captures statuses and headers; its options
  (`status_check=`, `call_timeout_s=`, ...) are passed through.
- A replan raises `ModelRetry` with the policy's message: PydanticAI's own
  retry prompt, which the model sees as the tool's error.
- An escalation raises `Escalated` out of `agent.run` with its note; the model
  is not asked again.
- Approvals: PydanticAI's own flow works on this toolset as on any other
  (`toolset.approval_required(...)`, output type `DeferredToolRequests`): the
  call is approved before it is sent, then goes through the policy. Nothing the
  policy decides is turned into an approval: an escalation ends the policy's
  run, so approving it could not resume the call (docs/cookbook/pydantic-ai.md).
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from .._mcp.caller import RetryingToolCaller
from .._mcp.connection import McpConnection
from ..component import Run
from ..config_defaults import MAX_STEPS_PER_RUN

# The server validates the arguments; PydanticAI passes them on as they are.
_ANY_ARGUMENTS = SchemaValidator(schema=core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))

# PydanticAI stops a run after a tool's `max_retries` ModelRetry. The policy
# bounds the replans itself (`max-replans-per-run`, each a step of the run), so
# the default is the run's default step budget: the policy's budget is met first.
DEFAULT_MAX_RETRIES = MAX_STEPS_PER_RUN


def _result_for_the_model(result: CallToolResult) -> Any:
    """What PydanticAI gives the model for a successful result: the structured
    content if the server sent one, else the text blocks (one block: its text)."""
    structured = result.structured_content
    if structured is not None:
        # The MCP SDK wraps a plain value as {"result": value}: the model gets the value (as MCPToolset gives it).
        return structured["result"] if isinstance(structured, dict) and list(structured) == ["result"] else structured
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    others = [block.model_dump(mode="json", by_alias=True) for block in result.content if not isinstance(block, TextContent)]
    parts: list[Any] = [*texts, *others]
    return parts[0] if len(parts) == 1 else parts


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


class RetryingMCPToolset(AbstractToolset[Any]):
    """The MCP server's tools, each call through `RetryingToolCaller` over
    `connection` (an `McpConnection`, or a URL for `McpConnection.http(url)`,
    which the toolset then owns: `await toolset.close()`) in the policy's
    `run`. `caller_options` go to `RetryingToolCaller`. `max_retries` is
    PydanticAI's per-tool ModelRetry limit (default `DEFAULT_MAX_RETRIES`).
    One toolset per policy run, as one caller per run."""

    def __init__(
        self,
        connection: McpConnection | str,
        run: Run,
        *,
        id: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        **caller_options: Any,
    ) -> None:
        self._owns_connection = isinstance(connection, str)
        self.connection = McpConnection.http(connection) if isinstance(connection, str) else connection
        self.caller = RetryingToolCaller(self.connection, run, **caller_options)
        self._id = id
        self.max_retries = max_retries

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def label(self) -> str:
        return f"RetryingMCPToolset({self.connection!r})"

    async def __aenter__(self) -> RetryingMCPToolset:
        # Connecting and listing are calls of the policy; the connection lives
        # across agent runs (a resumed run enters again), closed by its owner.
        await self.caller.list_tools()
        return self

    async def __aexit__(self, *_exc: object) -> bool | None:
        return None

    async def close(self) -> None:
        """Closes the connection if the toolset made it from a URL."""
        if self._owns_connection:
            await self.connection.close()

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools: dict[str, ToolsetTool[Any]] = {}
        for tool in await self.caller.list_tools():
            definition = ToolDefinition(
                name=tool.name,
                description=tool.description,
                parameters_json_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
                metadata={"annotations": tool.annotations.model_dump(by_alias=True) if tool.annotations else None},
            )
            tools[tool.name] = ToolsetTool(toolset=self, tool_def=definition, max_retries=self.max_retries, args_validator=_ANY_ARGUMENTS)
        return tools

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]) -> Any:
        result = await self.caller.call_tool(name, tool_args)  # Escalated propagates: the run stops
        if result.is_error:  # the wrapper returns an error result only for a replan
            raise ModelRetry(_text(result) or f"{name} failed")
        return _result_for_the_model(result)


__all__ = ["DEFAULT_MAX_RETRIES", "RetryingMCPToolset"]
