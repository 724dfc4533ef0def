"""The levers issue 17 measures: W/V (shorter warmups) and S (spawned EngineCore) restart from
B's primed caches; every start runs without PYTHONDONTWRITEBYTECODE, as a unit does; the JSON
says how much bytecode the interpreter had; plans take +load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from warmctl.bench import bytecode, configs
from warmctl.bench.runner import Knobs, Runner, parse_plan
from warmctl.errors import WarmctlError


@pytest.fixture
def site(tmp_path: Path) -> configs.Site:
    return configs.Site(
        device="gpu",
        venv=tmp_path / "venv",
        model="/models/qwen3",
        served_name="m",
        port=8123,
        workdir=tmp_path / "work",
        warmctl_venv=tmp_path / "wv",
        extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    )


def test_w_v_s_are_b_with_one_lever_and_share_its_caches(site, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # the H200 image's environment
    table = configs.standard(w_warmup_args=("--max-batch", "8"))
    b = table["B"].launch(site, site.workdir / "tb")
    assert b.spec.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "PYTHONDONTWRITEBYTECODE" not in b.spec.env  # a unit never has it
    assert b.spec.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    for key in "WVS":
        cfg = table[key]
        assert cfg.cache_dir(site) == table["B"].cache_dir(site) and cfg.home(site) == table[
            "B"
        ].home(site)
        launch = cfg.launch(site, site.workdir / f"t{key}")
        assert launch.spec.argv == b.spec.argv, key
        assert launch.spec.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0", key  # machine env kept
    s = table["S"].launch(site, site.workdir / "ts")
    assert s.spec.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert table["W"].launch(site, site.workdir / "tw").warmup_argv[-2:] == ["--max-batch", "8"]
    v = table["V"].launch(site, site.workdir / "tv").warmup_argv
    assert v[-len(configs.V_WARMUP_ARGS) :] == list(configs.V_WARMUP_ARGS)
    a = table["A"].launch(site, site.workdir / "ta")
    assert "PYTHONDONTWRITEBYTECODE" not in a.spec.env
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in a.spec.env  # plain vLLM: its CLI's spawn


def test_a_shared_cache_makes_the_first_start_a_restart(site, tmp_path) -> None:
    steps = parse_plan("B,W+sleep+load,S", configs.standard())
    assert [s.label for s in steps] == ["B", "W+sleep+load", "S"]
    assert steps[1].sleep and steps[1].load and not steps[2].load
    names = []

    class Fake(Runner):
        def _start(self, step, name, state):  # type: ignore[override]
            names.append(name)
            return {"name": name, "config": step.config.key, "state": state}

    Fake(site, steps, tmp_path / "out", Knobs(), None, lambda _: None, {}).run()
    assert names == ["1-B-cold", "2-W-restart", "3-S-restart"]


def test_plan_flags_are_checked() -> None:
    table = configs.standard()
    for bad in ("B+load+load", "B+fast", "Z"):
        with pytest.raises(WarmctlError, match="bad plan item"):
            parse_plan(bad, table)


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(path.glob("lib/python3*/site-packages"))
    for name in ("vllm", "torch"):
        (site / name / "sub").mkdir(parents=True)
        (site / name / "__init__.py").write_text("X = 1\n")
        (site / name / "sub" / "m.py").write_text("Y = 2\n")
    return path / "bin" / "python"


def test_bytecode_is_measured_and_compiled(tmp_path, monkeypatch) -> None:
    python = _venv(tmp_path / "v")
    extra = tmp_path / "extra"
    (extra / "transformers").mkdir(parents=True)
    (extra / "transformers" / "__init__.py").write_text("Z = 3\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))  # like the H200's /root/site
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    info = bytecode.prepare(python, compile_first=False)
    assert info["bench_env_PYTHONDONTWRITEBYTECODE"] == "1"
    assert info["starts_env_PYTHONDONTWRITEBYTECODE"] is None
    assert set(info["before"]) == {"vllm", "torch", "transformers"}
    assert info["before"]["vllm"] == {
        "path": str(next(tmp_path.glob("v/lib/python3*/site-packages")) / "vllm"),
        "py_files": 2,
        "with_bytecode": 0.0,
    }
    assert "after" not in info
    info = bytecode.prepare(python, compile_first=True)
    assert info["compiled"]["exit"] == 0
    assert all(v["with_bytecode"] == 1.0 for v in info["after"].values())
    line = bytecode.describe(info)
    assert "site-packages compiled first" in line and "vllm 100%" in line
    assert "was '1' in the bench's environment" in line
    assert bytecode.describe(None) == "bytecode: not recorded"


def test_an_interpreter_that_does_not_run_is_one_error(tmp_path) -> None:
    with pytest.raises(WarmctlError, match="cannot ask"):
        bytecode.prepare(tmp_path / "nope" / "python", compile_first=False)


def test_server_errors_are_the_error_lines_of_a_window() -> None:
    from warmctl.bench.logphases import server_errors
    from warmctl.bench.process import StampedLine

    lines = [
        StampedLine(1.0, "(APIServer pid=1) ERROR 12-01 [server_utils.py:384] Exception caught."),
        StampedLine(2.0, "(APIServer pid=1) INFO 12-01 wake up the engine with tags: None"),
        StampedLine(3.0, "Traceback (most recent call last):"),
        StampedLine(9.0, "(APIServer pid=1) ERROR later, outside the window"),
    ]
    found = server_errors(lines, 0.5, 5.0)
    assert found == [lines[0].text, lines[2].text]
