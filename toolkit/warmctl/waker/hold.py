"""Hold the requests that reach an instance asleep-and-wakeable, wake it once, release them.

nginx sees the wakeable flag and asks the waker (its `auth_request` subrequest, `http.py`)
before it passes a request to vLLM. `Hold.hold` answers at once when there is nothing to wait
for, else keeps the request until one of:

- woke      the wakeable, closed and warming flags are all gone: the wake (GPU: `warmctl wake
            --gate CLOSED --gate WAKEABLE`; CPU: the unit's start, whose warmup removes the flag)
            is done. Every held request is released, in the order they came.
- failed    the wake-request file is gone while the instance is still wakeable-asleep: the wake
            service ended (its ExecStopPost removes the file whatever the result) and the wake
            did not happen. Every held request is refused, and so is every new one for
            `failed_backoff` seconds (no wake storm); the next one after that asks again.
- refused   the closed flag appeared: a window that refuses requests put the instance to sleep.
- timeout   this request was held `hold` seconds: refused; the wake goes on for the others.
- gone      nginx closed the connection (it gave up on the client).

The first request of a wake creates the wake-request file (a path unit starts the wake
service); the ones that come meanwhile wait for the same wake. A wake that succeeds removes the
flag before its service ends and the request file goes, so reading the request file first and
then the flag tells a failed wake from a done one.

The same hold carries a single host's requests across a restart or relaunch (docs/LAUNCHER.md):
while the holding flag exists (the drain before it creates it, the end of it removes it, done or
failed) nginx sends /v1/* here too, and nothing is asked for: the requests wait for the flag to
go (and the warming one). Then one `GET /health` of the server decides for all of them:

- relaunched        it answers: released, served by the new server (or by the old one, which a
                    relaunch that refused its launch file left serving);
- relaunch-failed   it does not: refused, 503 (nothing serves: the unit failed);
- relaunch-timeout  this request was held `hold` seconds: refused; the others wait on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from warmctl.sleepwake.gate import Flags, ask
from warmctl.terminal.output import error_line, info_line, warning_line
from warmctl.waker.metrics import WakerMetrics

# While something is held the flags are polled this often: systemd's services create and remove
# them (no event reaches this process; the standard library has no inotify), a held client
# waits on it, and 4 stat() calls every 25 ms cost nothing. Nothing is polled when nothing is
# held.
POLL_S = 0.025
PASS = ("awake", "woke", "relaunched")  # nginx lets these through (204); others: 403
# the gate's states (warmctl.sleepwake.gate) a request is held in; asleep (the closed flag)
# refuses, any
# other (draining: nginx's business) passes
HELD = ("wakeable", "holding", "warming")


@dataclass(eq=False)
class Holder:
    arrived: float
    deadline: float
    done: asyncio.Future[str] = field(repr=False)
    relaunch: bool = False  # held across a restart or relaunch (the holding flag), not a wake


class Hold:
    def __init__(
        self,
        name: str,
        flags: Flags,
        hold_s: float,
        failed_backoff_s: float,
        metrics: WakerMetrics,
        clock: Callable[[], float] = time.monotonic,
        on_asked: Callable[[], None] | None = None,
        serving: Callable[[], bool] | None = None,
    ) -> None:
        self.name, self.flags, self.hold_s = name, flags, hold_s
        # after a restart or relaunch: does the server answer? (None: assume it does)
        self.serving = serving
        self.relaunch_seen = False  # the holding flag existed since the last outcome
        # called when this process created the wake-request file (the waker's own wake, GPU)
        self.on_asked = on_asked
        self.failed_backoff_s, self.metrics, self.clock = failed_backoff_s, metrics, clock
        self.queue: deque[Holder] = deque()
        self.wake_seen = False  # the wake-request file existed since the last outcome
        self.failed_until = 0.0  # refuse at once until then (clock)
        self.timeout_logged = False  # one timeout line and count per wake, not per request
        self._poller: asyncio.Task[None] | None = None

    # -- one request ----------------------------------------------------------------------
    async def hold(self, gone: Callable[[], Awaitable[Any]] | None = None) -> tuple[str, float]:
        """(outcome, seconds held) for one request nginx asks about; `gone()` completes when
        nginx closed the connection (awaited only while the request is held)."""
        now = self.clock()
        # the gate's state (warmctl.sleepwake.gate: the proxy's precedence); a holding flag older
        # than
        # the hold's bound holds no new request (a restart whose end never removed it, e.g. a
        # hand's `systemctl reload` that failed): they pass on
        state = self.flags.state(hold_max_age=self.hold_s)
        if state == "asleep":
            return self._count("refused", 0.0)
        if state not in HELD:
            return "awake", 0.0  # woke between nginx's look at the flag and ours
        wakeable, holding = state == "wakeable", state == "holding"
        if wakeable and now < self.failed_until:
            return self._count("failed", 0.0)
        if not self.queue:
            self.relaunch_seen = False  # a new hold (a timed-out one may have left it set)
        future = asyncio.get_running_loop().create_future()
        holder = Holder(now, now + self.hold_s, future, relaunch=holding and not wakeable)
        if holder.relaunch and not self.relaunch_seen:
            self.relaunch_seen = True
            info_line(f"{self.name}: a restart or relaunch runs: holding requests until it ends")
        self.queue.append(holder)
        self.metrics.holding.set(len(self.queue))
        if wakeable and not self._ask_wake():
            return self._count("failed", 0.0)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        waits: set[asyncio.Future[Any]] = {holder.done}
        watcher = asyncio.ensure_future(gone()) if gone is not None else None
        if watcher is not None:
            waits.add(watcher)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
        if not holder.done.done():  # nginx went away first
            self._finish(holder, "gone")
        return self._count(holder.done.result(), self.clock() - holder.arrived)

    def _count(self, outcome: str, seconds: float) -> tuple[str, float]:
        self.metrics.held_one(outcome, seconds)
        return outcome, seconds

    def _ask_wake(self) -> bool:
        """The wake-request file exists (this call may have created it); False when it could
        not be written (every held request is refused then)."""
        try:
            created = ask(self.flags.wake_request, f"wake asked by the waker ({self.name})")
        except OSError as err:
            error_line(
                f"{self.name}: cannot ask for a wake: {self.flags.wake_request}: "
                f"{err.strerror or err}"
            )
            self.metrics.failed_wakes.labels("ask").inc()
            self._finish_all("failed")
            return False
        self.wake_seen = True
        if created:
            self.timeout_logged = False
            self.metrics.wakes_asked.inc()
            self.metrics.changed()
            info_line(
                f"{self.name}: a request reached it asleep: asked for a wake "
                f"({self.flags.wake_request})"
            )
            if self.on_asked is not None:
                self.on_asked()
        return True

    # -- all of them ----------------------------------------------------------------------
    async def _poll(self) -> None:
        while self.queue:
            await asyncio.sleep(POLL_S)
            if self.step() == "ended":  # the restart or relaunch ended: is a server there?
                ok = True
                if self.serving is not None:
                    ok = await asyncio.get_running_loop().run_in_executor(None, self.serving)
                self.relaunched(ok)

    def relaunched(self, serving: bool) -> None:
        """The holding flag is gone: release every held request (a server answers) or refuse
        them (none does: the restart or relaunch failed)."""
        if not self.queue:
            return
        held = self.clock() - self.queue[0].arrived
        if serving:
            info_line(
                f"{self.name}: the restart or relaunch ended: {len(self.queue)} held requests "
                f"released (the longest held {held:.2f} s)"
            )
            self._finish_all("relaunched")
        else:
            error_line(
                f"{self.name}: the restart or relaunch ended and no server answers: "
                f"{len(self.queue)} held requests refused (503 relaunch-failed)"
            )
            self._finish_all("relaunch-failed")

    def step(self) -> str | None:
        """Look at the files once and settle what they decide; "ended" when a restart or
        relaunch the requests were held for ended (the caller asks the server, `relaunched`)."""
        if not self.queue:
            return None
        now = self.clock()
        # the request file before the flags: a wake that succeeded removed the flag first
        requested = self.flags.wake_request.exists()
        state = self.flags.state()
        if state == "asleep":
            info_line(
                f"{self.name}: put to sleep by a window that refuses requests: "
                f"{len(self.queue)} held requests refused"
            )
            self._finish_all("refused")
            return None
        wakeable = state == "wakeable"
        self.relaunch_seen = self.relaunch_seen or state == "holding"
        if state not in HELD:
            if self.relaunch_seen:
                return "ended"
            held = now - self.queue[0].arrived
            info_line(
                f"{self.name}: awake: {len(self.queue)} held requests released "
                f"(the longest held {held:.2f} s)"
            )
            self._finish_all("woke")
            return None
        if wakeable and requested:
            self.wake_seen = True
        elif wakeable and self.wake_seen:
            self.failed_until = now + self.failed_backoff_s
            self.metrics.failed_wakes.labels("failed").inc()
            error_line(
                f"{self.name}: the wake failed (its request {self.flags.wake_request} "
                f"is gone, the instance still asleep): {len(self.queue)} held requests "
                f"refused, and new ones for {self.failed_backoff_s:g} s"
            )
            self._finish_all("failed")
            return None
        elif wakeable and not self._ask_wake():  # asleep again before the queue emptied
            return None
        late = [h for h in self.queue if now >= h.deadline]
        if late:
            if not self.timeout_logged:
                self.timeout_logged = True
                if any(not h.relaunch for h in late):
                    self.metrics.failed_wakes.labels("timeout").inc()
                warning_line(
                    f"{self.name}: not awake after {self.hold_s:g} s (--hold): "
                    "held requests refused as they reach it; the wake, restart or relaunch "
                    "goes on"
                )
            for h in late:
                self._finish(h, "relaunch-timeout" if h.relaunch else "timeout")
        return None

    def _finish(self, holder: Holder, outcome: str) -> None:
        if not holder.done.done():
            holder.done.set_result(outcome)
        with contextlib.suppress(ValueError):
            self.queue.remove(holder)
        self.metrics.holding.set(len(self.queue))

    def _finish_all(self, outcome: str) -> None:
        """Settle every held request, in the order they came (their answers go out in that
        order: the futures' callbacks run first in, first out)."""
        if outcome not in ("timeout", "relaunch-timeout"):
            self.wake_seen = False
            self.relaunch_seen = False
            self.timeout_logged = False
        while self.queue:
            self._finish(self.queue[0], outcome)

    def shutdown(self) -> None:
        """The waker stops: nothing it holds will be released by it."""
        if self.queue:
            warning_line(f"{self.name}: stopping: {len(self.queue)} held requests refused")
        self._finish_all("failed")

    def state(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "holding": len(self.queue),
            "wake_asked": self.wake_seen,
            "relaunch": self.relaunch_seen,
            "refusing_s": max(0.0, self.failed_until - now),
        }
