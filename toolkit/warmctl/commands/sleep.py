"""`warmctl sleep HOST...`: a thin command over `warmctl.sleepwake.actions.sleep_instance`."""

from __future__ import annotations

from functools import partial
from typing import Any

import click

from warmctl.commands.options import (
    cause_option,
    drain_timeout_option,
    guard,
    host_options,
    one_instance,
    output_check_option,
    per_host,
    resolve_targets,
    textfile_options,
)
from warmctl.plan.instance import SLEEP_LEVEL
from warmctl.server.target import Target
from warmctl.terminal.output import lock_wait_line


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
@output_check_option(
    "Record the greedy answers (token ids, logprobs) of a few fixed prompts to FILE once "
    "the server is drained, before /sleep; `warmctl wake --output-check FILE` replays them."
)
@click.option(
    "--next-wake",
    metavar="CALENDAR",
    help="When the sleep window ends (its wake: a cron or OnCalendar expression). Only for "
    "the metrics: written as warmctl_sleep_next_wake_timestamp_seconds, so an alert can tell "
    "a wake that did not happen (the window services pass it).",
)
@click.option(
    "--window",
    metavar="NAME",
    help="The sleep window that puts it to sleep: written into the gate flag's text, so "
    "`warmctl status --gate-dir` says which window.",
)
@cause_option("sleep")
@textfile_options
def command(**params: Any) -> None:
    """Drain in-flight requests, then put a server to sleep.

    Waits until vllm:num_requests_running and vllm:num_requests_waiting are 0, and so is the
    API server's count of requests in flight (/load, with --enable-server-load-tracking), as
    vLLM crashes or hangs when sleep races live requests; then POST /sleep?level=N and confirms with
    /is_sleeping. Already asleep: nothing to do. Needs a server started with
    VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode. On a terminal, each host's line says how
    many requests the drain still waits for and for how long so far.

    Exit status: 0 asleep, 2 on any error (a drain that timed out included).
    """
    guard(partial(_sleep, **params))


def _sleep(hosts: tuple[str, ...], api_key: str | None, timeout: float, as_json: bool,
           gate_path: str | None, check_file: str | None, next_wake: str | None,
           textfile_dir: str | None, instance_name: str | None, **opts: Any) -> int:  # fmt: skip
    from warmctl.commands.options import check_instance_name
    from warmctl.errors import WarmctlError
    from warmctl.observe.textfile import write_metrics
    from warmctl.sleepwake.actions import SleepOptions, sleep_lines
    from warmctl.sleepwake.gate import WINDOW_NAME
    from warmctl.sleepwake.steps import DEFAULT_OP_TIMEOUT, SleepReport
    from warmctl.terminal.output import report_hosts
    from warmctl.terminal.waits import board

    targets = resolve_targets(hosts)
    if opts["window"] and not WINDOW_NAME.fullmatch(opts["window"]):
        raise WarmctlError(f"--window {opts['window']!r}: a window's name", kind="input")
    check_instance_name(instance_name, targets)
    one_instance("--gate", gate_path, targets)
    one_instance("--output-check", check_file, targets)
    wake_at = _next_wake_timestamp(next_wake) if next_wake else None
    options = SleepOptions(gate=gate_path, check_file=check_file, instance=instance_name,
                           op_timeout=max(timeout, DEFAULT_OP_TIMEOUT), **opts)  # fmt: skip
    with board(not as_json) as track:
        results = per_host(targets, partial(_one, options, api_key, timeout, track))
    metrics_code = write_metrics(textfile_dir, instance_name, "sleep", targets, results,
                                 next_wake=wake_at, cause=options.cause)  # fmt: skip
    lines = partial(sleep_lines, drain_only=options.drain_only)
    labels = [t.label for t in targets]
    code = report_hosts("sleep", labels, results, SleepReport, lines, as_json=as_json)
    return max(code, metrics_code)


def _one(options: Any, api_key: str | None, timeout: float, track: Any, t: Target) -> Any:
    from warmctl.server.client import Client
    from warmctl.sleepwake.actions import sleep_instance
    from warmctl.terminal.waits import say_of

    client = Client(t, api_key, timeout)
    return sleep_instance(client, options, say_of(track(t.label)), lock_wait_line(t.label))


def _next_wake_timestamp(expr: str) -> float:
    """Unix time of the next elapse of `expr` (a bad expression is one line, exit 2)."""
    from warmctl.plan.calendar import next_elapse

    return next_elapse(expr).timestamp()
