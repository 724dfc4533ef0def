"""The files of one instance the waker reads (the gate's flags) and creates (its two requests to
systemd), all in the gate folder (warmctl.facts: wakeable, gate, warming, draining, holding,
wake_request, sleep_request)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Flags:
    wakeable: Path  # asleep, a request wakes it (the proxy sends its requests to the waker)
    closed: Path  # asleep, requests refused (a window whose on_request is refuse)
    warming: Path  # the unit's warmup runs
    draining: Path  # out of rotation for a restart
    wake_request: Path  # the waker asks systemd for a wake (vllm-NAME-wake-request.path)
    sleep_request: Path | None  # ... for an idle sleep (None: no idle sleep)
    # a restart or relaunch runs: requests are held until it is gone (None: not held, the
    # instance is behind a load balancer or the waker was started without --holding)
    holding: Path | None = None

    def paths(self) -> list[Path]:
        every = (self.wakeable, self.closed, self.warming, self.draining, self.wake_request)
        optional = [p for p in (self.sleep_request, self.holding) if p is not None]
        return [*every, *optional]

    def is_holding(self, max_age: float | None = None) -> bool:
        """The holding flag exists (and, with `max_age`, was created less than that many
        seconds ago: a restart or relaunch whose end never removed it, e.g. a hand's
        `systemctl reload` that failed, stops holding requests after the hold's bound)."""
        if self.holding is None:
            return False
        try:
            mtime = self.holding.stat().st_mtime
        except OSError:
            return False
        return max_age is None or time.time() - mtime < max_age

    def awake(self) -> bool:
        """Serving, and nothing is about to change that: no flag, no sleep asked for."""
        busy = [self.wakeable, self.closed, self.warming, self.draining, self.sleep_request,
                self.holding]  # fmt: skip
        return not any(p is not None and p.exists() for p in busy)


def ask(path: Path, what: str) -> bool:
    """Create the request file `path` unless it exists; True when this call created it.

    Atomic both ways: the text is written to a temporary file first and linked to `path`
    (`link` fails when `path` exists), so a path unit never sees half a file and two asks never
    replace each other (a replaced file would not start the unit again). OSError propagates."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(f"{what} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        tmp.chmod(0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)
