"""The built-in mappings of the any-call helper: an exception (or a returned
response) of a common client as the contract's `Observation`. They only
translate (the status, the headers as received, the body text, the transport
fault and how far the request got); what it means is the policy's to say.

Each client is looked up in `sys.modules` only: a package that was never
imported cannot have raised, and costs nothing. Covered: httpx (and its fork
httpx2), requests, the
openai and anthropic SDKs, and the standard library's timeouts and refused or
reset connections.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import Any

from .limits import MAX_BODY_BYTES, bounded_headers_text, cut
from .types import Delivery, Observation, TransportError, http_failure, transport_failure


def _pairs(headers: Any) -> list[tuple[str, str]]:
    """Response headers as (name, value) pairs, repeated names kept where the client keeps them."""
    if headers is None:
        return []
    items: Iterable[Any]
    if hasattr(headers, "multi_items"):  # httpx.Headers
        items = headers.multi_items()
    elif hasattr(headers, "items"):
        items = headers.items()
    else:
        items = headers
    return [(str(name), str(value)) for name, value in items]


def _unread_requests_body(response: Any) -> str | None:
    """The start of a requests response body not read yet (`stream=True`): at
    most `MAX_BODY_BYTES` + 1 bytes from its raw stream, never the whole body
    (which may be endless); None when the response is not such a one."""
    if getattr(response, "_content", None) is not False or getattr(response, "_content_consumed", True):
        return None
    raw = getattr(response, "raw", None)
    if raw is None or not hasattr(raw, "read"):
        return ""
    limit = MAX_BODY_BYTES + 1
    chunks: list[bytes] = []
    size = 0
    try:
        while size < limit:
            chunk = raw.read(limit - size)
            if not chunk:
                break
            chunks.append(bytes(chunk))
            size += len(chunk)
    except Exception:  # noqa: BLE001 - a stream that fails: what was read, or no body
        pass
    encoding = getattr(response, "encoding", None) or "utf-8"
    try:
        return b"".join(chunks).decode(encoding, errors="replace")
    except (LookupError, TypeError):  # an unknown encoding
        return b"".join(chunks).decode("utf-8", errors="replace")


def _text(response: Any) -> str:
    """A response's body as text, or "" when it cannot be read (a stream not read)."""
    try:
        unread = _unread_requests_body(response)
        if unread is not None:
            return unread
        text = response.text
    except Exception:  # noqa: BLE001 - httpx.ResponseNotRead, a body that cannot be decoded: no body
        return ""
    return text if isinstance(text, str) else ""


def response_failure(response: Any) -> Observation:
    """An HTTP response (httpx, requests, or any with `status_code`, `headers`
    and `text`) as an `http-status` observation, within the contract's limits."""
    status = int(response.status_code)
    headers = bounded_headers_text(_pairs(getattr(response, "headers", None)))
    return http_failure(status, headers, cut(_text(response), MAX_BODY_BYTES))


def _transport(kind: TransportError, error: BaseException, delivery: Delivery) -> Observation:
    return transport_failure(kind, cut(f"{type(error).__name__}: {error}", MAX_BODY_BYTES), delivery=delivery)


def _module(name: str) -> Any:
    return sys.modules.get(name)


# httpx, and its fork httpx2 (which mcp 2.x and the openai and anthropic SDKs of 2026 use): the same classes.
_HTTPX = ("httpx", "httpx2")


def _httpx(error: BaseException) -> Observation | None:
    for name in _HTTPX:
        observation = _httpx_of(_module(name), error)
        if observation is not None:
            return observation
    return None


def _httpx_of(httpx: Any, error: BaseException) -> Observation | None:
    if httpx is None:
        return None
    if isinstance(error, httpx.HTTPStatusError):
        return response_failure(error.response)
    if isinstance(error, (httpx.ConnectTimeout, httpx.PoolTimeout)):  # no connection: nothing left
        return _transport("timeout", error, "not-sent")
    if isinstance(error, httpx.TimeoutException):
        return _transport("timeout", error, "sent")
    if isinstance(error, httpx.ConnectError):
        return _transport("connection-refused", error, "not-sent")
    if isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
        return _transport("stream-closed", error, "sent")
    if isinstance(error, httpx.TransportError):
        return _transport("other", error, "unknown")
    return None


def _requests(error: BaseException) -> Observation | None:
    requests = _module("requests")
    if requests is None:
        return None
    exceptions = requests.exceptions
    if isinstance(error, exceptions.HTTPError) and error.response is not None:
        return response_failure(error.response)
    if isinstance(error, exceptions.ConnectTimeout):
        return _transport("timeout", error, "not-sent")
    if isinstance(error, exceptions.Timeout):
        return _transport("timeout", error, "sent")
    if isinstance(error, exceptions.ConnectionError):
        return _requests_connection(error)
    return None


def _requests_connection(error: BaseException) -> Observation:
    """A requests `ConnectionError`: urllib3's error inside says whether a
    connection was made (refused: nothing sent) or cut while the request was out."""
    urllib3 = _module("urllib3")
    inner: list[Any] = [*getattr(error, "args", ()), error.__context__, error.__cause__]
    reason = getattr(inner[0], "reason", None) if inner else None
    inner.append(reason)
    if urllib3 is not None:
        failures = urllib3.exceptions
        if any(isinstance(e, failures.NewConnectionError) for e in inner):
            return _transport("connection-refused", error, "not-sent")
        if any(isinstance(e, failures.ProtocolError) for e in inner):
            return _transport("stream-closed", error, "sent")
    return _transport("connection-reset", error, "unknown")


def _sdk(error: BaseException, package: str) -> Observation | None:
    """The openai and anthropic SDKs' errors (the same shapes): a status error
    with its response; a timeout or a connection error, with the httpx error
    that caused it read for how far the request got."""
    sdk = _module(package)
    if sdk is None:
        return None
    status_error = getattr(sdk, "APIStatusError", None)
    timeout_error = getattr(sdk, "APITimeoutError", None)
    connection_error = getattr(sdk, "APIConnectionError", None)
    if status_error is not None and isinstance(error, status_error):
        return response_failure(error.response)
    if timeout_error is not None and isinstance(error, timeout_error):
        cause = error.__cause__
        inner = _httpx(cause) if cause is not None else None
        return inner if inner is not None and "transport" in inner["kind"] else _transport("timeout", error, "unknown")
    if connection_error is not None and isinstance(error, connection_error):
        cause = error.__cause__
        inner = _httpx(cause) if cause is not None else None
        return inner if inner is not None and "transport" in inner["kind"] else _transport("other", error, "unknown")
    return None


def _stdlib(error: BaseException) -> Observation | None:
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return _transport("timeout", error, "unknown")
    if isinstance(error, ConnectionRefusedError):
        return _transport("connection-refused", error, "not-sent")
    if isinstance(error, ConnectionResetError):
        return _transport("connection-reset", error, "unknown")
    return None


def observe_exception(error: BaseException) -> Observation | None:
    """The observation of an exception one of the known clients raised, or
    None for one no mapping knows (the helper then re-raises it unchanged)."""
    for mapping in (_httpx, _requests, lambda e: _sdk(e, "openai"), lambda e: _sdk(e, "anthropic"), _stdlib):
        observation = mapping(error)
        if observation is not None:
            return observation
    return None


def observe_result(value: Any) -> Observation | None:
    """A returned httpx (or httpx2) or requests response whose status is 400 or more is a
    failure (its observation); anything else is a result (None)."""
    for name, attribute in (("httpx", "Response"), ("httpx2", "Response"), ("requests", "Response")):
        module = _module(name)
        kind = getattr(module, attribute, None) if module is not None else None
        if kind is not None and isinstance(value, kind) and int(value.status_code) >= 400:
            return response_failure(value)
    return None


__all__ = ["observe_exception", "observe_result", "response_failure"]
