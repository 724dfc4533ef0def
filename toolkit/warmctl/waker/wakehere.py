"""The waker's own wake, for an instance in vLLM sleep mode (GPU hosts).

A CPU host's wake is a start of the unit, which only systemd may do: the waker creates the
wake-request file and a path unit runs the wake service. A sleep-mode wake is HTTP to vLLM on
loopback plus the gate's files, all the service user's to do; started as a service it would
pay a Python start and imports of its own (and the window check's) before the ~0.2 s wake
itself, all of it inside the first request's hold. So the waker calls the library's wake
(`warmctl.sleepwake.actions.wake_instance`: the same output check, light warmup, gate, as
`warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request` does) in a thread of its own
process, and writes the same metrics and journal lines. The wake-request file is created and
removed around it as the path unit's service would, so the hold reads the outcome the same way
(flag gone: woke; file gone, flag still there: failed). The gate's lock
(`warmctl.sleepwake.gate.instance_lock`) keeps it from overlapping a sleep of the same instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from warmctl.terminal.output import error_line, info_line


@dataclass(frozen=True)
class WakeHere:
    """What the waker's own wake acts on."""

    target: str  # HOST:PORT of vLLM on this host
    gates: tuple[str, ...]  # the flags opened once awake (closed, wakeable)
    check_file: str | None = None  # the answers recorded before the sleep
    textfile_dir: str | None = None
    instance: str | None = None


def run_wake(spec: WakeHere) -> int:
    """One wake, as `warmctl wake` with `--cause request` does it: its lines (or its error) on
    the log, its metrics written; 0 awake, else 2 (1: it crashed)."""
    from warmctl.errors import WarmctlError
    from warmctl.observe.textfile import write_metrics
    from warmctl.server.client import DEFAULT_TIMEOUT, Client
    from warmctl.server.target import parse_target
    from warmctl.sleepwake.actions import WakeOptions, wake_instance, wake_lines
    from warmctl.sleepwake.steps import DEFAULT_OP_TIMEOUT
    from warmctl.terminal.output import console, lock_wait_line

    target = parse_target(spec.target)
    options = WakeOptions(
        # `warmctl wake`'s warmup defaults: light, a server that answers is not waited for
        warmup={"light": True, "wait_start": False, "ready_timeout": 1800.0},
        gates=spec.gates,
        check_file=spec.check_file,
        cause="request",
        instance=spec.instance,
        op_timeout=max(DEFAULT_TIMEOUT, DEFAULT_OP_TIMEOUT),
    )
    client = Client(target, os.environ.get("VLLM_API_KEY"), DEFAULT_TIMEOUT)
    try:
        result: object = wake_instance(client, options, None, lock_wait_line(target.label))
    except WarmctlError as err:
        result = err
    except Exception as err:
        error_line(f"the wake crashed: {err.__class__.__name__}: {err}")
        return 1
    code = write_metrics(spec.textfile_dir, spec.instance, "wake", [target], [result],
                         cause="request")  # fmt: skip
    if isinstance(result, WarmctlError):
        error_line(str(result))
        return 2
    for line in wake_lines(result):  # type: ignore[arg-type]
        console().print(line)
    return code


class LocalWake:
    """Runs the wake when the hold asked for one (its request file just created)."""

    def __init__(self, name: str, spec: WakeHere, request_file: Path) -> None:
        self.name, self.spec, self.request_file = name, spec, request_file
        self.task: asyncio.Task[None] | None = None
        # warmctl's wake path imported now, not inside the first request's hold

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        t0 = time.monotonic()
        try:
            code = await asyncio.to_thread(run_wake, self.spec)
        finally:
            # as the wake service's ExecStopPost: the hold reads the outcome from the flags
            with contextlib.suppress(FileNotFoundError):
                self.request_file.unlink()
        took = time.monotonic() - t0
        if code == 0:
            info_line(f"{self.name}: woken by this waker in {took:.2f} s")
        else:
            error_line(f"{self.name}: the wake failed (exit {code}, {took:.2f} s)")
