"""Terminal tables of a benchmark document: starts side by side, startup phases, sleep/wake,
caches written outside the persistent cache dir, and the issue's targets."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from warmctl.bench.bytecode import describe
from warmctl.bench.starts import starts
from warmctl.bench.targets import evaluate
from warmctl.terminal.termsafe import safe


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _ok(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if "skipped" not in s]


def starts_table(doc: dict[str, Any]) -> Table:
    title = "Starts (TTFT in ms; x = first / steady; idle = one request after an idle pause)"
    t = Table(title=title, title_justify="left")
    for col in (
        "start",
        "ready s",
        "warm s",
        "1st",
        "steady",
        "x",
        "idle",
        "burst 1st",
        "burst",
        "x",
        "ms/tok",
        "GPU MiB",
        "compile",
        "graphs",
        "JIT@serve",
    ):
        t.add_column(col, justify="left" if col == "start" else "right")
    for s in starts(doc):
        if "skipped" in s:
            t.add_row(s["name"], "skipped", *[""] * 13)
            continue
        one, b, d = s.get("single") or {}, s.get("bursts") or {}, s.get("decode") or {}
        mem = (s.get("gpu_serving") or {}).get("used_mib")
        st = s.get("startup") or {}
        jit = sum((s.get("jit_while_serving") or {}).values())
        t.add_row(
            s["name"] + (" (error)" if "error" in s else ""),
            _f(s.get("ready_s")),
            _f(s.get("warm_s")),
            _f(one.get("first_ms")),
            _f(one.get("steady_ms")),
            _f(one.get("ratio"), "{:.2f}"),
            _f(one.get("after_idle_ms")),
            _f(b.get("first_mean_ms")),
            _f(b.get("steady_mean_ms")),
            _f(b.get("ratio"), "{:.2f}"),
            _f(d.get("ms_per_token"), "{:.2f}"),
            _f(mem, "{:,}"),
            st.get("compile_cache", "-"),
            _f(st.get("capture_sizes"), "{}"),
            str(jit),
        )
    return t


def phases_table(doc: dict[str, Any]) -> Table:
    steps = [s for s in _ok(starts(doc)) if s.get("startup")]
    t = Table(title="Startup phases (s, from the log as it streamed)", title_justify="left")
    t.add_column("phase")
    for s in steps:
        t.add_column(s["name"], justify="right")
    names: list[str] = []
    for s in steps:
        for p in s["startup"]["phases"]:
            if p["name"] not in names:
                names.append(p["name"])
    names.append("unit warmup (ExecStartPost)")
    for name in names:
        row = []
        for s in steps:
            if name.startswith("unit warmup"):
                row.append(_f((s.get("warmup") or {}).get("seconds"), "{:.2f}"))
                continue
            secs = [p["end_s"] - p["start_s"] for p in s["startup"]["phases"] if p["name"] == name]
            row.append(_f(secs[0], "{:.2f}") if secs else "-")
        t.add_row(name, *row)
    t.add_row("= start -> warm", *[_f(s.get("warm_s")) for s in steps])
    return t


def sleep_table(doc: dict[str, Any]) -> Table | None:
    rows = [(s["name"], c) for s in _ok(doc.get("steps", [])) for c in s.get("sleep") or []]
    if not rows:
        return None
    t = Table(title="Sleep / wake", title_justify="left")
    for col in (
        "start",
        "level",
        "how",
        "sleep s",
        "GPU serving",
        "asleep",
        "freed",
        "wake s",
        "1st TTFT ms",
        "wake->token s",
        "check s",
        "steady ms",
        "output",
        "log errors",
    ):
        t.add_column(col, justify="left" if col in ("start", "how") else "right")
    for name, c in rows:
        if "error" in c or "skipped" in c:
            t.add_row(
                name,
                _f(c.get("level"), "{}"),
                c.get("how", "-"),
                c.get("error") or c.get("skipped"),
                *[""] * 10,
            )
            continue
        t.add_row(
            name,
            str(c["level"]),
            c["how"],
            _f(c["sleep_s"], "{:.2f}"),
            _f(c["mem_serving_mib"], "{:,}"),
            _f(c["mem_asleep_mib"], "{:,}"),
            _f(c.get("freed_fraction"), "{:.1%}"),
            _f(c["wake_s"], "{:.3f}"),
            _f(c["first_ttft_ms"]),
            _f(c["wake_to_first_token_s"], "{:.3f}"),
            _check(c.get("wake_detail") or {}),
            _f(c["steady_after_ms"]),
            {True: "same", False: "DIFFERS"}.get(c.get("output_same"), "-"),
            str(len(c.get("server_log_errors") or [])),
        )
    return t


def _check(wake: dict[str, Any]) -> str:
    """The output check's time when it passed, else its status."""
    check = wake.get("output_check") or {}
    if check.get("status") == "passed":
        return _f(check.get("seconds"), "{:.3f}")
    return str(check.get("status", "-"))


def load_table(doc: dict[str, Any]) -> Table | None:
    """Sleep and wake under streaming load (loadsleep): what happened to every request."""
    rows = [
        (s["name"], r) for s in _ok(doc.get("steps", [])) for r in s.get("sleep_under_load") or []
    ]
    if not rows:
        return None
    t = Table(title="Sleep under load (warmctl sleep + wake behind the gate)", title_justify="left")
    for col in (
        "start",
        "clients",
        "level",
        "in flight",
        "started",
        "completed",
        "refused",
        "cut",
        "engine errors",
        "after wake",
        "sleep s",
        "wake s",
        "output check",
        "log errors",
    ):
        t.add_column(col, justify="left" if col in ("start", "output check") else "right")
    for name, r in rows:
        if "error" in r or "skipped" in r:
            level = _f(r.get("level"), "{}")
            t.add_row(name, "", level, r.get("error") or r.get("skipped"), *[""] * 10)
            continue
        c = r["counts"]
        t.add_row(
            name,
            str(r["clients"]),
            str(r["level"]),
            str(r["in_flight_at_sleep"]),
            str(c["started"]),
            str(c["completed"]),
            str(c["refused"]),
            str(c["cut"]),
            str(c["engine_errors"]),
            str(r["completed_after_wake"]),
            _f(r["sleep_s"], "{:.2f}"),
            _f(r["wake_s"], "{:.2f}"),
            str((r.get("output_check") or {}).get("status", "-")),
            str(len(r.get("server_log_errors") or [])),
        )
    return t


def leaks_table(doc: dict[str, Any]) -> Table | None:
    """Caches a start wrote to HOME or TMPDIR: lost on reboot / PrivateTmp, or not pinned."""
    t = Table(title="Written outside the persistent cache dir (MiB)", title_justify="left")
    for col in ("start", "where", "folder", "MiB"):
        t.add_column(col, justify="right" if col == "MiB" else "left")
    n = 0
    for s in _ok(doc.get("steps", [])):
        for role in ("home", "tmp"):
            for folder, size in (s.get("disk") or {}).get(role, {}).items():
                if size >= 64 * 1024:
                    t.add_row(s["name"], role, folder, f"{size / 2**20:.1f}")
                    n += 1
    return t if n else None


def targets_table(doc: dict[str, Any]) -> Table:
    t = Table(title="Targets", title_justify="left")
    for col in ("target", "config", "measured", "limit", "met"):
        t.add_column(col)
    for v in evaluate(doc):
        met = "n/a" if v.met is None else ("[green]yes[/]" if v.met else "[red]NO[/]")
        t.add_row(v.target, v.config, v.measured, v.limit, met)
    return t


def print_report(doc: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=200)
    meta = doc.get("meta", {})
    console.print(  # the server's words: plain text, control characters escaped
        safe(
            f"vLLM {meta.get('vllm_version', '?')} on "
            f"{meta.get('device_name') or meta.get('device')}"
            f", model {meta.get('model')}, plan {meta.get('plan')}"
        ),
        markup=False,
    )
    console.print(describe(meta.get("bytecode")))
    for table in (
        phases_table(doc),
        sleep_table(doc),
        load_table(doc),
        leaks_table(doc),
        starts_table(doc),
        targets_table(doc),
    ):
        if table is not None:
            console.print(table)
