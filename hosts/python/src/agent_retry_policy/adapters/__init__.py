"""Framework adapters: the policy inside the agent frameworks people already run.

Each adapter is a module of its own with its own optional dependency, imported
only when it is (this package imports nothing heavy):

- `agent_retry_policy.adapters.openai_agents` (extra `openai-agents`):
  `RetryingMCPServer`, an OpenAI Agents SDK `MCPServer` whose tool calls go
  through `RetryingToolCaller`;
- `agent_retry_policy.adapters.pydantic_ai` (extra `pydantic-ai`):
  `RetryingMCPToolset`, a PydanticAI toolset over the same wrapper;
- `agent_retry_policy.adapters.langchain` (extra `langchain`, a venv of its own
  because langchain-mcp-adapters needs `mcp<2`): `PolicyInterceptor`, a
  langchain-mcp-adapters tool-call interceptor built on the any-call helper.

In every one: an escalation stops the run and reaches the application as
`Escalated` (with its note), never the model; a replan reaches the model as the
framework's own retry signal; the HTTP client is a capturing one, so the policy
sees statuses and headers. docs/cookbook/ has a page per framework.
"""
