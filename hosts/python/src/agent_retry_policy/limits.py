"""What the host passes to the policy, bounded before it crosses the boundary
(contract 0.9.0; the numbers are the Rust host's `limits.rs`, mirrored into
`limits_generated.py` by tests/contract/make_mirrors.py, as for the Node host).
Lowering a value into the guest costs its size in memory and copying, so a 40
MB tool error or 5,800 headers are cut here, not in the guest.

Sizes are UTF-8 bytes, as the contract counts them; a text is cut at a
character boundary.
"""

from __future__ import annotations

from typing import Any, cast

from .limits_generated import (
    MAX_ARGUMENTS_BYTES,
    MAX_BODY_BYTES,
    MAX_CONFIG_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS,
    MAX_ID_BYTES,
    MAX_LIFTED_TEXT_BYTES,
    MAX_SERVER_BYTES,
    MAX_SNAPSHOT_BYTES,
    MAX_STRUCTURED_BYTES,
)
from .types import Observation, TaskReport

U32_MAX = 0xFFFF_FFFF


def utf8_size(text: str) -> int:
    """The length of `text` in UTF-8 bytes."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def within(text: str, max_bytes: int) -> bool:
    """Whether `text` is at most `max_bytes` UTF-8 bytes, without encoding a long
    text. True for what is not a string: the value conversion refuses it."""
    if not isinstance(text, str):
        return True
    if len(text) > max_bytes:  # a character is at least one byte
        return False
    if len(text) * 4 <= max_bytes:  # and at most four
        return True
    return utf8_size(text) <= max_bytes


def cut(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes, at a character boundary."""
    if within(text, max_bytes):
        return text
    head = text[:max_bytes]  # at least max_bytes bytes: only these can survive
    if head.isascii():
        return head
    return head.encode("utf-8", "surrogatepass")[:max_bytes].decode("utf-8", "ignore")


def cut_lifted_text(text: str) -> str:
    """A text lifted from the policy (a reason, a message, a note, a last
    error) as the host logs or returns it: at most 65,536 UTF-8 bytes, cut at a
    character boundary, with ` … [cut: N bytes]` saying how many were removed.
    The guest is not trusted to keep its prose short."""
    if not isinstance(text, str) or within(text, MAX_LIFTED_TEXT_BYTES):
        return text
    kept = cut(text, MAX_LIFTED_TEXT_BYTES)
    return f"{kept} … [cut: {utf8_size(text) - utf8_size(kept)} bytes]"


def _headers_within(headers: Any) -> bool:
    return len(headers) <= MAX_HEADERS and all(
        within(name, MAX_HEADER_VALUE_BYTES) and within(value, MAX_HEADER_VALUE_BYTES) for name, value in headers
    )


def _header_text_within(text: str) -> bool:
    """Whether joined header lines are within the limits (at most 128 lines,
    each name and value at most 4,096 bytes), without splitting a short text."""
    if not text:
        return True
    if text.count("\n") >= MAX_HEADERS:
        return False
    if within(text, MAX_HEADER_VALUE_BYTES):
        return True
    return all(within(line, MAX_HEADER_VALUE_BYTES) or _line_within(line) for line in text.split("\n"))


def _line_within(line: str) -> bool:
    name, _, value = line.partition(":")
    return within(name, MAX_HEADER_VALUE_BYTES) and within(value.strip(" "), MAX_HEADER_VALUE_BYTES)


def bounded_header_text(text: str) -> str:
    """Joined header lines as passed: at most 128 lines, each name and value cut
    to 4,096 bytes (a name ends at the first `:`)."""
    if not isinstance(text, str) or _header_text_within(text):
        return text
    lines = []
    for line in text.split("\n")[:MAX_HEADERS]:
        name, colon, value = line.partition(":")
        lines.append(
            f"{cut(name, MAX_HEADER_VALUE_BYTES)}{colon} {cut(value.strip(' '), MAX_HEADER_VALUE_BYTES)}"
            if colon
            else cut(line, MAX_HEADER_VALUE_BYTES)
        )
    return "\n".join(lines)


def bounded_observation(observation: Observation) -> Observation:
    """The observation as the host passes it: the same object when it is within
    every limit, else a copy with the body cut to 65,536 bytes, structured
    content over 65,536 bytes dropped, and at most 128 header lines, each name
    and value cut to 4,096 bytes. A value of the wrong shape is passed as it
    is: the value conversion refuses it with its own error."""
    if not isinstance(observation, dict):
        return observation
    body = observation.get("body", "")
    structured = observation.get("structured-content")
    headers = observation.get("headers", "")
    try:
        if (
            within(body, MAX_BODY_BYTES)
            and (structured is None or within(structured, MAX_STRUCTURED_BYTES))
            and (not isinstance(headers, str) or _header_text_within(headers))
        ):
            return observation
    except (TypeError, ValueError):
        return observation
    bounded = dict(observation)
    if isinstance(body, str):
        bounded["body"] = cut(body, MAX_BODY_BYTES)
    if isinstance(structured, str):
        bounded["structured-content"] = bounded_structured(structured)
    if isinstance(headers, str):
        bounded["headers"] = bounded_header_text(headers)
    return cast(Observation, bounded)


def _one_line(text: str) -> str:
    """`text` with every CR and LF replaced by a space (a line break would split
    a `name: value` line in two)."""
    if "\n" in text or "\r" in text:
        return text.replace("\r", " ").replace("\n", " ")
    return text


def join_headers(headers: Any) -> str:
    """The headers as `record-failure` takes them: one `name: value` line per
    header, joined with "\n"; a CR or LF inside a name or value becomes a space.
    Nothing is cut (`bounded_headers_text` applies the limits too)."""
    if not headers:
        return ""
    return "\n".join(f"{_one_line(name)}: {_one_line(value)}" for name, value in headers)


def bounded_headers_text(headers: Any) -> str:
    """`join_headers` of header pairs within the limits: at most 128, each name
    and value cut to 4,096 bytes (before joining)."""
    if not headers:
        return ""
    if not _headers_within(headers):
        headers = [(cut(name, MAX_HEADER_VALUE_BYTES), cut(value, MAX_HEADER_VALUE_BYTES)) for name, value in list(headers[:MAX_HEADERS])]
    return join_headers(headers)


def bounded_structured(structured: str | None) -> str | None:
    """Structured content as passed: None over 65,536 bytes (cut JSON is not JSON)."""
    return structured if structured is None or within(structured, MAX_STRUCTURED_BYTES) else None


def bounded_task(task: TaskReport) -> TaskReport:
    """A task report as the host passes it: its message cut to 65,536 bytes
    (the Rust host's rule; the policy keeps the first 4,096). A value of the
    wrong shape is passed as it is, for the value conversion to refuse."""
    if not isinstance(task, dict):
        return task
    message = task.get("message", "")
    if not isinstance(message, str) or within(message, MAX_BODY_BYTES):
        return task
    return cast(TaskReport, {**task, "message": cut(message, MAX_BODY_BYTES)})


def too_large(input_name: str, value: str, max_bytes: int = MAX_ID_BYTES) -> dict[str, Any] | None:
    """The run error `too-large` the component would answer for an id over its
    limit (`{"too-large": {"input", "size-bytes", "limit-bytes"}}`), or None."""
    if within(value, max_bytes):
        return None
    return {"too-large": {"input": input_name, "size-bytes": min(utf8_size(value), U32_MAX), "limit-bytes": max_bytes}}


__all__ = [
    "MAX_ARGUMENTS_BYTES",
    "MAX_BODY_BYTES",
    "MAX_CONFIG_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_ID_BYTES",
    "MAX_LIFTED_TEXT_BYTES",
    "MAX_SERVER_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_STRUCTURED_BYTES",
    "bounded_header_text",
    "bounded_headers_text",
    "bounded_observation",
    "bounded_structured",
    "bounded_task",
    "cut",
    "cut_lifted_text",
    "join_headers",
    "too_large",
    "utf8_size",
]
