"""nvidia-smi parsing, with a scripted nvidia-smi on PATH (the CI machine has no GPU)."""

import os
import stat

import pytest

from warmctl.bench import gpumem

SCRIPT = """#!/bin/sh
case "$*" in
  *query-gpu=name*) echo "NVIDIA H200, 580.159.04" ;;
  *query-gpu=memory*) echo "133971, 143771" ;;
  *query-compute-apps*) printf '4242, 131000\\n4243, 2500\\n999, 77\\n' ;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    path = tmp_path / "nvidia-smi"
    path.write_text(SCRIPT)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return path


def test_reads_device_and_own_processes(fake_smi):
    assert gpumem.available()
    assert gpumem.gpu_name() == "NVIDIA H200, 580.159.04"
    mem = gpumem.read([4242, 4243])
    assert (mem.used_mib, mem.total_mib, mem.procs_mib) == (133971, 143771, 133500)
    assert gpumem.read().procs_mib is None
    assert gpumem.read([1]).procs_mib is None


def test_no_nvidia_smi_means_no_figures(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not gpumem.available()
    assert gpumem.read([1]) is None and gpumem.gpu_name() is None


def test_two_gpus_are_summed_and_kept_apart(fake_smi):
    """A tensor-parallel server spreads over every GPU: the figure is the machine's."""
    fake_smi.write_text(
        SCRIPT.replace('echo "133971, 143771"', "printf '70100, 143771\\n69900, 143771\\n'")
    )
    mem = gpumem.read([4242, 4243])
    assert (mem.used_mib, mem.total_mib) == (140000, 287542)
    assert mem.per_gpu_used_mib == (70100, 69900)
    assert mem.procs_mib == 133500
