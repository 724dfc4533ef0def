"""The lab itself: dependency check, cached venv, deterministic local model, server lifecycle."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from tests.lib import deps, model, vllmcpu
from tests.lib.common import LabError
from tests.lib.procgroup import group_members
from tests.lib.server import VllmServer

FLAGS_AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
FLAGS_OLD = "processor\t: 0\nflags\t\t: fpu sse sse2 avx\n"


def _checks(tmp_path: Path, cpuinfo: str, **kwargs):
    info = tmp_path / "cpuinfo"
    info.write_text(cpuinfo)
    return deps.run_checks(cpuinfo=info, cache=tmp_path, **kwargs)


def test_deps_pass_on_a_capable_machine(tmp_path: Path) -> None:
    checks = _checks(tmp_path, FLAGS_AVX2, machine="x86_64", system="Linux", python=(3, 11))
    assert deps.failure(checks) is None, checks


def test_deps_name_every_reason_in_one_line(tmp_path: Path) -> None:
    checks = _checks(
        tmp_path,
        FLAGS_OLD,
        machine="aarch64",
        system="Linux",
        python=(3, 10),
        min_disk_gib=1e9,
    )
    reason = deps.failure(checks)
    assert reason is not None and "\n" not in reason
    for part in ("lacks AVX2", "aarch64", "3.10 (need >= 3.11)", "GiB free"):
        assert part in reason, reason


def test_deps_unreadable_cpuinfo_fails(tmp_path: Path) -> None:
    checks = deps.run_checks(cpuinfo=tmp_path / "missing", cache=tmp_path)
    assert "no CPU flags readable" in (deps.failure(checks) or "")


def test_lab_check_command_passes_here() -> None:
    from click.testing import CliRunner
    from tests.lib.cli import command

    result = CliRunner().invoke(command, ["check", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    names = {c["name"]: c["ok"] for c in json.loads(result.stdout)}
    assert names.keys() >= {"os", "arch", "python", "avx2", "disk", "memory"}
    assert all(names.values())


def test_shape_rules() -> None:
    assert model.PRESETS["tiny"].parameters() == pytest.approx(0.56e6, rel=0.01)
    assert model.PRESETS["qwen3-0.6b"].parameters() == pytest.approx(596e6, rel=0.01)
    with pytest.raises(LabError, match="head_dim 16"):
        model.Shape(128, 256, 2, 8, 1, 16, 2048)
    tiny = model.PRESETS["tiny"]
    assert model.model_key(tiny, 0) == model.model_key(tiny, 0)
    assert model.model_key(tiny, 0) != model.model_key(tiny, 1)


@pytest.mark.integration
def test_venv_is_reused(lab_python: Path) -> None:
    t0 = time.monotonic()
    assert vllmcpu.ensure_venv() == lab_python
    assert time.monotonic() - t0 < 5
    assert vllmcpu.is_built()
    site = lab_python.parent.parent / "lib"
    for dropped in vllmcpu.DROP:
        assert not list(site.glob(f"python3*/site-packages/{dropped}")), dropped


@pytest.mark.integration
def test_model_is_real_and_deterministic(
    lab_python: Path, lab_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = json.loads((lab_model / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert config["head_dim"] == 64 and config["vocab_size"] == 2048
    vocab = json.loads((lab_model / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(2048))
    assert "<|im_start|>" in (lab_model / "chat_template.jinja").read_text()
    # the same shape and seed built again from scratch gives the same bytes
    monkeypatch.setenv("WARMCTL_CACHE", str(tmp_path))
    again = model.ensure_model(lab_python, "tiny")
    assert again.parent == tmp_path / "models" and again.name == lab_model.name
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (lab_model, again)]
        assert digest[0] == digest[1], name
    t0 = time.monotonic()
    assert model.ensure_model(lab_python, "tiny") == again
    assert time.monotonic() - t0 < 1


@pytest.mark.integration
def test_server_that_dies_at_start_is_one_line_and_leaves_nothing(
    lab_python: Path, tmp_path: Path
) -> None:
    server = VllmServer(lab_python, tmp_path / "no-such-model", log_path=tmp_path / "vllm.log")
    with pytest.raises(LabError) as err:
        server.start()
    message = str(err.value)
    assert "exited with code" in message and str(tmp_path / "vllm.log") in message
    assert "\n" not in message
    assert server.pgid is not None and group_members(server.pgid) == []


@pytest.mark.integration
def test_server_not_ready_in_time_is_killed(lab_python: Path, lab_model: Path, tmp_path) -> None:
    server = VllmServer(lab_python, lab_model, ready_timeout=3, log_path=tmp_path / "vllm.log")
    t0 = time.monotonic()
    with pytest.raises(LabError, match="not ready after 3s"):
        server.start()
    assert time.monotonic() - t0 < 60
    assert server.pgid is not None and group_members(server.pgid) == []
    assert not server.running()


@pytest.mark.integration
def test_session_server_logs_to_a_file(vllm_server: VllmServer) -> None:
    assert vllm_server.running()
    assert "Starting vLLM server" in vllm_server.log_path.read_text(errors="replace")
    members = group_members(vllm_server.pgid or -1)
    assert len(members) >= 2  # the API server and its engine core, all in one group
