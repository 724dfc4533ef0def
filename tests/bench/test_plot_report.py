"""`warmctl bench --report FILE` prints the tables of a saved run and draws each start's phases
as a stacked bar, from the JSON alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmctl.bench import plot
from warmctl.cli import cli

RUN = Path(__file__).resolve().parents[2] / "docs/bench/h200-2026-12-01-run2.json"


def _step(name: str, phases: list[tuple[str, float, float]], warmup: float | None) -> dict:
    return {
        "name": name,
        "config": name.split("-")[1],
        "state": name.split("-")[2],
        "ready_s": phases[-1][2],
        "warm_s": phases[-1][2] + (warmup or 0.0),
        "startup": {"phases": [{"name": n, "start_s": a, "end_s": b} for n, a, b in phases]},
        "warmup": {"seconds": warmup} if warmup else None,
    }


def test_bars_stack_every_phase_in_startup_order() -> None:
    doc = {
        "steps": [
            _step("1-A-cold", [("imports", 0, 10), ("compile", 10, 40)], None),
            _step("2-B-restart", [("imports", 0, 9), ("load", 9, 12), ("compile", 12, 15)], 2.0),
            {"name": "3-B-restart", "skipped": "budget"},
        ]
    }
    labels, names, values = plot.bars(doc)
    assert labels == ["1-A-cold\n40.0 s", "2-B-restart\n17.0 s"]
    assert names == ["imports", "compile", "load", plot.WARMUP]
    assert values["compile"] == [30.0, 3.0] and values["load"] == [0.0, 3.0]
    assert values[plot.WARMUP] == [0.0, 2.0]
    # each bar adds up to the start's start -> warm
    assert [sum(v[i] for v in values.values()) for i in range(2)] == [40.0, 17.0]


def test_report_draws_the_saved_h200_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    saved = tmp_path / "bench.json"
    shutil.copy(RUN, saved)
    result = CliRunner().invoke(cli, ["bench", "--report", str(saved)])
    assert result.exit_code == 0, result.output
    png = saved.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "Startup phases" in result.output and "bytecode: site-packages compiled first" in (
        result.output
    )
    other = tmp_path / "pics" / "x.png"
    result = CliRunner().invoke(cli, ["bench", "--report", str(saved), "--plot", str(other)])
    assert result.exit_code == 0 and other.exists()


def test_without_matplotlib_the_report_says_so(tmp_path, monkeypatch) -> None:
    import builtins

    real = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    saved = tmp_path / "bench.json"
    shutil.copy(RUN, saved)
    result = CliRunner().invoke(cli, ["bench", "--report", str(saved)])
    assert result.exit_code == 0  # the tables still print; the picture is a note
    assert "no picture: drawing needs matplotlib" in result.stderr
    result = CliRunner().invoke(cli, ["bench", "--report", str(saved), "--plot", "x.png"])
    assert result.exit_code == 2 and "pip install 'warmctl[bench]'" in result.stderr


def test_a_file_that_is_not_a_bench_document_is_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    result = CliRunner().invoke(cli, ["bench", "--report", str(bad)])
    assert result.exit_code == 2 and "not a warmctl bench.json" in result.stderr
    assert "Traceback" not in result.output


def test_the_saved_runs_tables_show_the_load_and_the_checks(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    run1 = RUN.with_name("h200-2026-12-01-run1.json")
    png = tmp_path / "run1.png"
    result = CliRunner().invoke(cli, ["bench", "--report", str(run1), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "Sleep under load" in result.output
    assert "output check after warmctl wake" in result.output
