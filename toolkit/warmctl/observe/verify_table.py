"""The table of `warmctl verify` results, one code for the command's output and for the table
the role warmctl.vllm.vllm_verify shows on the controller (through the collection's filters,
so the plain lines need nothing beyond the standard library: rich only on a terminal)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

COLUMNS = [
    "RESULT",
    "FIRST TTFT",
    "FIRST TOTAL",
    "STEADY TTFT p50",
    "p90",
    "FIRST/STEADY",
    "DECODE ms/tok",
    "WHY",
]


def cells(d: Mapping[str, Any], style: Callable[[str], Any] = str) -> list[Any]:
    """One result's cells under COLUMNS; `style` dresses the status (rich text on a terminal)."""
    ratio = "-" if d.get("ratio") is None else f"{d['ratio']:.2f}x"
    decode = d.get("decode_ms_per_token")
    attempt = d.get("attempt") or 1
    return [
        style(str(d["status"]) + (f" (attempt {attempt})" if attempt > 1 else "")),
        _ms(d.get("first_ttft_s")),
        _ms(d.get("first_total_s")),
        _ms(d.get("steady_median_ttft_s")),
        _ms(d.get("steady_p90_ttft_s")),
        ratio,
        "-" if decode is None else f"{decode:.2f}",
        why(d),
    ]


def why(report: Mapping[str, Any]) -> str:
    """Why the host failed, after why each earlier attempt did ("attempt 1: ...")."""
    reasons = report.get("reasons") or []
    now = "; ".join(reasons) if reasons else _without_label(report.get("error"), report["target"])
    earlier = report.get("earlier_attempts") or []
    if not earlier:
        return now
    notes = [f"attempt {n}: {'; '.join(e.get('reasons') or [])}" for n, e in enumerate(earlier, 1)]
    if now:
        notes.append(f"attempt {report.get('attempt')}: {now}")
    return " | ".join(notes)


def _without_label(message: str | None, label: str) -> str:
    """The HOST column already names the host."""
    if not message:
        return ""
    return message.removeprefix(f"{label}: ")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def results_table(results: Sequence[Mapping[str, Any]], style: Callable[[str], Any]) -> Table:
    """`warmctl verify`'s table: a row per target."""
    from warmctl.terminal.output import table

    return table(None, ["HOST", *COLUMNS], [[str(d["target"]), *cells(d, style)] for d in results])


def fleet_lines(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """The role's table as plain lines (the play's output): a row per host and instance;
    `rows`: inventory host -> its results, each with its `instance` (and, from the deploy, the
    `vllm` release it runs: a VLLM column)."""
    from warmctl.terminal.termsafe import safe

    release = any("vllm" in r for results in rows.values() for r in results)
    body = [
        [
            safe(c, one_line=True)
            for c in [
                host,
                str(r["instance"]),
                *([str(r.get("vllm") or "-")] if release else []),
                *cells(r),
            ]
        ]
        for host, results in rows.items()
        for r in results
    ]
    lines = [["HOST", "INSTANCE", *(["VLLM"] if release else []), *COLUMNS], *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
