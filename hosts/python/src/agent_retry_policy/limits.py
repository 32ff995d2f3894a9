"""What the host passes to the policy, bounded before it crosses the boundary
(contract 0.4.0; the numbers of the Rust host's `limits.rs`, which the Node host
applies too). Lowering a value into the guest costs its size in memory and
copying, so a 40 MB tool error or 5,800 headers are cut here, not in the guest.

Sizes are UTF-8 bytes, as the contract counts them; a text is cut at a
character boundary.
"""

from __future__ import annotations

from typing import Any, cast

from .types import Failure, Outcome

# The most bytes of a failure's body (or tool-error text, or empty-result detail) passed.
MAX_BODY_BYTES = 65_536
# The most bytes of structured content passed; longer is dropped (cut JSON is not JSON).
MAX_STRUCTURED_BYTES = 65_536
# The most headers passed (the policy reads 64 and names the rest).
MAX_HEADERS = 128
# The most bytes of one header name or value passed (the policy parses values up to 1,024).
MAX_HEADER_VALUE_BYTES = 4_096
# The longest run id, action id, tool name or idempotency key.
MAX_ID_BYTES = 256
# The longest configuration text.
MAX_CONFIG_BYTES = 1 << 20

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


def _headers_within(headers: Any) -> bool:
    return len(headers) <= MAX_HEADERS and all(
        within(name, MAX_HEADER_VALUE_BYTES) and within(value, MAX_HEADER_VALUE_BYTES) for name, value in headers
    )


def bounded_failure(failure: Failure) -> Failure:
    """The failure as the host passes it: the same object when it is within every
    limit, else a copy with the body cut to 65,536 bytes, structured content over
    65,536 bytes dropped, and at most 128 headers, each name and value cut to
    4,096 bytes. A value of the wrong shape is passed as it is: the value
    conversion refuses it with its own error."""
    if not isinstance(failure, dict):
        return failure
    try:
        return _bounded_failure(failure)
    except (TypeError, ValueError):
        return failure


def _bounded_failure(failure: Failure) -> Failure:
    body = failure.get("body", "")
    structured = failure.get("structured-content")
    headers = failure.get("headers", ())
    if within(body, MAX_BODY_BYTES) and (structured is None or within(structured, MAX_STRUCTURED_BYTES)) and _headers_within(headers):
        return failure
    bounded = dict(failure)
    bounded["body"] = cut(body, MAX_BODY_BYTES)
    bounded["structured-content"] = structured if structured is None or within(structured, MAX_STRUCTURED_BYTES) else None
    bounded["headers"] = [
        (cut(name, MAX_HEADER_VALUE_BYTES), cut(value, MAX_HEADER_VALUE_BYTES)) for name, value in list(headers[:MAX_HEADERS])
    ]
    return cast(Failure, bounded)


def bounded_outcome(outcome: Outcome) -> Outcome:
    """The outcome as the host passes it (a failure bounded as `bounded_failure`,
    an empty result's detail cut to 65,536 bytes); the same object when within."""
    if isinstance(outcome, dict):
        if "failure" in outcome:
            failure = outcome["failure"]  # type: ignore[typeddict-item]
            bounded = bounded_failure(failure)
            return outcome if bounded is failure else {"failure": bounded}
        if "empty-result" in outcome:
            detail = outcome["empty-result"]  # type: ignore[typeddict-item]
            if isinstance(detail, str) and not within(detail, MAX_BODY_BYTES):
                return {"empty-result": cut(detail, MAX_BODY_BYTES)}
    return outcome


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
    """`join_headers` of the headers as `bounded_failure` passes them: at most
    128, each name and value cut to 4,096 bytes (before joining)."""
    if not headers:
        return ""
    if not _headers_within(headers):
        headers = [(cut(name, MAX_HEADER_VALUE_BYTES), cut(value, MAX_HEADER_VALUE_BYTES)) for name, value in list(headers[:MAX_HEADERS])]
    return join_headers(headers)


def bounded_structured(structured: str | None) -> str | None:
    """Structured content as passed: None over 65,536 bytes (cut JSON is not JSON)."""
    return structured if structured is None or within(structured, MAX_STRUCTURED_BYTES) else None


def too_large(input_name: str, value: str, max_bytes: int = MAX_ID_BYTES) -> dict[str, Any] | None:
    """The run error `too-large` the component would answer for an id over its
    limit (`{"too-large": {"input", "size-bytes", "limit-bytes"}}`), or None."""
    if within(value, max_bytes):
        return None
    return {"too-large": {"input": input_name, "size-bytes": min(utf8_size(value), U32_MAX), "limit-bytes": max_bytes}}


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CONFIG_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_ID_BYTES",
    "MAX_STRUCTURED_BYTES",
    "bounded_failure",
    "bounded_headers_text",
    "bounded_outcome",
    "bounded_structured",
    "cut",
    "join_headers",
    "too_large",
    "utf8_size",
]
