"""The playbooks that derive the instances' facts without the host probe (restart, warmup, sleep,
wake) find out the kind of host first: `vllm_service_launcher: auto` is the launcher on GPU hosts
only, so a CPU host whose kind nobody asked was taken for a GPU host, and the restart playbook
asked a launcher that was not there ("not the pre-imported launcher")."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from tests.ansible.conftest import run_playbook, write_inventory

INSTANCES = [{"name": "a", "model": "/srv/models/m", "port": 8000},
             {"name": "b", "model": "/srv/models/m", "port": 8001, "launcher": True}]  # fmt: skip


def shown(stdout: str) -> dict[str, Any]:
    """Each host's {'kind', 'launcher'} from the play's last task (its msg: JSON, shown as YAML)."""
    found = re.findall(r"ok: \[(\w+)\] =>\s*msg: '(\{.*\})'$", stdout, re.MULTILINE)
    return {host: json.loads(msg) for host, msg in found}


def test_kind_is_probed_when_unknown(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"  # an nvidia-smi that sees no GPU (this machine may have none at all)
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    inventory = write_inventory(tmp_path / "inv.json", {
        "probed": {"vllm_service_instances": INSTANCES},
        "said_gpu": {"vllm_service_instances": INSTANCES, "vllm_preflight_device": "gpu"},
        "known_cpu": {"vllm_service_instances": INSTANCES, "vllm_preflight_device_kind": "cpu",
                      "vllm_preflight_device": "gpu"},
    })  # fmt: skip
    proc = run_playbook("tests/ansible/facts.yml", inventory,
                        PATH=f"{bindir}:{os.environ['PATH']}")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert shown(proc.stdout) == {
        "probed": {"kind": "cpu", "launcher": ["b"]},  # auto: off on a CPU host; b asks for it
        "said_gpu": {"kind": "gpu", "launcher": ["a", "b"]},
        "known_cpu": {"kind": "cpu", "launcher": ["b"]},  # the probe's answer is not asked again
    }
