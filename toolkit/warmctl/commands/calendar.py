"""`warmctl calendar`: cron -> systemd OnCalendar, and "is now inside a sleep window?"."""

from __future__ import annotations

import click

from warmctl.commands.options import guard


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

    EXPRESSION is a 5-field cron expression ("0 20 * * 1-5"; names, ranges, lists, steps,
    @daily ...) or an OnCalendar expression, which passes through. Cron matches a day when
    either a restricted day-of-month or a restricted day-of-week matches; systemd needs both,
    so such an expression gives two lines (a timer takes several OnCalendar= lines). Each
    result is checked with `systemd-analyze calendar` where available.

    Exit status: 0 converted (or inside the window), 1 outside the window, 2 malformed input.
    """

    def body() -> int:
        from warmctl.plan.calendar import CalendarError, in_window, to_oncalendar

        if window:
            if expression is not None:
                raise CalendarError("give either EXPRESSION or --in-window SLEEP WAKE, not both")
            inside = in_window(*window)
            click.echo("inside" if inside else "outside")
            return 0 if inside else 1
        if expression is None:
            raise CalendarError("missing EXPRESSION (a cron or OnCalendar expression)")
        for line in to_oncalendar(expression):
            click.echo(line)
        return 0

    guard(body)
