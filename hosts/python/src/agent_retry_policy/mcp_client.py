"""A retrying wrapper around the MCP SDK's `ClientSession.call_tool` (mcp 2.x).

    http_client = create_capturing_http_client()
    async with http_client, streamable_http_client(url, http_client=http_client) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            caller = RetryingToolCaller(session, run, status_check=check_refunds)
            result = await caller.call_tool("issue_refund", {"order_id": "A1", "amount": 500})

For each call the wrapper derives the idempotency key once (and sends it only
if the tool's input schema has the key argument), asks the policy to begin the
call, waits the admission delay, sends, turns what happened into the contract's
`outcome`, records it and does what the decision says: retry (wait, resend with
the same key), check-status (ask the caller's status check, record what it
found), replan (return the message as the tool error the model sees), succeed
(return the result) or escalate (raise `Escalated` with the note). All policy
is in the component; this module only observes and obeys.

What the SDK hides: for a POST answered with a non-2xx status, mcp 2.x raises
`MCPError(-32603, "Server returned an error response")` and drops the status,
headers and body; and a network error on a POST tears the whole session down.
`create_capturing_http_client` gives the SDK an httpx2 client whose transport
records, for the attempt in progress (a context variable, which the SDK carries
into its POST task), the status, headers and body of a failed POST, and turns a
network error into a marked HTTP 599 answer so that the session survives and the
attempt fails with the real transport error.

Every attempt (and every call escalated before it is sent) gets one log line
(logger `agent_retry_policy.mcp`), one JSON object with these fields in this
order, the same in the Rust and Node hosts: `event` ("agent_retry.attempt"),
`ts`, `run`, `policy`, `step` (the wrapper's count of the model's calls, the N of
the `step-N` the key is derived from; the same for every attempt of a call),
`call` (null when the call was not admitted), `tool`, `attempt` (0 when not
sent), `key` (the idempotency key sent, null when the tool takes none),
`outcome`, `class`, `rule`, `action`, `delay_ms` (null unless retry), `hint_ms`
(the decision's hint), `escalation` (the escalation reason, null unless
escalate) and `reason`. `policy` names the policy that decided: the component's
identity (`agent-retry:policy@0.3.0 wasm 1a2b3c4d5e6f`) unless the caller was
given `policy_identity` (a host serving a `LivePolicy` passes
`str(loaded.identity)`, e.g. `generation 3 (wasm 1a2b3c4d5e6f, config
0f0e0d0c0b0a)`).

When the policy itself fails (a `PolicyTrap`: a trap, fuel or memory exhausted,
a value outside the contract; or `InstanceUnusable` after one), the wrapper
takes the safe fallback: no retry, and `Escalated` (reason
`unclassified-failure`, `policy_failure` set) with a note saying that the policy
failed and what the last attempt saw. Serve the next run from a fresh instance
(`PolicyComponent.instantiate`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import httpx2
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, PaginatedRequestParams, TextContent, Tool

from .component import Run, now_ms
from .entropy import EntropySource, OsEntropy
from .errors import Escalated, InstanceUnusable, PolicyTrap
from .types import (
    CallRequest,
    Decision,
    EscalateAction,
    EscalateAdmission,
    FailureOutcome,
    Outcome,
    ReplanAction,
    RetryAction,
    StatusCheckResult,
    SucceedAction,
    ToolHints,
    TransportError,
    action_name,
    empty_result,
    http_failure,
    protocol_failure,
    tool_error,
    transport_failure,
)

logger = logging.getLogger("agent_retry_policy.mcp")
_T = TypeVar("_T")

# The header that marks the stand-in answer for a network error.
TRANSPORT_ERROR_HEADER = "x-agent-retry-transport-error"
TRANSPORT_ERROR_STATUS = 599
# How much of a failed response's body is kept (the policy keeps at most
# `max-message-chars` of it anyway).
MAX_CAPTURED_BODY = 64 * 1024


@dataclass
class AttemptCapture:
    """What the HTTP layer saw for one attempt."""

    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: str = ""
    transport_error: TransportError | None = None
    transport_detail: str = ""


_current_attempt: contextvars.ContextVar[AttemptCapture | None] = contextvars.ContextVar("agent_retry_current_attempt", default=None)


def classify_network_error(error: BaseException) -> TransportError:
    """An httpx2 exception as the contract's transport error."""
    cause: BaseException | None = error
    while cause is not None:  # TLS and DNS failures are not blips: "other" escalates
        if isinstance(cause, (ssl.SSLError, socket.gaierror)):
            return "other"
        cause = cause.__cause__ or cause.__context__
    if isinstance(error, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return "connection-refused"  # the request never reached the server
    if isinstance(error, (httpx2.ReadTimeout, httpx2.WriteTimeout, httpx2.TimeoutException)):
        return "timeout"
    if isinstance(error, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)):
        return "connection-reset"
    if isinstance(error, httpx2.StreamError):
        return "stream-closed"
    return "other"


class CapturingTransport(httpx2.AsyncBaseTransport):
    """Wraps a transport; records failed POSTs for the attempt in progress."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        capture = _current_attempt.get()
        if capture is None or request.method != "POST":
            return await self.inner.handle_async_request(request)
        try:
            response = await self.inner.handle_async_request(request)
        except httpx2.TransportError as e:
            capture.transport_error = classify_network_error(e)
            capture.transport_detail = f"{type(e).__name__}: {e}"
            # mcp 2.3's POST task would let the exception end the session; an error
            # status instead resolves just this request with an MCPError.
            return httpx2.Response(
                TRANSPORT_ERROR_STATUS,
                headers={"content-type": "text/plain", TRANSPORT_ERROR_HEADER: capture.transport_error},
                content=capture.transport_detail.encode(),
                request=request,
            )
        if response.status_code < 400:
            return response
        # Read the body here and hand the SDK a fresh response with the same bytes.
        body = await response.aread()
        await response.aclose()
        capture.status = response.status_code
        # Every field as received, repeated ones as separate pairs (the policy joins
        # list-valued ones such as RateLimit itself).
        encoding = response.headers.encoding
        capture.headers = [(k.decode(encoding), v.decode(encoding)) for k, v in response.headers.raw]
        capture.body = body[:MAX_CAPTURED_BODY].decode("utf-8", errors="replace")
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            content=body,
            request=request,
            extensions={k: v for k, v in response.extensions.items() if k == "http_version"},
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def create_capturing_http_client(
    *, timeout: httpx2.Timeout | None = None, headers: Mapping[str, str] | None = None, **kwargs: Any
) -> httpx2.AsyncClient:
    """An httpx2 client for `streamable_http_client(url, http_client=...)` that lets
    the wrapper see failed POSTs. Defaults match the SDK's (30 s, 300 s reads)."""
    return httpx2.AsyncClient(
        transport=CapturingTransport(),
        timeout=timeout or httpx2.Timeout(30.0, read=300.0),
        headers=dict(headers or {}),
        **kwargs,
    )


@dataclass(frozen=True)
class StatusCheckRequest:
    """What a status check is asked about: a write that may have been applied."""

    session: ClientSession
    tool: str
    arguments: Mapping[str, Any]
    idempotency_key: str | None
    call_id: int


StatusCheck = Callable[[StatusCheckRequest], Awaitable[StatusCheckResult]]
EmptyCheck = Callable[[CallToolResult], str | None]


def _is_empty_value(value: Any) -> bool:
    if value is None or value == "" or value == [] or value == {}:
        return True
    if isinstance(value, dict):
        return all(_is_empty_value(v) for v in value.values())
    return False


def default_empty_check(result: CallToolResult) -> str | None:
    """What is wrong with a successful result, or None if it is usable: no
    content blocks (or only blank text) and no structured content is empty."""
    blank_text = all(isinstance(block, TextContent) and not block.text.strip() for block in result.content)
    if blank_text and _is_empty_value(result.structured_content):
        return "the tool returned an empty result"
    return None


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON: nothing the policy could read
        return None


def tool_error_outcome(result: CallToolResult) -> FailureOutcome:
    """The outcome of an `isError: true` result: `tool-error(none)` with the text
    content blocks joined with "\n" as the body and `structuredContent` as JSON
    text. The wrapper does not read an upstream status itself: the policy reads
    the text and the structured content (a status, a provider's error type, a
    wait in prose such as "try again in 20s")."""
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    return tool_error(text, _json_text(result.structured_content))


def protocol_error_outcome(error: MCPError) -> FailureOutcome:
    """The outcome of a JSON-RPC error: its code, its message as the body, and
    its `data` (if any) as JSON text in `structured-content`."""
    return protocol_failure(error.code, error.message, data=_json_text(error.data))


@dataclass(frozen=True)
class _CallTag:
    """What every log line of one call carries: its step and its key."""

    step: int
    key: str | None = None


@dataclass
class _Observed:
    outcome: Outcome
    summary: str
    result: CallToolResult | None = None


class RetryingToolCaller:
    """Calls MCP tools through one run of the policy. One caller per run; it
    is used from one asyncio task at a time, as the run's instance is."""

    def __init__(
        self,
        session: ClientSession,
        run: Run,
        *,
        status_check: StatusCheck | Mapping[str, StatusCheck] | None = None,
        key_argument: str = "idempotency_key",
        entropy: EntropySource | None = None,
        attempt_timeout_s: float = 30.0,
        tools: list[Tool] | None = None,
        empty_check: EmptyCheck = default_empty_check,
        clock: Callable[[], int] = now_ms,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        log: logging.Logger = logger,
        policy_identity: str | None = None,
    ) -> None:
        self.session = session
        self.run = run
        # Which policy made the decisions, on every log line (`policy`): the
        # component's identity by default; a host serving a LivePolicy passes
        # `str(loaded.identity)` of the Loaded the run was started from.
        if policy_identity is not None and not isinstance(policy_identity, str):
            raise TypeError(f"policy_identity must be a string (e.g. str(loaded.identity)), got {type(policy_identity).__name__}")
        self.policy_identity: str = policy_identity if policy_identity is not None else run.instance.policy_identity
        self.status_check = status_check
        self.key_argument = key_argument
        self.entropy = entropy or OsEntropy()
        self.attempt_timeout_s = attempt_timeout_s
        self.empty_check = empty_check
        self.clock = clock
        self.sleep = sleep
        self.log = log
        self._tools: dict[str, Tool] | None = {t.name: t for t in tools} if tools is not None else None
        self._steps = 0

    async def _tool(self, name: str) -> Tool | None:
        if self._tools is None:
            tools: dict[str, Tool] = {}
            cursor: str | None = None
            while True:
                page = await self.session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                tools.update({t.name: t for t in page.tools})
                cursor = page.next_cursor
                if not cursor:
                    break
            self._tools = tools
        return self._tools.get(name)

    def _takes_key(self, tool: Tool | None) -> bool:
        properties = (tool.input_schema or {}).get("properties") if tool is not None else None
        return isinstance(properties, dict) and self.key_argument in properties

    @staticmethod
    def _hints(tool: Tool | None) -> ToolHints | None:
        annotations = tool.annotations if tool is not None else None
        if annotations is None:
            return None
        return {
            "read-only": annotations.read_only_hint,
            "destructive": annotations.destructive_hint,
            "idempotent": annotations.idempotent_hint,
        }

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *, action_id: str | None = None) -> CallToolResult:
        """Makes one intended call, retrying as the policy says. Returns what the
        model should see: the result, or (replan) an `isError` result carrying
        the policy's message. Raises `Escalated` when the run must stop.

        `action_id` names the call's place in the run for its idempotency key
        (default: `step-N`, N counting this caller's calls from 1, as the Rust
        host does, so all hosts derive the same key for the same run and call);
        pass a stable one to keep the key across a host restart."""
        self._steps += 1
        step = self._steps
        action = action_id if action_id is not None else f"step-{step}"
        tool = await self._tool(name)
        send_arguments = dict(arguments or {})
        key: str | None = None
        if self._takes_key(tool):
            key = self._policy(_CallTag(step), name, "not sent", self.run.instance.derive_idempotency_key, self.run.run_id, action)
            send_arguments[self.key_argument] = key
        tag = _CallTag(step, key)
        request: CallRequest = {"tool": name, "idempotency-key": key, "hints": self._hints(tool)}
        admission = self._policy(tag, name, "not sent", self.run.begin_call, request, self.clock())
        if "escalate" in admission:
            refusal = cast(EscalateAdmission, admission)["escalate"]
            self._log_line(tag, name, None, 0, "not sent", None, "escalate", None, refusal["note"], escalation=refusal["reason"])
            raise Escalated(refusal, tool=name)
        ticket = admission["send"]  # narrowed: not an escalation
        call_id = ticket["call-id"]
        if ticket["delay-ms"]:
            await self.sleep(ticket["delay-ms"] / 1000)

        attempt = 1  # the attempt each outcome reports: 1, then each retry plan's
        while True:
            observed = await self._attempt(name, send_arguments)
            decision = self._policy(
                tag,
                name,
                observed.summary,
                self.run.record_outcome,
                call_id,
                attempt,
                observed.outcome,
                self.clock(),
                self.entropy.next_u64(),
            )
            self._log_decision(tag, name, call_id, attempt, observed.summary, decision)
            while decision["action"] == "check-status":
                found = await self._check_status(name, send_arguments, key, call_id)
                outcome: Outcome = {"status-check": found}
                # Reported under the attempt whose effect was checked.
                decision = self._policy(
                    tag,
                    name,
                    f"status check: {found}",
                    self.run.record_outcome,
                    call_id,
                    attempt,
                    outcome,
                    self.clock(),
                    self.entropy.next_u64(),
                )
                self._log_decision(tag, name, call_id, attempt, f"status check: {found}", decision)
            action_taken = decision["action"]
            kind = action_name(action_taken)
            if kind == "retry":
                plan = cast(RetryAction, action_taken)["retry"]
                await self.sleep(plan["delay-ms"] / 1000)
                attempt = plan["attempt"]
                continue
            if kind == "replan":
                message = cast(ReplanAction, action_taken)["replan"]
                return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
            if kind == "succeed":
                if observed.result is not None and observed.outcome == "success":
                    return observed.result
                note = cast(SucceedAction, action_taken)["succeed"] or "done"
                return CallToolResult(content=[TextContent(type="text", text=note)], is_error=False)
            if kind == "escalate":
                raise Escalated(cast(EscalateAction, action_taken)["escalate"], tool=name)
            raise AssertionError(f"unknown action {action_taken!r}")  # the contract has no other

    def _policy(self, tag: _CallTag, tool: str, last_outcome: str, ask: Callable[..., _T], *args: Any) -> _T:
        """Asks the policy; if the policy itself fails, the safe fallback: no
        retry, escalate with a note saying so (and what the last attempt saw)."""
        try:
            return ask(*args)
        except (PolicyTrap, InstanceUnusable) as e:
            note = (
                f"the retry policy failed ({type(e).__name__}: {e}); not retried. Last outcome of {tool}: {last_outcome}. "
                "Effects of this run are not known to the host: check before sending again."
            )
            self._log_line(tag, tool, None, 0, last_outcome, None, "escalate", None, note, escalation="unclassified-failure")
            escalation = {
                "reason": "unclassified-failure",
                "last-error": last_outcome,
                "resets-in-ms": None,
                "effects": [],
                "effects-total": 0,
                "note": note,
            }
            raise Escalated(escalation, tool=tool, policy_failure=e) from e

    async def _attempt(self, name: str, arguments: Mapping[str, Any]) -> _Observed:
        capture = AttemptCapture()
        token = _current_attempt.set(capture)
        result: CallToolResult | None = None
        error: BaseException | None = None
        try:
            result = await asyncio.wait_for(self.session.call_tool(name, dict(arguments)), self.attempt_timeout_s)
        except asyncio.TimeoutError as e:
            error = e
        except MCPError as e:
            error = e
        finally:
            _current_attempt.reset(token)
        # The first case that fits, in the contract's order: HTTP status,
        # transport, JSON-RPC error, isError.
        if capture.status is not None:
            summary = f"HTTP {capture.status}"
            return _Observed(http_failure(capture.status, capture.headers, capture.body), summary)
        if capture.transport_error is not None:
            return _Observed(transport_failure(capture.transport_error, capture.transport_detail), capture.transport_error)
        if isinstance(error, asyncio.TimeoutError):
            return _Observed(transport_failure("timeout", f"no response within {self.attempt_timeout_s} s"), "timeout")
        if isinstance(error, MCPError):
            if error.code == REQUEST_TIMEOUT:  # the session's own read timeout
                return _Observed(transport_failure("timeout", error.message), "timeout")
            if error.code == CONNECTION_CLOSED:
                return _Observed(transport_failure("stream-closed", error.message), "stream closed")
            return _Observed(protocol_error_outcome(error), f"JSON-RPC {error.code}")
        assert result is not None
        if result.is_error:
            return _Observed(tool_error_outcome(result), "isError", result)
        what = self.empty_check(result)
        if what is not None:
            return _Observed(empty_result(what), "empty result", result)
        return _Observed("success", "success", result)

    async def _check_status(self, name: str, arguments: Mapping[str, Any], key: str | None, call_id: int) -> StatusCheckResult:
        check = self.status_check.get(name) if isinstance(self.status_check, Mapping) else self.status_check
        if check is None:
            return "unknown"  # nobody can tell: the policy escalates rather than risk a second write
        try:
            found = await check(StatusCheckRequest(self.session, name, dict(arguments), key, call_id))
        except Exception as e:  # a failed check knows nothing
            failed = {
                "event": "agent_retry.status_check_failed",
                "run": self.run.run_id,
                "tool": name,
                "policy": self.policy_identity,
                "error": repr(e),
            }
            self.log.warning(json.dumps(failed, ensure_ascii=False))
            return "unknown"
        return found if found in ("found", "absent", "unknown") else "unknown"

    def _log_decision(self, tag: _CallTag, tool: str, call_id: int, attempt: int, outcome: str, decision: Decision) -> None:
        action = decision["action"]
        delay = cast(RetryAction, action)["retry"]["delay-ms"] if action_name(action) == "retry" else None
        escalation = cast(EscalateAction, action)["escalate"]["reason"] if action_name(action) == "escalate" else None
        self._log_line(
            tag,
            tool,
            call_id,
            attempt,
            outcome,
            decision["class"],
            action_name(action),
            delay,
            decision["reason"],
            rule=decision["rule"],
            hint_ms=decision["hint-ms"],
            escalation=escalation,
        )

    def _log_line(
        self,
        tag: _CallTag,
        tool: str,
        call_id: int | None,
        attempt: int,
        outcome: str,
        klass: str | None,
        action: str,
        delay_ms: int | None,
        reason: str,
        *,
        rule: str | None = None,
        hint_ms: int | None = None,
        escalation: str | None = None,
    ) -> None:
        # The fields and their order are the same in all three hosts (module
        # docstring). `step` and `key` name the call (`tag`); `rule` is the
        # classification rule that applied; `hint_ms` the decision's hint;
        # `escalation` the escalation reason (the contract's name, e.g.
        # "run-steps-spent"); `policy` which policy decided (`policy_identity`).
        self.log.info(
            json.dumps(
                {
                    "event": "agent_retry.attempt",
                    "ts": round(time.time(), 3),
                    "run": self.run.run_id,
                    "policy": self.policy_identity,
                    "step": tag.step,
                    "call": call_id,
                    "tool": tool,
                    "attempt": attempt,
                    "key": tag.key,
                    "outcome": outcome,
                    "class": klass,
                    "rule": rule,
                    "action": action,
                    "delay_ms": delay_ms,
                    "hint_ms": hint_ms,
                    "escalation": escalation,
                    "reason": reason,
                },
                ensure_ascii=False,
            )
        )
