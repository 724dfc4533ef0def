"""`warmctl wake HOST...`: a thin command over `warmctl.sleepwake.actions.wake_instance`."""

from __future__ import annotations

from functools import partial
from typing import Any

import click

from warmctl.commands.options import (
    cause_option,
    guard,
    host_options,
    one_instance,
    output_check_option,
    per_host,
    resolve_targets,
    textfile_options,
)
from warmctl.commands.warmup_options import warmup_kwargs, warmup_options
from warmctl.server.target import Target
from warmctl.terminal.output import lock_wait_line


@click.command(name="wake")
@host_options()
@click.option(
    "--level",
    type=click.Choice(["auto", "1", "2"]),
    default="auto",
    show_default=True,
    help="The level the server sleeps at. auto: what the server reports "
    "(vllm:engine_sleep_state), else the level-2 path, which is correct after either level.",
)
@click.option("--no-warmup", is_flag=True, help="Do not warm the server after waking it.")
@click.option(
    "--full-warmup",
    is_flag=True,
    help="Run the whole warmup (the ramp over the batch sizes). Default after a wake: one "
    "short request per route, since the server kept its compiled kernels and CUDA graphs.",
)
@click.option(
    "--gate",
    "gate_paths",
    metavar="FILE",
    multiple=True,
    help="The instance's proxy gate flag (one HOST): removed once the server is awake and "
    "warm, so the proxy passes requests again. Repeatable (the asleep flag and the wakeable "
    "one): all are removed, only after a wake that succeeded (an awake server's too).",
)
@output_check_option(
    "Before the warmup and the gate: ask the prompts `warmctl sleep --output-check FILE` "
    "recorded and fail (gate closed, exit 2) when a token id differs or a logprob moved more "
    "than --output-tolerance; the failure is kept in FILE and sleeps refuse to record until a "
    "check passes again (after a restart). No recording in FILE: not checked (said so)."
)
@click.option(
    "--output-tolerance",
    type=click.FloatRange(min=0),
    default=0.05,
    show_default=True,
    metavar="X",
    help="Largest logprob difference accepted on an equal token.",
)
@cause_option("wake")
@warmup_options
@textfile_options
def command(**params: Any) -> None:
    """Wake a sleeping server (reloading weights after level 2), then warm it.

    Level 1: POST /wake_up. Level 2: POST /wake_up?tags=weights, POST /collective_rpc
    {"method": "reload_weights"}, POST /wake_up?tags=kv_cache, POST /reset_prefix_cache.
    Then /is_sleeping must say false, and a warmup runs so the first user request after a wake
    is fast: one short streamed request per route (completions, and chat when the model has a
    template), or with --full-warmup (implied by --batch-sizes) the whole `warmctl warmup`.
    Already awake: only the warmup runs. On a terminal, each host's line says which step it
    waits for and for how long.

    Exit status: 0 awake (and warm), 2 on any error.
    """
    guard(partial(_wake, **params))


def _wake(hosts: tuple[str, ...], api_key: str | None, timeout: float, as_json: bool,
          level: str, no_warmup: bool, full_warmup: bool, gate_paths: tuple[str, ...],
          check_file: str | None, output_tolerance: float, cause: str,
          textfile_dir: str | None, instance_name: str | None, **warmup: Any) -> int:  # fmt: skip
    from warmctl.commands.options import check_instance_name
    from warmctl.commands.warmup_options import progress_display
    from warmctl.observe.textfile import write_metrics
    from warmctl.sleepwake.actions import WakeOptions, wake_lines
    from warmctl.sleepwake.steps import DEFAULT_OP_TIMEOUT, WakeReport
    from warmctl.terminal.output import report_hosts

    kwargs = warmup_kwargs(**warmup)
    kwargs["light"] = not (full_warmup or "batch_sizes" in kwargs)
    targets = resolve_targets(hosts)
    check_instance_name(instance_name, targets)
    one_instance("--gate", gate_paths, targets)
    one_instance("--output-check", check_file, targets)
    options = WakeOptions(
        level=None if level == "auto" else int(level), run_warmup=not no_warmup, warmup=kwargs,
        gates=gate_paths, check_file=check_file, tolerance=output_tolerance, cause=cause,
        instance=instance_name, op_timeout=max(timeout, DEFAULT_OP_TIMEOUT),
    )  # fmt: skip
    with progress_display(not as_json) as make:
        results = per_host(targets, partial(_one, options, api_key, timeout, make))
    metrics_code = write_metrics(textfile_dir, instance_name, "wake", targets, results,
                                 cause=cause)  # fmt: skip
    labels = [t.label for t in targets]
    code = report_hosts("wake", labels, results, WakeReport, wake_lines, as_json=as_json)
    return max(code, metrics_code)


def _one(options: Any, api_key: str | None, timeout: float, make: Any, t: Target) -> Any:
    from warmctl.server.client import Client
    from warmctl.sleepwake.actions import wake_instance

    return wake_instance(
        Client(t, api_key, timeout), options, make(t.label), lock_wait_line(t.label)
    )
