"""Sleep and wake a vLLM server safely.

Sleep drains first: vLLM's `/sleep` aborts or races requests in flight (vllm-project/vllm#45520,
#45268), so we wait until `vllm:num_requests_running` + `vllm:num_requests_waiting` is 0, and so
is the API server's own count of requests in flight (`/load`, see `drain`), before
`POST /sleep?level=N`, then confirm with `/is_sleeping`. Wake after level 2 must reload weights:
`/wake_up?tags=weights`, `/collective_rpc {"method": "reload_weights"}`, `/wake_up?tags=kv_cache`,
`/reset_prefix_cache`; then the warmup runs so the first user request after a wake is fast.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client, device_from_config
from warmctl.warmth.warmup import WarmupReport, warmup

DEFAULT_DRAIN_TIMEOUT = 60.0
DEFAULT_OP_TIMEOUT = 600.0  # offloading or reloading big weights can take minutes


@dataclass
class Step:
    name: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds}


@dataclass
class DrainResult:
    drained: bool
    seconds: float
    running: float
    waiting: float
    polls: int
    # the API server's requests in flight (`/load`) at the last poll; None: it has no /load
    in_flight: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def still(self) -> str:
        """What the last poll saw, e.g. "0 running, 0 waiting, 1 in flight at the API server"."""
        return in_flight_text(self.running, self.waiting, self.in_flight)


def in_flight_text(running: float, waiting: float, in_flight: int | None) -> str:
    text = f"{running:g} running, {waiting:g} waiting"
    return text if in_flight is None else f"{text}, {in_flight} in flight at the API server"


def drain(
    client: Client,
    timeout: float = DEFAULT_DRAIN_TIMEOUT,
    interval: float = 0.2,
    settle: int = 2,
    on_wait: Callable[[str], None] | None = None,
) -> DrainResult:
    """Wait until running + waiting requests are 0, and so is the API server's count of
    requests in flight, on `settle` polls in a row (or `timeout`); `on_wait(text)` is told how
    many are in flight and for how long it has waited.

    The engine's gauges alone miss a request the API server has taken but not yet handed to
    the engine: vLLM sends a stream's 200 headers, tokenises, queues it to the engine, and the
    gauges count it only after an engine step. `/load` (vLLM's `--enable-server-load-tracking`,
    which the unit always passes) counts it from the moment its handler is entered until its
    body is sent. A server without `/load` (older vLLM) is drained on the gauges alone; one
    started without the flag answers 0 there, which then adds nothing."""
    t0 = time.monotonic()
    zeros = polls = 0
    has_load = True
    while True:
        in_flight = client.server_load() if has_load else None
        has_load = in_flight is not None
        m = client.metrics()
        polls += 1
        if m.running is None and m.waiting is None:
            raise WarmctlError(
                f"{client.target.label}: /metrics has no vllm:num_requests_running or "
                "vllm:num_requests_waiting: cannot tell whether requests are in flight",
                kind="protocol",
            )
        running, waiting = m.running or 0.0, m.waiting or 0.0
        idle = running + waiting == 0 and not in_flight
        zeros = zeros + 1 if idle else 0
        elapsed = time.monotonic() - t0
        if zeros >= settle:
            return DrainResult(True, elapsed, running, waiting, polls, in_flight)
        if elapsed + interval > timeout:
            return DrainResult(False, elapsed, running, waiting, polls, in_flight)
        if on_wait is not None:
            on_wait(
                f"draining: {in_flight_text(running, waiting, in_flight)} "
                f"({elapsed:.0f} of {timeout:g} s)"
            )
        time.sleep(interval)


def _wait_sleeping(client: Client, want: bool, timeout: float, interval: float = 0.2) -> float:
    t0 = time.monotonic()
    while True:
        if client.is_sleeping() == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 + interval > timeout:
            state = "asleep" if want else "awake"
            raise WarmctlError(
                f"{client.target.label}: the server accepted the request but is not {state} "
                f"after {timeout:g} s (/is_sleeping)",
                kind="server",
            )
        time.sleep(interval)


_SLEEP_FLAG = re.compile(r"enable_sleep_mode['\"]?\s*[:=]\s*(True|False|true|false)")


def sleep_facts(config: Any) -> tuple[bool | None, str | None]:
    """(enable_sleep_mode, device) from `/server_info`'s vllm_config (dict, or str on old vLLM)."""
    enabled: bool | None = None
    if isinstance(config, dict):
        model = config.get("model_config")
        flag = model.get("enable_sleep_mode") if isinstance(model, dict) else None
        enabled = flag if isinstance(flag, bool) else None
    elif isinstance(config, str):
        match = _SLEEP_FLAG.search(config)
        enabled = (match.group(1).lower() == "true") if match else None
    return enabled, device_from_config(config)


def sleep_mode_problem(client: Client) -> str | None:
    """Why this server cannot sleep, when `/server_info` says so; None when it can or does not
    tell. (A server started without --enable-sleep-mode still answers /sleep with 200, and on
    CPU it then only pauses: new requests hang until /wake_up.)"""
    try:
        info = client.server_info()
    except WarmctlError as err:
        if err.kind in ("dev_route", "not_found", "protocol", "bad_request", "generic", "timeout"):
            return None
        raise
    enabled, device = sleep_facts(info.get("vllm_config"))
    if enabled is not False:
        return None
    why = "sleep mode is not enabled on this server (started without --enable-sleep-mode"
    if device == "cpu":
        why += "; on CPU vLLM cannot sleep: /sleep would only pause it and hang new requests"
    return why + ")"


@dataclass
class SleepReport:
    target: str
    level: int
    already_asleep: bool = False
    drain: DrainResult | None = None
    steps: list[Step] = field(default_factory=list)
    total_s: float = 0.0
    output_check: dict[str, Any] | None = None  # what `before_sleep` recorded (outputcheck)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "level": self.level,
            "already_asleep": self.already_asleep,
            "drain": self.drain.to_dict() if self.drain else None,
            "steps": [s.to_dict() for s in self.steps],
            "total_s": self.total_s,
            "output_check": self.output_check,
        }


def sleep(
    client: Client,
    level: int = 1,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    poll_interval: float = 0.2,
    op_timeout: float = DEFAULT_OP_TIMEOUT,
    before_sleep: Callable[[], dict[str, Any]] | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> SleepReport:
    """Drain, sleep at `level`, confirm. Already asleep -> a no-op report. A drain that times
    out raises (kind `drain_timeout`) and the server is left awake. `before_sleep` runs on the
    drained server just before `/sleep` (outputcheck records its answers there)."""
    if level not in (1, 2):
        raise WarmctlError(f"sleep level must be 1 or 2, not {level}", kind="input")
    t0 = time.monotonic()
    report = SleepReport(target=client.target.label, level=level)
    client.health()  # a dead engine is reported as such, before anything is changed
    if client.is_sleeping():
        report.already_asleep = True
        report.total_s = time.monotonic() - t0
        return report
    problem = sleep_mode_problem(client)
    if problem:
        raise WarmctlError(
            f"{client.target.label}: {problem}; not put to sleep", kind="unsupported"
        )
    drain_step(client, report, drain_timeout, poll_interval, on_wait, "not put to sleep")
    if before_sleep is not None:
        s0 = time.monotonic()
        report.output_check = before_sleep()
        report.steps.append(Step("record outputs", time.monotonic() - s0))
    s0 = time.monotonic()
    if on_wait is not None:
        on_wait(f"sleeping at level {level} (POST /sleep)")
    client.sleep(level, timeout=op_timeout)
    report.steps.append(Step(f"sleep level {level}", time.monotonic() - s0))
    report.steps.append(Step("confirm", _wait_sleeping(client, True, 30.0, poll_interval)))
    report.total_s = time.monotonic() - t0
    return report


def drain_step(
    client: Client,
    report: SleepReport,
    drain_timeout: float,
    poll_interval: float,
    on_wait: Callable[[str], None] | None,
    not_done: str,
) -> None:
    """The drain before a sleep or a stop, recorded in `report`; one that times out raises (kind
    `drain_timeout`, "LABEL: `not_done`: still ... after --drain-timeout S s")."""
    report.drain = drain(client, drain_timeout, poll_interval, on_wait=on_wait)
    report.steps.append(Step("drain", report.drain.seconds))
    if not report.drain.drained:
        raise WarmctlError(
            f"{client.target.label}: {not_done}: still {report.drain.still()} "
            f"after --drain-timeout {drain_timeout:g} s",
            kind="drain_timeout",
        )


@dataclass
class WakeReport:
    target: str
    already_awake: bool = False
    level: int | None = None
    level_source: str = ""  # "server" (vllm:engine_sleep_state), "--level", "assumed"
    steps: list[Step] = field(default_factory=list)
    warmup: WarmupReport | None = None
    total_s: float = 0.0
    output_check: dict[str, Any] | None = None  # what `check` found (outputcheck)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "already_awake": self.already_awake,
            "level": self.level,
            "level_source": self.level_source,
            "steps": [s.to_dict() for s in self.steps],
            "warmup": self.warmup.to_dict() if self.warmup else None,
            "total_s": self.total_s,
            "output_check": self.output_check,
        }


def sleep_level_of(client: Client) -> int | None:
    """1 or 2 when the server tells (`vllm:engine_sleep_state`), else None."""
    try:
        level = client.metrics().sleep_level
    except WarmctlError as err:
        if err.kind in ("protocol", "not_found"):
            return None
        raise
    return level if level in (1, 2) else None


def wake(
    client: Client,
    level: int | None = None,
    run_warmup: bool = True,
    warmup_options: dict[str, Any] | None = None,
    op_timeout: float = DEFAULT_OP_TIMEOUT,
    on_step: Callable[[str], None] | None = None,
    check: Callable[[], dict[str, Any]] | None = None,
) -> WakeReport:
    """Wake (reloading weights after level 2), confirm, then warm up.

    The level comes from the server when it exports `vllm:engine_sleep_state`, else from `level`;
    if neither tells, the level-2 path is used: it is correct after either level (it reloads the
    weights from disk, where level 1 would have restored them from CPU memory).
    `check` runs once the server is awake, before the warmup (outputcheck replays the answers
    recorded before the sleep; it raises when they differ).
    """
    t0 = time.monotonic()
    report = WakeReport(target=client.target.label)

    def step(name: str, fn: Callable[[], object]) -> None:
        if on_step:
            on_step(name)
        s0 = time.monotonic()
        fn()
        report.steps.append(Step(name, time.monotonic() - s0))

    client.health()
    if not client.is_sleeping():
        report.already_awake = True
    else:
        told = sleep_level_of(client)
        if told is not None:
            report.level, report.level_source = told, "server"
        elif level in (1, 2):
            report.level, report.level_source = level, "--level"
        else:
            report.level, report.level_source = 2, "assumed"
        if report.level == 1:
            step("wake_up", lambda: client.wake_up(timeout=op_timeout))
        else:
            step("wake_up weights", lambda: client.wake_up(["weights"], timeout=op_timeout))
            step(
                "reload_weights",
                lambda: client.collective_rpc("reload_weights", timeout=op_timeout),
            )
            step("wake_up kv_cache", lambda: client.wake_up(["kv_cache"], timeout=op_timeout))
            step("reset_prefix_cache", client.reset_prefix_cache)
        report.steps.append(Step("confirm", _wait_sleeping(client, False, 30.0)))
    if check is not None:
        if on_step:
            on_step("check outputs")
        s0 = time.monotonic()
        report.output_check = check()
        report.steps.append(Step("check outputs", time.monotonic() - s0))
    if run_warmup:
        if on_step:
            on_step("warmup")
        # light by default: a woken server kept its kernels and graphs (H200: a full ramp
        # after a wake cost 1.7-2.9 s and changed nothing); warmup_options={"light": False}
        options = {"light": True, **(warmup_options or {})}
        if options["light"] and (report.output_check or {}).get("status") == "passed":
            options["completions_warm"] = True  # the check's prompts were completions
        report.warmup = warmup(client, **options)
        report.steps.append(Step("warmup", report.warmup.total_s))
    report.total_s = time.monotonic() - t0
    return report
