"""The waker's own wake, for an instance in vLLM sleep mode (GPU hosts).

A CPU host's wake is a start of the unit, which only systemd may do: the waker creates the
wake-request file and a path unit runs the wake service. A sleep-mode wake is HTTP to vLLM on
loopback plus the gate's files, all the service user's to do; started as a service it would
pay a Python start and imports of its own (and the window check's) before the ~0.2 s wake
itself, all of it inside the first request's hold. So the waker runs exactly what that service
would run, `warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request ...` (the same
output check, light warmup, gate, metrics, journal lines), in a thread of its own process, with
warmctl already imported. The wake-request file is created and removed around it as the path
unit's service would, so the hold reads the outcome the same way (flag gone: woke; file gone,
flag still there: failed). The gate's lock (`warmctl.gate.instance_lock`, taken by `--gate`)
keeps it from overlapping a sleep of the same instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from warmctl.output import error_line, info_line


def run_wake(argv: list[str]) -> int:
    """`warmctl ARGV` in this thread; its exit status."""
    import click

    from warmctl.cli import cli

    try:
        cli.main(args=argv, prog_name="warmctl", standalone_mode=False)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except Exception as err:
        error_line(f"the wake crashed: {err.__class__.__name__}: {err}")
        return 1
    return 0


class LocalWake:
    """Runs the wake when the hold asked for one (its request file just created)."""

    def __init__(self, name: str, argv: list[str], request_file: Path) -> None:
        self.name, self.argv, self.request_file = name, argv, request_file
        self.task: asyncio.Task[None] | None = None
        # warmctl's wake path imported now, not inside the first request's hold
        import warmctl.commands.wake
        import warmctl.outputcheck
        import warmctl.sleepwake  # noqa: F401

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        t0 = time.monotonic()
        try:
            code = await asyncio.to_thread(run_wake, self.argv)
        finally:
            # as the wake service's ExecStopPost: the hold reads the outcome from the flags
            with contextlib.suppress(FileNotFoundError):
                self.request_file.unlink()
        took = time.monotonic() - t0
        if code == 0:
            info_line(f"{self.name}: woken by this waker in {took:.2f} s")
        else:
            error_line(f"{self.name}: the wake failed (exit {code}, {took:.2f} s)")
