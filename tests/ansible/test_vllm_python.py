"""vllm_install_vllm_python: an interpreter that already has vLLM. The install role leaves it
alone (no venv created, no pip, no bytecode compiled into it; warmctl's venv as usual), the units
run vLLM with it, and the validation wants an absolute path. Preflight's check of the interpreter
is in test_preflight_host.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.ansible.conftest import BIN, ROOT, ansible_env, write_inventory

from warmctl.plan.render import render_instance
from warmctl.plan.validate import problems

INSTANCE = {"name": "qwen", "model": "/srv/models/qwen", "port": 8000, "launcher": True}


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(path.glob("lib/python3*/site-packages"))
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.26.0"\n')
    return site


def _tasks(stdout: str) -> dict[str, str]:
    """TASK name -> what its first result line says (ok, changed, skipping, ...)."""
    out = {}
    for block in stdout.split("TASK [")[1:]:
        name = block.split("]", 1)[0].split(" : ", 1)[-1]
        status = re.search(r"^(ok|changed|skipping|fatal|failed)", block, re.M)
        out[name] = status.group(1) if status else "?"
    return out


def _play(tmp: Path, tasks: str, host: dict[str, object], *args: str) -> str:
    play = tmp / f"play-{tasks}"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.import_role:\n        name: warmctl.vllm.vllm_install\n"
        f"        tasks_from: {tasks}\n"
        "  handlers:\n    - name: vllm_service restart changed\n"  # the service role's
        "      ansible.builtin.debug:\n        msg: restart\n"
    )
    inv = write_inventory(tmp / "inv.json", {"h": host})
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inv), str(play), *args],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout


def test_the_role_creates_no_venv_and_runs_no_pip_for_it(tmp_path: Path) -> None:
    given = tmp_path / "image"
    _venv(given)
    wheel = tmp_path / "dist/warmctl-9.9.9-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"not installed: --check")
    (tmp_path / "dist/warmctl-requirements.txt").write_text("")
    host = {
        "vllm_preflight_device_kind": "cpu",
        "vllm_install_vllm_python": str(given / "bin/python"),
        "vllm_install_venv": str(tmp_path / "venv"),
        "vllm_install_warmctl_venv": str(tmp_path / "warmctl"),
        "vllm_install_warmctl_wheel": str(wheel),
        "vllm_install_warmctl_requirements": str(tmp_path / "dist/warmctl-requirements.txt"),
        "vllm_install_warmctl_dist": str(tmp_path / "host-dist"),
    }
    status = _tasks(_play(tmp_path, "venv", host, "--check"))
    for name in (
        "Read the installed vLLM version",
        "Install vLLM into its venv",
        "Remove the packages that break vLLM on CPU hosts",
    ):
        assert status[name] == "skipping", status
    assert status["Install warmctl's dependencies, pinned by hash"] == "changed"  # as usual
    assert not (tmp_path / "venv").exists()
    # the same host without the variable: the role would install vLLM (check mode: reported)
    del host["vllm_install_vllm_python"]
    status = _tasks(_play(tmp_path, "venv", host, "--check"))
    assert status["Install vLLM into its venv"] == "changed"


def test_no_bytecode_is_compiled_into_the_given_interpreter(tmp_path: Path) -> None:
    given_site = _venv(tmp_path / "image")
    warmctl_site = _venv(tmp_path / "warmctl")
    host = {
        "vllm_install_vllm_python": str(tmp_path / "image/bin/python"),
        "vllm_install_venv": str(tmp_path / "image"),
        "vllm_install_warmctl_venv": str(tmp_path / "warmctl"),
    }
    _play(tmp_path, "bytecode", host)
    assert not (given_site / "vllm/__pycache__").exists()
    assert (warmctl_site / "vllm/__pycache__").is_dir()


def test_the_unit_runs_vllm_with_the_given_interpreter() -> None:
    host = {
        "vllm_install_vllm_python": "/opt/image/bin/python3",
        "vllm_preflight_device_kind": "gpu",
    }
    unit = render_instance({**INSTANCE, "gpus": [0]}, host)
    service = next(text for path, text in unit.files.items() if path.endswith("vllm-qwen.service"))
    start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(start.removeprefix("ExecStart="))
    assert argv[0] == "/opt/image/bin/python3" and argv[1].endswith("/vllm_launch.py")
    assert "/opt/vllm/venv" not in service
    default = render_instance({**INSTANCE, "gpus": [0]}, {"vllm_preflight_device_kind": "gpu"})
    text = next(t for p, t in default.files.items() if p.endswith("vllm-qwen.service"))
    assert "ExecStart=/opt/vllm/venv/bin/python " in text


def test_the_variable_is_an_absolute_path_when_set() -> None:
    def lines(value: str) -> list[str]:
        return [p.line("h") for p in problems({"vllm_install_vllm_python": value})]

    assert lines("") == [] and lines("/opt/image/bin/python3") == []
    assert lines("bin/python") == [
        'h: vllm_install_vllm_python: is the string "bin/python" (empty, or an absolute path of '
        "letters, digits and . _ - + @ : /, e.g. /opt/vllm)"
    ]
