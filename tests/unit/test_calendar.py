"""cron -> OnCalendar conversion, parsing errors and window arithmetic (warmctl.plan.calendar)."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from warmctl.commands.calendar import command
from warmctl.plan.calendar import (
    CalendarError,
    calendar_error,
    in_window,
    is_cron,
    next_elapse,
    parse_cron,
    to_oncalendar,
)

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

CONVERSIONS = [
    ("0 20 * * 1-5", ["Mon..Fri *-*-* 20:00:00"]),
    ("30 7 * * mon-fri", ["Mon..Fri *-*-* 07:30:00"]),
    ("30 7 * * MON,WED,FRI", ["Mon,Wed,Fri *-*-* 07:30:00"]),
    ("0 0 * * 0", ["Sun *-*-* 00:00:00"]),
    ("0 0 * * 7", ["Sun *-*-* 00:00:00"]),
    ("0 22 * * sat,sun", ["Sat,Sun *-*-* 22:00:00"]),
    ("0 22 * * 5-7", ["Fri..Sun *-*-* 22:00:00"]),
    ("*/15 * * * *", ["*-*-* *:00/15:00"]),
    ("*/15 9-17 * * *", ["*-*-* 09..17:00/15:00"]),
    ("5 */6 * * *", ["*-*-* 00/6:05:00"]),
    ("0 0 */2 * *", ["*-*-01/2 00:00:00"]),
    ("0 12 1 jan-mar,dec *", ["*-01..03,12-01 12:00:00"]),
    ("0 12 1,15 * *", ["*-*-01,15 12:00:00"]),
    ("0 9-17/2 * * *", ["*-*-* 09,11,13,15,17:00:00"]),
    ("0,30 8 * * *", ["*-*-* 08:00,30:00"]),
    ("0 0 1,15 * 5", ["*-*-01,15 00:00:00", "Fri *-*-* 00:00:00"]),  # cron: either day rule
    ("@daily", ["*-*-* 00:00:00"]),
    ("@midnight", ["*-*-* 00:00:00"]),
    ("@hourly", ["*-*-* *:00:00"]),
    ("@weekly", ["Sun *-*-* 00:00:00"]),
    ("@monthly", ["*-*-01 00:00:00"]),
    ("@yearly", ["*-01-01 00:00:00"]),
    ("Mon..Fri 20:00", ["Mon..Fri 20:00"]),  # OnCalendar passes through
    ("Fri *-*-* 21:00:00", ["Fri *-*-* 21:00:00"]),
    ("daily", ["daily"]),
]


@pytest.mark.parametrize(("cron", "expected"), CONVERSIONS)
def test_conversion(cron, expected):
    assert to_oncalendar(cron, check=False) == expected


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize(("cron", "expected"), CONVERSIONS)
def test_systemd_accepts_every_conversion(cron, expected):
    assert to_oncalendar(cron, check=True) == expected  # check=True runs systemd-analyze
    for line in expected:
        proc = subprocess.run([SYSTEMD_ANALYZE, "calendar", line], capture_output=True, check=False)
        assert proc.returncode == 0


@pytest.mark.parametrize(
    ("cron", "reason"),
    [
        ("61 * * * *", "minute value 61 is outside 0-59"),
        ("0 24 * * *", "hour value 24 is outside 0-23"),
        ("0 0 0 * *", "day-of-month value 0 is outside 1-31"),
        ("0 0 * 13 *", "month value 13 is outside 1-12"),
        ("0 0 * * 8", "day-of-week value 8 is outside 0-7"),
        ("0 0 * * fri-mon", "range 'fri-mon' runs backwards"),
        ("*/0 * * * *", "bad step '0'"),
        ("*/x * * * *", "bad step 'x'"),
        ("a * * * *", "minute value 'a' is not a number or name"),
        ("0 0 * foo *", "month value 'foo' is not a number or name"),
        ("1,,2 * * * *", "empty list item"),
        ("@reboot", "@reboot is not a time of day"),
        ("@often", "unknown macro"),
    ],
)
def test_malformed_cron(cron, reason):
    with pytest.raises(CalendarError, match=reason.replace("(", r"\(")):
        to_oncalendar(cron, check=False)
    assert reason in calendar_error(cron)


def test_empty_and_non_string():
    assert "empty or not a string" in calendar_error("")
    assert "empty or not a string" in calendar_error(5)


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_malformed_oncalendar_is_caught_by_systemd():
    assert "Failed to parse calendar specification" in calendar_error("Mon..Fry 07:30")
    assert calendar_error("Mon..Fri 07:30") == ""


def test_is_cron():
    assert is_cron("0 20 * * 1-5") and is_cron("@daily")
    assert not is_cron("Mon..Fri 20:00") and not is_cron("*-*-* 20:00:00")


def test_cron_day_rules():
    both = parse_cron("0 0 13 * 5")  # the 13th OR a Friday
    assert both.matches_day(dt.date(2026, 11, 13)) and both.matches_day(dt.date(2026, 11, 6))
    assert not both.matches_day(dt.date(2026, 11, 7))
    one = parse_cron("0 0 */2 * 5")  # '*'-led day-of-month counts as unrestricted: AND
    assert one.matches_day(dt.date(2026, 11, 13)) and not one.matches_day(dt.date(2026, 11, 6))


TZ = dt.UTC
MON_19 = dt.datetime(2026, 11, 30, 19, 0, tzinfo=TZ)  # a Monday


def test_next_elapse_cron():
    assert next_elapse("0 20 * * 1-5", MON_19) == dt.datetime(2026, 11, 30, 20, 0, tzinfo=TZ)
    assert next_elapse("30 7 * * 1-5", MON_19) == dt.datetime(2026, 12, 1, 7, 30, tzinfo=TZ)
    fri = dt.datetime(2026, 12, 4, 21, 0, tzinfo=TZ)
    assert next_elapse("30 7 * * 1-5", fri) == dt.datetime(2026, 12, 7, 7, 30, tzinfo=TZ)
    assert next_elapse("0 0 29 2 *", MON_19) == dt.datetime(2028, 2, 29, 0, 0, tzinfo=TZ)
    with pytest.raises(CalendarError, match="never fires"):
        next_elapse("0 0 31 2 *", MON_19)


@pytest.mark.parametrize(
    ("now", "inside"),
    [
        (dt.datetime(2026, 11, 30, 19, 59, tzinfo=TZ), False),  # Monday before 20:00
        (dt.datetime(2026, 11, 30, 20, 0, tzinfo=TZ), True),  # the sleep minute itself
        (dt.datetime(2026, 11, 30, 23, 0, tzinfo=TZ), True),
        (dt.datetime(2026, 12, 1, 7, 29, tzinfo=TZ), True),
        (dt.datetime(2026, 12, 1, 7, 30, tzinfo=TZ), False),
        (dt.datetime(2026, 12, 1, 12, 0, tzinfo=TZ), False),
        (dt.datetime(2026, 12, 5, 12, 0, tzinfo=TZ), True),  # Saturday: asleep since Friday
    ],
)
def test_in_window_weekday_nights(now, inside):
    assert in_window("0 20 * * 1-5", "30 7 * * 1-5", now) is inside


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_in_window_oncalendar_from_now():
    now = dt.datetime.now().astimezone()
    start = (now - dt.timedelta(hours=1)).strftime("%H:%M")
    end = (now + dt.timedelta(hours=1)).strftime("%H:%M")
    assert in_window(f"*-*-* {start}:00", f"*-*-* {end}:00") is True
    assert in_window(f"*-*-* {end}:00", f"*-*-* {start}:00") is False


def test_cli_converts_and_errors():
    runner = CliRunner()
    ok = runner.invoke(command, ["0 20 * * 1-5"])
    assert ok.exit_code == 0 and ok.output == "Mon..Fri *-*-* 20:00:00\n"
    two = runner.invoke(command, ["0 0 1,15 * 5"])
    assert two.output.splitlines() == ["*-*-01,15 00:00:00", "Fri *-*-* 00:00:00"]
    bad = runner.invoke(command, ["0 25 * * *"])
    assert bad.exit_code == 2
    assert bad.output.strip() == (
        "warmctl: error: cron '0 25 * * *': hour value 25 is outside 0-23"
    )
    assert "Traceback" not in bad.output
    missing = runner.invoke(command, [])
    assert missing.exit_code == 2 and missing.output.count("\n") == 1


def test_cli_in_window_exit_codes():
    runner = CliRunner()
    now = dt.datetime.now().astimezone()
    before = (now - dt.timedelta(minutes=90)).strftime("%M %H")
    after = (now + dt.timedelta(minutes=90)).strftime("%M %H")
    inside = runner.invoke(command, ["--in-window", f"{before} * * *", f"{after} * * *"])
    assert inside.exit_code == 0 and inside.output == "inside\n"
    outside = runner.invoke(command, ["--in-window", f"{after} * * *", f"{before} * * *"])
    assert outside.exit_code == 1 and outside.output == "outside\n"
    bad = runner.invoke(command, ["--in-window", "0 25 * * *", "0 1 * * *"])
    assert bad.exit_code == 2 and "hour value 25" in bad.output
