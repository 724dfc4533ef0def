"""`warmctl sleep HOST...`"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from warmctl.errors import WarmctlError
from warmctl.facts import SLEEP_LEVEL
from warmctl.options import (
    cause_option,
    drain_timeout_option,
    guard,
    host_options,
    per_host,
    resolve_targets,
    textfile_options,
)
from warmctl.target import Target


@click.command(name="sleep")
@host_options()
@click.option(
    "--level",
    type=click.IntRange(1, 2),
    default=SLEEP_LEVEL,
    show_default=True,
    help="1: weights to CPU memory, KV cache dropped. 2: weights and KV cache dropped "
    "(wake reloads the weights from disk).",
)
@drain_timeout_option("the server is NOT put to sleep.")
@click.option(
    "--gate",
    "gate_path",
    metavar="FILE",
    help="The instance's proxy gate flag (one HOST): created before the drain, so the proxy "
    "answers new requests 503 + Retry-After while in-flight ones finish; put back if the "
    "sleep fails.",
)
@click.option(
    "--drain-only",
    is_flag=True,
    help="Close the gate and drain, but do not POST /sleep (servers that cannot sleep, e.g. "
    "on CPU: stop the unit afterwards).",
)
@click.option(
    "--output-check",
    "check_file",
    metavar="FILE",
    envvar="WARMCTL_OUTPUT_CHECK",
    show_envvar=True,
    help="Record the greedy answers (token ids, logprobs) of a few fixed prompts to FILE once "
    "the server is drained, before /sleep; `warmctl wake --output-check FILE` replays them.",
)
@click.option(
    "--next-wake",
    metavar="CALENDAR",
    help="When the sleep window ends (its wake: a cron or OnCalendar expression). Only for "
    "the metrics: written as warmctl_sleep_next_wake_timestamp_seconds, so an alert can tell "
    "a wake that did not happen (the window services pass it).",
)
@cause_option("sleep")
@textfile_options
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    level: int,
    drain_timeout: float,
    gate_path: str | None,
    drain_only: bool,
    check_file: str | None,
    next_wake: str | None,
    cause: str,
    textfile_dir: str | None,
    instance_name: str | None,
) -> None:
    """Drain in-flight requests, then put a server to sleep.

    Waits until vllm:num_requests_running and vllm:num_requests_waiting are 0, and so is the
    API server's count of requests in flight (/load, with --enable-server-load-tracking), as
    vLLM crashes or hangs when sleep races live requests; then POST /sleep?level=N and confirms with
    /is_sleeping. Already asleep: nothing to do. Needs a server started with
    VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode. On a terminal, each host's line says how
    many requests the drain still waits for and for how long so far.

    Exit status: 0 asleep, 2 on any error (a drain that timed out included).
    """

    def body() -> int:
        from warmctl.client import Client
        from warmctl.gate import (
            behind_closed_gate,
            drain_only_report,
            gate_for,
            instance_lock,
            sleep_reason,
        )
        from warmctl.options import check_instance_name, write_metrics
        from warmctl.output import info_line, report_hosts
        from warmctl.outputcheck import recorder
        from warmctl.sleepwake import DEFAULT_OP_TIMEOUT, SleepReport, sleep
        from warmctl.waits import board, say_of

        targets = resolve_targets(hosts)
        check_instance_name(instance_name, targets)
        gate = gate_for(gate_path, targets)
        if check_file and len(targets) != 1:
            raise WarmctlError(
                f"--output-check belongs to one instance: give exactly one HOST, not "
                f"{len(targets)}",
                kind="input",
            )
        wake_at = _next_wake_timestamp(next_wake) if next_wake else None

        def one(t: Target, say: Callable[[str], None] | None) -> SleepReport:
            client = Client(t, api_key, timeout)
            if drain_only:
                return drain_only_report(client, drain_timeout, on_wait=say)
            return sleep(
                client,
                level=level,
                drain_timeout=drain_timeout,
                op_timeout=max(timeout, DEFAULT_OP_TIMEOUT),
                before_sleep=recorder(client, Path(check_file)) if check_file else None,
                on_wait=say,
            )

        reason = sleep_reason(cause, None if drain_only else level)

        def guarded(t: Target, say: Callable[[str], None] | None) -> SleepReport:
            if gate is None:
                return one(t, say)
            with instance_lock([gate], lambda text: info_line(f"{t.label}: {text}", True)):
                return behind_closed_gate(gate, lambda: one(t, say), reason)

        with board(not as_json) as track:
            results = per_host(targets, lambda t: guarded(t, say_of(track(t.label))))
        metrics_code = write_metrics(
            textfile_dir, instance_name, "sleep", targets, results, next_wake=wake_at, cause=cause
        )

        def lines(r: SleepReport) -> list[str]:
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

        labels = [t.label for t in targets]
        code = report_hosts("sleep", labels, results, SleepReport, lines, as_json=as_json)
        return max(code, metrics_code)

    guard(body)


def _next_wake_timestamp(expr: str) -> float:
    """Unix time of the next elapse of `expr` (a bad expression is one line, exit 2)."""
    from warmctl.calendar import next_elapse

    return next_elapse(expr).timestamp()
