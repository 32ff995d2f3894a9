"""A local HTTP server that answers from a script (stdlib http.server in a
thread): each request takes the next answer (status, headers, body, and a
delay before answering), and what each request carried is recorded."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: str = ""
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FaultyServer:
    """`FaultyServer(*answers)`; `url`, `seen` (the requests), `close()`. The
    last answer repeats once the script is spent."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers) or [Answer()]
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with server._lock:
                    server.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    answer = server.answers.pop(0) if len(server.answers) > 1 else server.answers[0]
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                data = answer.body.encode()
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers:
                        self.send_header(name, value)
                    if not any(name.lower() == "content-type" for name, _ in answer.headers):
                        self.send_header("content-type", "application/json" if answer.body.startswith(("{", "[")) else "text/plain")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = do_PUT = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    """A URL on which nothing listens (a connection there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
