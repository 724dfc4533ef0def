"""Bounded HTTP under requests: every call has a wall-clock deadline (from the connection to the
last byte read, a server that drips one byte at a time included) and a cap on the bytes read.

requests' own timeout is per socket operation: a server that sends a byte every few seconds
never trips it. Here one watchdog thread shuts a call's socket down when the call's deadline
passes (what urllib3's own `HTTPResponse.shutdown()` does to interrupt a read): the blocked
read returns at once and the call ends with the deadline's error. The socket is known from the
moment it connects (a drip in the headers is cut too; connecting and Python's TLS handshake
take the time left as their own deadline). Bodies are read in chunks against a byte budget,
never whole.

The caps (docs/SECURITY.md, "Bounded clients"): JSON answers `JSON_LIMIT`, /metrics
`METRICS_LIMIT`, an error answer's body `ERROR_LIMIT` (only its message is shown), a stream
`STREAM_LIMIT` in all and `LINE_LIMIT` per line.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

KIB = 1024
MIB = 1024 * KIB
JSON_LIMIT = 4 * MIB
METRICS_LIMIT = 8 * MIB  # vLLM says ~0.1 MiB; parsing 8 MiB takes seconds of CPU
ERROR_LIMIT = 64 * KIB
STREAM_LIMIT = 64 * MIB
LINE_LIMIT = 1 * MIB
CHUNK = 64 * KIB


class LimitHit(Exception):
    """A call went past its deadline (`what` "deadline") or its byte cap ("size")."""

    def __init__(self, what: str, read: int) -> None:
        super().__init__(what)
        self.what = what
        self.read = read


class Deadline:
    """One call's wall-clock end (time.monotonic()); the socket it uses, to cut at the end."""

    __slots__ = ("_lock", "_sock", "done", "end", "fired", "seconds")

    def __init__(self, seconds: float, end: float | None = None) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds if end is None else end
        self.fired = False
        self.done = False
        self._sock: Any = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return self.fired or self.remaining() <= 0

    def watch(self, sock: Any) -> None:
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired:
            _shutdown(sock)

    def fire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.fired = True
            sock = self._sock
        if sock is not None:
            _shutdown(sock)


def _shutdown(sock: Any) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread for the process: fires each armed deadline when it passes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")  # when the thread wakes next, unless notified

    def arm(self, deadline: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline.end, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="warmctl-deadline")
                self._thread.daemon = True
                self._thread.start()
            if deadline.end < self._wakes_at:  # else it wakes in time: no thread switch
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._wakes_at = float("inf")
                    self._cond.wait()
                end, _, deadline = self._heap[0]
                if deadline.done:
                    heapq.heappop(self._heap)
                    continue
                delay = end - time.monotonic()
                if delay > 0:
                    self._wakes_at = end
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
            deadline.fire()


_WATCHDOG = _Watchdog()
_current = threading.local()


@contextlib.contextmanager
def watching(deadline: Deadline) -> Iterator[Deadline]:
    """The calls this thread makes inside are cut at `deadline`."""
    previous = getattr(_current, "deadline", None)
    _current.deadline = deadline
    _WATCHDOG.arm(deadline)
    try:
        yield deadline
    finally:
        with deadline._lock:
            deadline.done = True
        _current.deadline = previous


def _watch(sock: Any) -> None:
    deadline = getattr(_current, "deadline", None)
    if deadline is not None and sock is not None:
        deadline.watch(sock)


class _Watched:
    """A connection whose socket the thread's current deadline can cut."""

    def _new_conn(self) -> Any:
        sock = super()._new_conn()  # type: ignore[misc]
        _watch(sock)
        return sock

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _watch(getattr(self, "sock", None))  # the TLS socket, or a kept-alive one
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_Watched, HTTPConnection):
    pass


class _HTTPSConnection(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection  # type: ignore[assignment]


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class BoundedAdapter(HTTPAdapter):
    """requests' adapter with connections a deadline can cut (direct and through an HTTP
    proxy)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS  # type: ignore[attr-defined]

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = _POOLS
        return manager


def session() -> requests.Session:
    sess = requests.Session()
    adapter = BoundedAdapter()
    sess.mount("http://", adapter)
    sess.mount("https://", adapter)
    # no compressed answers: a byte cap then counts what the server sent
    sess.headers["Accept-Encoding"] = "identity"
    return sess


def read_body(resp: requests.Response, deadline: Deadline, limit: int) -> bytes:
    """The whole body, or LimitHit past `limit` bytes or the deadline."""
    buf = bytearray()
    for chunk in resp.iter_content(chunk_size=CHUNK):
        buf += chunk
        if len(buf) > limit:
            raise LimitHit("size", len(buf))
        if deadline.passed():
            raise LimitHit("deadline", len(buf))
    if deadline.fired:  # the socket was cut: what came is not the whole answer
        raise LimitHit("deadline", len(buf))
    return bytes(buf)


def read_some(resp: requests.Response, deadline: Deadline, limit: int) -> bytes:
    """At most `limit` bytes of the body, what arrived before the deadline (an error answer's
    body: its message is all that is shown); never raises."""
    buf = bytearray()
    with contextlib.suppress(Exception):
        for chunk in resp.iter_content(chunk_size=CHUNK):
            buf += chunk
            if len(buf) >= limit or deadline.passed():
                break
    return bytes(buf[:limit])


def read_lines(
    resp: requests.Response,
    deadline: Deadline,
    limit: int = STREAM_LIMIT,
    line_limit: int = LINE_LIMIT,
) -> Iterator[bytes]:
    """The body's lines as soon as each network chunk arrives (a chunked body: no read-ahead
    beyond the chunk); LimitHit past `limit` bytes in all, a line longer than `line_limit`, or
    the deadline. Chunks are read `CHUNK` bytes at most: a server's chunk size is not trusted."""
    pending = b""
    total = 0
    for chunk in resp.iter_content(chunk_size=CHUNK):
        total += len(chunk)
        if total > limit:
            raise LimitHit("size", total)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        if len(pending) > line_limit:
            raise LimitHit("line", total)
        yield from complete
        if deadline.passed():
            raise LimitHit("deadline", total)
    if deadline.fired:
        raise LimitHit("deadline", total)
    if pending:
        yield pending
