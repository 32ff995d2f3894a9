"""The retrying wrapper (`RetryingToolCaller`): one call of the model through the
policy, its attempts, the `initialize` and `tools/list` pseudo-calls, status
checks, limits and log lines (the module docstring of
`agent_retry_policy.mcp_client` says how it observes and obeys).

Each call goes through the policy's single run path (contract 0.8.0, kept by 0.9.0):
`begin_call` (naming the server, for the circuit breakers), then per attempt `record_success`, `record_empty_result` or
`record_failure` (the raw observation: status, headers and body as received,
JSON-RPC code, message and data, whether an `Mcp-Session-Id` was sent, how far
the request got), and per status check `record_status_check`; each answers
with a `Verdict` of integers and enum cases. The wrapper decides nothing about
what a failure means (a lost session included): a retry whose verdict says
`reconnect` opens a new session first. With a call or run limit, every report
passes the time left to it (`time-left-ms`). The words are read
(`last_decision(call_id)`) only when something needs them: a replan's message
for the model, an escalation's hand-off, a success's note when there is no
result to return, and the log line's `reason`: the line is written only when
the logger is enabled for INFO, and then always carries the reason, so the
decision is read for every logged attempt and for none when INFO is off. A
call not admitted reads the hand-off with `escalation()`. That bookkeeping,
and every event (the circuit breakers' changes included), is `_call_core.CallCore`'s, shared with `call_with_policy`:
this module does the MCP I/O (sessions, attempts, polls, status checks).

An escalation carries the run's snapshot (contract 0.9.0: `Run.snapshot`,
with the stopped call's arguments as compact JSON); `resume` takes a
snapshot and a person's answer, resumes the run on the caller's policy and
goes on as `Run.resumed_call()` says: a `send` runs the same call loop from
the resumed attempt and ticket, with the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, Union, cast

from mcp import ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    CallToolResult,
    InputResponses,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from pydantic import ValidationError

from .. import otel
from .._call_core import CallCore, ReplannedBeforeSend, Report, RunBook, check_name, forget_task
from .._telemetry import Telemetry
from .._verdicts import Answer as _Answer
from .._verdicts import bounded, rule_name
from ..component import Run, now_ms
from ..entropy import EntropySource, OsEntropy
from ..errors import (
    CallCancelled,
    CallTimedOut,
    Escalated,
    InstanceUnusable,
    PolicyTrap,
    RunMisuse,
    SessionLost,
    SnapshotError,
    StopCause,
    Stopped,
)
from ..events import CallScope, EscalationEvent, ReplanEvent, ResumeEvent, TaskPollEvent
from ..guard import CallGuard, Outcome, RunGuard
from ..hooks import Hooks
from ..limits import MAX_ID_BYTES, MAX_SERVER_BYTES, cut_lifted_text, utf8_size, within
from ..metrics import RetryMetrics
from ..types import (
    CallStart,
    Delivery,
    Observation,
    ReplanAction,
    ResumeAnswer,
    ResumedCall,
    StatusCheckResult,
    SucceedAction,
    TaskReport,
    TaskStatus,
    ToolHints,
    Verdict,
    http_failure,
    input_required,
    json_text,
    protocol_failure,
    tool_error,
    transport_failure,
)
from . import continuation, tasks
from .capture import AttemptCapture, _current_attempt
from .connection import McpConnection, _ConnectFailure, _describe, _Generation, _spawn
from .continuation import InputNeeded
from .tasks import TaskCreated, TaskState

logger = logging.getLogger("agent_retry_policy.mcp")
_T = TypeVar("_T")

# What the decisions on a failure seen through a transport that cannot capture say.
CAPTURE_MISSING_SUFFIX = " [no HTTP status or headers: the transport is not the wrapper's capturing one]"
# The pseudo-tools connecting and listing the tools are called as.
INITIALIZE = "initialize"
TOOLS_LIST = "tools/list"
PSEUDO_TOOL_HINTS: ToolHints = {"read-only": True, "destructive": False, "idempotent": True}

# Errors mcp's streamable HTTP client makes up itself when its transport is not
# the wrapper's (the real status, headers and body are gone by then).
_SDK_HTTP_ERRORS = (
    (INTERNAL_ERROR, "Server returned an error response"),
    (INVALID_REQUEST, "Session terminated"),
    (METHOD_NOT_FOUND, "Not Found"),
    (INVALID_REQUEST, "server answered a request with 202 Accepted"),
)
_SDK_HTTP_PREFIXES = ("SSE stream", "Failed to parse JSON response", "Unexpected content type")
# The dispatcher's own message when the session's read stream ended: the session is over.
_SESSION_CLOSED_MESSAGE = "Connection closed"
# The dispatcher's own message when a request's timeout passed (`Request 'tools/call' timed out`).
_SDK_TIMEOUT_MESSAGE = re.compile(r"Request .* timed out")
# How long a `tasks/cancel` may take before the wrapper goes on without its answer.
CANCEL_TIMEOUT_S = 5.0
# The run's limit unless the caller sets one (None: none): a policy that waits for ever cannot hold a run.
DEFAULT_RUN_TIMEOUT_S = 1800.0

# The new sessions a run may set up after its first (a verdict's `reconnect`,
# a session suspect after a cut stream or a refused connection, a stdio server
# started again), unless `max_reconnects_per_run` says otherwise: the same in every host.
DEFAULT_MAX_RECONNECTS_PER_RUN = 3

# The once-per-connection warning on tools without annotations: where it points, how many names it lists.
TOOLS_WITHOUT_HINTS_DOC = "docs/users.md#a-tool-without-annotations-is-an-unkeyed-write"
MAX_TOOLS_NAMED = 20
MAX_TOOL_NAME_CHARS = 128
# The connections (or bare sessions) already warned about tools without annotations.
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()


def _warned_connection(owner: Any) -> bool:
    """Whether `owner` was warned already (and from now on it is)."""
    try:
        if owner in _WARNED:
            return True
        _WARNED.add(owner)
    except TypeError:  # not weakly referenceable: warned every time it lists (never silently)
        return False
    return False


# Transport faults after which an HTTP session is suspect: the next request goes
# on a new one (transport state, as a pool drops a broken connection; the policy
# still decides whether there is a next request).
_SUSPECT_AFTER = frozenset(["connection-reset", "connection-refused", "stream-closed"])


@dataclass(frozen=True)
class StatusCheckRequest:
    """What a status check is asked about: a write that may have been applied.
    `session` is the current session (re-established if it was lost)."""

    session: ClientSession
    tool: str
    arguments: Mapping[str, Any]
    idempotency_key: str | None
    call_id: int


# A status check: async, or plain (run in a thread of its own, off the loop).
StatusCheck = Callable[[StatusCheckRequest], Union[StatusCheckResult, Awaitable[StatusCheckResult]]]
EmptyCheck = Callable[[CallToolResult], str | None]


def _is_empty_value(value: Any) -> bool:
    if value is None or value == "" or value == [] or value == {}:
        return True
    if isinstance(value, dict):
        return all(_is_empty_value(v) for v in value.values())
    return False


def _given_key_fits(key: Any) -> bool:
    """Whether a key the application put in the arguments can be told to the
    policy as the call's key: a non-empty string of at most `MAX_ID_BYTES` UTF-8
    bytes (the Rust host's `given_key_fits`)."""
    return isinstance(key, str) and key != "" and within(key, MAX_ID_BYTES)


def default_empty_check(result: CallToolResult) -> str | None:
    """What is wrong with a successful result, or None if it is usable: no
    content blocks (or only blank text) and no structured content is empty."""
    blank_text = all(isinstance(block, TextContent) and not block.text.strip() for block in result.content)
    if blank_text and _is_empty_value(result.structured_content):
        return "the tool returned an empty result"
    return None


def tool_error_outcome(result: CallToolResult, *, session_id_sent: bool = False) -> Observation:
    """The observation of an `isError: true` result: `tool-error(none)` with the text
    content blocks joined with "\\n" as the body and `structuredContent` as JSON
    text. The wrapper does not read an upstream status itself: the policy reads
    the text and the structured content (a status, a provider's error type, a
    wait in prose such as "try again in 20s")."""
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    return tool_error(text, json_text(result.structured_content), session_id_sent=session_id_sent)


def protocol_error_outcome(error: MCPError, *, session_id_sent: bool = False) -> Observation:
    """The observation of a JSON-RPC error: its code, its message as the body,
    and its `data` (if any) as JSON text in `structured-content`."""
    return protocol_failure(error.code, error.message, data=json_text(error.data), session_id_sent=session_id_sent)


def _sdk_stand_in(error: MCPError) -> Observation | None:
    """The observation an error mcp's HTTP client made up from a 404 stands for,
    when the wrapper's capture did not see the answer: the SDK says "Session
    terminated" for a 404 to a request that carried a session id, "Not Found"
    for one that did not. Nothing else is known of it (no headers, no body)."""
    if (error.code, error.message) == (INVALID_REQUEST, "Session terminated"):
        return http_failure(404, (), "", session_id_sent=True)
    if (error.code, error.message) == (METHOD_NOT_FOUND, "Not Found"):
        return http_failure(404, (), "", session_id_sent=False)
    return None


def _sdk_http_error(error: MCPError) -> bool:
    """Whether mcp's streamable HTTP client made this error up itself (from a
    status or a stream it saw), rather than the server answering it."""
    if (error.code, error.message) in _SDK_HTTP_ERRORS:
        return True
    return error.code in (CONNECTION_CLOSED, PARSE_ERROR, INVALID_REQUEST) and error.message.startswith(_SDK_HTTP_PREFIXES)


def _server_answered(capture: AttemptCapture, error: MCPError) -> bool:
    """Whether a JSON-RPC error whose code the SDK also gives its own failures
    (-32000 connection closed, -32001 its timeout) is the server's answer. Over
    the capturing transport, the capture knows: the response to the request came
    whole. Without it (stdio, another HTTP client) nothing saw the bytes: the
    SDK's own errors are the ones in the exact forms it makes them."""
    if capture.seen:
        return capture.responded
    if error.code == CONNECTION_CLOSED:
        return error.message != _SESSION_CLOSED_MESSAGE and not _sdk_http_error(error)
    return _SDK_TIMEOUT_MESSAGE.fullmatch(error.message) is None


@dataclass
class _Observed:
    """One attempt (or poll) as observed: a success (nothing but `result`), an
    empty result (`empty`: what is wrong), a failure (`observation`), a task's
    status (`task`), or a failed poll (`poll_failure`)."""

    result: Any = None
    observation: Observation | None = None
    empty: str | None = None
    capture_missing: bool = False
    # What the server said of the call's task (a poll's answer, or the call answered by a task).
    task: TaskReport | None = None
    # The task a tool call's answer made.
    task_id: str | None = None
    # A poll (`tasks/get`) that failed, as observed.
    poll_failure: Observation | None = None

    @property
    def success(self) -> bool:
        return self.observation is None and self.empty is None and self.task is None and self.poll_failure is None

    @property
    def report(self) -> Report:
        """What the run is told of it."""
        return Report(failure=self.observation, empty=self.empty, task=self.task, poll_failure=self.poll_failure)

    @property
    def outcome(self) -> Outcome:
        """The facts the guard keeps (an answer unless a failure was observed; a task in its status)."""
        if self.task is not None:
            return Outcome.task(self.task["status"])
        return Outcome.of(self.observation)


@dataclass
class _CallState:
    """The call in progress (the model's, or a listing of the tools), for a
    stop (`CallTimedOut`, `CallCancelled`): its limit and what is out. `core`
    keeps the call's books and events (none before the call is made)."""

    tool: str
    deadline: float | None
    cause: StopCause
    limit_s: float | None
    core: CallCore | None = None
    attempts_sent: int = 0
    # An attempt of the call, or its task, is out (a stop lists the call's effect as possibly applied).
    in_flight: bool = False
    # An attempt's request is out (a stop says "while attempt N was in flight").
    attempt_out: bool = False
    # The call's task while it lives (cancelled if the call stops).
    task_id: str | None = None
    # The stop of a pseudo-call (`initialize`, `tools/list`) in progress when the call stopped.
    pseudo_stopped: Stopped | None = None

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


@dataclass
class _PseudoProgress:
    """How far a pseudo-call got, for its stop: the attempts sent, and whether one is out."""

    sent: int = 0
    in_flight: bool = False


class _AttemptClock:
    """One attempt's two timeouts: idle (no answer and no progress; each
    progress notification starts it again) and whole (progress or not).
    `progress_callback` is the SDK's progress callback of the attempt's
    requests; while a handler of the application answers the server's
    questions (`waiting_on_a_person`), the idle timeout does not run."""

    def __init__(self, idle_s: float, whole_s: float, progress_callback: ProgressFnT) -> None:
        self.started = self.active = time.monotonic()
        self.idle_s, self.whole_s = idle_s, whole_s
        self.progress_callback = progress_callback
        self._held = 0

    def progressed(self) -> None:
        self.active = time.monotonic()

    @asynccontextmanager
    async def waiting_on_a_person(self) -> AsyncIterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            self.progressed()

    def ends_at(self) -> float:
        whole = self.started + self.whole_s
        return whole if self._held else min(self.active + self.idle_s, whole)

    def which(self) -> str:
        """What the timeout that passed was, for the observation's body."""
        if self.started + self.whole_s <= self.active + self.idle_s:
            return f"no response within the attempt's {self.whole_s:g} s in all (attempt-timeout-ms)"
        return f"no response or progress within {self.idle_s:g} s (idle-timeout-ms)"


# Sends an attempt's request on a session, on the attempt's clock (its progress callback).
_Send = Callable[[ClientSession, _AttemptClock], Awaitable[Any]]


class _DeadlinePassed(Exception):
    """Internal: the call's or the run's limit passed (raised up to `call_tool`)."""


def server_name_of(connection: McpConnection | None) -> str | None:
    """The server of a connection as the circuit breakers are told it, the same
    in every host: over HTTP its URL as given (the policy keeps it with the
    scheme and host in lower case, without user information, a default port, the
    query and the fragment, and at most 256 bytes of it); over stdio `stdio:` and
    the command and its arguments joined by single spaces. None for no connection
    (a bare session: pass `server_name`)."""
    if connection is None:
        return None
    if connection.url is not None:
        return connection.url
    return "stdio:" + " ".join([connection.command or "", *connection.args])


def _count(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _positive_or_none(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


class RetryingToolCaller:
    """Calls MCP tools through one run of the policy. One caller per run; it
    is used from one asyncio task at a time, as the run's instance is.

    `connection` is an `McpConnection` (preferred: the wrapper can connect it
    and re-establish a lost session) or an initialised `ClientSession` (works,
    but a lost session ends the call with `SessionLost`). `call_timeout_s`
    (default None: no limit) and `run_timeout_s` (default
    `DEFAULT_RUN_TIMEOUT_S`, 30 minutes; None: no limit) bound each call from
    the start of `call_tool`, and the run from the caller's construction: every report then
    passes the time left to the nearer of the two (`time-left-ms`), and no wait
    goes past it. Each attempt's timeouts are the policy's (`call-start`'s
    `idle-timeout-ms`, restarted by each progress notification, and
    `attempt-timeout-ms` in all, per tool in the configuration);
    `attempt_timeout_s`, if given, caps the idle timeout. Every `tools/call`
    carries a progress token: `on_progress(tool, progress, total, message)` sees
    each `notifications/progress` the server sends for it.
    `on_verdict(tool, attempt, verdict)` is called with every verdict the
    wrapper acts on (for tests and metrics; it must not raise).

    The run's guard (`agent_retry_policy.guard`), built from the configuration
    text the run's policy was loaded from (`run.config_text`), sees every
    begin, attempt, verdict, status check and read of `last-decision`. A
    verdict that breaks an invariant (a 403 retried, an unknown write resent, a
    key changed, a wait past the caps, a budget overrun, words that disagree
    with the verdict) ends the call with the policy-failure escalation, and
    every later call of the run escalates with it, nothing sent.

    Over HTTP, an attempt that fails with a reset or refused connection or a
    cut answer stream leaves its session suspect: the next request (the retry,
    a poll, a status check) goes on a new one, as a pool drops a broken
    connection. `max_reconnects_per_run` (default
    `DEFAULT_MAX_RECONNECTS_PER_RUN`, 3) bounds the new sessions after the
    first, whatever set them up; once spent, an attempt that needs one is not
    sent and is reported as `transport(other)`, `not-sent`, "reconnections
    spent: ...", which the policy escalates. After each new session the tool
    list is read again (on the next call), unless `tools` was given.

    The events of docs/events.md (attempts, waits, status checks, task polls,
    replans, escalations) are logged at INFO, counted in `metrics` (a
    `RetryMetrics`), given to `hooks` (a `Hooks`), and recorded through
    OpenTelemetry when `opentelemetry-api` is present (the global providers, or
    `tracer_provider` / `meter_provider`): a span per call, a client span per
    `tools/call` attempt, whose W3C trace context goes in the request's
    `params._meta`.

    The circuit breakers (the configuration's `circuit-breaker`) know the
    server as `server_name` if given (the same name in every worker, at most
    4,096 bytes), else the connection's (`server_name_of`: the URL, or `stdio:`
    and the command line; the policy normalises a URL); the pseudo-calls name it too.
    While a breaker of the server is open a call is not sent: the model gets an
    `isError` result whose text says so (as for a replan verdict), and a
    pseudo-call raises `SessionLost` with it."""

    def __init__(
        self,
        connection: McpConnection | ClientSession,
        run: Run,
        *,
        status_check: StatusCheck | Mapping[str, StatusCheck] | None = None,
        key_argument: str = "idempotency_key",
        entropy: EntropySource | None = None,
        attempt_timeout_s: float | None = None,
        call_timeout_s: float | None = None,
        run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S,
        tools: list[Tool] | None = None,
        empty_check: EmptyCheck = default_empty_check,
        clock: Callable[[], int] = now_ms,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        log: logging.Logger = logger,
        policy_identity: str | None = None,
        on_verdict: Callable[[str, int, Verdict], None] | None = None,
        on_progress: Callable[[str, float, float | None, str | None], None] | None = None,
        max_reconnects_per_run: int = DEFAULT_MAX_RECONNECTS_PER_RUN,
        hooks: Hooks | None = None,
        metrics: RetryMetrics | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        server_name: str | None = None,
    ) -> None:
        if server_name is not None and (not isinstance(server_name, str) or not server_name):
            raise TypeError(f"server_name must be a non-empty string (the server's name for the circuit breakers), got {server_name!r}")
        if server_name is not None and utf8_size(server_name) > MAX_SERVER_BYTES:
            raise ValueError(f"server_name is {utf8_size(server_name)} bytes; a call may name at most {MAX_SERVER_BYTES}")
        if isinstance(connection, McpConnection):
            self.connection: McpConnection | None = connection
            self._bare: ClientSession | None = None
        else:  # a ClientSession (or anything with its call_tool and list_tools)
            self.connection = None
            self._bare = connection
        self.run = run
        # The server's name for the circuit breakers (None: a bare session and no `server_name`: no breaker applies).
        self.server_name: str | None = server_name if server_name is not None else server_name_of(self.connection)
        # Which policy made the decisions, on every log line (`policy`): the
        # component's identity by default; a host serving a LivePolicy passes
        # `str(loaded.identity)` of the Loaded the run was started from.
        if policy_identity is not None and not isinstance(policy_identity, str):
            raise TypeError(f"policy_identity must be a string (e.g. str(loaded.identity)), got {type(policy_identity).__name__}")
        self.policy_identity: str = policy_identity if policy_identity is not None else run.instance.policy_identity
        self.status_check = status_check
        self.key_argument = key_argument
        self.entropy = entropy or OsEntropy()
        # None: the policy's idle timeout as it is; else a cap on it.
        self.attempt_timeout_s = _positive_or_none("attempt_timeout_s", attempt_timeout_s)
        self.call_timeout_s = _positive_or_none("call_timeout_s", call_timeout_s)
        self.run_timeout_s = _positive_or_none("run_timeout_s", run_timeout_s)
        self._run_deadline = time.monotonic() + self.run_timeout_s if self.run_timeout_s is not None else None
        self.empty_check = empty_check
        self.clock = clock
        self.sleep = sleep
        self.log = log
        self._tools: dict[str, Tool] | None = {t.name: t for t in tools} if tools is not None else None
        # The wrapper lists the tools itself (none were given): it lists them again after a new session.
        self._lists_tools = tools is None
        self.max_reconnects_per_run = _count("max_reconnects_per_run", max_reconnects_per_run)
        # Sessions this caller set up, and how many of them replaced one (on a connection another
        # caller may have connected first: counted as Rust and Node count them).
        self._sessions = 0
        self._reconnects = 0
        self._bare_lost: str | None = None
        self._capture_warned = False
        self.on_verdict = on_verdict
        self.on_progress = on_progress
        # Where the events go (docs/events.md): the log lines, the hooks, the metrics, OpenTelemetry.
        # The attempt lines stay alone on `log`; the other events go to its child `events` (`agent_retry_policy.mcp.events`).
        self.telemetry = Telemetry(
            log,
            events_log=log.getChild("events"),
            hooks=hooks,
            metrics=metrics,
            otel_recorder=otel.recorder(tracer_provider, meter_provider),
        )
        # The model's call in progress: its span, which its pseudo-calls' events go to (one call at a time).
        self._span: otel.CallSpan | None = None
        # `tasks/cancel`s of stopped calls, sent in the background (held until done).
        self._background: set[asyncio.Task[None]] = set()
        # What the wrapper enforces whatever the policy says, from the configuration the host holds; the
        # steps; the escalation of the first broken invariant (the rest of the run ends with it).
        self._book = RunBook(RunGuard(run.config_text))
        self.guard = self._book.guard
        # Whether a refused snapshot was logged already (once per caller).
        self._snapshot_warned = False

    @property
    def session(self) -> ClientSession | None:
        """The session calls go to now (None while an `McpConnection` is not connected)."""
        return self.connection.session if self.connection is not None else self._bare

    @property
    def listed_tools(self) -> list[Tool] | None:
        """The tools as last listed (or given), without listing them: None until `list_tools` or a call lists them."""
        return list(self._tools.values()) if self._tools is not None else None

    # -- the model's call

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *, action_id: str | None = None) -> CallToolResult:
        """Makes one intended call, retrying as the policy says. Returns what the
        model should see: the result, or (replan) an `isError` result carrying
        the policy's message. Raises `Escalated` when the run must stop,
        `SessionLost` when the session is lost and cannot be re-established,
        `CallTimedOut` when `call_timeout_s` or `run_timeout_s` passes, and
        `CallCancelled` (a `CancelledError`) when the task is cancelled.

        `action_id` names the call's place in the run for its idempotency key
        (default: `step-N`, N counting this caller's calls from 1, as the Rust
        host does, so all hosts derive the same key for the same run and call);
        pass a stable one to keep the key across a host restart. A key the
        application already put in `arguments` is never replaced: a non-empty
        string of at most 256 UTF-8 bytes is the call's key, sent unchanged with
        every attempt; any other value (but None) is sent as it is and the call
        counts as an unkeyed write."""
        self._book.steps += 1
        step = self._book.steps
        return await self._guarded_call(name, arguments, step, lambda state, core: self._call_tool(state, core, name, arguments, action_id))

    async def _guarded_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None,
        step: int | None,
        body: Callable[[_CallState, CallCore], Awaitable[CallToolResult]],
    ) -> CallToolResult:
        """One call of the model (or a resumed one) under the call's and the
        run's limits, with its span; what stops it (a limit, a cancellation)
        is written as a stop, and an escalation carries the run's snapshot
        (`Escalated.snapshot`), taken with the call's `arguments`."""
        started = time.monotonic()
        call_deadline = started + self.call_timeout_s if self.call_timeout_s is not None else None
        run_deadline = self._run_deadline
        if call_deadline is not None and (run_deadline is None or call_deadline <= run_deadline):
            deadline, cause, limit = call_deadline, cast(StopCause, "call-timeout"), self.call_timeout_s
        else:
            deadline, cause, limit = run_deadline, cast(StopCause, "run-timeout"), self.run_timeout_s
        state = _CallState(name, deadline, cause, limit)
        recorder = self.telemetry.otel
        self._span = recorder.call(name, self.run.run_id, self.policy_identity, step) if recorder is not None else None
        core = state.core = self._core(state, name, step)
        try:
            core.refuse_if_broken()
            return await body(state, core)
        except _DeadlinePassed:
            self._abandon_task(state)
            raise CallTimedOut(self._stop(state, state.cause, during=self._pseudo_during(state))) from None
        except asyncio.CancelledError as e:
            self._abandon_task(state)
            if isinstance(e, CallCancelled):
                raise
            raise CallCancelled(self._stop(state, "cancelled", during=self._pseudo_during(state))) from e
        except BaseException as e:
            # A call that ended otherwise (SessionLost, a bug): its spans end (no-op once ended).
            core.attempt_failed(type(e).__qualname__)
            if self._span is not None:
                self._span.end("stop", error_type=type(e).__qualname__)
            if isinstance(e, Escalated):
                # The stopped call's arguments when it is the model's call (a pseudo-call's have none).
                self._attach_snapshot(e, arguments if e.tool == name else None)
            raise
        finally:
            self._span = None

    def _attach_snapshot(self, escalated: Escalated, arguments: Mapping[str, Any] | str | None) -> None:
        """Takes the escalated run's snapshot (contract 0.9.0) into
        `escalated.snapshot`, with the stopped call's arguments as compact
        JSON. A snapshot refused (another call of the run still open, ...) is
        None, and the first refusal is logged (`agent_retry.snapshot_refused`);
        after a failure of the policy itself, or a person's `abort` (the
        component refuses an aborted run's snapshot), none is taken."""
        if escalated.snapshot is not None or escalated.policy_failure is not None:
            return
        if escalated.reason == "aborted":  # a person ended the run: there is nothing left to answer
            return
        if isinstance(arguments, str) or arguments is None:
            arguments_json = arguments
        else:
            try:
                arguments_json = json.dumps(dict(arguments), separators=(",", ":"), ensure_ascii=False)
            except (TypeError, ValueError) as e:  # arguments the SDK could send but JSON cannot hold: none kept
                arguments_json = None
                self._snapshot_refused("arguments", f"the call's arguments are not JSON ({e}): the snapshot keeps none")
        try:
            escalated.snapshot = self.run.snapshot(arguments_json, self.clock())
        except SnapshotError as e:
            self._snapshot_refused(e.kind, e.message)
        except (PolicyTrap, InstanceUnusable) as e:
            self._snapshot_refused("policy-failed", str(e))

    def _snapshot_refused(self, kind: str, message: str) -> None:
        """Why an escalation carries no snapshot: logged once per caller."""
        if self._snapshot_warned:
            return
        self._snapshot_warned = True
        line = {
            "event": "agent_retry.snapshot_refused",
            "ts": round(time.time(), 3),
            "run": self.run.run_id,
            "policy": self.policy_identity,
            "kind": kind,
            "reason": cut_lifted_text(message),
        }
        self.telemetry.events_log.warning(json.dumps(line, ensure_ascii=False))

    # -- resuming an escalation (contract 0.9.0)

    async def resume(self, snapshot: str, answer: ResumeAnswer) -> CallToolResult:
        """Resumes an escalated run from its snapshot (`Escalated.snapshot`,
        taken by any host) with a person's answer, and goes on as the run says.
        The run is resumed on the policy this caller's run came from
        (`Policy.resume_run`) and becomes this caller's run: later
        `call_tool` calls go to it. Then, for the call that stopped it:

        - `send` (`ResumeAnswer.retry()`): its next attempt is sent with the
          same tool, arguments and idempotency key, and the call goes on as any
          call from that attempt (retries, status checks, escalation);
        - `succeed` (`done`): a result holding the person's text ("" if none);
        - `replan` (`skip`): the `isError` result a replan gives, with the
          run's message for the model;
        - `escalate` (`abort`, or the account budget refused the retry):
          raises `Escalated`, with a new snapshot (none after `abort`: the
          run is over).

        Raises `SnapshotError` (its `kind`: `tampered`, `other-contract`,
        `malformed`, `too-large`) for a snapshot refused: nothing is sent. A
        `send` whose snapshot keeps no arguments (missing, or not a JSON
        object) is never sent either: the call is closed unsent in the resumed
        run and `SnapshotError` `malformed` is raised. Emits
        `agent_retry.resume` once."""
        if not isinstance(answer, ResumeAnswer):
            raise TypeError(f"answer must be a ResumeAnswer (ResumeAnswer.retry(), ...), got {answer!r}")
        policy = self.run.policy
        if policy is None:
            raise TypeError("this caller's run was not started from a Policy (Policy.start_run): there is no policy to resume on")
        run = policy.resume_run(snapshot, answer, self.clock())
        self.run = run
        # A fresh book for the resumed run: its guard from the configuration,
        # its steps after every call the run began (so that a later call's
        # `step-N` key is no key the run already used).
        self._book = RunBook(RunGuard(run.config_text), steps=max(self._book.steps, run.report()["calls"]))
        self.guard = self._book.guard
        call = run.resumed_call()
        tool = call["tool"] if call is not None else ""
        scope = CallScope(run.run_id, self.policy_identity, None, call["call-id"] if call is not None else None, tool)
        action = call["action"] if call is not None else ("escalate" if run.escalation() is not None else "succeed")
        self.telemetry.emit(ResumeEvent(scope, answer.kind, action, call["attempt"] if call is not None else 0))
        arguments_json = call["arguments-json"] if call is not None else None
        if call is None or action != "send":
            return self._resumed_ending(scope, call, action, arguments_json)
        # A pseudo-call (`initialize`, `tools/list`) has no arguments; a call of the model's needs its own.
        arguments = {} if tool in (INITIALIZE, TOOLS_LIST) else self._resumed_arguments(call)
        return await self._guarded_call(tool, arguments_json, None, lambda state, core: self._resumed_send(state, core, call, arguments))

    def _resumed_arguments(self, call: ResumedCall) -> dict[str, Any]:
        """The resumed call's arguments, as the snapshot keeps them. Missing
        or not a JSON object, they are never made up (no `{}` for a write):
        the call is closed unsent in the resumed run (`abandon_call`, not
        sent, cancelled) and `SnapshotError` `malformed` is raised."""
        kept = call["arguments-json"]
        try:
            decoded = json.loads(kept) if kept is not None else None
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            return decoded
        with contextlib.suppress(RunMisuse):  # a call already over: nothing left open to close
            self.run.abandon_call(call["call-id"], call["attempt"], False, "cancelled")
        raise SnapshotError(
            "malformed",
            f"the snapshot keeps no arguments for call {call['call-id']} ({call['tool']}): it cannot be sent again; nothing was sent",
        )

    def _resumed_ending(self, scope: CallScope, call: ResumedCall | None, action: str, arguments_json: str | None) -> CallToolResult:
        """A resumed call that is over without a send: what `call_tool` gives
        for a success, a replan or an escalation."""
        if action == "escalate":
            escalation = self.run.escalation()
            if escalation is None:  # the contract says there is one: fail safe all the same
                raise Escalated(
                    {"reason": "unclassified-failure", "note": "the resumed run said escalate but gave no hand-off", "effects": []},
                    tool=scope.tool,
                )
            escalation = bounded(escalation)
            decision = self.run.last_decision(scope.call) if scope.call is not None else None
            rule = decision["rule"] if decision is not None else None
            self.telemetry.emit(EscalationEvent(scope, call["attempt"] if call else 0, rule, escalation["reason"], escalation["note"]))
            escalated = Escalated(escalation, tool=scope.tool or None)
            self._attach_snapshot(escalated, arguments_json)
            raise escalated
        if action == "replan":
            decision = self.run.last_decision(scope.call) if scope.call is not None else None
            if decision is None or "replan" not in decision["action"]:
                said = "none" if decision is None else str(decision["action"])
                raise Escalated(
                    {
                        "reason": "unclassified-failure",
                        "note": f"the resumed run said replan, but its last decision is {said}",
                        "effects": [],
                    },
                    tool=scope.tool,
                )
            message = cut_lifted_text(cast(ReplanAction, decision["action"])["replan"])
            self.telemetry.emit(ReplanEvent(scope, call["attempt"] if call else 0, decision["rule"], message, decision=decision))
            return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
        text = (call["result-text"] if call is not None else None) or ""
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=False)

    async def _resumed_pseudo_call(self, state: _CallState, core: CallCore, call: ResumedCall) -> CallToolResult:
        """A resumed `initialize` or `tools/list` (the escalation stopped the
        connecting or the listing, not a call of the model's): its attempt is
        made from the ticket (a connection already up is not made again: the
        attempt is abandoned, nothing sent), and the model is told that no
        call of its was sent."""
        name = call["tool"]
        if name == INITIALIZE and (self.connection is None or self.connection.connected):
            self.run.abandon_call(call["call-id"], call["attempt"], False, "cancelled")
        elif name == INITIALIZE:
            await self._ensure_session(state, call)
        else:
            await self._ensure_session(state)
            given = None if self._lists_tools else self._tools
            await self._tool(state, "", call)
            if given is not None:  # the tools the caller was given stay the ones it uses
                self._tools = given
        core.succeeded()
        text = f"{name} succeeded after the escalation was answered; no call of the model's was stopped: call the tool again"
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=False)

    async def _resumed_send(self, state: _CallState, core: CallCore, call: ResumedCall, arguments: Mapping[str, Any]) -> CallToolResult:
        """The resumed call's attempt (`send`): the same tool, the stored
        `arguments` (`_resumed_arguments`) and the same key, on the ticket's
        timeouts and delay; then the call's loop from that attempt."""
        name = call["tool"]
        if name in (INITIALIZE, TOOLS_LIST):
            return await self._resumed_pseudo_call(state, core, call)
        try:
            await self._ensure_session(state)
            await self._tool(state, name)
        except BaseException as e:
            # The session or the tools could not be had: the resumed call was never sent, and
            # is closed so that the run's snapshot is not refused for it (calls-open).
            try:
                self.run.abandon_call(call["call-id"], call["attempt"], False, "cancelled")
            except RunMisuse:
                pass  # already closed
            if isinstance(e, Escalated) and e.snapshot is None:
                self._attach_snapshot(e, None)
            raise
        send_arguments = dict(arguments)
        key = call["idempotency-key"]
        if key is not None:
            send_arguments[self.key_argument] = key
        start, guard = core.resumed(call)
        attempt = call["attempt"]
        if start.delay_ms:
            core.waits(attempt, "admission", start.delay_ms, None)
            await self._sleep(state, start.delay_ms / 1000)
        return await self._attempts(state, core, name, send_arguments, start, guard, attempt)

    async def list_tools(self) -> list[Tool]:
        """The server's tools, as this caller uses them: listed through the
        policy (the `tools/list` pseudo-call, connecting first with the
        `initialize` one if needed, each retried and escalated as the policy
        says) once, and again after a new session; the `tools` given, if any.
        Bounded by the run's limit (listing is no call of the model's). Raises
        `Escalated`, `SessionLost` or `CallTimedOut` as `call_tool` does."""
        state = _CallState(TOOLS_LIST, self._run_deadline, "run-timeout", self.run_timeout_s)
        state.core = self._core(state, TOOLS_LIST, None)
        try:
            await self._ensure_session(state)
            await self._tool(state, "")
        except Escalated as e:
            self._attach_snapshot(e, None)
            raise
        except _DeadlinePassed:
            # The pseudo-call in progress wrote its stop; else (none was) the listing's own.
            raise CallTimedOut(state.pseudo_stopped or self._stop(state, state.cause)) from None
        except asyncio.CancelledError as e:
            if isinstance(e, CallCancelled):
                raise
            raise CallCancelled(state.pseudo_stopped or self._stop(state, "cancelled")) from e
        return list((self._tools or {}).values())

    def _core(self, state: _CallState, tool: str, step: int | None) -> CallCore:
        """The books and events of one call (a pseudo-call's go to the model's call span, if any)."""
        return CallCore(
            self.run,
            self._book,
            self.telemetry,
            CallScope(self.run.run_id, self.policy_identity, step, None, tool),
            span=self._span,
            now_ms=self.clock,
            time_left_ms=lambda: self._time_left_ms(state),
            entropy=self.entropy,
            on_verdict=self.on_verdict,
            server=self.server_name,
        )

    def _abandon_task(self, state: _CallState) -> None:
        """A call stopped while its task lives: the task is cancelled in the background (nobody waits for it now)."""
        if state.task_id is not None:
            self._cancel_in_background(state.tool, state.task_id)

    def _cancel_in_background(self, name: str, task_id: str) -> asyncio.Task[None]:
        """Sends `tasks/cancel` in a task of its own (held until done), bounded by `CANCEL_TIMEOUT_S`."""
        self._background.add(task := _spawn(self._send_cancel(name, task_id)))
        task.add_done_callback(self._background.discard)
        return task

    async def _call_tool(
        self, state: _CallState, core: CallCore, name: str, arguments: Mapping[str, Any] | None, action_id: str | None
    ) -> CallToolResult:
        action = action_id if action_id is not None else f"step-{core.scope.step}"
        await self._ensure_session(state)
        tool = await self._tool(state, name)
        send_arguments = dict(arguments or {})
        key: str | None = None
        if self._takes_key(tool):
            if send_arguments.get(self.key_argument) is not None:
                # A key the application already gave (None is none) names the effect it means: sent
                # unchanged, never replaced (as in every host). One the policy cannot be
                # told still goes as it is, and the call counts as an unkeyed write.
                given = send_arguments[self.key_argument]
                key = cast(str, given) if _given_key_fits(given) else None
            else:
                key = core.ask("not sent", self.run.instance.derive_idempotency_key, self.run.run_id, action)
                send_arguments[self.key_argument] = key
        core.key = key
        # Attempt 1 from here: a stop during the admission wait abandons the call at its first attempt.
        try:
            start, guard = core.begin(self._hints(tool))
        except ReplannedBeforeSend as replan:  # a circuit breaker of the server is open: nothing sent
            return CallToolResult(content=[TextContent(type="text", text=replan.message)], is_error=True)
        if start.delay_ms:
            core.waits(1, "admission", start.delay_ms, None)
            await self._sleep(state, start.delay_ms / 1000)
        return await self._attempts(state, core, name, send_arguments, start, guard, 1)

    async def _attempts(
        self,
        state: _CallState,
        core: CallCore,
        name: str,
        send_arguments: dict[str, Any],
        start: CallStart,
        guard: CallGuard,
        attempt: int,
    ) -> CallToolResult:
        """The call's attempts from `attempt` (1 for a call begun; a resumed
        call's): each sent, reported and acted on as the verdict says, until
        it succeeds, replans or escalates."""
        while True:
            await self._ensure_session(state)
            span = core.attempt_started(attempt, mcp=True)
            # The attempt span's W3C trace context, for the server (MCP SEP-414).
            meta = span.trace_meta() if span is not None else {}
            with span.current() if span is not None else contextlib.nullcontext():
                observed = await self._attempt(
                    state,
                    name,
                    attempt,
                    lambda session, clock, meta=meta: _send_tool_call(session, clock, name, send_arguments, meta),
                    tool_call=True,
                    start=start,
                )
            guard.attempted(observed.outcome)
            if observed.task_id is not None:  # the call answered with a task: its status read, as each poll's is
                core.emit(TaskPollEvent(core.scope, attempt, observed.task_id, _poll_status(observed)))
            answer = self._record(core, guard, attempt, observed)
            # A task: polled as the policy says until it ends; the tool is not called again meanwhile.
            task_id = observed.task_id
            while task_id is not None:
                # A live task of a write may apply it: a stop now says so (`may_have_applied`).
                state.task_id, state.in_flight = task_id, True
                if answer.verdict.cancel_task:
                    await self._cancel_task(state, task_id)
                if answer.kind != "poll":
                    break
                # The task polled is the one the server named last (never last-decision's words).
                state.task_id = task_id
                delay = answer.delay_ms
                if answer.reconnect:
                    self._reconnect_before_retry(answer)
                core.waits(attempt, "poll", delay, answer.verdict.hint_ms)
                await self._sleep(state, delay / 1000)
                await self._ensure_session(state)
                observed = await self._poll(state, name, attempt, task_id, start)
                if observed.poll_failure is not None:
                    guard.poll_failed()  # the task still lives
                else:
                    guard.polled(observed.outcome)  # its status, or its end (the attempt's outcome)
                core.emit(TaskPollEvent(core.scope, attempt, task_id, _poll_status(observed)))
                answer = self._record(core, guard, attempt, observed, counted=False)
                if observed.task is not None:
                    task_id = observed.task["task-id"]  # the server's latest word on which task it is
                elif not observed.poll_failure:
                    task_id = None  # it completed or failed: reported as the attempt's outcome
            if state.task_id is not None:
                state.task_id, state.in_flight = None, False
            while answer.kind == "check-status":
                await self._ensure_session(state)
                found = await self._check_status(state, core, name, send_arguments)
                # Reported under the attempt whose effect was checked.
                answer = core.status_checked(guard, attempt, self._check_name(name), found)
            kind = answer.kind
            if kind == "retry":
                delay, attempt = answer.delay_ms, answer.next_attempt
                core.attempt = attempt  # the call's attempt now, for a stop during the wait (`abandon_call`)
                if answer.reconnect:  # the policy read a lost session (or a refused revision): a new session first
                    self._reconnect_before_retry(answer)
                core.waits(attempt, "retry", delay, answer.verdict.hint_ms)
                await self._sleep(state, delay / 1000)
                continue
            if kind == "replan":
                message, _rule = core.replanned(answer)
                return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
            if kind == "succeed":
                core.succeeded()
                if observed.result is not None and observed.success:
                    return cast(CallToolResult, observed.result)
                note = cut_lifted_text(cast(SucceedAction, answer.decision["action"])["succeed"] or "done")
                return CallToolResult(content=[TextContent(type="text", text=note)], is_error=False)
            if kind == "escalate":
                raise core.escalated_by(answer)
            raise core.no_task_to_poll(kind, observed.report.words)

    def _record(self, core: CallCore, guard: CallGuard, attempt: int, observed: _Observed, *, counted: bool = True) -> _Answer:
        """Reports what an attempt (or a poll: not `counted`) observed; a
        failure seen without the capture says so in its line's reason."""
        suffix = CAPTURE_MISSING_SUFFIX if observed.capture_missing else ""
        return core.record(guard, observed.report, attempt, counted=counted, reason_suffix=suffix)

    # -- connecting and listing: the pseudo-calls

    async def _ensure_session(self, state: _CallState, resumed: ResumedCall | None = None) -> None:
        """Before an attempt or a status check: a session that is there, or
        (an `McpConnection`) the `initialize` pseudo-call to establish it."""
        if self.connection is None:
            if self._bare_lost is not None:
                raise SessionLost(
                    f"the MCP session is lost ({self._bare_lost}) and this caller was built on a bare ClientSession, which it "
                    "cannot re-establish: build it on an McpConnection",
                    tool=state.tool,
                )
            return
        if self.connection.connected:
            return
        if self.connection._closed:
            raise SessionLost(f"the connection ({self.connection!r}) was closed", tool=state.tool)
        if self._reconnects_spent():
            return  # not connected again: the attempt that needs it is reported as the budget's end (`_attempt`)
        seen = self.connection._current
        again = self._sessions > 0 or (seen is not None and seen.initialized)
        lost = self.connection.lost if seen is not None and seen.initialized else None
        what = (
            f"could not reach the MCP server again after the session was lost ({lost})" if lost else "could not connect to the MCP server"
        )
        connection = self.connection

        async def connect(_none: ClientSession) -> Any:
            return await connection._connect(seen)

        await self._pseudo_call(state, INITIALIZE, connect, what, resumed)
        self._sessions += 1
        if again:
            self._reconnects += 1
        if again and self._lists_tools:
            self._tools = None  # a restarted server may describe its tools anew: listed again on the next call

    def _reconnects_spent(self) -> bool:
        """Whether the next request needs a new session after the first, and none is left in the budget."""
        connection = self.connection
        if connection is None or connection.connected:
            return False
        seen = connection._current
        again = self._sessions > 0 or (seen is not None and seen.initialized)
        return again and self._reconnects >= self.max_reconnects_per_run

    def _spent_observed(self) -> _Observed:
        reconnects = self._reconnects
        detail = f"reconnections spent: {reconnects} new sessions in this run (max_reconnects_per_run {self.max_reconnects_per_run})"
        return _Observed(observation=transport_failure("other", detail, delivery="not-sent"))

    async def _tool(self, state: _CallState, name: str, resumed: ResumedCall | None = None) -> Tool | None:
        if self._tools is None or resumed is not None:

            async def list_all(session: ClientSession) -> dict[str, Tool]:
                tools: dict[str, Tool] = {}
                cursor: str | None = None
                while True:
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools.update({t.name: t for t in page.tools})
                    cursor = page.next_cursor
                    if not cursor:
                        return tools

            self._tools = cast("dict[str, Tool]", await self._pseudo_call(state, TOOLS_LIST, list_all, "could not list the tools", resumed))
            self._warn_tools_without_hints(self._tools)
        return self._tools.get(name)

    def _warn_tools_without_hints(self, tools: Mapping[str, Tool]) -> None:
        """Once per connection: the tools the server listed without annotations,
        which the policy treats as unkeyed writes unless configured (a 503 on one
        escalates `status-unknown` rather than retrying)."""
        bare = sorted(name for name, tool in tools.items() if tool.annotations is None)
        owner: Any = self.connection if self.connection is not None else self._bare
        if not bare or owner is None or _warned_connection(owner):
            return
        shown = [cut_lifted_text(name)[:MAX_TOOL_NAME_CHARS] for name in bare[:MAX_TOOLS_NAMED]]
        warning = {
            "event": "agent_retry.tools_without_hints",
            "ts": round(time.time(), 3),
            "run": self.run.run_id,
            "policy": self.policy_identity,
            "tools": shown,
            "count": len(bare),
            "reason": f"{len(bare)} of {len(tools)} tools carry no annotations (readOnlyHint, idempotentHint): unless the "
            "configuration names them, each counts as an unkeyed write, and a failure whose outcome is unknown escalates "
            "status-unknown instead of retrying. Configure their effect under `tools`; see "
            f"{TOOLS_WITHOUT_HINTS_DOC}",
        }
        self.telemetry.events_log.warning(json.dumps(warning, ensure_ascii=False))

    async def _pseudo_call(
        self,
        state: _CallState,
        name: str,
        send: Callable[[ClientSession], Awaitable[Any]],
        what: str,
        resumed: ResumedCall | None = None,
    ) -> Any:
        """`initialize` or `tools/list` as a call of the policy: begun (a step),
        sent, observed and decided like a tool's; retried as the policy says. A
        stop (the limit, a cancellation) abandons it in the run and writes its
        stop line (`state.pseudo_stopped`); the call it served stops after it."""
        core = self._core(state, name, None)
        progress = _PseudoProgress()
        try:
            return await self._pseudo_attempts(state, core, progress, name, send, what, resumed)
        except _DeadlinePassed:
            state.pseudo_stopped = self._stop(state, state.cause, core=core, in_flight=progress.in_flight, sent=progress.sent)
            raise
        except asyncio.CancelledError:
            state.pseudo_stopped = self._stop(state, "cancelled", core=core, in_flight=progress.in_flight, sent=progress.sent)
            raise

    async def _pseudo_attempts(
        self,
        state: _CallState,
        core: CallCore,
        progress: _PseudoProgress,
        name: str,
        send: Callable[[ClientSession], Awaitable[Any]],
        what: str,
        resumed: ResumedCall | None = None,
    ) -> Any:
        try:
            # A resumed pseudo-call (its escalation answered `retry`) goes on from its ticket.
            start, guard = core.begin(PSEUDO_TOOL_HINTS) if resumed is None else core.resumed(resumed)
        except ReplannedBeforeSend as replan:  # a circuit breaker of the server is open: nothing sent
            raise SessionLost(f"{what} ({name}): {replan.message}", tool=state.tool) from None
        attempt = 1 if resumed is None else resumed["attempt"]
        if start.delay_ms:
            core.waits(attempt, "admission", start.delay_ms, None)
            await self._sleep(state, start.delay_ms / 1000)
        while True:
            if name != INITIALIZE:
                await self._ensure_session(state)
            core.attempt = attempt
            progress.sent, progress.in_flight = progress.sent + 1, True
            observed = await self._attempt(state, name, attempt, lambda session, _clock: send(session), tool_call=False, start=start)
            progress.in_flight = False
            failure = observed.observation
            if failure is not None and "transport" in failure["kind"]:
                failure["body"] = f"{what}: {failure.get('body', '')}"
            guard.attempted(observed.outcome)
            answer = self._record(core, guard, attempt, observed)
            while answer.kind == "check-status":  # nobody can check a connection: the policy decides on "unknown"
                answer = core.status_checked(guard, attempt, None, "unknown")
            kind = answer.kind
            if kind == "retry":
                delay, attempt = answer.delay_ms, answer.next_attempt
                core.attempt = attempt
                if answer.reconnect and name != INITIALIZE:
                    self._reconnect_before_retry(answer)
                core.waits(attempt, "retry", delay, answer.verdict.hint_ms)
                await self._sleep(state, delay / 1000)
                continue
            if kind == "succeed":
                return observed.result
            if kind == "replan":
                message = cut_lifted_text(cast(ReplanAction, answer.decision["action"])["replan"])
                raise SessionLost(f"{what} ({name}): {message}", tool=state.tool)
            if kind == "escalate":
                raise core.escalated_by(answer)
            raise core.no_task_to_poll(kind, observed.report.words)

    # -- one attempt

    async def _attempt(self, state: _CallState, name: str, attempt: int, send: _Send, *, tool_call: bool, start: CallStart) -> _Observed:
        """Sends one attempt (in a task of its own, which carries the attempt's
        capture) and waits for the first of: its answer, its answer stream cut,
        its session ended, its timeouts (`start`'s: idle, restarted by each
        progress notification, and in all), the call's or the run's limit."""
        remaining = state.remaining()
        if remaining is not None and remaining <= 0:
            raise _DeadlinePassed
        if name != INITIALIZE and self._reconnects_spent():
            return self._spent_observed()

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            clock.progressed()
            self._tell_progress(name, progress, total, message)

        clock = _AttemptClock(self._idle_timeout_s(start), start.attempt_timeout_ms / 1000, progressed)

        # The session the request goes to (none yet for `initialize`, which makes one).
        generation = self.connection._current if self.connection is not None and name != INITIALIZE else None
        # Connecting may send a probe whose failure is expected (a legacy server's
        # answer to `server/discover`): the attempt is what its last request saw.
        capture = AttemptCapture(latest_request_only=name == INITIALIZE, read_probe=self.run.instance.read_probe_answer)
        lost_at_send: list[bool] = []

        async def run() -> Any:
            lost_at_send.append(generation is not None and generation.lost is not None)
            session = self.session if name != INITIALIZE else None
            if session is None and name != INITIALIZE:
                raise _ConnectFailure(
                    "connection-refused", self.connection.lost if self.connection and self.connection.lost else "not connected"
                )
            return await send(cast(ClientSession, session), clock)

        token = _current_attempt.set(capture)
        try:
            task = asyncio.ensure_future(run())
        finally:
            _current_attempt.reset(token)
        if tool_call:
            state.in_flight = state.attempt_out = True
            state.attempts_sent += 1
        watchers = [asyncio.ensure_future(capture.cut.wait())]
        if generation is not None and not generation.ended.is_set():
            watchers.append(asyncio.ensure_future(generation.ended.wait()))
        try:
            while True:
                remaining = state.remaining()
                until_timeout = clock.ends_at() - time.monotonic()
                by_deadline = remaining is not None and remaining < until_timeout
                wait_s = max(0.0, remaining if by_deadline and remaining is not None else until_timeout)
                done, _ = await asyncio.wait({task, *watchers}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                # Progress during the wait moves the idle timeout on (never past the whole one).
                if done or by_deadline or clock.ends_at() <= time.monotonic():
                    break
        finally:
            for watcher in watchers:
                watcher.cancel()
            if not task.done():
                task.cancel()
                task.add_done_callback(forget_task)
        if not done:
            if by_deadline:
                raise _DeadlinePassed  # the attempt stays in flight: it may have applied
            state.in_flight = state.task_id is not None  # a poll leaves a live task in flight
            state.attempt_out = False
            observed = self._observe(
                capture, None, None, timed_out=clock.which(), generation=generation, lost_at_send=False, tool_call=tool_call
            )
            return observed
        state.in_flight = state.task_id is not None
        state.attempt_out = False
        if name == INITIALIZE and self.connection is not None:
            generation = self.connection._current  # the session it tried to make (what ended it, if it did)
        result: Any = None
        error: BaseException | None = None
        if task.done():
            if task.cancelled():
                error = asyncio.CancelledError()
            else:
                error = task.exception()
                if error is None:
                    result = task.result()
        else:
            error = None  # ended early: the stream was cut or the connection lost
        observed = self._observe(
            capture,
            result,
            error,
            timed_out=None,
            generation=generation,
            lost_at_send=bool(lost_at_send and lost_at_send[0]),
            tool_call=tool_call,
            finished=task.done(),
        )
        failure = observed.observation
        if name != INITIALIZE and failure is not None and self.connection is not None and self.connection.kind == "http":
            fault = failure["kind"].get("transport") if isinstance(failure["kind"], dict) else None
            if fault in _SUSPECT_AFTER:
                # Not a decision: whether to send again is the policy's; where it goes is the transport's.
                self._session_lost(generation, f"suspect after {fault} on {name} attempt {attempt}")
        return observed

    def _observe(
        self,
        capture: AttemptCapture,
        result: Any,
        error: BaseException | None,
        *,
        timed_out: str | None,
        generation: _Generation | None,
        lost_at_send: bool,
        tool_call: bool,
        finished: bool = True,
    ) -> _Observed:
        """What an attempt saw, as the contract's observation: the first case
        that fits, in the contract's order (HTTP status, transport, JSON-RPC
        error, isError), with the facts as received. What they mean (a lost
        session, a blip, a bug) is the policy's to say."""
        sent_id = capture.session_header
        if capture.status is not None:
            return _Observed(observation=http_failure(capture.status, capture.headers, capture.body, session_id_sent=sent_id))
        if capture.transport_error is not None:
            observation = transport_failure(
                capture.transport_error, capture.transport_detail, delivery=capture.delivery, session_id_sent=sent_id
            )
            return _Observed(observation=observation)
        # How far a request that got no answer went, as far as the transport saw.
        out: Delivery = "answer-started" if capture.answered else ("sent" if capture.seen else "unknown")
        if timed_out is not None:
            observation = transport_failure("timeout", timed_out, delivery=out, session_id_sent=sent_id)
            return _Observed(observation=observation)
        if not finished:  # the connection was lost while the request was out
            lost = generation.lost if generation is not None else None
            detail = f"the connection was lost while the request was out: {lost}"
            delivery: Delivery = "not-sent" if lost_at_send else (out if capture.seen else "sent")
            return _Observed(observation=transport_failure("stream-closed", detail, delivery=delivery, session_id_sent=sent_id))
        if isinstance(error, _ConnectFailure):
            return _Observed(observation=transport_failure(error.kind, error.detail, delivery="not-sent"))
        if isinstance(error, MCPError):
            missing = not capture.seen and _sdk_http_error(error)
            if missing:
                self._warn_capture_missing(error)
                stand_in = _sdk_stand_in(error)
                if stand_in is not None:
                    return _Observed(observation=stand_in, capture_missing=True)
            if error.code in (REQUEST_TIMEOUT, CONNECTION_CLOSED) and _server_answered(capture, error):
                # The server's own error with a code the SDK also gives its failures: an answer like any other.
                return _Observed(observation=protocol_error_outcome(error, session_id_sent=sent_id), capture_missing=missing)
            if error.code == REQUEST_TIMEOUT:  # the session's own read timeout
                observation = transport_failure("timeout", error.message, delivery=out if capture.seen else "sent", session_id_sent=sent_id)
                return _Observed(observation=observation, capture_missing=missing)
            if error.code == CONNECTION_CLOSED:
                if error.message == _SESSION_CLOSED_MESSAGE:  # the session's transport is over (its pipe or stream closed)
                    lost = generation.lost if generation is not None and generation.lost else "the session's connection closed"
                    # Not a decision: this session cannot carry another request, whatever the policy says.
                    self._session_lost(generation, lost)
                    delivery = "not-sent" if lost_at_send else "sent"
                    return _Observed(
                        observation=transport_failure(
                            "stream-closed", f"{error.message}: {lost}", delivery=delivery, session_id_sent=sent_id
                        ),
                    )
                observation = transport_failure(
                    "stream-closed", error.message, delivery=out if capture.seen else "unknown", session_id_sent=sent_id
                )
                return _Observed(observation=observation, capture_missing=missing)
            return _Observed(observation=protocol_error_outcome(error, session_id_sent=sent_id), capture_missing=missing)
        if isinstance(error, asyncio.CancelledError):
            return _Observed(
                observation=transport_failure("other", "the request was cancelled inside the MCP SDK", session_id_sent=sent_id)
            )
        if error is not None:  # anything else the SDK raised (a malformed result, ...): reported as it is
            return _Observed(observation=transport_failure("other", _describe(error), session_id_sent=sent_id))
        if not tool_call:
            return _Observed(result)
        if isinstance(result, InputNeeded):  # asked what no handler of the application answers
            return _Observed(observation=input_required(result.questions, session_id_sent=sent_id))
        if isinstance(result, TaskCreated):
            status: TaskStatus = "cancelled" if result.status == "cancelled" else "working"  # the polls read the rest
            return _Observed(task=tasks.report(result, status, self.clock()), task_id=result.task_id)
        return self._observe_result(cast(CallToolResult, result), sent_id)

    def _observe_result(self, call_result: CallToolResult, sent_id: bool) -> _Observed:
        """A tool's result (the call's, or its task's): an error, empty, or usable."""
        if call_result.is_error:
            return _Observed(call_result, observation=tool_error_outcome(call_result, session_id_sent=sent_id))
        what = self.empty_check(call_result)
        if what is not None:
            return _Observed(call_result, empty=what)
        return _Observed(call_result)

    async def _poll(self, state: _CallState, name: str, attempt: int, task_id: str, start: CallStart) -> _Observed:
        """Polls the call's task once (not an attempt): what it says, its
        outcome if it ended (completed: the tool's result; failed: its JSON-RPC
        error), or the poll's own failure, as observed."""
        polled = await self._attempt(
            state, name, attempt, lambda session, clock: _send_poll(session, clock, task_id), tool_call=False, start=start
        )
        if polled.observation is not None:
            return _Observed(poll_failure=polled.observation, capture_missing=polled.capture_missing)
        now = self.clock()
        if isinstance(polled.result, _InputAnswered):
            return _Observed(task=tasks.report(polled.result.task, "input-answered", now))
        task = tasks.read_state(polled.result)
        if task is None:
            return self._unusable_answer(polled.result, "not a task")
        sent_id = False  # a 2026-07-28 session carries no Mcp-Session-Id
        if task.status == "working":
            return _Observed(task=tasks.report(task, "working", now))
        if task.status == "input_required":
            asked = continuation.questions(task.input_requests or {}) or task.status_message or "input the server did not describe"
            return _Observed(task=tasks.report(task, "input-required", now, asked))
        if task.status == "cancelled":
            return _Observed(task=tasks.report(task, "cancelled", now))
        if task.status == "completed":
            if task.result is None:
                return self._unusable_answer(polled.result, "completed without a result")
            try:
                result = CallToolResult.model_validate(task.result)
            except ValidationError as e:
                detail = f"the completed task's result is not a tool result: {e}"
                return _Observed(observation=transport_failure("other", detail, delivery="answer-started"))
            return self._observe_result(result, sent_id)
        if task.status == "failed":
            if task.error is None:
                return self._unusable_answer(polled.result, "failed without an error")
            # A code that is no integer, or past i32, is no code the contract carries: -32603, as the Rust host reads it.
            code = tasks.error_code(task.error)
            code = INTERNAL_ERROR if code is None else code
            message = str(task.error.get("message", ""))
            observation = protocol_failure(code, message, data=json_text(task.error.get("data")))
            return _Observed(observation=observation)
        return self._unusable_answer(polled.result, f"status {task.status!r}, which MCP does not define")

    @staticmethod
    def _unusable_answer(answer: Any, why: str) -> _Observed:
        """A `tasks/get` answer the wrapper cannot use: reported once as the
        poll's failure (-32603, the answer's text as the body); the verdict
        says whether to poll again."""
        return _Observed(poll_failure=protocol_failure(INTERNAL_ERROR, tasks.answer_text(answer)))

    async def _cancel_task(self, state: _CallState, task_id: str) -> None:
        """`tasks/cancel`, as the verdict says (before acting on it), waited
        for at most until the call's or run's deadline: one still out then goes
        on in the background, and the verdict is acted on all the same."""
        sending = self._cancel_in_background(state.tool, task_id)
        remaining = state.remaining()
        wait_s = CANCEL_TIMEOUT_S if remaining is None else min(CANCEL_TIMEOUT_S, remaining)
        if wait_s > 0:
            await asyncio.wait({sending}, timeout=wait_s)

    async def _send_cancel(self, name: str, task_id: str) -> None:
        """Sends `tasks/cancel` and waits up to `CANCEL_TIMEOUT_S` for its
        answer; best effort: a cancel that fails is logged, not raised."""
        session = self.session
        error: BaseException | None = None
        if session is None:
            error = SessionLost("no session to send tasks/cancel on")
        else:
            task = _spawn(tasks.cancel_task(session, task_id))
            try:
                await asyncio.wait_for(task, CANCEL_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                error = e
        if error is not None:
            failed = {
                "event": "agent_retry.task_cancel_failed",
                "ts": round(time.time(), 3),
                "run": self.run.run_id,
                "policy": self.policy_identity,
                "tool": name,
                "task": task_id,
                "error": repr(error),
            }
            self.log.warning(json.dumps(failed, ensure_ascii=False))

    def _reconnect_before_retry(self, answer: _Answer) -> None:
        """A retry the policy says needs a new session: the current one is
        retired, so the next attempt connects (negotiating again) first. A bare
        `ClientSession` cannot reconnect: the next attempt raises `SessionLost`."""
        generation = self.connection._current if self.connection is not None else None
        rule = rule_name(self.run.instance.rule_names(), answer.verdict)
        self._session_lost(generation, f"the retry policy asks for a new session (rule {rule})")

    def _idle_timeout_s(self, start: CallStart) -> float:
        """The attempt's idle timeout: the policy's, capped by `attempt_timeout_s` if the user set it."""
        idle = start.idle_timeout_ms / 1000
        return idle if self.attempt_timeout_s is None else min(idle, self.attempt_timeout_s)

    def _tell_progress(self, tool: str, progress: float, total: float | None, message: str | None) -> None:
        """Passes a progress notification to the application's `on_progress`;
        a hook that raises is logged, and the attempt goes on."""
        if self.on_progress is None:
            return
        try:
            self.on_progress(tool, progress, total, message)
        except Exception as e:  # noqa: BLE001 - the application's hook must not end the attempt
            failed = {
                "event": "agent_retry.on_progress_failed",
                "ts": round(time.time(), 3),
                "run": self.run.run_id,
                "policy": self.policy_identity,
                "tool": tool,
                "error": repr(e),
            }
            self.log.warning(json.dumps(failed, ensure_ascii=False))

    def _time_left_ms(self, state: _CallState) -> int | None:
        """The time to the call's or the run's deadline, whichever is sooner, in
        ms (0 once passed); None without either."""
        remaining = state.remaining()
        if remaining is None:
            return None
        return max(0, int(remaining * 1000))

    def _session_lost(self, generation: _Generation | None, why: str) -> None:
        if self.connection is not None:
            self.connection._mark_lost(generation, why)
        elif self._bare_lost is None:
            self._bare_lost = why

    def _warn_capture_missing(self, error: MCPError) -> None:
        if self._capture_warned:
            return
        self._capture_warned = True
        warning = {
            "event": "agent_retry.capture_missing",
            "ts": round(time.time(), 3),
            "run": self.run.run_id,
            "policy": self.policy_identity,
            "error": f"JSON-RPC {error.code}: {error.message}",
            "reason": "a failure came from an HTTP transport that is not the wrapper's capturing one: its status, headers "
            "and body (a Retry-After, a 403's reason) do not reach the policy. Build the caller on McpConnection.http(url), "
            "or give streamable_http_client the client of create_capturing_http_client()",
        }
        self.log.warning(json.dumps(warning, ensure_ascii=False))

    # -- waits, checks, the policy, the log

    async def _sleep(self, state: _CallState, seconds: float) -> None:
        """A wait the policy asked for; one that would end past the call's or the
        run's limit is not slept."""
        remaining = state.remaining()
        if remaining is not None and seconds >= remaining:
            raise _DeadlinePassed
        if seconds > 0:
            await self.sleep(seconds)

    async def _check_status(self, state: _CallState, core: CallCore, name: str, arguments: Mapping[str, Any]) -> StatusCheckResult:
        check = self.status_check.get(name) if isinstance(self.status_check, Mapping) else self.status_check
        if check is None:
            return "unknown"  # nobody can tell: the policy escalates rather than risk a second write
        session = self.session
        if session is None or core.call_id is None:
            return "unknown"
        remaining = state.remaining()
        if remaining is not None and remaining <= 0:
            raise _DeadlinePassed
        found = await core.check_status(check, StatusCheckRequest(session, name, dict(arguments), core.key, core.call_id), remaining)
        if found is None:
            raise _DeadlinePassed
        return found

    def _stop(
        self,
        state: _CallState,
        cause: StopCause,
        *,
        core: CallCore | None = None,
        in_flight: bool | None = None,
        sent: int | None = None,
        during: str | None = None,
    ) -> Stopped:
        """The stop's record, and its log line (docs/events.md, "Stop
        reasons"): of the call (`state`'s; `during`: the pseudo-call in
        progress for it), or of the pseudo-call `core` in progress
        (`in_flight`: its attempt out; `sent`: its attempts sent). The run is
        told first (`abandon_call`), so the call no longer counts as open and a
        write on the wire is listed as possibly applied."""
        if core is None:
            core, in_flight, attempt_out, sent = state.core, state.in_flight, state.attempt_out, state.attempts_sent
        else:  # a pseudo-call has no task: what is out is its attempt
            in_flight = attempt_out = bool(in_flight)
            sent = sent or 0
        assert core is not None
        limit_ms = round(state.limit_s * 1000) if state.limit_s is not None else None
        return core.stop(cause, limit_ms, in_flight=in_flight, attempt_out=attempt_out, sent=sent, during=during)

    @staticmethod
    def _pseudo_during(state: _CallState) -> str | None:
        """The pseudo-call (`initialize`, `tools/list`) in progress for the call when it stopped, if one was."""
        return state.pseudo_stopped.tool if state.pseudo_stopped is not None else None

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

    def _check_name(self, tool: str) -> str | None:
        """What checks `tool`'s status (the status check's function name), or None when nothing can."""
        check = self.status_check.get(tool) if isinstance(self.status_check, Mapping) else self.status_check
        return None if check is None else check_name(check)


def _poll_status(observed: _Observed) -> str:
    """What a poll read of the task: its status, its end, or the poll's failure."""
    if observed.task is not None:
        return observed.task["status"]
    if observed.poll_failure is not None:
        return "poll failed"
    return "completed" if observed.observation is None else "failed"


async def _send_tool_call(
    session: ClientSession, clock: _AttemptClock, name: str, arguments: Mapping[str, Any], meta: Mapping[str, str] | None = None
) -> Any:
    """One attempt's `tools/call`, with a progress token, its continuations
    answered by the application's handlers: a `CallToolResult`, a task
    (`TaskCreated`), or `InputNeeded` when nobody can answer the server.
    `meta`: the attempt span's W3C trace context, put in `params._meta` (passed
    only when there is one, so a session without the `meta` argument still works)."""
    extra: dict[str, Any] = {"meta": dict(meta)} if meta else {}

    async def send(responses: InputResponses | None, request_state: str | None) -> Any:
        return await session.call_tool(
            name,
            dict(arguments),
            progress_callback=clock.progress_callback,
            input_responses=responses,
            request_state=request_state,
            allow_input_required=True,
            allow_claimed=True,
            **extra,
        )

    return await continuation.settle(session, await send(None, None), send, clock.waiting_on_a_person)


@dataclass(frozen=True)
class _InputAnswered:
    """A poll found the task asking for input, and the application's handlers answered it (`tasks/update`)."""

    task: TaskState


async def _send_poll(session: ClientSession, clock: _AttemptClock, task_id: str) -> Any:
    """One poll (`tasks/get`) of a task: its answer as it came (`_poll` reads
    it), or `_InputAnswered` when the input it asks for was answered by the
    application's handlers (`tasks/update`)."""
    answer = await tasks.get_task(session, task_id)
    task = tasks.read_state(answer)
    if task is None:
        return answer
    requests = task.input_requests or {}
    if task.status == "input_required" and requests and continuation.answerable(session, requests):
        async with clock.waiting_on_a_person():
            responses = await continuation.answer(session, requests)
        await tasks.update_task(session, task_id, responses)
        return _InputAnswered(task)
    return answer
