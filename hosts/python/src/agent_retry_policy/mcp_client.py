"""A retrying wrapper around the MCP SDK's `ClientSession.call_tool` (mcp 2.x).

    async with McpConnection.http(url) as connection:          # or McpConnection.stdio("agent-retry", ["serve", "--stdio"])
        caller = RetryingToolCaller(connection, run, status_check=check_refunds)
        result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount": 500})

For each call the wrapper derives the idempotency key once (and sends it only
if the tool's input schema has the key argument), asks the policy to begin the
call, waits the admission delay, sends, reports what it observed (the
contract's `observation`: the status, headers and body as received, a JSON-RPC
error's code, message and data, the SDK's error as the transport error it
stands for, whether `Mcp-Session-Id` was sent, how far the request got) and
does what the verdict says: retry (wait, reconnect first if the verdict says
`reconnect`, resend with the same key), check-status (ask the caller's status check, record what it
found), replan (return the message as the tool error the model sees), succeed
(return the result) or escalate (raise `Escalated` with the note, and the
run's snapshot: `Escalated.snapshot`, which `caller.resume(snapshot,
ResumeAnswer.retry())` resumes later, in any host). All policy is in the
component; this module only observes and obeys.

MCP 2026-07-28 (contract 0.9.0). Each attempt's timeouts are the policy's
(`call-start`: `idle-timeout-ms`, restarted by each progress notification, and
`attempt-timeout-ms` in all; per tool in the configuration; `attempt_timeout_s`,
if given, caps the idle one). Every `tools/call` carries a progress token; each
`notifications/progress` reaches `on_progress(tool, progress, total, message)`.
An `input_required` answer is answered by the application's SDK handlers
(`McpConnection(..., elicitation_callback=..., sampling_callback=...,
list_roots_callback=...)`) in the same attempt; a question no handler answers is
reported as failure kind `input-required` with the server's questions. The
client declares the tasks extension (`io.modelcontextprotocol/tasks`): a call
answered by a task is reported (`record_task_status`) and polled with
`tasks/get` as the verdicts say (`poll`: wait, reconnect if asked, poll), each
poll's status, completion, failure or own failure (`record_poll_failure`)
reported; input a task asks for goes back through `tasks/update` when a handler
answers it; `tasks/cancel` is sent when a verdict says `cancel_task`, and when
a call stops (deadline, cancellation) while its task lives.

The connection is the wrapper's (`McpConnection`): it connects over streamable
HTTP with the wrapper's capturing client, or over stdio by starting the server,
and connects again when the session is lost. It connects through the SDK's
negotiating mode (`mcp.Client(mode="auto")`: MCP 2026-07-28 through
`server/discover`, else the `initialize` handshake of 2025-11-25 and older).
Connecting (`initialize`: the probe and the handshake, with the
process start) and `tools/list` are calls of the policy too, of the pseudo-tools
`initialize` and `tools/list` (read-only, idempotent, no key; `step` null on
their log lines): retried, escalated (`Escalated`) or, on a replan,
`SessionLost`, as the policy decides. The wrapper does not decide that a
session is lost: it reports the answer as it came (a 404 with
`session-id-sent`), and the policy's verdict says `reconnect`; the session is
then re-established before the retry. A stdio pipe that closes is
`transport(stream-closed)`; that session cannot carry another request, so it
is re-established before the next attempt or status check. A caller
built on a bare `ClientSession` works the same but cannot reconnect
(`SessionLost`). `call_timeout_s` / `run_timeout_s` bound a call and the run
(`CallTimedOut`; the run's default is `DEFAULT_RUN_TIMEOUT_S`, 30 minutes, and
None turns it off); cancelling the task raises `CallCancelled`, a
`CancelledError`.

What the SDK hides: for a POST answered with a non-2xx status, mcp 2.x raises
`MCPError(-32603, "Server returned an error response")` and drops the status,
headers and body; a network error on a POST tears the whole session down; and
an answer stream cut mid-body either ends the session (JSON) or is reported as
the SDK's own `-32000` (SSE). `create_capturing_http_client` gives the SDK an
httpx2 client whose transport records, for the attempt in progress (a context
variable, which the SDK carries into its POST task), the status, headers and
body of a failed POST, turns a network error into a marked HTTP 599 answer (so
that the session survives and the attempt fails with the real transport error),
and watches each answer's body: one that ends before the JSON-RPC response is
`stream-closed` at once. A failure from an HTTP transport that is not this one
is logged once (`agent_retry.capture_missing`) and its decisions' logged reason
says so.

Every attempt (and every call escalated before it is sent) gets one log line
(logger `agent_retry_policy.mcp`), one JSON object with these fields in this
order, the same in the Rust and Node hosts: `event` ("agent_retry.attempt"),
`ts`, `run`, `policy`, `step` (the wrapper's count of the model's calls, the N of
the `step-N` the key is derived from; the same for every attempt of a call;
null for `initialize` and `tools/list`), `call` (null when the call was not
admitted), `tool`, `attempt` (0 when not sent), `key` (the idempotency key sent,
null when the tool takes none), `outcome`, `class`, `rule`, `action`, `delay_ms`
(null unless retry or poll), `hint_ms` (the decision's hint), `escalation` (the
escalation reason, null unless escalate) and `reason` (cut to
`limits.MAX_LIFTED_TEXT_BYTES`, as every text lifted from the policy the wrapper
logs or returns); a line of a broken invariant ends with `invariant`. A call stopped by a
limit or a cancellation logs one more line: outcome `call-timeout`,
`run-timeout` or `cancelled`, action `stop`. `policy` names the policy that
decided: the component's identity (`agent-retry:policy@0.8.0 wasm 1a2b3c4d5e6f`)
unless the caller was given `policy_identity` (a host serving a `LivePolicy`
passes `str(loaded.identity)`, e.g. `generation 3 (wasm 1a2b3c4d5e6f, config
0f0e0d0c0b0a)`).

When the policy itself fails (a `PolicyTrap`: a trap, fuel or memory exhausted,
a value outside the contract; or `InstanceUnusable` after one), the wrapper
takes the safe fallback: no retry, and `Escalated` (reason
`unclassified-failure`, `policy_failure` set) with a note saying that the policy
failed and what the last attempt saw. Serve the next run from a fresh instance
(`PolicyComponent.instantiate`).

The wrapper does not trust the policy for a few invariants (the run's
`agent_retry_policy.guard`, from the configuration text the host holds): a
400/401/403/404/409/422 or JSON-RPC -32600/-32601/-32602 answer is not
repeated as it was (unless the configuration or the server's own headers say it
may be), an unkeyed write whose outcome is unknown is not resent without a
status check, a tool is not called again while its task lives, the key never
changes, no wait passes the configuration's caps, no attempt or poll passes its
budgets, and `last-decision` says what the verdict said. A verdict that breaks
one ends the call the same way, the fault a `PolicyBoundaryViolation` whose
message is `invariant <name>: <detail>`, its line naming the call and the
attempt; the run's later calls escalate with the same note, nothing sent.

The wrapper's parts are in the private subpackage `agent_retry_policy._mcp`:
`capture` (the capturing HTTP transport and the watching of answer bodies),
`connection` (`McpConnection`), `caller` (`RetryingToolCaller`),
`continuation` (answering `input_required`) and `tasks` (the tasks extension's
requests and answers); this module re-exports their public names.
"""

from ._mcp.caller import (
    CAPTURE_MISSING_SUFFIX,
    DEFAULT_MAX_RECONNECTS_PER_RUN,
    DEFAULT_RUN_TIMEOUT_S,
    INITIALIZE,
    PSEUDO_TOOL_HINTS,
    TOOLS_LIST,
    EmptyCheck,
    RetryingToolCaller,
    StatusCheck,
    StatusCheckRequest,
    default_empty_check,
    logger,
    protocol_error_outcome,
    server_name_of,
    tool_error_outcome,
)
from ._mcp.capture import (
    MAX_CAPTURED_BODY,
    TRANSPORT_ERROR_HEADER,
    TRANSPORT_ERROR_STATUS,
    AttemptCapture,
    CapturingTransport,
    classify_network_error,
    create_capturing_http_client,
)

# The capture of the attempt in progress (a context variable): the tests set it.
from ._mcp.capture import _current_attempt as _current_attempt
from ._mcp.connection import CLOSE_TIMEOUT_S, CONNECT_MODES, ConnectMode, McpConnection
from ._mcp.tasks import TASKS_EXTENSION, TasksExtension

__all__ = [
    "CAPTURE_MISSING_SUFFIX",
    "CLOSE_TIMEOUT_S",
    "CONNECT_MODES",
    "DEFAULT_MAX_RECONNECTS_PER_RUN",
    "DEFAULT_RUN_TIMEOUT_S",
    "INITIALIZE",
    "MAX_CAPTURED_BODY",
    "PSEUDO_TOOL_HINTS",
    "TASKS_EXTENSION",
    "TOOLS_LIST",
    "TRANSPORT_ERROR_HEADER",
    "TRANSPORT_ERROR_STATUS",
    "AttemptCapture",
    "CapturingTransport",
    "ConnectMode",
    "EmptyCheck",
    "McpConnection",
    "RetryingToolCaller",
    "StatusCheck",
    "StatusCheckRequest",
    "TasksExtension",
    "classify_network_error",
    "create_capturing_http_client",
    "default_empty_check",
    "logger",
    "protocol_error_outcome",
    "server_name_of",
    "tool_error_outcome",
]
