"""Idle sleep's detector (the trigger kind `idle_sleep`, warmctl.sleepwake.triggers): ask for a
sleep once the instance served nothing for `idle_after` seconds (its setting `after`).

Idle means, as the proxy sees it: no request of the instance's /v1/ location finished for that
long, and none is in flight now.

- Finished: nginx writes the access log line of every /v1/ request vLLM answered (`if=
  $upstream_addr`: not the 401s nor the gate's own 503s) to the activity socket as a syslog
  datagram (`access_log syslog:server=unix:...`); each datagram is activity
  (warmctl.waker.detector.Activity). /health and /metrics
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
import time
from collections.abc import Callable, Mapping
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.sleepwake.gate import ask
from warmctl.terminal.output import error_line, info_line, warning_line
from warmctl.waker.detector import Watch


class IdleWatch:
    """The idle sleep's detector (warmctl.waker.detector.Detector)."""

    def __init__(self, watch: Watch, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.flags, self.load = watch.name, watch.flags, watch.load
        self.idle_after = float(watch.settings["after"])
        self.metrics, self.clock = watch.metrics, clock
        self.sleep_request = watch.request
        self.last = clock()  # the last activity (or when the instance became awake)
        self.activities = 0  # datagrams read
        self.asleep = False  # not awake at the last look
        self.load_problem: str | None = None  # why /load did not answer (said once)
        # how often the flags are looked at: a wake is seen within a second (a tenth of a
        # short idle_after), so the idle clock starts again from it
        self.interval = min(1.0, max(0.02, self.idle_after / 10))
        # how long the activity socket is left alone after a read (Activity)
        self.pause = min(0.25, self.idle_after / 20)

    @classmethod
    def problems(cls, settings: Mapping[str, Any]) -> list[str]:
        after = settings.get("after")
        if isinstance(after, bool) or not isinstance(after, (int, float)) or after <= 0:
            return [f"after: {after!r} where a number of seconds above 0 goes"]
        return []

    def state(self) -> dict[str, Any]:
        return {"idle_s": round(self.clock() - self.last, 3), "idle_after": self.idle_after,
                "activities": self.activities}  # fmt: skip

    def summary(self) -> str:
        return f"idle sleep after {self.idle_after:g} s"

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
