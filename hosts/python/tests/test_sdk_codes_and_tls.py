"""Two failures the SDK's types do not tell apart by themselves:

- A JSON-RPC error with -32000 or -32001 is the server's answer when the server
  sent it (a lost session, an upstream timeout it relays): it is reported as
  `protocol-error(code)`, like any JSON-RPC error. Only the SDK's own errors
  with those codes (the connection closed, its own timeout: no answer came) are
  transport failures. The capture knows which: the response came whole.
- A TLS error is `tls` / `not-sent` only when the handshake failed. A bad TLS
  record after the request was written is a broken connection
  (`connection-reset`, `sent`), answered by the capturing transport's stand-in
  like any network error, not a raw `ssl.SSLError`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from demo_server import DemoServer
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_retry_policy import EmbeddedAccounts, PolicyComponent, SplitMix64
from agent_retry_policy._mcp.caller import _server_answered
from agent_retry_policy.mcp_client import (
    TRANSPORT_ERROR_HEADER,
    AttemptCapture,
    CapturingTransport,
    McpConnection,
    RetryingToolCaller,
    _current_attempt,
    classify_network_error,
    create_capturing_http_client,
)
from agent_retry_policy.types import Verdict

TOOL = "lookup_order"


def attempt_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agent_retry_policy.mcp"]
    return [line for line in lines if line.get("event") == "agent_retry.attempt" and line["tool"] == TOOL]


def new_caller(session: McpConnection | ClientSession, verdicts: list[tuple[str, int, Verdict]], **kwargs: Any) -> RetryingToolCaller:
    instance = PolicyComponent.load().instantiate(accounts=EmbeddedAccounts(), entropy=SplitMix64(7))
    run = instance.load_policy({}).start_run("sdk-codes")
    return RetryingToolCaller(
        session,
        run,
        entropy=SplitMix64(3),
        attempt_timeout_s=20.0,
        call_timeout_s=60.0,
        sleep=lambda _s: asyncio.sleep(0),
        on_verdict=lambda tool, attempt, verdict: verdicts.append((tool, attempt, verdict)),
        **kwargs,
    )


# --- M3: a server's -32000 / -32001 is a protocol error ---------------------------


@pytest.mark.parametrize(
    ("code", "message"),
    [(-32001, "upstream request timed out"), (-32000, "upstream busy, try again in 20s"), (-32000, "Connection closed")],
)
def test_a_servers_json_rpc_error_with_the_sdks_own_codes_is_a_protocol_error(
    code: int, message: str, demo: Callable[..., DemoServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo(
        "--era", "dual", faults=[{"tool": TOOL, "call": 1, "fault": {"kind": "json-rpc-error", "code": code, "message": message}}]
    )
    verdicts: list[tuple[str, int, Verdict]] = []

    async def call() -> None:
        async with McpConnection.http(server.url) as connection:
            await new_caller(connection, verdicts).call_tool(TOOL, {"order_id": "A1"})

    asyncio.run(call())
    first = attempt_lines(caplog)[0]
    # Even the SDK's own wording ("Connection closed"): the server sent it, the answer came.
    assert first["outcome"] == f"json-rpc {code}", first
    assert first["rule"] != "transport", first
    if "20s" in message:  # the server's relayed wait is read, as in any protocol error
        assert first["hint_ms"] == 20_000, first


def test_the_sdks_own_timeout_over_the_capturing_transport_is_a_transport_timeout(
    demo: Callable[..., DemoServer], caplog: pytest.LogCaptureFixture
) -> None:
    # The server holds its answer back; the SDK's read timeout (0.5 s) ends the
    # request with its own -32001: no answer came, so it is transport(timeout).
    caplog.set_level(logging.INFO, logger="agent_retry_policy.mcp")
    server = demo("--era", "handshake", faults=[{"tool": TOOL, "call": 1, "fault": {"kind": "timeout-after-apply", "delay-ms": 3000}}])
    verdicts: list[tuple[str, int, Verdict]] = []

    async def call() -> None:
        async with (
            create_capturing_http_client() as client,
            streamable_http_client(server.url, http_client=client) as (read, write),
            ClientSession(read, write, read_timeout_seconds=0.5) as session,
        ):
            await session.initialize()
            await new_caller(session, verdicts).call_tool(TOOL, {"order_id": "A1"})

    asyncio.run(call())
    first = attempt_lines(caplog)[0]
    assert (first["outcome"], first["rule"]) == ("transport timeout", "transport"), first


def _capture(*, seen: bool, responded: bool) -> AttemptCapture:
    capture = AttemptCapture()
    capture.seen, capture.responded = seen, responded
    return capture


def test_who_sent_a_32000_or_32001_is_what_the_capture_saw_not_the_message() -> None:
    sdk_timeout = MCPError(-32001, "Request 'tools/call' timed out")
    sdk_closed = MCPError(-32000, "Connection closed")
    relayed = MCPError(-32001, "upstream request timed out")
    for error in (sdk_timeout, sdk_closed, relayed):
        assert _server_answered(_capture(seen=True, responded=True), error), error
        assert not _server_answered(_capture(seen=True, responded=False), error), error
    # Without a capturing transport (stdio): only the SDK's exact forms are its own.
    assert not _server_answered(_capture(seen=False, responded=False), sdk_timeout)
    assert not _server_answered(_capture(seen=False, responded=False), sdk_closed)
    assert not _server_answered(_capture(seen=False, responded=False), MCPError(-32000, "SSE stream ended without a response"))
    assert _server_answered(_capture(seen=False, responded=False), relayed)
    assert _server_answered(_capture(seen=False, responded=False), MCPError(-32000, "Session not found"))


REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo"}}


# --- M4: a TLS error after the request was written ---------------------------------


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def bad_record_server(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A TLS server that completes the handshake, reads the whole request, then
    writes a TLS record the client cannot decrypt. Yields its URL and the
    requests it read."""
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    read: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            raw.settimeout(5)
            tls: ssl.SSLSocket | None = None
            try:
                tls = context.wrap_socket(raw, server_side=True)  # takes over raw's descriptor
                data = b""
                while b"\r\n\r\n" not in data:
                    data += tls.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += tls.recv(65536)
                read.append(body)
                os.write(tls.fileno(), b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # application data no key decrypts
                stop.wait(0.5)
            except OSError:
                pass
            finally:
                (tls or raw).close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}/mcp", read
    stop.set()
    thread.join(timeout=5)
    listener.close()


def test_a_bad_tls_record_after_the_request_was_written_is_a_reset_connection_not_tls(
    bad_record_server: tuple[str, list[bytes]],
) -> None:
    url, read = bad_record_server

    async def post() -> tuple[AttemptCapture, httpx2.Response]:
        capture = AttemptCapture()
        token = _current_attempt.set(capture)
        try:
            transport = CapturingTransport(httpx2.AsyncHTTPTransport(verify=False))
            try:
                response = await transport.handle_async_request(httpx2.Request("POST", url, json=REQUEST))
            finally:
                await transport.aclose()
        finally:
            _current_attempt.reset(token)
        return capture, response

    capture, response = asyncio.run(post())
    assert json.loads(read[0]) == REQUEST, "the server read the whole request"
    # Answered by the stand-in (no raw ssl.SSLError), as a broken connection after the write.
    assert response.status_code == 599 and response.headers[TRANSPORT_ERROR_HEADER] == "connection-reset"
    assert (capture.transport_error, capture.delivery) == ("connection-reset", "sent"), capture.transport_detail
    assert "SSLError" in capture.transport_detail


def test_only_a_failed_handshake_is_tls() -> None:
    bad_record = ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] decryption failed or bad record mac")
    handshake = httpx2.ConnectError("certificate verify failed")
    handshake.__cause__ = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert classify_network_error(handshake) == ("tls", "not-sent")
    assert classify_network_error(bad_record, written=True) == ("connection-reset", "sent")
    assert classify_network_error(bad_record) == ("connection-reset", "unknown")  # written or not: not known
    read_error = httpx2.ReadError("broken")
    read_error.__cause__ = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert classify_network_error(read_error) == ("connection-reset", "sent")
