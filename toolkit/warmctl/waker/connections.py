"""The waker's door under a connection storm: a bound on its connections, and one log line per
storm.

Only nginx's workers and the service user can connect (the sockets' mode, `service.py`), and
nginx sends its subrequest's head the moment it connects; a connection that sends nothing is
closed after `http.HEAD_TIMEOUT_S`. Past the bound, a new connection takes the place of the
oldest one that has not sent its head yet (idle: it waits for nothing), so a storm of idle
connections can never lock a real request out; only when every connection holds a request is
the new one refused (closed: nginx answers its client 503 "waking-failed"). The door accepts
one connection at a time and admits it before the next (`Door`), and the process's descriptor
limit is sized to the bound (`service.fit_descriptors`), so accept() does not run out of
descriptors; if it does all the same (a limit set lower), that is part of the storm too, not a
traceback per accept.

A storm is counted, not logged per connection: one line when it has been quiet for `QUIET_S`
seconds (how many connections, how many idle ones closed, how many refused, how long), and one
a minute while it goes on; every event also counts in the waker's metrics
(warmctl_waker_past_bound_connections_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from warmctl.terminal.output import warning_line

QUIET_S = 5.0  # a storm is over after this long without hitting the bound
EVERY_S = 60.0  # a storm that goes on: one line a minute


class Storm:
    """Counts what the bound did; one line per storm (and a minute of a long one)."""

    def __init__(
        self,
        name: str,
        bound: int,
        log: Callable[[str], None] = warning_line,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.name, self.bound, self.log, self.clock = name, bound, log, clock
        self.count = count  # each event, as it comes (the metrics)
        self.counts: Counter[str] = Counter()
        self.began: float | None = None  # this storm's first event (or the last line's)
        self.last = 0.0
        self.storms = 0  # storms logged (tests, /state)
        self._check: asyncio.TimerHandle | None = None

    def note(self, kind: str) -> None:
        """One event: "idle" (an idle connection closed to make room), "refused" (every
        connection held a request), "descriptors" (accept() found no descriptor)."""
        now = self.clock()
        self.counts[kind] += 1
        if self.count is not None:
            self.count(kind)
        self.last = now
        if self.began is None:
            self.began = now
            self._schedule(QUIET_S)
        elif now - self.began >= EVERY_S:
            self._line(now, over=False)

    def _schedule(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test of the counting): lines on close()
            return
        self._check = loop.call_later(delay, self._quiet)

    def _quiet(self) -> None:
        now = self.clock()
        if now - self.last >= QUIET_S:
            self._line(now, over=True)
        else:
            self._schedule(self.last + QUIET_S - now)

    def _line(self, now: float, over: bool) -> None:
        if self.began is None or not self.counts:
            return
        c = self.counts
        total = sum(c.values())
        said = {
            "idle": "idle ones closed to make room",
            "refused": "refused (every connection held a request)",
            "descriptors": "accepts without a free descriptor",
        }
        what = [f"{c[kind]} {text}" for kind, text in said.items() if c[kind]]
        span = max(self.last - self.began, 0.0) if over else EVERY_S
        tail = "over" if over else "goes on (one line a minute)"
        self.log(
            f"{self.name}: waker: a connection storm: {total} connection(s) past its bound of "
            f"{self.bound} in {span:.1f} s: {', '.join(what)}; {tail}"
        )
        self.storms += 1
        self.counts.clear()
        self.began = None if over else now
        if over and self._check is not None:
            self._check.cancel()
            self._check = None

    def close(self) -> None:
        """The waker stops: what is counted gets its line."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        self._line(self.clock(), over=True)


class Conn:
    """One accepted connection: its socket, then its stream writer once asyncio wraps it."""

    __slots__ = ("evicted", "sock", "writer")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writer: asyncio.StreamWriter | None = None
        self.evicted = False  # closed to make room

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()  # its handler sees the end and returns


class Connections:
    """The door's connections, oldest first: the idle ones (no head yet), the busy ones (a
    request read: held or being answered) and the closing ones (closed for room, their
    descriptor not yet released: asyncio closes a socket one turn of the loop later)."""

    def __init__(self, bound: int, storm: Storm) -> None:
        self.bound, self.storm = bound, storm
        self.idle: dict[Conn, None] = {}  # insertion order: oldest first
        self.busy: set[Conn] = set()
        self.closing: set[Conn] = set()
        self.on_released: Callable[[], None] | None = None  # the door waits for descriptors

    def __len__(self) -> int:
        return len(self.idle) + len(self.busy)

    def descriptors(self) -> int:
        return len(self) + len(self.closing)

    def admit(self, conn: Conn) -> bool:
        """Room for a new connection: the oldest idle one closed if needed; False (refuse it)
        when every connection holds a request."""
        if len(self) >= self.bound:
            if not self.idle:
                self.storm.note("refused")
                return False
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            oldest.evicted = True
            self.closing.add(oldest)
            oldest.abort()
            self.storm.note("idle")
        self.idle[conn] = None
        return True

    def started(self, conn: Conn) -> bool:
        """Its head came: a request, no longer to be closed for room (False: it was closed for
        room already)."""
        if conn not in self.idle:
            return False
        del self.idle[conn]
        self.busy.add(conn)
        return True

    def released(self, conn: Conn) -> None:
        """Its descriptor is closed."""
        self.idle.pop(conn, None)
        self.busy.discard(conn)
        self.closing.discard(conn)
        if self.on_released is not None:
            self.on_released()


class Door:
    """The accept loop of the waker's stream socket, instead of asyncio's: each connection is
    admitted (`Connections.admit`) as it is accepted, before the next one, and accepting waits
    while BOUND + CLOSING_MAX descriptors are taken, so the connections never hold more than
    that many (asyncio's server accepts a whole backlog before its handlers see one). accept()
    without a free descriptor: counted in the storm, the door rests RETRY_S."""

    CLOSING_MAX = 128
    RETRY_S = 0.1

    def __init__(
        self,
        sock: socket.socket,
        connections: Connections,
        serve: Callable[[Conn], Coroutine[Any, Any, None]],
    ) -> None:
        self.sock, self.connections, self.serve = sock, connections, serve
        self.loop = asyncio.get_running_loop()
        self.reading = False
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        connections.on_released = self._resume

    def start(self) -> None:
        self._resume()

    def _resume(self) -> None:
        if not self.reading and not self.closed and self._room():
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self.reading = True

    def _pause(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.sock.fileno())
            self.reading = False

    def _room(self) -> bool:
        return self.connections.descriptors() < self.connections.bound + self.CLOSING_MAX

    def _accept(self) -> None:
        for _ in range(self.CLOSING_MAX):
            if not self._room():
                self._pause()  # until a descriptor is released
                return
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.connections.storm.note("descriptors")
                    self._pause()
                    self.loop.call_later(self.RETRY_S, self._resume)
                return
            sock.setblocking(False)
            conn = Conn(sock)
            if not self.connections.admit(conn):
                sock.close()
                continue
            task = self.loop.create_task(self._run(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(self, conn: Conn) -> None:
        try:
            await self.serve(conn)
        finally:
            if conn.writer is not None:
                conn.writer.transport.abort()
                with contextlib.suppress(Exception):
                    await conn.writer.wait_closed()
            else:
                conn.sock.close()
            self.connections.released(conn)

    def close(self) -> None:
        self.closed = True
        self._pause()
        self.sock.close()
