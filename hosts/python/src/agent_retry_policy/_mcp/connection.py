"""The MCP connection the wrapper establishes and re-establishes (`McpConnection`):
streamable HTTP with the capturing client (`capture.py`), or stdio with the server
started (again) by the wrapper; each session a `_Generation` with its supervisor task."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from ..types import TransportError
from .capture import _current_attempt, create_capturing_http_client

_T = TypeVar("_T")

# How long `McpConnection.close` waits for a connection to wind down (a stdio
# server gets the SDK's close-stdin, SIGTERM, SIGKILL sequence) before it
# cancels what is left.
CLOSE_TIMEOUT_S = 10.0


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


class McpConnection:
    """An MCP connection the wrapper can establish and re-establish: over
    streamable HTTP (`McpConnection.http(url)`, always with the wrapper's
    status- and header-capturing client; a lost session is re-initialised), or
    over stdio (`McpConnection.stdio(command, args)`, the server started by the
    wrapper; a server that exits is started again). `RetryingToolCaller`
    connects it (the `initialize` pseudo-call) on its first call and whenever
    it is lost. Close it (`await connection.close()`, or `async with`): that
    ends its session and its server process, if any. One event loop."""

    def __init__(
        self,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        if (url is None) == (command is None):
            raise ValueError("an McpConnection needs a url (McpConnection.http) or a command (McpConnection.stdio)")
        self.url = url
        self.headers = dict(headers or {})
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.kind = "http" if url is not None else "stdio"
        self._current: _Generation | None = None
        self._generations = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def http(cls, url: str, *, headers: Mapping[str, str] | None = None) -> McpConnection:
        """Streamable HTTP at `url` (e.g. `http://127.0.0.1:8080/mcp`); `headers`
        go on every request (e.g. an Authorization header)."""
        return cls(url=url, headers=headers)

    @classmethod
    def stdio(
        cls, command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None
    ) -> McpConnection:
        """A server the wrapper starts: `command args...`, speaking MCP on its
        stdin and stdout (its stderr goes to ours). `env` is added to the SDK's
        safe default environment."""
        return cls(command=command, args=args, env=env, cwd=cwd)

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
            self._current.stop.set()
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
        generation.stop.set()  # its supervisor winds it down in the background

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
            generation.task = _spawn(supervise(generation))
            self._tasks.add(generation.task)
            generation.task.add_done_callback(self._tasks.discard)
            try:
                await generation.ready.wait()
                if generation.session is None:
                    failure = generation.failure
                    if isinstance(failure, OSError) and self.kind == "stdio":
                        raise _ConnectFailure("connection-refused", f"could not start the server ({self.command}): {failure}")
                    raise _ConnectFailure("other", f"could not open the connection: {_describe(failure) if failure else 'no session'}")
                lost_at_start = generation.lost
                if lost_at_start is not None:
                    raise _ConnectFailure("connection-refused", lost_at_start)
                await generation.session.initialize()
            except BaseException:
                self._retire(generation)
                raise
            generation.initialized = True
            return generation

    async def _supervise_http(self, generation: _Generation) -> None:
        try:
            client = create_capturing_http_client(headers=self.headers)
            async with client, streamable_http_client(cast(str, self.url), http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    generation.session = session
                    generation.ready.set()
                    await generation.stop.wait()
        except BaseException as e:  # noqa: BLE001 - the supervisor's end is reported, never raised
            generation.failure = e
        finally:
            generation.supervisor_done("the HTTP session")

    async def _supervise_stdio(self, generation: _Generation) -> None:
        params = StdioServerParameters(command=cast(str, self.command), args=self.args, env=self.env, cwd=self.cwd)
        try:
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
                    async with ClientSession(relay_receive, write) as session:
                        generation.session = session
                        generation.ready.set()
                        await generation.stop.wait()
                    relays.cancel_scope.cancel()
        except BaseException as e:  # noqa: BLE001 - the supervisor's end is reported, never raised
            generation.failure = e
        finally:
            generation.supervisor_done("the stdio session")
