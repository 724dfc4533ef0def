"""The `warmctl` click group. Subcommands live in `warmctl.commands.<name>` and are imported
only when invoked, so `warmctl --help` stays fast (no requests/rich/ansible at import)."""

from __future__ import annotations

import importlib
import importlib.util
import os

import click

from warmctl import __version__

# name -> (module under warmctl.commands, one-line help shown by `warmctl --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("status", "Health, model, version, sleep state and load of vLLM servers."),
    "warmup": ("warmup", "Wait until a server is ready, then warm it with real-shaped traffic."),
    "sleep": ("sleep", "Drain in-flight requests, then put a server to sleep."),
    "drain": ("drain", "Take an instance out of rotation: close its gate, let requests finish."),
    "relaunch": ("relaunch", "Replace a launcher-run server from its imported vLLM, then warm it."),
    "restart": ("restart", "Restart an instance's unit, or reload it where that applies a change."),
    "wake": ("wake", "Wake a sleeping server (reloading weights after level 2), then warm it."),
    "verify": ("verify", "Measure first-request vs steady TTFT and decode speed; PASS/FAIL."),
    "waker": ("waker", "Idle sleep and wake on request for one proxied instance (long-running)."),
    "window-check": (
        "window_check",
        "Exit 0 if an instance's unit is active, so its window may act; else say why not.",
    ),
    "calendar": ("calendar", "Convert a cron expression to a systemd OnCalendar expression."),
    "render": ("render", "Render an instance's systemd unit, env file and timers from templates/."),
    "tune": ("tune", "Propose capture sizes, limits, warmup and KV cache from a host's traffic."),
    "bench": ("bench", "Cold-start / restart / sleep benchmark of a rendered instance."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, (mod, _) in COMMANDS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(f"warmctl.commands.{entry[0]}")
        return module.command

    def invoke(self, ctx: click.Context) -> object:
        """The last-resort handler: an exception no command turned into its one line becomes
        `warmctl: error: COMMAND: internal error: TYPE: message` and exit 2; the traceback
        only with --debug or WARMCTL_DEBUG=1."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                raise
            from warmctl.errors import WarmctlError
            from warmctl.terminal.output import error_line

            if isinstance(exc, WarmctlError):
                error_line(exc.message)
                ctx.exit(exc.exit_code)
            where = ctx.invoked_subcommand or ctx.info_name or "warmctl"
            detail = " ".join(str(exc).split())[:500] or "(no message)"
            name = type(exc).__name__
            error_line(f"{where}: internal error: {name}: {detail} (--debug shows where)")
            ctx.exit(2)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug")) or os.environ.get("WARMCTL_DEBUG", "") not in ("", "0")


def _module_exists(mod: str) -> bool:
    return importlib.util.find_spec(f"warmctl.commands.{mod}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="warmctl")
@click.option(
    "--debug",
    is_flag=True,
    help="Show the Python traceback of an unexpected error (also WARMCTL_DEBUG=1).",
)
def cli(debug: bool) -> None:
    """Deploy, warm, sleep, wake and verify vLLM servers.

    HOST is HOST[:PORT] (default port 8000), [IPv6]:PORT, or a URL such as
    https://llm-1:8443 (a URL without a port means 80/443). The server commands take
    --api-key (or VLLM_API_KEY), --timeout and --json (machine output with the raw samples).

    Exit status: 0 success; 1 verify found a host failing or asleep; 2 error (unreachable,
    HTTP failure, bad input), reported as one line on stderr.
    """
    del debug  # read by LazyGroup.invoke


def main() -> None:
    cli()
