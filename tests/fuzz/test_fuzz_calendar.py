"""Any string as a cron/OnCalendar window: converted (and `systemd-analyze calendar` accepts
every result), or one line (CalendarError; `warmctl calendar` exits 2)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import budget, invoke, one_line
from warmctl.plan.calendar import CalendarError, to_oncalendar

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze")

TOKEN = st.sampled_from(
    [
        "*",
        "0",
        "1",
        "7",
        "23",
        "31",
        "59",
        "60",
        "1-5",
        "5-1",
        "*/15",
        "0/0",
        "1,15",
        "mon",
        "fri",
        "jan",
        "sun-sat",
        "@daily",
        "@reboot",
        "Mon..Fri",
        "*-*-*",
        "07:30",
        "2026-02-30",
        "~",
        ",",
        "-1",
        "L",
    ]
)
FIELD = st.one_of(
    TOKEN, st.integers(-1, 61).map(str), st.lists(TOKEN, min_size=2, max_size=3).map(",".join)
)


def cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    """One valid cron field of values low..high: *, N, A-B, */S, A-B/S or a list of them."""
    value = st.integers(low, high)
    span = st.tuples(value, value).map(sorted).map(lambda ab: f"{ab[0]}-{ab[1]}")
    item = st.one_of(
        value.map(str), span, st.builds(lambda a, s: f"{a}/{s}", span, st.integers(1, 9))
    )
    return st.one_of(st.just("*"), st.integers(1, 30).map(lambda s: f"*/{s}"),
                     st.lists(item, min_size=1, max_size=3).map(",".join))  # fmt: skip


VALID_CRON = st.tuples(cron_field(0, 59), cron_field(0, 23), cron_field(1, 31),
                       cron_field(1, 12), cron_field(0, 7)).map(" ".join)  # fmt: skip
ONCALENDAR = st.builds(
    lambda day, h, m: f"{day}*-*-* {h:02d}:{m:02d}:00",
    st.sampled_from(["", "Mon ", "Mon..Fri ", "Sat,Sun ", "Fri "]),
    st.integers(0, 24), st.integers(0, 60),
)  # fmt: skip
CRON = st.one_of(
    VALID_CRON,
    st.lists(FIELD, min_size=5, max_size=5).map(" ".join),  # cron-shaped, often wrong
    st.lists(TOKEN, min_size=1, max_size=7).map(" ".join),
)
EXPRESSIONS = st.one_of(
    CRON, ONCALENDAR, st.text(st.characters(codec="ascii"), max_size=30), st.text(max_size=30)
)


def systemd_accepts(expr: str) -> bool:
    proc = subprocess.run(
        ["systemd-analyze", "calendar", "--", expr], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0


@settings(max_examples=budget(300))
@given(EXPRESSIONS)
@example("0 0 31 2 *")  # never fires
@example("*/0 * * * *")
@example("0 0 * * 7")
@example("-\x80")  # systemd-analyze's answer was not UTF-8: a UnicodeDecodeError traceback
@example("--help")  # was passed to systemd-analyze as its option, and "converted"
@example("\x00")  # an argv with a NUL byte: ValueError
def test_calendar_converts_or_says_why_in_one_line(expr: str) -> None:
    try:
        results = to_oncalendar(expr)
    except CalendarError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert results
    for result in results:
        assert systemd_accepts(result), (expr, result)


@settings(max_examples=budget(60))
@given(EXPRESSIONS)
def test_warmctl_calendar_prints_results_or_one_line(expr: str) -> None:
    result = invoke("calendar", "--", expr)
    if result.exit_code == 0:
        assert result.output.strip() and not result.stderr
    else:
        one_line(result)
