"""The installed collection's filters on a controller that has ansible-core but not warmctl (an
operator's Ansible repository: `ansible-galaxy collection install`, nothing else): they import
warmctl from the wheel the collection carries in files/ and read the roles and templates from
the installed collection. Seen failing on the GPU host's controller: Python 3.12, where
ansible-core's path hook claims the wheel's entry on sys.path and cannot read zip files ("No
module named 'warmctl'"), and then the roles looked for beside the wheel, not the collection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.lib import collection


def test_filters_of_an_installed_collection_work_without_warmctl(tmp_path: Path) -> None:
    project = collection.project(tmp_path / "project")
    # ansible-core and its dependencies, but not the checkout's warmctl (its editable .pth is
    # a site file: -S leaves it out)
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"], "LC_ALL": "C.UTF-8"}
    env.pop("ANSIBLE_CONFIG", None)
    alone = subprocess.run([sys.executable, "-S", "-c", "import warmctl.cli"], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert alone.returncode != 0, "warmctl is importable: the test would prove nothing"
    expr = (
        "{{ ({'name': 'qwen', 'model': '/m', 'port': 8000, 'windows': [{'name': 'n', "
        "'sleep': '0 20 * * *', 'wake': '0 7 * * *'}]} | warmctl.vllm.vllm_instance_facts("
        "{'vllm_preflight_device_kind': 'gpu'})).upstream }} "
        "{{ '0 20 * * 1-5' | warmctl.vllm.vllm_oncalendar | first }}"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-m", "ansible", "adhoc", "localhost", "-m", "ansible.builtin.debug",
         "-a", json.dumps({"msg": expr})],
        cwd=project.path, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "18000 Mon..Fri *-*-* 20:00:00" in out, out[-3000:]
