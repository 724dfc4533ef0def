"""`warmctl calendar`: cron -> systemd OnCalendar, and "is now inside a sleep window?"."""

from __future__ import annotations

import click


@click.command("calendar")
@click.argument("expression", required=False)
@click.option(
    "--in-window",
    "window",
    nargs=2,
    metavar="SLEEP WAKE",
    help="Exit 0 if now lies inside the window SLEEP..WAKE (cron or OnCalendar), 1 if not.",
)
def command(expression: str | None, window: tuple[str, str] | None) -> None:
    """Print the systemd OnCalendar expression(s) for EXPRESSION, one per line.

    EXPRESSION is a 5-field cron expression ("0 20 * * 1-5", names, ranges, lists, steps,
    @daily ...) or an OnCalendar expression, which passes through. Each result is checked
    with `systemd-analyze calendar` where available. Malformed input: one line, exit 2.
    """
    from warmctl.calendar import CalendarError, in_window, to_oncalendar

    try:
        if window:
            if expression is not None:
                raise CalendarError("give either EXPRESSION or --in-window SLEEP WAKE, not both")
            inside = in_window(*window)
            click.echo("inside" if inside else "outside")
            raise SystemExit(0 if inside else 1)
        if expression is None:
            raise CalendarError("missing EXPRESSION (a cron or OnCalendar expression)")
        for line in to_oncalendar(expression):
            click.echo(line)
    except CalendarError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
