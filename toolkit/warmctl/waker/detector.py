"""A sleep trigger's detector in the waker: what the waker gives it (`Watch`), what it does
(`Detector`), how the waker finds it from its kind (warmctl.sleepwake.triggers: `detector`,
"module:Class") and the proxy's activity log a kind may read (`Activity`).

A detector runs in the waker's event loop until the waker stops. When its cause happens it
creates its request file (`warmctl.sleepwake.gate.ask(watch.request, ...)`): a path unit starts
the trigger's service, which sleeps (or wakes) the instance behind its gate and lock and removes
the file when it ends. It asks for nothing while the instance is not awake
(`watch.flags.awake()`: no flag, no sleep asked for).
"""

from __future__ import annotations

import asyncio
import importlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from warmctl.sleepwake.gate import Flags
from warmctl.sleepwake.triggers import TriggerKind
from warmctl.waker.metrics import WakerMetrics


@dataclass(frozen=True)
class Trigger:
    """A trigger in the waker's configuration: its kind (by its cause), its request file and
    the settings its detector reads."""

    kind: TriggerKind
    request: Path
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class Watch:
    """What the waker gives a detector."""

    name: str  # the instance (log lines)
    flags: Flags  # its gate's flags and the triggers' request files
    request: Path  # this trigger's request file: created to ask for its sleep or wake
    settings: Mapping[str, Any]  # its settings (the kind's `watched`, from the plan)
    load: Callable[[], int | None]  # vLLM's /load: requests in flight (None: no such route)
    metrics: WakerMetrics


class Detector(Protocol):
    """What the waker runs for a trigger: built from its Watch, `run` until cancelled."""

    # after a read of the activity socket, how long it is left alone (kinds with `activity`)
    pause: float

    def __init__(self, watch: Watch) -> None: ...

    @classmethod
    def problems(cls, settings: Mapping[str, Any]) -> list[str]:
        """What is wrong with its settings in the waker's configuration (none: [])."""
        ...

    async def run(self) -> None: ...

    def activity(self, count: int) -> None:
        """`count` requests finished at the proxy (kinds with `activity`)."""
        ...

    def state(self) -> dict[str, Any]:
        """Its part of the waker's state (the door's GET /state)."""
        ...

    def summary(self) -> str:
        """Its part of the waker's start line ("idle sleep after 900 s")."""
        ...


def detector_class(kind: TriggerKind) -> type[Detector]:
    """The detector of a trigger kind, imported by its name."""
    module, _, name = kind.detector.partition(":")
    found: type[Detector] = getattr(importlib.import_module(module), name)
    return found


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
