"""What the CLI prints: rich tables on a terminal (plain text when piped), or JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table


def console(stderr: bool = False) -> Console:
    """A console that stays readable when piped (no colour, wide enough for the tables)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 200, highlight=False, soft_wrap=not tty)


def emit_json(command: str, results: Sequence[dict[str, Any]], exit_code: int) -> None:
    payload = {"command": command, "exit_code": exit_code, "results": list(results)}
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error_line(message: str) -> None:
    sys.stderr.write(f"warmctl: error: {message}\n")
    sys.stderr.flush()


def ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.{digits}f} ms"


def secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*row)
    return t


def status_style(status: str) -> str:
    return {"PASS": "[green]PASS[/]", "FAIL": "[red]FAIL[/]", "ASLEEP": "[yellow]ASLEEP[/]"}.get(
        status, f"[red]{status}[/]"
    )


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
