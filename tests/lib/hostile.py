"""A hostile HTTP server on loopback, in a thread: a small vLLM look-alike whose chosen routes
misbehave as an attacker (or a compromised server) would.

Behaviours, on the routes in `on` (every other route answers as vLLM does):

- drip_head   the status line, then the headers one byte every `interval` s, never ending
- drip_body   whole headers (a long Content-Length), then the body one byte every `interval` s
- endless     a chunked body of 64 KiB chunks without a newline, never ending
- huge        Content-Length 2 GiB, the bytes as fast as the client takes them
- bad_json    200 with a body that is not JSON (not Prometheus text on /metrics)
- deep_json   200 with `[` nested 100,000 deep (json.loads -> RecursionError)
- escapes     500 with terminal escape sequences in its error message; model names and the
              version carry them on every route (title change, screen clear, colours, C1 CSI,
              a bidirectional override, rich markup)

    with Hostile("drip_body", on={"/health"}) as srv:
        ...srv.url...
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Self

BEHAVIOURS = ("drip_head", "drip_body", "endless", "huge", "bad_json", "deep_json", "escapes")
# what a terminal would act on; none of it may reach the operator's terminal raw
EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u009b1m\u202e[bold]b[/bold]\r"
RAW_BYTES = ("\x1b", "\x07", "\u009b", "\u202e", "\r")
MODEL = "tiny"
GIVE_UP_S = 120.0  # a hostile answer stops after this long (the old, unbounded client ends)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    hostile: Hostile


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(GIVE_UP_S)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                if not data:
                    return
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            while len(body) < length:
                data = sock.recv(65536)
                if not data:
                    return
                body += data
            self.server.hostile.answer(sock, method, target.split("?", 1)[0], body)
        except OSError:
            return


def _reply(sock: socket.socket, status: str, body: bytes, ctype: str = "application/json") -> None:
    sock.sendall(
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )


class Hostile:
    def __init__(
        self, behaviour: str, on: Iterable[str] = (), interval: float = 0.1, asleep: bool = False
    ) -> None:
        assert behaviour in BEHAVIOURS, behaviour
        self.behaviour = behaviour
        self.asleep = asleep
        self.on = frozenset(on)
        self.interval = interval
        self.stop = threading.Event()
        self.hits: list[str] = []  # the hostile answers given, by route
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hostile = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()

    # -- answers -------------------------------------------------------------------------
    def answer(self, sock: socket.socket, method: str, path: str, body: bytes) -> None:
        if path in self.on:
            self.hits.append(path)
            streamed = path.startswith("/v1/") and b'"stream": true' in body
            if streamed and self.behaviour in ("bad_json", "deep_json"):  # as server-sent events
                line = b"{not json" if self.behaviour == "bad_json" else b"[" * 100_000
                _reply(sock, "200 OK", b"data: " + line + b"\n\n", "text/event-stream")
                return
            getattr(self, f"_{self.behaviour}")(sock, path)
            return
        self._normal(sock, method, path, body)

    def _model(self) -> str:
        return MODEL + EVIL if self.behaviour == "escapes" else MODEL

    def _normal(self, sock: socket.socket, method: str, path: str, body: bytes) -> None:
        version = "0.11.0" + (EVIL if self.behaviour == "escapes" else "")
        answers: dict[str, object] = {
            "/v1/models": {"data": [{"id": self._model(), "max_model_len": 4096}]},
            "/version": {"version": version},
            "/is_sleeping": {"is_sleeping": self.asleep},
            "/load": {"server_load": 0},
            "/server_info": {"vllm_config": {"compilation_config": {}}},
            "/tokenize": {"count": 400},
        }
        if path == "/metrics":
            text = (
                'vllm:num_requests_running{model_name="tiny"} 0.0\n'
                'vllm:num_requests_waiting{model_name="tiny"} 0.0\n'
            )
            _reply(sock, "200 OK", text.encode(), "text/plain; version=0.0.4")
        elif path in ("/v1/completions", "/v1/chat/completions"):
            request = json.loads(body or b"{}")
            if request.get("stream"):
                self._stream(sock)
            else:
                answer = {"choices": [{"text": "x", "logprobs": None, "token_ids": [1]}]}
                _reply(sock, "200 OK", json.dumps(answer).encode())
        elif path in answers:
            _reply(sock, "200 OK", json.dumps(answers[path]).encode())
        else:  # /health, /sleep, /wake_up, /reset_prefix_cache...
            _reply(sock, "200 OK", b"")

    def _stream(self, sock: socket.socket) -> None:
        chunk = {"choices": [{"text": "x", "finish_reason": None}]}
        lines = [f"data: {json.dumps(chunk)}\n\n"] * 4 + ["data: [DONE]\n\n"]
        body = "".join(lines).encode()
        _reply(sock, "200 OK", body, "text/event-stream")

    def _drip(self, sock: socket.socket, data: bytes) -> None:
        end = time.monotonic() + GIVE_UP_S
        i = 0
        while not self.stop.is_set() and time.monotonic() < end:
            sock.sendall(data[i % len(data) : i % len(data) + 1])
            i += 1
            if self.stop.wait(self.interval):
                return

    def _drip_head(self, sock: socket.socket, path: str) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\n")
        self._drip(sock, b"X-Drip: " + b"a" * 60 + b"\r\n")

    def _drip_body(self, sock: socket.socket, path: str) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        self._drip(sock, b'{"data": [' + b" " * 1000)

    def _flood(self, sock: socket.socket, block: bytes) -> None:
        end = time.monotonic() + GIVE_UP_S
        while not self.stop.is_set() and time.monotonic() < end:
            sock.sendall(block)

    def _endless(self, sock: socket.socket, path: str) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        self._flood(sock, b"10000\r\n" + b"a" * 0x10000 + b"\r\n")

    def _huge(self, sock: socket.socket, path: str) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2147483648\r\n\r\n")
        self._flood(sock, b" " * 0x10000)

    def _bad_json(self, sock: socket.socket, path: str) -> None:
        _reply(sock, "200 OK", b'{"data": [not json} \x00\xff{{{', "application/json")

    def _deep_json(self, sock: socket.socket, path: str) -> None:
        _reply(sock, "200 OK", b"[" * 100_000)

    def _escapes(self, sock: socket.socket, path: str) -> None:
        message = f"boom {EVIL} end"
        body = json.dumps({"error": {"message": message}}).encode()
        _reply(sock, "500 Internal Server Error", body)
