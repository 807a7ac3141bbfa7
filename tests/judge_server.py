"""A real HTTP server on 127.0.0.1 that answers like an OpenAI-compatible chat endpoint.

Tests give it a `reply(body) -> (status, payload)` function and an optional delay; it records
every request (body and headers) and the most requests it ever had in flight at once.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def chat_reply(text: str, prompt_tokens: int = 10, completion_tokens: int = 2, usage: bool = True) -> dict:
    body = {"id": "chatcmpl-test", "object": "chat.completion", "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    if usage:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}
    return body


def user_content(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


class JudgeServer:
    def __init__(self, reply: Callable[[dict], tuple[int, dict | str]], delay_s: float = 0.0,
                 headers: dict[str, str] | None = None):
        self.reply = reply
        self.delay_s = delay_s
        self.extra_headers = headers or {}
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()  # wakes delayed handlers when the test ends
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll interval keeps shutdown (and so each test) fast.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return self.base_url + "/v1"

    def __enter__(self) -> "JudgeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.paths.append(self.path)
                    server._in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server._in_flight)
                try:
                    if server.delay_s:
                        server._stop.wait(server.delay_s)
                    status, payload = server.reply(body)
                finally:
                    # Out of flight before the reply is sent: a client that gets it may send its next
                    # request at once, and counting both would read as one request too many in flight.
                    with server._lock:
                        server._in_flight -= 1
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    for key, value in server.extra_headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):  # keep test output quiet
                pass

        return Handler
