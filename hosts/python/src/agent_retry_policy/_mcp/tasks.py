"""Tasks (MCP 2026-07-28 Tasks extension, SEP-2663, `io.modelcontextprotocol/tasks`)
on the Python SDK, which has only the hooks: the wrapper's client declares the
extension with a result claim for `resultType: "task"` (the SDK hands the parsed
answer back with `allow_claimed=True`), and sends `tasks/get`, `tasks/update`
and `tasks/cancel` as its own request types (`name_param` gives them the
`Mcp-Name` header). The SDK's own task types are the 2025-11-25 shapes, which
this wire does not use. What a task's answer says is read here into the
contract's `task-report` (facts only: the policy decides what to do)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.types import CallToolResult, InputRequests, InputResponses, Request, RequestParams, Result
from pydantic import ConfigDict, TypeAdapter

from ..types import TaskReport, TaskStatus

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class _TaskFields(Result):
    """A task's fields as the server gives them (camelCase on the wire). The
    numbers and times are kept as they came: one that does not fit the
    contract is reported as none (`report`), never a reason to refuse the answer."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: str
    status_message: str | None = None
    created_at: Any = None
    last_updated_at: Any = None
    ttl_ms: Any = None
    poll_interval_ms: Any = None


class TaskCreated(_TaskFields):
    """A `tools/call` answered by a task (`resultType: "task"`)."""

    result_type: Literal["task"] = "task"


class TaskState(_TaskFields):
    """A `tasks/get` answer: the task, and with its status the input it asks
    for (`input_required`), its result (`completed`) or its error (`failed`)."""

    result_type: str | None = None
    input_requests: InputRequests | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class _TaskIdParams(RequestParams):
    task_id: str


class _UpdateParams(RequestParams):
    task_id: str
    input_responses: InputResponses


class GetTask(Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


class UpdateTask(Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(Request[_TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


class _Acknowledged(Result):
    model_config = ConfigDict(extra="allow")


async def _not_resolved_here(_task: TaskCreated, _context: ClaimContext) -> CallToolResult:
    # The wrapper calls with `allow_claimed=True` and polls as the policy says; `Client.call_tool` never runs this.
    raise RuntimeError("a task is polled by RetryingToolCaller, not by Client.call_tool")


class TasksExtension(ClientExtension):
    """Declares the tasks extension and claims its `resultType: "task"` answers."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskCreated, resolve=_not_resolved_here),)


# A `tasks/get` answer as it came (the SDK's JSON value), read by `read_state`.
_ANSWER: TypeAdapter[Any] = TypeAdapter(Any)

U64_MAX = 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


async def get_task(session: Any, task_id: str) -> Any:
    """A `tasks/get` answer, unread (`read_state` reads it): one the wrapper
    cannot use is reported with its text, not lost in the SDK's validation."""
    return await session.send_request(GetTask(params=_TaskIdParams(task_id=task_id)), _ANSWER)


def read_state(answer: Any) -> TaskState | None:
    """A `tasks/get` answer as a task, or None if it is not one."""
    try:
        return TaskState.model_validate(answer, by_name=False)
    except ValueError:  # pydantic's ValidationError is one
        return None


def answer_text(answer: Any) -> str:
    """An answer the wrapper cannot use, as the body of its report: its JSON text (compact, as received)."""
    try:
        return json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(answer)


def u64(value: Any) -> int | None:
    """A number the contract carries as a u64; None if it is not one (negative, fractional, too large, not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX else None


def error_code(error: dict[str, Any]) -> int | None:
    """A JSON-RPC error's code, if it is an integer the contract carries (i32)."""
    code = error.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) and I32_MIN <= code <= I32_MAX else None


async def update_task(session: Any, task_id: str, responses: InputResponses) -> None:
    await session.send_request(UpdateTask(params=_UpdateParams(task_id=task_id, input_responses=responses)), _Acknowledged)


async def cancel_task(session: Any, task_id: str) -> None:
    await session.send_request(CancelTask(params=_TaskIdParams(task_id=task_id)), _Acknowledged)


def age_ms(task: _TaskFields, now_ms: int) -> int | None:
    """How long ago the task was created, by the host's clock (`createdAt` is
    ISO 8601); None without a `createdAt` it can read."""
    if not isinstance(task.created_at, str) or not task.created_at:
        return None
    try:
        created = datetime.fromisoformat(task.created_at.replace("Z", "+00:00"))
        if created.tzinfo is None:
            return None
        return u64(max(0, now_ms - int(created.timestamp() * 1000)))
    except (ValueError, OverflowError, OSError):
        return None


def report(task: _TaskFields, status: TaskStatus, now_ms: int, message: str | None = None) -> TaskReport:
    """The contract's `task-report` of a task's answer (`message`: the
    questions of an input nobody answered, else the task's `statusMessage`)."""
    return {
        "task-id": task.task_id,
        "status": status,
        "poll-interval-ms": u64(task.poll_interval_ms),
        "ttl-ms": u64(task.ttl_ms),
        "age-ms": age_ms(task, now_ms),
        "message": message if message is not None else task.status_message or "",
    }
