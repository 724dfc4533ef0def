"""`warmctl bench`'s options reach the run as one object: the machine's server, C's and W's
levers, the traffic knobs and the budget arrive where the runner and the JSON read them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from warmctl.bench import bytecode, main, runner
from warmctl.cli import cli


def test_every_option_reaches_the_runner_and_the_json(tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run(self: runner.Runner) -> dict[str, Any]:
        seen["runner"] = self
        return {"meta": self.doc["meta"], "steps": []}

    monkeypatch.setattr(runner.Runner, "run", fake_run)
    monkeypatch.setattr(bytecode, "prepare", lambda python, compile_: {"compiled": compile_})
    monkeypatch.setattr(main, "print_report", lambda doc: None)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64, "other": 1}')
    args = [
        "bench", "--model", str(model), "--python", sys.executable, "--device", "cpu",
        "--out", str(tmp_path / "out"), "--port", "8123", "--served-name", "tiny",
        "--plan", "A,C,W", "--arg=--enforce-eager", "--env", "VLLM_X=1",
        "--tensor-parallel-size", "2", "--c-capture-sizes", "8,1,4",
        "--c-gpu-memory-utilization", "0.5", "--w-warmup-args", "--max-batch 2",
        "--budget", "900", "--requests", "3", "--bursts", "2", "--burst-width", "4",
        "--decode-tokens", "8", "--idle-gap", "0.5", "--start-timeout", "60",
        "--no-compile-bytecode",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    run = seen["runner"]
    assert (run.site.device, run.site.port, run.site.served_name) == ("cpu", 8123, "tiny")
    assert run.site.model == str(model.resolve())
    assert run.site.extra_args == ("--enforce-eager",)
    assert run.site.extra_env == {"VLLM_X": "1"}
    assert run.site.tensor_parallel_size == 2
    assert run.out == (tmp_path / "out").absolute()
    assert [s.label for s in run.steps] == ["A", "C", "W"]
    assert run.budget_s == 900
    assert run.knobs == runner.Knobs(
        single_n=3, bursts_n=2, burst_width=4, decode_tokens=8, idle_gap_s=0.5,
        start_timeout_s=60,
    )  # fmt: skip
    meta = run.doc["meta"]
    assert meta["knobs"] == {
        "requests": 3, "bursts": 2, "burst_width": 4, "decode_tokens": 8, "idle_gap_s": 0.5,
    }  # fmt: skip
    assert meta["bytecode"] == {"compiled": False}
    assert meta["model_config"] == {"hidden_size": 64}
    assert (meta["device"], meta["plan"], meta["tensor_parallel_size"]) == ("cpu", "A,C,W", 2)
    c = meta["configs"]["C"]
    assert c["compilation_config"] == {"cudagraph_capture_sizes": [1, 4, 8]}
    assert c["instance_extra"] == {"gpu_memory_utilization": 0.5}
    assert meta["configs"]["W"]["instance_extra"] == {"warmup_args": ["--max-batch", "2"]}
    assert "--budget=900" in meta["command"] and "--served-name=tiny" in meta["command"]


def test_too_few_requests_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "--model", "m", "--out", str(tmp_path), "--requests", "1"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "warmctl bench: --requests and --bursts need at least 2 (a first and a steady one)"
    )
    assert not (tmp_path / "work").exists()
