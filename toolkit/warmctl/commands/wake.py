"""`warmctl wake HOST...`"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from warmctl.errors import WarmctlError
from warmctl.options import (
    cause_option,
    guard,
    host_options,
    per_host,
    resolve_targets,
    textfile_options,
)
from warmctl.target import Target
from warmctl.warmup_cli import warmup_kwargs, warmup_options

if TYPE_CHECKING:
    from warmctl.sleepwake import WakeReport
    from warmctl.waits import Tracker


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
@click.option(
    "--output-check",
    "check_file",
    metavar="FILE",
    envvar="WARMCTL_OUTPUT_CHECK",
    show_envvar=True,
    help="Before the warmup and the gate: ask the prompts `warmctl sleep --output-check FILE` "
    "recorded and fail (gate closed, exit 2) when a token id differs or a logprob moved more "
    "than --output-tolerance; the failure is kept in FILE and sleeps refuse to record until a "
    "check passes again (after a restart). No recording in FILE: not checked (said so).",
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
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    level: str,
    no_warmup: bool,
    full_warmup: bool,
    gate_paths: tuple[str, ...],
    check_file: str | None,
    output_tolerance: float,
    cause: str,
    textfile_dir: str | None,
    instance_name: str | None,
    **options: object,
) -> None:
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

    def body() -> int:
        from warmctl.client import Client
        from warmctl.output import report_hosts
        from warmctl.outputcheck import checker
        from warmctl.sleepwake import DEFAULT_OP_TIMEOUT, WakeReport, wake
        from warmctl.warmup_cli import progress_display

        kwargs = warmup_kwargs(**options)  # type: ignore[arg-type]
        kwargs["light"] = not (full_warmup or "batch_sizes" in kwargs)
        from warmctl.gate import gates_for, instance_lock, open_after
        from warmctl.options import check_instance_name, write_metrics
        from warmctl.output import info_line

        targets = resolve_targets(hosts)
        check_instance_name(instance_name, targets)
        gates = gates_for(gate_paths, targets)
        if check_file and len(targets) != 1:
            raise WarmctlError(
                f"--output-check belongs to one instance: give exactly one HOST, not "
                f"{len(targets)}",
                kind="input",
            )
        wanted = None if level == "auto" else int(level)

        def one(t: Target, tracker: Tracker | None) -> WakeReport:
            client = Client(t, api_key, timeout)
            check = checker(client, Path(check_file), output_tolerance) if check_file else None
            return wake(
                client,
                level=wanted,
                run_warmup=not no_warmup,
                warmup_options={**kwargs, "progress": tracker},
                op_timeout=max(timeout, DEFAULT_OP_TIMEOUT),
                on_step=(lambda step: tracker.say(f"waking: {step}")) if tracker else None,
                check=check,
            )

        with progress_display(not as_json) as make:

            def locked(t: Target) -> WakeReport:
                with instance_lock(gates, lambda text: info_line(f"{t.label}: {text}", True)):
                    return open_after(gates, lambda: one(t, make(t.label)))

            results = per_host(targets, locked)
        metrics_code = write_metrics(
            textfile_dir, instance_name, "wake", targets, results, cause=cause
        )

        def lines(r: WakeReport) -> list[str]:
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

        labels = [t.label for t in targets]
        code = report_hosts("wake", labels, results, WakeReport, lines, as_json=as_json)
        return max(code, metrics_code)

    guard(body)
