"""roles/vllm_install/tasks/bytecode.yml: the units' venvs get bytecode for every module, check
mode writes none, and a second run reports no change (a file that cannot compile included)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.ansible.conftest import BIN, ROOT, ansible_env, write_inventory

TASKS = ROOT / "roles/vllm_install/tasks/bytecode.yml"


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(path.glob("lib/python3*/site-packages"))
    (site / "nocompile17").mkdir()
    (site / "nocompile17" / "__init__.py").write_text("VALUE = 17\n")
    (site / "nocompile17" / "broken.py").write_text("def (:\n")  # test data: never compiles
    return site


def _play(tmp: Path, venv: Path, warmctl: Path, *args: str) -> dict[str, int]:
    play = tmp / "play.yml"
    play.write_text(
        f"- hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.import_tasks: {TASKS}\n"
    )
    inv = write_inventory(
        tmp / "inv.json",
        {"h": {"vllm_install_venv": str(venv), "vllm_install_warmctl_venv": str(warmctl)}},
    )
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inv), str(play), *args],
        cwd=ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    recap = re.search(r"^h\s+:\s+(.*)$", proc.stdout, re.M)
    assert recap, proc.stdout[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}


def test_bytecode_is_compiled_once_and_check_mode_writes_none(tmp_path: Path) -> None:
    venv, warmctl = tmp_path / "vllm", tmp_path / "warmctl"
    site = _venv(venv)
    _venv(warmctl)
    pyc = site / "nocompile17" / "__pycache__"
    stats = _play(tmp_path, venv, warmctl, "--check")
    assert not pyc.exists()  # check mode counted, wrote nothing
    stats = _play(tmp_path, venv, warmctl)
    assert stats["changed"] == 1 and stats["failed"] == 0  # one task, both venvs compiled
    assert any(p.name.startswith("__init__.") for p in pyc.iterdir())
    assert not any(p.name.startswith("broken.") for p in pyc.iterdir())
    assert sum(1 for _ in warmctl.glob("lib/python3*/site-packages/nocompile17/__pycache__/*"))
    stats = _play(tmp_path, venv, warmctl)
    assert stats["changed"] == 0  # idempotent, though broken.py still has no bytecode
