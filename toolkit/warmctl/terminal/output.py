"""What the CLI prints: rich tables on a terminal (plain text when piped), or JSON.

Everything printed here is terminal-safe (warmctl.terminal.termsafe): a server's text (an error
message, a model name, a version, a host's verify result) has its control characters escaped,
and a plain `str` is never read as rich markup or emoji codes: only `styled()` (warmctl's own
markup, its values escaped) colours. This is the one place: every line and table the CLI
prints goes through it, whatever the text's way in (an HTTP answer, a host's JSON, a flag
file), while JSON output needs nothing (json.dumps escapes control characters).

Under systemd (stdout/stderr connected to the journal, as `JOURNAL_STREAM` says) every line
starts with an sd-daemon priority prefix: `<3>` errors, `<4>` warnings, `<6>` the rest, so
`journalctl -p err -u 'vllm-*'` finds a failed sleep. Elsewhere nothing changes.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import IO, Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from warmctl.terminal.termsafe import safe

ERR, WARNING, INFO = 3, 4, 6


def journal_attached(stream: IO[str]) -> bool:
    """True when `stream` is the journal stream systemd set up for this process
    (JOURNAL_STREAM is "DEVICE:INODE" of it; a child with other redirections keeps the
    variable but not the stream, so compare)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError, io.UnsupportedOperation):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class _Prefixed(io.TextIOBase):
    """Writes through to `stream`, starting every line with `<N>`."""

    def __init__(self, stream: IO[str], priority: int) -> None:
        self._stream = stream
        self._prefix = f"<{priority}>"
        self._at_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_start:
                out.append(self._prefix)
            out.append(piece)
            self._at_start = piece.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False


def _line(stream: IO[str], priority: int, text: str) -> None:
    prefix = f"<{priority}>" if journal_attached(stream) else ""
    stream.write(f"{prefix}{safe(text, one_line=True)}\n")
    stream.flush()


class SafeConsole(Console):
    """A rich console whose `print` escapes control characters in plain strings (and, made
    with markup and emoji off, shows them as they are)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(safe(o) if isinstance(o, str) else o for o in objects), **kwargs)


def console(stderr: bool = False) -> Console:
    """A console that stays readable when piped (no colour, wide enough for the tables)."""
    stream: IO[str] = sys.stderr if stderr else sys.stdout
    if journal_attached(stream):
        stream = _Prefixed(stream, INFO)
    tty = stream.isatty()
    return SafeConsole(
        file=stream,
        width=None if tty else 200,
        highlight=False,
        soft_wrap=not tty,
        markup=False,
        emoji=False,
    )


def styled(markup: str, *values: object) -> Text:
    """warmctl's own rich `markup` (a str.format template), each of `values` put in as plain
    text (control characters and markup escaped): `styled("[bold]{}[/]: ok", name)`."""
    return Text.from_markup(markup.format(*(escape(safe(v)) for v in values)), emoji=False)


def plain(value: str | Text) -> Text:
    """A table cell or title: warmctl's `styled` text as it is, any str as literal text."""
    return value if isinstance(value, Text) else Text(safe(value))


def emit_json(command: str, results: Sequence[dict[str, Any]], exit_code: int) -> None:
    payload = {"command": command, "exit_code": exit_code, "results": list(results)}
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error_line(message: str) -> None:
    _line(sys.stderr, ERR, f"warmctl: error: {message}")


def warning_line(message: str) -> None:
    _line(sys.stderr, WARNING, f"warmctl: warning: {message}")


def info_line(message: str, stderr: bool = False) -> None:
    """One line of a long-running command's log (the waker), or a note of a command whose
    stdout is its result (`stderr`); priority info under journald."""
    _line(sys.stderr if stderr else sys.stdout, INFO, f"warmctl: {message}")


def ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.{digits}f} ms"


def secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table(
    title: str | Text | None, columns: Sequence[str], rows: Sequence[Sequence[str | Text]]
) -> Table:
    """A table whose str cells are plain text (a server's words are never markup)."""
    t = Table(
        title=None if title is None else plain(title), title_justify="left", header_style="bold"
    )
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(plain(cell) for cell in row))
    return t


def status_style(status: str) -> Text:
    """A verify result coloured: PASS green, ASLEEP yellow, anything else red."""
    word = status.split(" ", 1)[0]
    colour = {"PASS": "green", "ASLEEP": "yellow"}.get(word, "red")
    return styled(f"[{colour}]{{}}[/]", status)


R = TypeVar("R")


def report_hosts(
    command: str,
    labels: Sequence[str],
    results: Sequence[R | BaseException],
    kind: type[R],
    lines: Callable[[R], list[str]],
    *,
    as_json: bool,
    ok_code: int = 0,
) -> int:
    """Print what one action did on each host (`lines` of its report) or its one-line error;
    with `as_json` the reports' dicts instead. Exit status: `ok_code` (0 unless the caller says
    otherwise), or 2 when any host failed."""
    code = ok_code
    out = console()
    dicts: list[dict[str, Any]] = []
    for label, r in zip(labels, results, strict=True):
        if not isinstance(r, kind):
            code = 2
            error_line(str(r))
            dicts.append({"target": label, "error": str(r), "error_kind": getattr(r, "kind", None)})
            continue
        dicts.append(r.to_dict())  # type: ignore[attr-defined]
        if not as_json:
            for line in lines(r):
                out.print(line)
    if as_json:
        emit_json(command, dicts, code)
    return code


def lock_wait_line(label: str) -> Callable[[str], None]:
    """What a sleep or wake says while it waits for another one of the same instance."""
    return partial(_info, label)


def _info(label: str, text: str) -> None:
    info_line(f"{label}: {text}", True)
