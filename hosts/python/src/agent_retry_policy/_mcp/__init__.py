"""The parts of the MCP wrapper (private): `capture` (the capturing HTTP
transport), `connection` (`McpConnection`) and `caller` (`RetryingToolCaller`).
Import them from `agent_retry_policy.mcp_client`, the public module."""
