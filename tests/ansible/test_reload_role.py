"""A deploy that changes only what the launcher applies reloads; anything else restarts
(roles/vllm_service/tasks/render.yml decides which to ask for; restart.yml runs each instance's
`warmctl restart`, which does it where it applies and says which it did: warmctl.host.restart).

On this machine, without systemd: the roles render into a temporary root, the instance under the
launcher runs for real (the launcher on the rendered launch file, serving the vLLM double), and
systemctl is tests/ansible/fake_systemctl.py, whose `reload` runs the unit's ExecReload= lines
(`warmctl relaunch --check`, then `warmctl relaunch`) as systemd would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from tests.ansible.conftest import ROOT, stub_paths, write_inventory
from tests.launcher.fakes import wait_state
from tests.lib.server import free_port

from warmctl.launcher import SCRIPT

# instance a, under the launcher: its RuntimeDirectory is /run/vllm-NAME (warmctl.plan.instance),
# so its name is this process's own (two runs at once on one machine do not share it)
A = f"a{os.getpid()}"
RUNTIME = Path(f"/run/vllm-{A}")
VENV = Path(sys.executable).parent.parent  # holds bin/python and bin/warmctl


class Host:
    """One GPU host: `a` under the launcher (the default there), `b` a plain unit."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.port, self.port_b = free_port(), free_port()
        self.units, self.etc = tmp_path / "units", tmp_path / "etc"
        self.units.mkdir()
        self.etc.mkdir()
        self.systemd = tmp_path / "systemd.json"
        bindir = tmp_path / "bin"
        bindir.mkdir()
        fake = bindir / "systemctl"
        fake.write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                        f"sys.argv[0] = {str(ROOT / 'tests/ansible/fake_systemctl.py')!r}\n"
                        "runpy.run_path(sys.argv[0], run_name='__main__')\n")  # fmt: skip
        fake.chmod(0o755)
        self.path = f"{bindir}:{os.environ['PATH']}"
        self.launcher: subprocess.Popen[bytes] | None = None

    def variables(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {
            **stub_paths(self.tmp / "stub"),
            "vllm_install_venv": str(VENV),
            "vllm_install_warmctl_venv": str(VENV),
            "vllm_preflight_device_kind": "gpu",
            "vllm_service_unit_dir": str(self.units),
            "vllm_service_config_dir": str(self.etc),
            "vllm_service_warmup_args": ["--max-batch", "2"],
            "vllm_service_instances": [
                {"name": A, "model": "/m", "port": self.port, **a},
                {"name": "b", "model": "/m", "port": self.port_b, "launcher": False, **b},
            ],
        }

    def deploy(
        self, a: dict[str, Any], b: dict[str, Any], *args: str, ok: bool = True
    ) -> tuple[str, dict]:
        inventory = write_inventory(self.tmp / "inv.json", {"h": self.variables(a, b)})
        pid = self.launcher.pid if self.launcher else 0
        self.systemd.write_text(json.dumps({
            f"vllm-{A}.service": {"MainPID": pid, "path": str(self.units / f"vllm-{A}.service")},
            "vllm-b.service": {"MainPID": 0, "path": str(self.units / "vllm-b.service")},
        }))  # fmt: skip
        proc = subprocess.run(
            [str(VENV / "bin/ansible-playbook"), "-i", str(inventory), "tests/ansible/reload.yml",
             *args],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
            env={**_ansible_env(), "PATH": self.path, "FAKE_SYSTEMD": str(self.systemd),
                 "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
        )  # fmt: skip
        assert (proc.returncode == 0) == ok, proc.stdout[-4000:] + proc.stderr[-2000:]
        said = re.search(r'"msg": ("DECISION .*")', proc.stdout)
        assert said, proc.stdout[-4000:]
        decision = json.loads(json.loads(said.group(1)).removeprefix("DECISION "))
        return proc.stdout, decision

    def start(self) -> None:
        """The unit's main process: the launcher on a's launch file, the double as the server."""
        # where the instance's facts put it (the unit's RuntimeDirectory): the deploy's check
        # (root) names the instance's own state file and refuses a launcher naming another
        self.state = RUNTIME / "launcher.json"
        shutil.rmtree(RUNTIME, ignore_errors=True)
        RUNTIME.mkdir(mode=0o750)
        self.launcher = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--launch-file", str(self.etc / f"{A}.launch"),
             "--state-file", str(self.state), "--", "-m", "tests.launcher.double_main"],
            env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'toolkit'}"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_state(self.state, 0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except requests.RequestException:
                time.sleep(0.1)
        raise AssertionError("the double did not start under the launcher")

    def max_num_seqs(self) -> int:
        url = f"http://127.0.0.1:{self.port}/server_info?config_format=json"
        return requests.get(url, timeout=5).json()["vllm_config"]["scheduler_config"][
            "max_num_seqs"
        ]

    def calls(self) -> list[str]:
        log = Path(f"{self.systemd}.log")
        lines = log.read_text().splitlines() if log.exists() else []
        return [ln for ln in lines if ln.split()[0] in ("reload", "restart", "start")]


def _ansible_env() -> dict[str, str]:
    from tests.ansible.conftest import ansible_env

    return ansible_env()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path)
    yield h
    if h.launcher and h.launcher.poll() is None:
        os.killpg(h.launcher.pid, signal.SIGTERM)
        try:
            h.launcher.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(h.launcher.pid, signal.SIGKILL)
    shutil.rmtree(RUNTIME, ignore_errors=True)


def _said(out: str) -> list[str]:
    return re.findall(rf'"msg": "((?:{A}|b): (?:reloaded|restarted)[^"]*)"', out)


def test_only_the_launch_file_changed_reloads_anything_else_restarts(host: Host) -> None:
    out, decision = host.deploy({"max_num_seqs": 4}, {"max_num_seqs": 4})
    assert decision == {"restart": [A, "b"], "reload": []}  # new units: started as units
    host.start()
    assert host.max_num_seqs() == 4
    before = json.loads(host.state.read_text())
    host.systemd.with_suffix(".json.log").unlink(missing_ok=True)

    # the same inventory again: nothing to do
    out, decision = host.deploy({"max_num_seqs": 4}, {"max_num_seqs": 4})
    assert decision == {"restart": [], "reload": []} and not _said(out)
    assert "changed=0" in out

    # --check of a change: the decision is said, nothing is written or done
    launch = (host.etc / f"{A}.launch").read_text()
    out, decision = host.deploy({"max_num_seqs": 8}, {"max_num_seqs": 8}, "--check")
    assert decision == {"restart": [A, "b"], "reload": [A]}
    assert (host.etc / f"{A}.launch").read_text() == launch and host.calls() == []

    # one vLLM argument of both: a (launcher) reloads, b (plain unit: its ExecStart) restarts
    unit_a = (host.units / f"vllm-{A}.service").read_text()
    out, decision = host.deploy({"max_num_seqs": 8}, {"max_num_seqs": 8})
    assert decision == {"restart": [A, "b"], "reload": [A]}
    assert (host.units / f"vllm-{A}.service").read_text() == unit_a  # a's unit untouched
    # (b runs nowhere here: systemd's restart of an inactive unit is a start)
    assert sorted(host.calls()) == [f"reload vllm-{A}.service", "restart vllm-b.service"]
    said = dict(line.split(": ", 1) for line in _said(out))
    assert said["b"] == "restarted"
    assert said[A].startswith("reloaded (launcher generation 2 runs: -m tests.launcher.double_main")
    assert "--max-num-seqs 8" in said[A]
    assert host.max_num_seqs() == 8  # the new server has it (its /server_info)
    after = json.loads(host.state.read_text())
    assert after["launcher_pid"] == before["launcher_pid"] == host.launcher.pid
    assert after["generation"] == 2 and after["server_pid"] != before["server_pid"]


def test_a_change_the_launcher_cannot_apply_restarts(host: Host) -> None:
    host.deploy({}, {})
    host.start()
    signals = json.loads(host.state.read_text())["signals"]
    Path(f"{host.systemd}.log").unlink(missing_ok=True)

    # a VLLM_* variable the server module read at import: the launch file alone changed, but
    # the launcher says only a restart applies it
    out, decision = host.deploy({"env": {"VLLM_DOUBLE_AT_IMPORT": "1"}}, {})
    assert decision == {"restart": [A], "reload": [A]}
    assert host.calls() == [f"restart vllm-{A}.service"]
    (said,) = _said(out)
    assert said.startswith(f"{A}: restarted (a reload cannot apply the change: ")
    assert "VLLM_DOUBLE_AT_IMPORT changed" in said
    assert json.loads(host.state.read_text())["signals"] == signals  # never signalled

    # a variable of the env file: a restart, decided by the render
    Path(f"{host.systemd}.log").unlink(missing_ok=True)
    out, decision = host.deploy({"env": {"VLLM_DOUBLE_AT_IMPORT": "1", "HF_TOKEN": "t"}}, {})
    assert decision == {"restart": [A], "reload": []}
    assert host.calls() == [f"restart vllm-{A}.service"] and _said(out) == [f"{A}: restarted"]


def test_a_launch_file_vllm_rejects_fails_the_deploy_and_the_server_serves_on(host: Host) -> None:
    """An argument vLLM's parser rejects (the double's parser rejects as vLLM's does): the
    launcher's check (its standby parses the file with the server's parser) fails the host in
    one line before any reload or restart; the server it runs keeps serving."""
    host.deploy({"max_num_seqs": 4}, {})
    host.start()
    before = json.loads(host.state.read_text())
    Path(f"{host.systemd}.log").unlink(missing_ok=True)

    out, decision = host.deploy(
        {"max_num_seqs": 4, "extra_args": ["--max-model-len", "abc"]}, {}, ok=False
    )
    assert decision == {"restart": [A], "reload": [A]}
    assert "vLLM rejects it: argument --max-model-len: invalid int value" in out, out[-3000:]
    assert host.calls() == []  # neither reloaded nor restarted
    after = json.loads(host.state.read_text())
    assert after["signals"] == before["signals"] and after["server_pid"] == before["server_pid"]
    assert host.max_num_seqs() == 4  # still serving
