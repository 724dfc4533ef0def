"""`warmctl window-check`: the window services' ExecCondition (run as root: `+`)."""

from __future__ import annotations

import click

from warmctl.commands.options import guard, textfile_options

# ExecCondition's exit statuses (systemd.service(5)): 1-254 skip the service, which is not
# marked failed; 255 fails it (systemctl --failed, OnFailure=, the unit's result)
SKIP = 1
FAIL = 255


@click.command("window-check")
@click.argument("unit")
@click.option(
    "--action",
    type=click.Choice(["sleep", "wake"]),
    required=True,
    help="What the window does now.",
)
@click.option("--window", "window", required=True, metavar="NAME", help="The window's name.")
@click.option(
    "--systemctl",
    "systemctl",
    default="systemctl",
    show_default=True,
    metavar="PATH",
    help="The systemctl to ask.",
)
@textfile_options
def command(
    unit: str,
    action: str,
    window: str,
    systemctl: str,
    textfile_dir: str | None,
    instance_name: str | None,
) -> None:
    """Exit 0 if UNIT is active, so that the window's sleep or wake goes ahead.

    Otherwise the window does not act, and says why: one line in the journal (warning when the
    unit is stopped, failed or starting: exit 1, the service is skipped; error when its state
    cannot be read: exit 255, the service fails), and with --textfile-dir the command's last
    run counts as failed and warmctl_window_skipped_timestamp_seconds{action,window,reason}
    says when and why. Run it as root (ExecCondition=+...): root's systemctl reaches systemd
    over its private socket, without D-Bus.
    """

    def body() -> int:
        from warmctl.errors import WarmctlError
        from warmctl.host.unitstate import ACTIONABLE, active_state
        from warmctl.observe.textfile import record_window_skip
        from warmctl.terminal.output import error_line, warning_line

        try:
            state = active_state(unit, systemctl)
        except WarmctlError as err:
            error_line(f"{err.message}: {action} of window {window} not done")
            code, reason = FAIL, "error"
        else:
            if state == ACTIONABLE:
                return 0
            warning_line(f"{unit} is {state}: {action} of window {window} skipped")
            code, reason = SKIP, state
        if textfile_dir:
            try:
                record_window_skip(textfile_dir, instance_name or unit, action, window, reason)
            except WarmctlError as err:
                error_line(err.message)
                code = FAIL
        return code

    guard(body)
