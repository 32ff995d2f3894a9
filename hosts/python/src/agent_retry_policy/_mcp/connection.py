"""The MCP connection the wrapper establishes and re-establishes (`McpConnection`):
streamable HTTP with the capturing client (`capture.py`), or stdio with the server
started (again) by the wrapper; each session a `_Generation` with its supervisor task.
Connecting goes through the SDK's `mcp.Client` in its negotiating mode (`mode="auto"`:
a `server/discover` probe, `initialize` if the server is a legacy one)."""

from __future__ import annotations

import asyncio
import contextvars
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

import anyio
import httpx2
from mcp import Client, ClientSession
from mcp.client.session import ElicitationFnT, ListRootsFnT, SamplingFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ..errors import ConnectionConfigError
from ..types import TransportError
from .capture import _current_attempt, create_capturing_http_client
from .tasks import TasksExtension

_T = TypeVar("_T")

# How long `McpConnection.close` waits for a connection to wind down (a stdio
# server gets the SDK's close-stdin, SIGTERM, SIGKILL sequence) before it
# cancels what is left.
CLOSE_TIMEOUT_S = 10.0

# How a connection negotiates the protocol revision: the SDK's `Client(mode=...)`.
# "auto" probes `server/discover` (2026-07-28 and later) and falls back to the
# `initialize` handshake (2025-11-25 and older); "legacy" only does the handshake.
ConnectMode = Literal["auto", "legacy"]
CONNECT_MODES: tuple[ConnectMode, ...] = ("auto", "legacy")


class _ConnectFailure(Exception):
    """A connection that could not be started (the process did not spawn)."""

    def __init__(self, kind: TransportError, detail: str) -> None:
        self.kind: TransportError = kind
        self.detail = detail
        super().__init__(detail)


class _Generation:
    """One session of a connection: its supervisor task owns the SDK's context
    managers (they must be left in the task that entered them)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.session: ClientSession | None = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.lost: str | None = None
        # Set when the session itself ended (its transport or process is gone):
        # an attempt in flight on it ends then. A session only marked lost (a 404)
        # may still answer the requests already out.
        self.ended = asyncio.Event()
        self.initialized = False
        self.failure: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        # Cancels the connecting (`Client.__aenter__`), when it is given up before
        # it is ready; a ready session ends by `stop` instead.
        self.connecting: anyio.CancelScope | None = None

    def mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason

    def mark_ended(self, reason: str) -> None:
        self.mark_lost(reason)
        self.ended.set()

    def supervisor_done(self, what: str) -> None:
        """The supervisor's end: the session is over (with the failure that
        ended it, if any), and whoever waits for it to be ready stops waiting."""
        detail = f": {_describe(self.failure)}" if self.failure is not None else ""
        self.mark_ended(f"{what} ended{detail}")
        self.ready.set()


def _errlog() -> Any:
    """Where a stdio server's stderr goes: ours, if it is a real file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL
    return sys.stderr


def _spawn(coro: Awaitable[_T]) -> asyncio.Task[_T]:
    """A task outside any attempt: it does not inherit the attempt's capture."""
    context = contextvars.copy_context()
    context.run(_current_attempt.set, None)
    return cast("asyncio.Task[_T]", context.run(asyncio.ensure_future, coro))


def _describe(error: BaseException) -> str:
    inner = getattr(error, "exceptions", None)  # an exception group (anyio's task groups)
    if isinstance(inner, (list, tuple)) and inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(error).__name__}: {error}"


def _find(error: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """`error` if it is a `kind`, or the first `kind` in it (an exception group)."""
    if error is None or isinstance(error, kind):
        return error
    for inner in getattr(error, "exceptions", None) or ():
        found = _find(inner, kind)
        if found is not None:
            return found
    return None


def _check_mode(mode: str) -> ConnectMode:
    if mode not in CONNECT_MODES:
        raise ConnectionConfigError("mode", f"unknown mode {mode!r}: expected 'auto' (negotiate the revision) or 'legacy'")
    return cast(ConnectMode, mode)


def _check_url(url: str) -> str:
    if not isinstance(url, str):
        raise ConnectionConfigError("url", f"the url must be a string, got {type(url).__name__}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        what = f"the URL scheme {parts.scheme!r}" if parts.scheme else "a URL without a scheme"
        raise ConnectionConfigError(
            "url", f"McpConnection.http cannot serve {what} ({url!r}): it speaks streamable HTTP, http:// or https:// only"
        )
    if not parts.hostname:
        raise ConnectionConfigError("url", f"the URL {url!r} names no host")
    return url


def _tls_context(root_certificates_pem: bytes | None) -> ssl.SSLContext | bool:
    """httpx2's default verification (the platform's roots), plus the given PEM
    roots if any; checked here so that a bad PEM fails at construction."""
    if root_certificates_pem is None:
        return True
    if not isinstance(root_certificates_pem, (bytes, bytearray)):
        raise ConnectionConfigError(
            "root_certificates_pem",
            f"root_certificates_pem must be bytes (PEM text, e.g. Path('ca.pem').read_bytes()), got {type(root_certificates_pem).__name__}",
        )
    try:
        text = bytes(root_certificates_pem).decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConnectionConfigError("root_certificates_pem", "root_certificates_pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    context = httpx2.create_ssl_context(verify=True)
    try:
        context.load_verify_locations(cadata=text)  # a str: PEM (bytes would be read as DER)
    except (ssl.SSLError, ValueError) as e:
        raise ConnectionConfigError("root_certificates_pem", f"root_certificates_pem could not be loaded: {e}") from e
    return context


class McpConnection:
    """An MCP connection the wrapper can establish and re-establish: over
    streamable HTTP (`McpConnection.http(url)`, always with the wrapper's
    status- and header-capturing client; a lost session is re-initialised), or
    over stdio (`McpConnection.stdio(command, args)`, the server started by the
    wrapper; a server that exits is started again). `RetryingToolCaller`
    connects it (the `initialize` pseudo-call) on its first call and whenever
    it is lost. Connecting negotiates the revision (`mode="auto"`, the SDK's:
    2026-07-28 through `server/discover`, else the `initialize` handshake of
    2025-11-25 and older). Close it (`await connection.close()`, or `async
    with`): that ends its session and its server process, if any. One event loop.
    A configuration that cannot work raises `ConnectionConfigError` here.

    The client declares the tasks extension (`io.modelcontextprotocol/tasks`):
    a server may answer a tool call with a task, which the wrapper polls as the
    policy says. `elicitation_callback`, `sampling_callback` and
    `list_roots_callback` are the SDK's own handlers (`mcp.Client`'s): they
    answer what a server asks for in an `input_required` answer; a request
    nobody handles is the policy's `input-required`."""

    def __init__(
        self,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        root_certificates_pem: bytes | None = None,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        mode: ConnectMode = "auto",
        elicitation_callback: ElicitationFnT | None = None,
        sampling_callback: SamplingFnT | None = None,
        list_roots_callback: ListRootsFnT | None = None,
    ) -> None:
        if (url is None) == (command is None):
            raise ValueError("an McpConnection needs a url (McpConnection.http) or a command (McpConnection.stdio)")
        self.mode: ConnectMode = _check_mode(mode)
        self.url = _check_url(url) if url is not None else None
        if root_certificates_pem is not None and url is None:
            raise ConnectionConfigError("root_certificates_pem", "root_certificates_pem is for https:// connections, not stdio")
        self._verify = _tls_context(root_certificates_pem)
        self.headers = dict(headers or {})
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.kind = "http" if url is not None else "stdio"
        # The application's handlers of what a server asks the client (the SDK's `Client` takes them).
        self.handlers: dict[str, Any] = {
            "elicitation_callback": elicitation_callback,
            "sampling_callback": sampling_callback,
            "list_roots_callback": list_roots_callback,
        }
        self._current: _Generation | None = None
        self._generations = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        root_certificates_pem: bytes | None = None,
        mode: ConnectMode = "auto",
        elicitation_callback: ElicitationFnT | None = None,
        sampling_callback: SamplingFnT | None = None,
        list_roots_callback: ListRootsFnT | None = None,
    ) -> McpConnection:
        """Streamable HTTP at `url` (`http://` or `https://`, e.g.
        `http://127.0.0.1:8080/mcp`); `headers` go on every request (e.g. an
        Authorization header). `root_certificates_pem`: PEM certificates of CAs
        trusted besides the platform's (a private CA), e.g.
        `Path("ca.pem").read_bytes()`. `mode`: "auto" (default) or "legacy" (the
        `initialize` handshake only). The callbacks answer a server's
        `input_required` requests (the class's docstring). Another URL scheme,
        or roots that are not PEM certificates, raise `ConnectionConfigError`
        (a `ValueError`)."""
        return cls(
            url=url,
            headers=headers,
            root_certificates_pem=root_certificates_pem,
            mode=mode,
            elicitation_callback=elicitation_callback,
            sampling_callback=sampling_callback,
            list_roots_callback=list_roots_callback,
        )

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        mode: ConnectMode = "auto",
        elicitation_callback: ElicitationFnT | None = None,
        sampling_callback: SamplingFnT | None = None,
        list_roots_callback: ListRootsFnT | None = None,
    ) -> McpConnection:
        """A server the wrapper starts: `command args...`, speaking MCP on its
        stdin and stdout (its stderr goes to ours). `env` is added to the SDK's
        safe default environment. `mode` and the callbacks as for `http`."""
        return cls(
            command=command,
            args=args,
            env=env,
            cwd=cwd,
            mode=mode,
            elicitation_callback=elicitation_callback,
            sampling_callback=sampling_callback,
            list_roots_callback=list_roots_callback,
        )

    def __repr__(self) -> str:
        target = self.url if self.kind == "http" else " ".join([str(self.command), *self.args])
        return f"McpConnection.{self.kind}({target!r})"

    @property
    def session(self) -> ClientSession | None:
        """The current session, if connected (a status check may use it)."""
        current = self._current
        return current.session if current is not None and current.initialized else None

    @property
    def connected(self) -> bool:
        """Connected, and not known to be lost."""
        current = self._current
        return not self._closed and current is not None and current.initialized and current.lost is None

    @property
    def lost(self) -> str | None:
        """Why the current session is lost, if it is."""
        current = self._current
        return current.lost if current is not None else None

    @property
    def generation(self) -> int:
        """How many sessions were started (the first is 1)."""
        return self._generations

    async def __aenter__(self) -> McpConnection:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Ends the session (and the server process, over stdio) and every task
        the connection started; waits at most `CLOSE_TIMEOUT_S`, then cancels."""
        self._closed = True
        if self._current is not None:
            self._end(self._current)
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)

    def _mark_lost(self, generation: _Generation | None, reason: str) -> None:
        if generation is not None:
            generation.mark_lost(reason)

    def _retire(self, generation: _Generation) -> None:
        generation.mark_lost(generation.lost or "replaced by a new session")
        self._end(generation)

    @staticmethod
    def _end(generation: _Generation) -> None:
        generation.stop.set()  # its supervisor winds it down in the background
        if generation.session is None and generation.connecting is not None:
            generation.connecting.cancel()  # still connecting: nobody waits for it now

    async def _connect(self, seen: _Generation | None) -> _Generation:
        """Starts a new session and initialises it (the `initialize` pseudo-call's
        attempt). `seen` is the session the caller saw lost: if another caller
        has connected since, that session is used."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            current = self._current
            if current is not None and current is not seen and current.initialized and current.lost is None:
                return current
            if self._closed:
                raise _ConnectFailure("connection-refused", "the connection was closed (McpConnection.close)")
            if current is not None:
                self._retire(current)
            self._generations += 1
            generation = _Generation(self._generations)
            self._current = generation
            supervise = self._supervise_http if self.kind == "http" else self._supervise_stdio
            # The supervisor connects (the SDK's `Client` negotiates as it is
            # entered), so it runs in the `initialize` attempt's context: the
            # negotiation's POSTs are that attempt's capture. Later requests are
            # sent from the attempts' own tasks, with their own captures.
            generation.task = asyncio.ensure_future(supervise(generation))
            self._tasks.add(generation.task)
            generation.task.add_done_callback(self._tasks.discard)
            try:
                await generation.ready.wait()
                if generation.session is None:
                    failure = generation.failure
                    answered = _find(failure, MCPError)
                    if answered is not None:  # the negotiation's answer (or the SDK's error for it): observed as before
                        raise answered
                    spawn_error = _find(failure, OSError)
                    if spawn_error is not None and self.kind == "stdio":
                        raise _ConnectFailure("connection-refused", f"could not start the server ({self.command}): {spawn_error}")
                    raise _ConnectFailure("other", f"could not open the connection: {_describe(failure) if failure else 'no session'}")
                lost_at_start = generation.lost
                if lost_at_start is not None:
                    raise _ConnectFailure("connection-refused", lost_at_start)
            except BaseException:
                self._retire(generation)
                raise
            generation.initialized = True
            return generation

    async def _run_client(self, generation: _Generation, transport: Any) -> None:
        """Connects through the SDK's `Client` (its negotiation, `self.mode`) and
        holds the session until `stop`. `cache=None`: `tools/list` must reach
        the server (it is a call of the policy), not the SDK's response cache."""
        with anyio.CancelScope() as connecting:
            generation.connecting = connecting
            handlers = {name: handler for name, handler in self.handlers.items() if handler is not None}
            async with Client(transport, mode=self.mode, cache=None, extensions=[TasksExtension()], **handlers) as client:
                generation.session = client.session
                generation.ready.set()
                await generation.stop.wait()

    async def _supervise_http(self, generation: _Generation) -> None:
        try:
            client = create_capturing_http_client(headers=self.headers, verify=self._verify)
            async with client:
                await self._run_client(generation, streamable_http_client(cast(str, self.url), http_client=client))
        except BaseException as e:  # noqa: BLE001 - the supervisor's end is reported, never raised
            generation.failure = e
        finally:
            generation.supervisor_done("the HTTP session")

    async def _supervise_stdio(self, generation: _Generation) -> None:
        params = StdioServerParameters(command=cast(str, self.command), args=self.args, env=self.env, cwd=self.cwd)

        @asynccontextmanager
        async def relayed() -> AsyncIterator[tuple[Any, Any]]:
            async with stdio_client(params, errlog=_errlog()) as (read, write):
                # The session reads through a relay, so that the connection is
                # marked lost (the pipe closed) before the SDK fails the requests out.
                relay_send, relay_receive = anyio.create_memory_object_stream[Any](0)

                async def relay() -> None:
                    async with relay_send:
                        try:
                            async for item in read:
                                await relay_send.send(item)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                            pass
                        if not generation.stop.is_set():
                            generation.mark_ended(f"the server's stdout closed: its process ({self.command}) exited")

                async with anyio.create_task_group() as relays:
                    relays.start_soon(relay)
                    try:
                        yield relay_receive, write
                    finally:
                        relays.cancel_scope.cancel()

        try:
            await self._run_client(generation, relayed())
        except BaseException as e:  # noqa: BLE001 - the supervisor's end is reported, never raised
            generation.failure = e
        finally:
            generation.supervisor_done("the stdio session")
