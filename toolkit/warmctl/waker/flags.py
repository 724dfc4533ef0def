"""The files of one instance the waker reads (the gate's flags) and creates (its two requests to
systemd), all in the gate folder (warmctl.facts: wakeable, gate, warming, draining, wake_request,
sleep_request)."""

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

    def paths(self) -> list[Path]:
        every = (self.wakeable, self.closed, self.warming, self.draining, self.wake_request)
        return [*every, *([self.sleep_request] if self.sleep_request else [])]

    def awake(self) -> bool:
        """Serving, and nothing is about to change that: no flag, no sleep asked for."""
        busy = [self.wakeable, self.closed, self.warming, self.draining, self.sleep_request]
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
