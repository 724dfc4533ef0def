"""Cron (5 fields) -> systemd ``OnCalendar`` expressions, and sleep-window arithmetic.

A standard cron expression (ranges, lists, steps, month and weekday names, ``@daily`` and the
other macros) becomes one systemd ``OnCalendar`` expression, or two when both day-of-month and
day-of-week are restricted (cron matches either; systemd would require both). Anything that is not
cron-shaped is taken as an ``OnCalendar`` expression and passes through unchanged. Every result is
checked with ``systemd-analyze calendar`` where that tool exists.

``in_window(sleep, wake)`` says whether *now* lies inside a sleep window: the next wake comes
before the next sleep.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
from dataclasses import dataclass

from warmctl.errors import WarmctlError

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
SYSTEMD_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # ISO 1..7
PRINTABLE = re.compile(r"^[\x20-\x7e]+$")  # cron and OnCalendar are ASCII
SEARCH_DAYS = 366 * 8  # every cron expression that can fire at all fires within 8 years


class CalendarError(WarmctlError, ValueError):
    """A calendar expression that cannot be used, said in one line (exit code 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2, kind="input")


@dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    names_base: int = 0


FIELDS = (
    Field("minute", 0, 59),
    Field("hour", 0, 23),
    Field("day-of-month", 1, 31),
    Field("month", 1, 12, MONTHS, 1),
    Field("day-of-week", 0, 7, WEEKDAYS, 0),
)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the matching values of each field (weekday 0 = Sunday)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_star: bool
    weekdays_star: bool

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return dom and dow
        return dom or dow


def is_cron(expr: str) -> bool:
    """Cron-shaped: a macro such as ``@daily`` or exactly five whitespace-separated fields."""
    text = expr.strip()
    return text.startswith("@") or len(text.split()) == 5


def _value(token: str, field: Field, expr: str) -> int:
    lowered = token.lower()
    if field.names and lowered in field.names:
        return field.names.index(lowered) + field.names_base
    if not token.isdigit():
        raise CalendarError(f"cron {expr!r}: {field.name} value {token!r} is not a number or name")
    number = int(token)
    if not field.low <= number <= field.high:
        raise CalendarError(
            f"cron {expr!r}: {field.name} value {number} is outside {field.low}-{field.high}"
        )
    return number


def _field(text: str, field: Field, expr: str) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CalendarError(f"cron {expr!r}: empty list item in the {field.name} field")
        base, _, step_text = item.partition("/")
        step = 1
        if step_text or item.endswith("/"):
            if not step_text.isdigit() or int(step_text) == 0:
                raise CalendarError(f"cron {expr!r}: bad step {step_text!r} in {field.name}")
            step = int(step_text)
        if base == "*":
            low, high = field.low, field.high
        elif "-" in base:
            start, _, end = base.partition("-")
            low, high = _value(start, field, expr), _value(end, field, expr)
            if low > high:
                raise CalendarError(f"cron {expr!r}: {field.name} range {base!r} runs backwards")
        else:
            low = _value(base, field, expr)
            high = field.high if step_text else low
        values.update(range(low, high + 1, step))
    if field.name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def parse_cron(expr: str) -> Cron:
    """Parse a 5-field cron expression or macro; raise CalendarError with the reason."""
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() == "@reboot":
            raise CalendarError(f"cron {expr!r}: @reboot is not a time of day")
        if text.lower() not in MACROS:
            raise CalendarError(f"cron {expr!r}: unknown macro (known: {', '.join(MACROS)})")
        text = MACROS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise CalendarError(f"cron {expr!r}: expected 5 fields, got {len(parts)}")
    minutes, hours, days, months, weekdays = (
        _field(part, field, expr) for part, field in zip(parts, FIELDS, strict=True)
    )
    return Cron(
        minutes, hours, days, months, weekdays, parts[2].startswith("*"), parts[4].startswith("*")
    )


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for value in sorted(values):
        if runs and runs[-1][1] == value - 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _compress(values: frozenset[int], field: Field, width: int = 2) -> str:
    full = set(range(field.low, field.high + 1))
    if set(values) >= full:
        return "*"
    ordered = sorted(values)
    if len(ordered) >= 3:
        step = ordered[1] - ordered[0]
        if step > 1 and ordered == list(range(ordered[0], field.high + 1, step)):
            return f"{ordered[0]:0{width}d}/{step}"
    parts: list[str] = []
    for low, high in _runs(ordered):
        if high - low >= 2:
            parts.append(f"{low:0{width}d}..{high:0{width}d}")
        else:
            parts.extend(f"{v:0{width}d}" for v in range(low, high + 1))
    return ",".join(parts)


def _weekdays(values: frozenset[int]) -> str:
    iso = [7 if v == 0 else v for v in values]
    parts: list[str] = []
    for low, high in _runs(iso):
        names = [SYSTEMD_WEEKDAYS[v - 1] for v in range(low, high + 1)]
        parts.append(f"{names[0]}..{names[-1]}" if len(names) >= 3 else ",".join(names))
    return ",".join(parts)


def cron_to_oncalendar(cron: Cron) -> list[str]:
    """One OnCalendar expression per alternative of the cron day rule (one, or two for OR)."""
    clock = f"{_compress(cron.hours, FIELDS[1])}:{_compress(cron.minutes, FIELDS[0])}:00"
    months = _compress(cron.months, FIELDS[3])
    days = _compress(cron.days, FIELDS[2])
    all_weekdays = len(cron.weekdays) == 7
    if not cron.days_star and not cron.weekdays_star:
        return [
            f"*-{months}-{days} {clock}",
            f"{_weekdays(cron.weekdays)} *-{months}-* {clock}",
        ]
    prefix = "" if all_weekdays else f"{_weekdays(cron.weekdays)} "
    return [f"{prefix}*-{months}-{days} {clock}"]


def check_oncalendar(expr: str) -> str | None:
    """Validate with `systemd-analyze calendar`; return its normalized form, None if absent."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return None
    proc = subprocess.run(
        [tool, "calendar", "--iterations=1", "--", expr],
        capture_output=True, text=True, errors="replace", check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["rejected"])[-1]
        raise CalendarError(f"OnCalendar {expr!r}: {reason}")
    match = re.search(r"Normalized form: (.+)", proc.stdout)
    return match.group(1).strip() if match else expr


def to_oncalendar(expr: str, check: bool = True) -> list[str]:
    """Cron or OnCalendar -> the OnCalendar expressions for a timer (checked when possible)."""
    if not isinstance(expr, str) or not expr.strip():
        raise CalendarError(f"calendar expression {expr!r}: empty or not a string")
    text = " ".join(expr.split())
    if not PRINTABLE.match(text):
        raise CalendarError(f"calendar expression {expr!r}: only printable ASCII can be a time")
    results = cron_to_oncalendar(parse_cron(text)) if is_cron(text) else [text]
    if check:
        for result in results:
            check_oncalendar(result)
    return results


def calendar_error(expr: object) -> str:
    """'' when `expr` is a usable cron/OnCalendar expression, else the one-line reason."""
    try:
        to_oncalendar(expr)  # type: ignore[arg-type]
    except CalendarError as exc:
        return str(exc)
    return ""


def _next_cron(cron: Cron, after: dt.datetime) -> dt.datetime:
    start = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    day = start.date()
    for _ in range(SEARCH_DAYS):
        if cron.matches_day(day):
            for hour in sorted(cron.hours):
                for minute in sorted(cron.minutes):
                    moment = dt.datetime.combine(day, dt.time(hour, minute), tzinfo=after.tzinfo)
                    if moment >= start:
                        return moment
        day += dt.timedelta(days=1)
    raise CalendarError("cron expression never fires")


def _next_systemd(expr: str) -> dt.datetime:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise CalendarError(f"OnCalendar {expr!r}: systemd-analyze is needed to evaluate it")
    proc = subprocess.run(
        [tool, "calendar", "--iterations=1", "--", expr],
        capture_output=True, text=True, errors="replace", check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["rejected"])[-1]
        raise CalendarError(f"OnCalendar {expr!r}: {reason}")
    utc = re.search(r"\(in UTC\): \w+ (\S+ \S+)", proc.stdout)
    local = re.search(r"Next elapse: \w+ (\S+ \S+)", proc.stdout)
    found = utc or local
    if found is None:
        raise CalendarError(f"OnCalendar {expr!r}: never elapses")
    return dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)


def next_elapse(expr: str, after: dt.datetime | None = None) -> dt.datetime:
    """The next time `expr` fires after `after` (default now). OnCalendar needs systemd-analyze
    and is evaluated from now only."""
    now = after or dt.datetime.now().astimezone()
    text = " ".join(expr.split())
    if is_cron(text):
        return _next_cron(parse_cron(text), now)
    if after is not None:
        raise CalendarError(f"OnCalendar {expr!r}: can only be evaluated from now")
    return min(_next_systemd(text) for text in to_oncalendar(text))


def in_window(sleep: str, wake: str, now: dt.datetime | None = None) -> bool:
    """True when `now` lies inside the window: the next wake comes before the next sleep."""
    return next_elapse(wake, now) < next_elapse(sleep, now)
