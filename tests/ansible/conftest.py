"""Runs ansible-playbook (connection=local) for the tests in this folder."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.ansible.cases import GOOD
from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401

from warmctl.plan.roles import role_defaults

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOCAL_TEMP="/tmp/.ansible-local",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        PATH=f"{BIN}:{env.get('PATH', '')}",
    )
    env.update(extra)
    return env


def write_inventory(path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    # the roles' defaults at group level (below host vars, like role defaults), so a test play
    # can run one task file of a role with every role's variables defined
    common = {
        **role_defaults(),
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    inventory = {"all": {"vars": common, "hosts": hosts}}
    path.write_text(json.dumps(inventory))
    return path


def run_playbook(playbook: str, inventory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook)],
        cwd=ROOT,
        env=ansible_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def problem_lines(stdout: str, host: str) -> list[str]:
    """The lines preflight printed for `host`: "host: variable.path: what (right)", one each."""
    return [line.strip() for line in stdout.splitlines() if line.strip().startswith(f"{host}: ")]


def stub_paths(root: Path) -> dict[str, str]:
    """Role path variables pointing into `root`, with executable stubs where units exec; the
    service group is this process's own (the launch file's group must exist here)."""
    venv, warmctl, home = root / "opt/vllm/venv", root / "opt/warmctl", root / "home"
    for exe in (venv / "bin/python", warmctl / "bin/warmctl"):
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    home.mkdir(parents=True, exist_ok=True)
    return {
        "vllm_install_venv": str(venv),
        "vllm_install_warmctl_venv": str(warmctl),
        "vllm_install_home": str(home),
        "vllm_install_cache_dir": str(root / "cache"),
        "vllm_install_group": grp.getgrgid(os.getgid()).gr_name,
    }


@pytest.fixture(scope="session")
def rendered_by_ansible(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every GOOD host rendered by the roles' own render tasks, in one ansible-playbook run."""
    root = tmp_path_factory.mktemp("ansible-render")
    paths = stub_paths(root / "stub")
    hosts: dict[str, dict[str, Any]] = {}
    for name, host_vars in GOOD.items():
        hosts[name] = {
            **host_vars,
            **paths,
            "vllm_service_unit_dir": str(root / name / "units"),
            "vllm_service_config_dir": str(root / name / "etc"),
        }
        (root / name / "units").mkdir(parents=True)
        (root / name / "etc").mkdir(parents=True)
    inventory = write_inventory(root / "inventory.json", hosts)
    proc = run_playbook("tests/ansible/render.yml", inventory)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {"root": root, "hosts": hosts, "output": proc.stdout}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
