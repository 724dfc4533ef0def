"""`warmctl relaunch HOST --main-pid PID [--check]`"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from warmctl.commands.options import guard, host_options, resolve_targets, textfile_options
from warmctl.commands.warmup_options import warmup_kwargs, warmup_options

if TYPE_CHECKING:
    from warmctl.launcher.relaunch import LauncherFiles, Relaunched
    from warmctl.server.target import Target
    from warmctl.warmth.warmup import WarmupReport


@click.command(name="relaunch")
@host_options()
@warmup_options
@textfile_options
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only say whether a relaunch can apply the launch file (no relaunch): exit 0 yes, "
    "3 a restart is needed (one line why), 2 error (vLLM rejects the file's arguments, too).",
)
@click.option(
    "--vllm-check/--no-vllm-check",
    default=True,
    show_default=True,
    help="With --check: have the launcher's standby parse the launch file with vLLM's own parser "
    "and build vLLM's configuration from it (SIGUSR1 to the launcher; waits up to "
    "--ready-timeout for its standby's imports). --no-vllm-check: read the launcher's state only.",
)
@click.option(
    "--launch-file",
    "expect_launch",
    default=None,
    help="The instance's launch file: refused (exit 2) when the launcher's command line names "
    "another. Root's callers (the deploy) pass it, so root reads only the instance's own file.",
)
@click.option(
    "--state-file",
    "expect_state",
    default=None,
    help="The instance's launcher state file, checked as --launch-file is.",
)
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    textfile_dir: str | None,
    instance_name: str | None,
    check_only: bool,
    vllm_check: bool,
    expect_launch: str | None,
    expect_state: str | None,
    **options: object,
) -> None:
    """Replace a server run by the pre-imported launcher, then warm it.

    The unit's `ExecReload` (vllm_service_launcher): SIGHUP to the launcher (--main-pid,
    systemd's $MAINPID), which stops the server and starts its standby, which imported vLLM
    before the signal (no Python imports: on an H200, relaunch to warm took 19-21 s against
    33-38 s for a primed restart); then the same warmup as the unit's ExecStartPost. HOST is
    the one server behind the launcher. The unit stays active.

    A launcher started with a launch file reads it again: the new server runs the file's vLLM
    arguments and VLLM_* variables. Before the signal the file is checked (one line and nothing
    signalled when it is not a launch file, or when only a restart can apply it: a variable
    vLLM read at import, a launcher upgraded on disk). At the signal the launcher's standby
    parses the file's arguments with vLLM's own parser and builds vLLM's configuration before
    the old server is stopped: what vLLM rejects is refused in one line and the old server keeps
    serving (--check asks the same of the standby). After it, the launcher's state file must
    show the new server launched from the file as it is now. A change of the unit or its env
    file still needs a restart.

    Exit status: 0 when the new server is warm, 3 when only a restart can apply the change
    (nothing was signalled), 2 on any other error.
    """

    def body() -> int:
        from warmctl.commands.options import check_instance_name
        from warmctl.launcher.relaunch import LauncherFiles, relaunch
        from warmctl.observe.textfile import write_metrics
        from warmctl.server.client import Client
        from warmctl.terminal.output import console, error_line
        from warmctl.warmth.warmup import warmup

        kwargs = warmup_kwargs(**options)  # type: ignore[arg-type]
        pid = kwargs.get("main_pid")
        if not pid:
            error_line("relaunch: needs the launcher's process: --main-pid PID (or $MAINPID)")
            return 2
        targets = resolve_targets(hosts)
        if len(targets) != 1:
            error_line("relaunch: exactly one HOST (the server behind --main-pid)")
            return 2
        check_instance_name(instance_name, targets)
        (target,) = targets
        expect = None
        if expect_launch is not None or expect_state is not None:
            expect = LauncherFiles(None, expect_launch, expect_state)
        if check_only:
            ready_timeout = float(kwargs["ready_timeout"])
            return _check(target, pid, expect, ready_timeout if vllm_check else None, as_json)
        err = console(stderr=True)
        done = relaunch(
            pid,
            float(kwargs["ready_timeout"]),
            on_wait=None if as_json else err.print,
            expect=expect,
        )
        report = warmup(Client(target, api_key, timeout), **kwargs)
        code = write_metrics(textfile_dir, instance_name, "warmup", targets, [report])
        _say_relaunched(target, done, report, code, as_json)
        return code

    guard(body)


def _check(
    target: Target,
    pid: int,
    expect: LauncherFiles | None,
    vllm_timeout: float | None,
    as_json: bool,
) -> int:
    """--check: whether launcher `pid` can relaunch with its launch file as it is now (vLLM's
    verdict from its standby, waited for up to `vllm_timeout` s; None: the state file only)."""
    from warmctl.launcher.relaunch import check, vet
    from warmctl.terminal.output import console, emit_json

    checked = check(pid, expect=expect)
    verdict = vet(pid, checked, vllm_timeout) if vllm_timeout is not None else None
    accepted = bool(verdict and verdict.get("checked"))
    if as_json:  # what it runs now, from its state file (the role's report)
        emit_json("relaunch", [checked.report(target.label, pid, accepted)], 0)
    else:
        console().print(checked.line(target.label, pid, accepted))
    return 0


def _say_relaunched(
    target: Target, done: Relaunched, report: WarmupReport, code: int, as_json: bool
) -> None:
    """The relaunch and its warmup: one JSON document, or one line (and one more on stderr
    when the metrics could not be written: exit `code`)."""
    from warmctl.terminal.output import console, emit_json, error_line

    doc = {
        "target": target.label,
        "launcher_pid": done.pid,
        "old_server_pids": list(done.old),
        "new_server_pids": list(done.new),
        "relaunch_s": round(done.seconds, 3),
        "generation": done.generation or None,
        "argv": done.argv or None,
        "warmup": report.to_dict(),
    }
    if as_json:
        emit_json("relaunch", [doc], code)
        return
    console().print(
        f"{target.label}: relaunched in {done.seconds:.1f} s (server "
        f"{','.join(map(str, done.old)) or '-'} -> {','.join(map(str, done.new))}"
        f"{f', generation {done.generation}' if done.generation else ''}), "
        f"warm {report.total_s:.1f} s later"
    )
    if code:
        error_line(f"{target.label}: relaunched and warm, but its metrics were not written")
