"""Relaunch a server run by the pre-imported launcher (`warmctl/launcher/vllm_launch.py`):
SIGHUP to the launcher (systemd's $MAINPID), wait until the old server is gone and a new one
was forked, then the caller warms it. The launcher stays; the unit never leaves `active`."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warmctl.errors import WarmctlError


@dataclass(frozen=True)
class Relaunched:
    pid: int  # the launcher
    old: tuple[int, ...]  # its server process(es) before
    new: tuple[int, ...]  # after
    seconds: float  # SIGHUP -> the new server forked


def children(pid: int, proc: Path = Path("/proc")) -> tuple[int, ...]:
    """The launcher's child processes (its server), from /proc (Linux)."""
    found: list[int] = []
    task_dir = proc / str(pid) / "task"
    try:
        tasks = list(task_dir.iterdir())
    except FileNotFoundError:
        raise WarmctlError(f"process {pid} is not running", kind="input") from None
    except OSError as exc:
        raise WarmctlError(f"cannot read {task_dir}: {exc.strerror}", kind="input") from None
    for task in tasks:
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return tuple(sorted(set(found)))


def is_launcher(pid: int, proc: Path = Path("/proc")) -> bool:
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"vllm_launch.py") for arg in cmdline[:3])


def relaunch(
    pid: int,
    timeout: float,
    *,
    proc: Path = Path("/proc"),
    on_wait: Callable[[str], None] | None = None,
    interval: float = 0.05,
) -> Relaunched:
    """SIGHUP the launcher `pid`; return once its old server is gone and a new one runs."""
    if pid <= 1:
        raise WarmctlError(f"--pid {pid}: not a launcher process", kind="input")
    if not is_launcher(pid, proc):
        raise WarmctlError(
            f"process {pid} is not the pre-imported launcher (vllm_launch.py): a unit without "
            "vllm_service_launcher restarts instead",
            kind="input",
        )
    old = children(pid, proc)
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise WarmctlError(f"process {pid} is not running", kind="input") from None
    except PermissionError:
        raise WarmctlError(f"not allowed to signal process {pid}", kind="input") from None
    deadline = t0 + timeout
    said = 0.0
    while True:
        now = children(pid, proc)
        if now and not set(now) & set(old):
            return Relaunched(pid, old, now, time.monotonic() - t0)
        if time.monotonic() > deadline:
            raise WarmctlError(
                f"launcher {pid}: no new server {timeout:.0f} s after SIGHUP "
                f"(server processes {', '.join(map(str, now)) or 'none'})"
            )
        if on_wait and time.monotonic() - said > 5:
            said = time.monotonic()
            on_wait(f"waiting for the old server ({', '.join(map(str, old))}) to stop")
        time.sleep(interval)
