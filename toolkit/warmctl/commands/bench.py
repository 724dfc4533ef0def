"""`warmctl bench`: cold start, primed restart, first requests, bursts, decode and sleep/wake of
plain vLLM (A), the project's unit (B) and an alternative (C), side by side on one machine."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from warmctl.errors import WarmctlError

if TYPE_CHECKING:
    from warmctl.bench.options import Levers


def _parse_env(items: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise WarmctlError(f"--env {item!r}: expected KEY=VALUE", kind="input")
        env[key] = value
    return env


def _command_line() -> str:
    """The options this run was given, as one reproducible command line."""
    ctx = click.get_current_context()
    parts = ["warmctl", "bench"]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if value is None or value == param.default or value == ():
            continue
        values = value if isinstance(value, tuple) else (value,)
        parts += [f"{param.opts[0]}={v}" for v in values]
    return shlex.join(parts)


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise WarmctlError(
            f"--c-capture-sizes {text!r}: expected integers like 1,2,4,8", kind="input"
        ) from None
    if not sizes or sizes[0] < 1:
        raise WarmctlError(f"--c-capture-sizes {text!r}: expected positive integers", kind="input")
    return sizes


@click.command("bench")
@click.option("--model", help="Model folder (or id) every configuration serves.")
@click.option(
    "--python",
    "python",
    type=click.Path(path_type=Path),
    default=sys.executable,
    show_default="this interpreter",
    help="Python that has vLLM installed.",
)
@click.option(
    "--plan",
    default="A,B,B+sleep,C,C",
    show_default=True,
    help="Starts in order (A plain vLLM, B the unit, C B + levers, W/V B with a shorter warmup, "
    "S B with a spawned EngineCore, L B under the launcher, R L with vLLM's start-up levers, "
    "P L with the standby preparing the next server and a shorter warmup after a relaunch, Q P "
    "with the EngineCore's modules preloaded, E R with the next standby forked later, X R + P "
    "with the next standby forked once the server is ready; "
    "W, V, S, L, R, P, Q, E and X restart from B's caches); a configuration's repeat is a "
    "restart with primed caches; +sleep adds the sleep/wake cycles, +load sleep and wake under "
    "16 streaming clients, +relaunch (L, R, P, Q, E, X) a relaunch.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "gpu", "cpu"]),
    default="auto",
    show_default=True,
    help="auto: gpu when nvidia-smi exists.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("out/bench"),
    show_default=True,
    help="Folder for bench.json, the server logs and the caches.",
)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-name", default="m", show_default=True)
@click.option(
    "--arg",
    "args",
    multiple=True,
    help="vLLM argument every configuration gets (this machine needs it), repeatable.",
)
@click.option("--env", "envs", multiple=True, help="KEY=VALUE every configuration gets.")
@click.option(
    "--tensor-parallel-size",
    type=int,
    default=1,
    show_default=True,
    help="GPUs per server: A gets --tensor-parallel-size N, B and C the instance keys "
    "tensor_parallel_size: N and gpus: [0..N-1].",
)
@click.option(
    "--c-capture-sizes",
    default=None,
    help="C's cudagraph_capture_sizes (default 1,2,4,8,16,24,32,48,...,384,512).",
)
@click.option(
    "--budget",
    type=float,
    default=None,
    help="Seconds the whole plan may take; starts that would not fit are skipped.",
)
@click.option(
    "--requests",
    "single_n",
    type=int,
    default=11,
    show_default=True,
    help="c=1 requests per start (the first is 'the first user request').",
)
@click.option(
    "--c-gpu-memory-utilization",
    type=float,
    default=None,
    help="C's gpu_memory_utilization (a KV cache sized to the workload wakes faster).",
)
@click.option(
    "--idle-gap",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds of idleness before one more c=1 request (0: skip).",
)
@click.option("--bursts", "bursts_n", type=int, default=9, show_default=True)
@click.option("--burst-width", type=int, default=16, show_default=True)
@click.option("--decode-tokens", type=int, default=128, show_default=True)
@click.option("--start-timeout", type=float, default=420.0, show_default=True)
@click.option(
    "--compile-bytecode/--no-compile-bytecode",
    default=True,
    show_default=True,
    help="Compile the vLLM interpreter's site-packages before the plan, as the deployment "
    "does on a host (the JSON records the bytecode share before and after either way).",
)
@click.option(
    "--w-warmup-args",
    default=None,
    metavar="ARGS",
    help="The unit warmup's arguments in configuration W (default: "
    "'--max-batch 16 --max-tokens 4'); the warmup trade-off against B.",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="PNG",
    help="Draw each start's phases, stacked, to PNG (needs matplotlib: the [bench] extra). "
    "With --report the default is the JSON's name with .png, drawn when matplotlib is there.",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Only print the tables of a saved bench.json and draw its starts (see --plot).",
)
def command(
    model: str | None,
    python: Path,
    plan: str,
    device: str,
    out: Path,
    port: int,
    served_name: str,
    args: tuple[str, ...],
    envs: tuple[str, ...],
    tensor_parallel_size: int,
    c_capture_sizes: str | None,
    c_gpu_memory_utilization: float | None,
    idle_gap: float,
    budget: float | None,
    single_n: int,
    bursts_n: int,
    burst_width: int,
    decode_tokens: int,
    start_timeout: float,
    report_file: Path | None,
    compile_bytecode: bool,
    w_warmup_args: str | None,
    plot_file: Path | None,
) -> None:
    """Cold-start / restart / sleep benchmark of a rendered instance.

    Starts vLLM once per plan item with exactly the command line and environment that
    `warmctl render` gives for the configuration (A is plain `vllm serve`), measures it with
    warmctl's client, writes OUT/bench.json and prints the tables and the targets.
    """
    try:
        from warmctl.bench.main import report_only, run

        if report_file is not None:
            report_only(
                report_file, plot_file or report_file.with_suffix(".png"), strict=bool(plot_file)
            )
            return
        if not model:
            raise WarmctlError("--model is required (a model folder or id)", kind="input")
        from warmctl.bench.options import BenchOptions, Server
        from warmctl.bench.runner import Knobs

        server = Server(  # a local folder as the unit would name it: an absolute path
            model=str(Path(model).resolve()) if Path(model).exists() else model,
            python=python,
            device=device,
            port=port,
            served_name=served_name,
            extra_args=args,
            extra_env=_parse_env(envs),
            tensor_parallel_size=tensor_parallel_size,
        )
        knobs = Knobs(
            single_n=single_n,
            bursts_n=bursts_n,
            burst_width=burst_width,
            decode_tokens=decode_tokens,
            start_timeout_s=start_timeout,
            idle_gap_s=idle_gap,
        )
        options = BenchOptions(
            server=server,
            out=out,
            plan=plan,
            levers=_levers(c_capture_sizes, c_gpu_memory_utilization, w_warmup_args),
            knobs=knobs,
            budget_s=budget,
            compile_bytecode=compile_bytecode,
            command_line=_command_line(),
        )
        doc = run(options)
        if plot_file is not None:
            from warmctl.bench.plot import draw

            draw(doc, plot_file)
    except WarmctlError as err:
        from warmctl.terminal.termsafe import safe

        click.echo(f"warmctl bench: {safe(err, one_line=True)}", err=True)
        sys.exit(err.exit_code)
    _exit_on_failed_starts(doc, out)


def _levers(
    c_capture_sizes: str | None, c_gpu_memory_utilization: float | None, w_warmup_args: str | None
) -> Levers:
    """C's and W's settings from their options (their defaults where not given)."""
    from warmctl.bench.options import Levers

    levers = Levers(c_gpu_memory_utilization=c_gpu_memory_utilization)
    if c_capture_sizes:
        levers = replace(levers, c_capture_sizes=_parse_sizes(c_capture_sizes))
    if w_warmup_args:
        levers = replace(levers, w_warmup_args=tuple(shlex.split(w_warmup_args)))
    return levers


def _exit_on_failed_starts(doc: dict[str, Any], out: Path) -> None:
    failed = [s["name"] for s in doc["steps"] if "error" in s]
    if failed:
        click.echo(
            f"warmctl bench: {len(failed)} start(s) failed: {', '.join(failed)} "
            f"(see {out}/bench.json and the logs beside it)",
            err=True,
        )
        sys.exit(1)
