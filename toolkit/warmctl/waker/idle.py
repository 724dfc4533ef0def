"""Idle sleep: ask for a sleep once the instance served nothing for `idle_after` seconds.

Idle means, as the proxy sees it: no request of the instance's /v1/ location finished for that
long, and none is in flight now.

- Finished: nginx writes the access log line of every /v1/ request vLLM answered (`if=
  $upstream_addr`: not the 401s nor the gate's own 503s) to the activity socket as a syslog
  datagram (`access_log syslog:server=unix:...`); each datagram is activity. /health and /metrics
  polls are not logged there, so a load balancer's or Prometheus' polls keep nobody awake.
- In flight: a stream that lasts longer than `idle_after` has no log line yet, so before asking
  for a sleep the waker reads vLLM's `/load` (the unit passes `--enable-server-load-tracking`:
  the API server counts a request from its handler's start to a stream's last byte). More than
  0 counts as activity now. `/load` not answering (stopped, restarting): no sleep, one line.

Only an awake instance is watched: no flag (wakeable, closed, warming, draining) and no sleep
asked for yet; the clock starts again whenever it becomes awake (a wake, a restart, a window's
wake). The sleep itself is systemd's (`vllm-NAME-sleep-idle.path` runs `warmctl sleep --gate
WAKEABLE --cause idle`), with the same drain, gate and output check as a window's: a request
that comes in the moment the sleep is asked for is drained, not cut.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from warmctl.errors import WarmctlError
from warmctl.sleepwake.gate import Flags, ask
from warmctl.terminal.output import error_line, info_line, warning_line
from warmctl.waker.metrics import WakerMetrics


class Activity:
    """The activity socket: every datagram is one request the proxy passed to vLLM.

    Read in bursts: once it is readable, every datagram waiting is read, the activity noted
    once, and the socket left alone for `pause` seconds. A busy instance then costs the waker a
    few wake-ups a second, not one per request (its CPU is the engine's host's); what the kernel
    drops meanwhile (a full queue: net.unix.max_dgram_qlen) only tells what is already known,
    and nginx drops it without a word (its syslog socket is non-blocking)."""

    def __init__(
        self, sock: socket.socket, on_activity: Callable[[int], None], pause: float
    ) -> None:
        self.sock, self.on_activity, self.pause = sock, on_activity, pause
        self.loop = asyncio.get_running_loop()
        self._later: asyncio.TimerHandle | None = None
        self.loop.add_reader(sock.fileno(), self._ready)

    def _ready(self) -> None:
        count = 0
        while True:
            try:
                self.sock.recv(65536)
            except OSError:  # BlockingIOError: nothing more waiting
                break
            count += 1
        if count:
            self.on_activity(count)
        self.loop.remove_reader(self.sock.fileno())
        self._later = self.loop.call_later(
            self.pause, self.loop.add_reader, self.sock.fileno(), self._ready
        )

    def close(self) -> None:
        if self._later is not None:
            self._later.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class IdleWatch:
    def __init__(
        self,
        name: str,
        flags: Flags,
        idle_after: float,
        load: Callable[[], int | None],
        metrics: WakerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if flags.sleep_request is None:
            raise ValueError("idle sleep needs the sleep-request file")
        self.name, self.flags, self.idle_after, self.load = name, flags, idle_after, load
        self.metrics, self.clock = metrics, clock
        self.sleep_request = flags.sleep_request
        self.last = clock()  # the last activity (or when the instance became awake)
        self.activities = 0  # datagrams read
        self.asleep = False  # not awake at the last look
        self.load_problem: str | None = None  # why /load did not answer (said once)
        # how often the flags are looked at: a wake is seen within a second (a tenth of a
        # short idle_after), so the idle clock starts again from it
        self.interval = min(1.0, max(0.02, idle_after / 10))
        # how long the activity socket is left alone after a read (Activity)
        self.pause = min(0.25, idle_after / 20)

    def activity(self, count: int = 1) -> None:
        self.last = self.clock()
        self.activities += count
        self.metrics.activity()

    async def run(self) -> None:
        while True:
            await self.check()

    async def check(self) -> None:
        """One look: sleeps until the next thing worth looking at."""
        if not self.flags.awake():
            self.asleep = True
            await asyncio.sleep(self.interval)
            return
        if self.asleep:  # awake again: its idle time starts now
            self.asleep = False
            self.last = self.clock()
        left = self.last + self.idle_after - self.clock()
        if left > 0:
            await asyncio.sleep(min(self.interval, left))
            return
        seen = self.last
        in_flight = await self._in_flight()
        if in_flight is None:
            await asyncio.sleep(self.interval)
            return
        if in_flight > 0:  # a request in flight is activity, now
            self.last = self.clock()
            return
        if self.last != seen or not self.flags.awake():  # something came while /load answered
            return
        self._ask(self.clock() - seen)

    async def _in_flight(self) -> int | None:
        try:
            value = await asyncio.to_thread(self.load)
        except WarmctlError as err:
            problem = err.message
        else:
            problem = None if value is not None else "vLLM has no /load route"
        if problem is not None:
            if self.load_problem is None:
                warning_line(
                    f"{self.name}: idle for {self.idle_after:g} s but cannot tell "
                    f"what is in flight ({problem}): no idle sleep until /load "
                    "answers"
                )
            self.load_problem = problem
            return None
        if self.load_problem is not None:
            info_line(f"{self.name}: /load answers again")
            self.load_problem = None
        return value

    def _ask(self, idle_s: float) -> None:
        try:
            ask(self.sleep_request, f"idle sleep asked by the waker ({self.name})")
        except OSError as err:
            error_line(
                f"{self.name}: cannot ask for an idle sleep: {self.sleep_request}: "
                f"{err.strerror or err}"
            )
            self.last = self.clock()  # try again after another idle_after, not in a loop
            return
        self.metrics.idle_sleeps_asked.inc()
        self.metrics.changed()
        info_line(
            f"{self.name}: no request for {idle_s:.0f} s and none in flight: asked for an "
            f"idle sleep ({self.sleep_request})"
        )
