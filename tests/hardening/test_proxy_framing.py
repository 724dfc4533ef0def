"""The vLLM double reads every request's body as a real server does (Content-Length or chunked,
whatever the method), so a body that holds a second request is never executed: straight at the
double and through the real proxy (whose kept-alive upstream connection would carry the
smuggled request to it). Bad framing: 400 and the connection closed."""

from __future__ import annotations

import socket
from typing import Any, BinaryIO

import pytest

from tests.double import VllmDouble
from tests.hardening.test_proxy import TOKEN, proxied  # noqa: F401 (a fixture)

SMUGGLED = b"POST /sleep?level=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def chunked(data: bytes, size: int = 7) -> bytes:
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def request(method: str, path: str, body: bytes | None = None, framing: str = "length",
            token: bool = True) -> bytes:  # fmt: skip
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if token:
        lines.append(f"Authorization: Bearer {TOKEN}")
    if body is not None and framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif body is not None:
        lines.append("Transfer-Encoding: chunked")
        body = chunked(body)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def read_response(f: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off a kept-alive connection (Content-Length or chunked)."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while (n := int(f.readline().split(b";")[0], 16)) > 0:
            body += f.read(n)
            f.readline()
        f.readline()
    else:
        body = f.read(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


def exchange(address: tuple[str, int], data: bytes, answers: int) -> list[tuple[int, Any]]:
    """Send `data` (requests back to back) on one connection, read `answers` responses."""
    with socket.create_connection(address, timeout=30) as sock, sock.makefile("rb") as f:
        sock.sendall(data)
        out = []
        for _ in range(answers):
            status, headers, _ = read_response(f)
            out.append((status, headers.get("connection")))
        return out


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_the_double_reads_a_body_whatever_the_method(
    vllm_double: VllmDouble, method: str, framing: str
) -> None:
    """A request with a body that holds a whole second request, then a plain one on the same
    connection: two answers, the smuggled /sleep never seen, the engine awake."""
    path = "/v1/models" if method == "GET" else "/health"
    data = request(method, path, SMUGGLED, framing) + request("GET", "/health")
    answers = exchange(("127.0.0.1", vllm_double.port), data, 2)
    assert answers[1][0] == 200, answers
    assert vllm_double.counters.requests == [(method, path), ("GET", "/health")]
    assert not vllm_double.is_sleeping and vllm_double.counters.sleeps == []


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Content-Length: 5\r\nContent-Length: 6",
        b"Content-Length: -1",
        b"Transfer-Encoding: chunked\r\nX: y",  # then a chunk size that is no hex number
    ],
)
def test_the_double_refuses_bad_framing_and_closes(vllm_double: VllmDouble, head: bytes) -> None:
    data = b"GET /health HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\nzz\r\n" + SMUGGLED
    with socket.create_connection(("127.0.0.1", vllm_double.port), timeout=30) as sock:
        sock.sendall(data)
        with sock.makefile("rb") as f:
            status, headers, _ = read_response(f)
            assert (status, headers.get("connection")) == (400, "close")
            assert f.read() == b""  # closed: nothing after it is read as a request
    assert vllm_double.counters.requests == [] and not vllm_double.is_sleeping


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_get_body_through_the_proxy_executes_nothing(
    proxied: dict[str, Any],  # noqa: F811 (the fixture)
    framing: str,
) -> None:
    """Through real nginx (HTTP/1.1 to the upstream, its connections kept alive): a GET whose
    body holds a /sleep, then more requests that reuse the upstream connection: the double
    answers each one, sees no /sleep and stays awake."""
    double: VllmDouble = proxied["double"]
    host, port = proxied["address"].split(":")
    data = request("GET", "/v1/models", SMUGGLED, framing)
    for _ in range(3):
        data += request("GET", "/v1/models")
    answers = exchange((host, int(port)), data, 4)
    assert [status for status, _ in answers] == [200] * 4, answers
    double.wait_for(lambda: len(double.counters.requests) >= 4, "the double's four requests")
    assert double.counters.requests == [("GET", "/v1/models")] * 4, double.counters.requests
    assert not double.is_sleeping and double.counters.sleeps == []
