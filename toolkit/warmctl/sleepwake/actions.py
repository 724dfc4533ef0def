"""Sleep, wake and drain of one instance as library calls: the server's steps
(warmctl.sleepwake.steps) behind its gate (warmctl.sleepwake.gate: the flag closed before and
opened after,
the instance's lock), with the output check. `warmctl sleep/wake/drain` are thin commands over
them; the waker calls `wake_instance` itself (warmctl.waker.wakehere).

Each call acts on one server and returns its report, or raises `WarmctlError`; `lines` of a
report are what the commands print for it (the waker logs the same)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.plan.instance import SLEEP_LEVEL
from warmctl.server.client import Client
from warmctl.sleepwake.gate import Gate, behind_closed_gate, instance_lock, open_after, sleep_reason
from warmctl.sleepwake.steps import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_OP_TIMEOUT,
    DrainResult,
    SleepReport,
    WakeReport,
    drain,
    drain_step,
    sleep,
    wake,
)

Say = Callable[[str], None]
# connection refused, engine dead or still loading: nothing in flight to wait for
NOT_SERVING_KINDS = ("refused", "server", "asleep", "timeout")


@dataclass(frozen=True)
class SleepOptions:
    level: int = SLEEP_LEVEL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    gate: str | None = None  # the flag closed before the drain (put back if the sleep fails)
    drain_only: bool = False  # servers that cannot sleep (CPU): drain, no POST /sleep
    check_file: str | None = None  # record the greedy answers there before /sleep
    cause: str = "manual"
    window: str | None = None  # the window that puts it to sleep (the flag's text)
    instance: str | None = None  # the instance's name (its lock), else the flag's
    op_timeout: float = DEFAULT_OP_TIMEOUT


@dataclass(frozen=True)
class WakeOptions:
    level: int | None = None  # None: what the server says, else the level-2 path
    run_warmup: bool = True
    warmup: dict[str, Any] = field(default_factory=lambda: {"light": True})
    gates: tuple[str, ...] = ()  # the flags opened once awake and warm
    check_file: str | None = None  # replay the answers recorded before the sleep
    tolerance: float = 0.05
    cause: str = "manual"
    instance: str | None = None
    op_timeout: float = DEFAULT_OP_TIMEOUT


def drain_only_report(
    client: Client,
    drain_timeout: float,
    poll_interval: float = 0.2,
    on_wait: Say | None = None,
) -> SleepReport:
    """For servers that cannot sleep (CPU): drain without POST /sleep; the caller then stops
    the unit. A drain that times out raises (kind `drain_timeout`)."""
    t0 = time.monotonic()
    report = SleepReport(target=client.target.label, level=0)
    client.health()
    drain_step(client, report, drain_timeout, poll_interval, on_wait, "not drained")
    report.total_s = time.monotonic() - t0
    return report


def _sleep_server(client: Client, opts: SleepOptions, say: Say | None) -> SleepReport:
    if opts.drain_only:
        return drain_only_report(client, opts.drain_timeout, on_wait=say)
    from warmctl.sleepwake.outputcheck import recorder

    return sleep(
        client,
        level=opts.level,
        drain_timeout=opts.drain_timeout,
        op_timeout=opts.op_timeout,
        before_sleep=recorder(client, Path(opts.check_file)) if opts.check_file else None,
        on_wait=say,
    )


def sleep_instance(
    client: Client, opts: SleepOptions, say: Say | None = None, on_lock_wait: Say | None = None
) -> SleepReport:
    """Close the gate (if any), drain, sleep; a failure puts the gate back and raises."""
    if opts.gate is None:
        return _sleep_server(client, opts, say)
    gate = Gate(opts.gate)
    reason = sleep_reason(opts.cause, None if opts.drain_only else opts.level, opts.window)
    with instance_lock([gate], on_lock_wait, opts.instance):
        return behind_closed_gate(gate, partial(_sleep_server, client, opts, say), reason)


def sleep_lines(r: SleepReport, drain_only: bool = False) -> list[str]:
    if drain_only:
        return [f"{r.target}: drained in {r.total_s:.2f} s, gate closed"]
    if r.already_asleep:
        return [f"{r.target}: already asleep, nothing to do"]
    steps = ", ".join(f"{s.name} {s.seconds:.2f} s" for s in r.steps)
    out = [f"{r.target}: asleep at level {r.level} ({steps})"]
    if r.output_check:
        c = r.output_check
        out.append(f"{r.target}: recorded {c['prompts']} greedy answers to {c['file']}")
    return out


def _wake_server(client: Client, opts: WakeOptions, tracker: Any) -> WakeReport:
    from warmctl.sleepwake.outputcheck import checker

    check = checker(client, Path(opts.check_file), opts.tolerance) if opts.check_file else None
    return wake(
        client,
        level=opts.level,
        run_warmup=opts.run_warmup,
        warmup_options={**opts.warmup, "progress": tracker},
        op_timeout=opts.op_timeout,
        on_step=(lambda step: tracker.say(f"waking: {step}")) if tracker else None,
        check=check,
    )


def wake_instance(
    client: Client, opts: WakeOptions, tracker: Any = None, on_lock_wait: Say | None = None
) -> WakeReport:
    """Wake (reloading weights after level 2), check, warm; then open the gates. A failure
    leaves them closed and raises. `tracker`: the warmup's progress (warmctl.terminal.waits)."""
    gates = [Gate(p) for p in opts.gates]
    with instance_lock(gates, on_lock_wait, opts.instance):
        return open_after(gates, partial(_wake_server, client, opts, tracker))


def wake_lines(r: WakeReport) -> list[str]:
    steps = ", ".join(f"{s.name} {s.seconds:.2f} s" for s in r.steps) or "nothing to do"
    out = [
        f"{r.target}: already awake ({steps})"
        if r.already_awake
        else f"{r.target}: awake after level {r.level} ({r.level_source}): {steps}"
    ]
    if r.output_check:
        c = r.output_check
        if c["status"] == "passed":
            diff = c.get("max_logprob_diff")
            out.append(
                f"{r.target}: outputs checked: {c['prompts']} greedy answers as before "
                f"the sleep ({c['seconds']:.2f} s"
                + (f", logprobs within {diff:.2g})" if diff is not None else ")")
            )
        else:
            out.append(f"{r.target}: outputs NOT checked: {c['detail']} ({c['file']})")
    if r.warmup:
        w = r.warmup
        ramp = ",".join(map(str, w.batch_sizes)) or "none"
        out.append(
            f"{r.target}: warmed ({w.mode}) with {w.requests} requests in "
            f"{w.total_s:.1f} s (batch sizes {ramp}, chat {'yes' if w.chat else 'no'})"
        )
    return out


@dataclass
class DrainReport:
    """`warmctl drain`: the gate closed as draining, then the wait for the requests in flight.
    `serving` False: the server was not answering (stopped, starting, dead), nothing to wait for."""

    target: str
    gate: str
    serving: bool
    drain: DrainResult | None
    total_s: float

    @property
    def drained(self) -> bool:
        return self.drain is None or self.drain.drained

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "gate": self.gate,
            "serving": self.serving,
            "drained": self.drained,
            "drain": self.drain.to_dict() if self.drain else None,
            "total_s": self.total_s,
        }


def drain_out_of_rotation(
    client: Client, gate: Gate, drain_timeout: float, poll_interval: float = 0.2
) -> DrainReport:
    """Close `gate` (the draining flag), then wait up to `drain_timeout` for the requests in
    flight (the same wait as a sleep's). The gate stays closed either way: the caller restarts,
    verifies, then opens it. A server that does not answer is not waited for."""
    t0 = time.monotonic()
    gate.close("draining")
    try:
        client.health()
    except WarmctlError as err:
        if err.kind not in NOT_SERVING_KINDS:
            raise
        return DrainReport(client.target.label, str(gate.path), False, None, time.monotonic() - t0)
    result = drain(client, drain_timeout, poll_interval)
    return DrainReport(client.target.label, str(gate.path), True, result, time.monotonic() - t0)


def drain_lines(r: DrainReport, drain_timeout: float) -> list[str]:
    if not r.serving:
        return [f"{r.target}: not serving, nothing to drain; gate {r.gate} closed"]
    d = r.drain
    assert d is not None
    if d.drained:
        return [f"{r.target}: drained in {d.seconds:.2f} s; gate {r.gate} closed"]
    return [
        f"{r.target}: NOT drained after --drain-timeout {drain_timeout:g} s: still "
        f"{d.still()}; gate {r.gate} closed"
    ]
