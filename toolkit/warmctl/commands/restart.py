"""`warmctl restart NAME --unit UNIT --config-dir DIR [--reload]`: a thin command over
`warmctl.host.restart.apply`."""

from __future__ import annotations

import click

from warmctl.commands.options import guard


@click.command(name="restart")
@click.argument("name")
@click.option("--unit", required=True, help="The instance's systemd unit, e.g. vllm-NAME.service.")
@click.option(
    "--config-dir",
    required=True,
    metavar="DIR",
    help="vllm_service_config_dir: where the instance's launch file is (a reload checks it).",
)
@click.option(
    "--reload",
    "reload_asked",
    is_flag=True,
    help="Reload instead where that applies the change: a unit under the pre-imported launcher "
    "that runs and whose launcher can relaunch with its launch file as it is now.",
)
@click.option(
    "--check-timeout",
    type=click.FloatRange(min=0),
    default=1800.0,
    show_default=True,
    help="With --reload: seconds to wait for vLLM's verdict on the launch file (from the "
    "standby of the unit's launcher, which imports vLLM first).",
)
@click.option(
    "--job-timeout",
    type=click.FloatRange(min=1),
    default=3600.0,
    show_default=True,
    help="Seconds each systemctl job (the reload, the restart and its warmup) may take.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def command(
    name: str,
    unit: str,
    config_dir: str,
    reload_asked: bool,
    check_timeout: float,
    job_timeout: float,
    as_json: bool,
) -> None:
    """Restart an instance's unit as a deploy does, or with --reload reload it where a reload
    applies the change (its launcher relaunches the server from the imported vLLM, warmed; the
    unit stays active), and say which in one line.

    Run as root by the vllm_service role (its plan's restart_argv). A reload that only a restart
    can apply (a variable vLLM read at import, a launcher upgraded on disk) restarts, and says
    why. A launch file the launcher cannot read, or whose arguments vLLM rejects, fails (exit 2)
    with nothing done: the server it runs serves on.

    Exit status: 0 reloaded or restarted, 2 anything else (one line on stderr).
    """

    def body() -> int:
        from warmctl.errors import WarmctlError
        from warmctl.host.restart import apply
        from warmctl.plan.validate import NAME, PATH
        from warmctl.terminal.output import console, emit_json

        if not NAME.match(name):
            raise WarmctlError(f"{name!r}: not an instance name", kind="input")
        if not PATH.match(config_dir):
            raise WarmctlError(f"--config-dir {config_dir!r}: not an absolute path", kind="input")
        done = apply(name, unit, config_dir, reload=reload_asked, vet_timeout=check_timeout,
                     job_timeout=job_timeout)  # fmt: skip
        if as_json:
            emit_json("restart", [done.to_dict()], 0)
        else:
            console().print(done.line())
        return 0

    guard(body)
