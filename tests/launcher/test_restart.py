"""`warmctl restart` (warmctl.host.restart): the deploy's restart, or a reload where it applies the
change, against a systemctl that records what it was asked (tests/ansible/fake_systemctl.py) and
real processes. The whole reload (a launcher running the vLLM double, the role deciding what to
ask for) is tests/ansible/test_reload_role.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmctl.cli import cli
from warmctl.errors import WarmctlError
from warmctl.host.restart import apply, unit_properties
from warmctl.launcher.relaunch import own_files

ROOT = Path(__file__).resolve().parents[2]
UNIT = "vllm-x.service"


class Systemd:
    """The fake systemctl's state (FAKE_SYSTEMD) and the calls it recorded."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = tmp / "systemd.json"
        self.unit_file = tmp / UNIT
        self.exe = tmp / "systemctl"
        self.exe.write_text(f"#!{sys.executable}\nimport runpy, sys\n"
                            f"sys.argv[0] = {str(ROOT / 'tests/ansible/fake_systemctl.py')!r}\n"
                            "runpy.run_path(sys.argv[0], run_name='__main__')\n")  # fmt: skip
        self.exe.chmod(0o755)
        monkeypatch.setenv("FAKE_SYSTEMD", str(self.state))
        monkeypatch.setenv("PATH", f"{tmp}:{Path(sys.executable).parent}:/usr/bin:/bin")

    def unit(self, main_pid: int, reload: bool) -> None:
        lines = ["[Service]", "ExecStart=/bin/true"] + (["ExecReload=/bin/true"] if reload else [])
        self.unit_file.write_text("\n".join(lines) + "\n")
        self.state.write_text(json.dumps({UNIT: {"MainPID": main_pid,
                                                 "path": str(self.unit_file)}}))  # fmt: skip

    def calls(self) -> list[str]:
        log = Path(f"{self.state}.log")
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Systemd:
    return Systemd(tmp_path, monkeypatch)


@pytest.fixture
def other_launcher(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line is a launcher's naming files that are not instance x's."""
    script = tmp_path / "bin" / "vllm_launch.py"
    script.parent.mkdir()
    script.write_text("import sys\nsys.stdin.read()\n")  # runs until its stdin closes
    proc = subprocess.Popen(
        [sys.executable, str(script), "--launch-file", str(tmp_path / "planted.launch"),
         "--state-file", str(tmp_path / "planted.json"), "--", "-m", "x"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_restart_is_a_restart(systemd: Systemd) -> None:
    systemd.unit(0, reload=True)
    done = apply("x", UNIT, "/etc/vllm", reload=False, vet_timeout=5, job_timeout=30,
                 systemctl=str(systemd.exe))  # fmt: skip
    assert done.line() == "x: restarted" and done.to_dict()["action"] == "restarted"
    assert systemd.calls() == [f"restart {UNIT}"]


def test_a_reload_asked_of_a_unit_that_cannot_reload_restarts(systemd: Systemd) -> None:
    systemd.unit(os.getpid(), reload=False)  # running: this process
    assert unit_properties(UNIT, str(systemd.exe))["CanReload"] == "no"
    done = apply("x", UNIT, "/etc/vllm", reload=True, vet_timeout=5, job_timeout=30,
                 systemctl=str(systemd.exe))  # fmt: skip
    assert done.line() == "x: restarted"
    assert systemd.calls() == [f"show {UNIT}"] * 2 + [f"restart {UNIT}"]


def test_a_stopped_unit_is_started(systemd: Systemd) -> None:
    systemd.unit(0, reload=True)  # MainPID 0: inactive
    done = apply("x", UNIT, "/etc/vllm", reload=True, vet_timeout=5, job_timeout=30,
                 systemctl=str(systemd.exe))  # fmt: skip
    assert done.action == "restarted" and systemd.calls() == [f"show {UNIT}", f"restart {UNIT}"]


def test_a_launcher_naming_other_files_is_refused_and_nothing_is_done(
    systemd: Systemd, other_launcher: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Root reads only the instance's own files (the plan's rule): a process of the service
    user's can show any command line."""
    systemd.unit(other_launcher.pid, reload=True)
    own = own_files(str(tmp_path / "etc"), "x")
    assert own.launch_file == f"{tmp_path}/etc/x.launch"
    assert own.state_file == "/run/vllm-x/launcher.json"
    with pytest.raises(WarmctlError, match="not this instance's launcher") as err:
        apply("x", UNIT, str(tmp_path / "etc"), reload=True, vet_timeout=5, job_timeout=30,
              systemctl=str(systemd.exe))  # fmt: skip
    assert err.value.exit_code == 2 and "planted.launch" in str(err.value)
    assert systemd.calls() == [f"show {UNIT}"]  # neither reloaded nor restarted


def _failing(tmp: Path, body: str) -> str:
    exe = tmp / "systemctl-failing"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_a_failed_restart_says_systemctls_words(tmp_path: Path) -> None:
    exe = _failing(tmp_path, "echo 'Job for vllm-x.service failed because the control process "
                             "exited with error code.' >&2; exit 1")  # fmt: skip
    with pytest.raises(WarmctlError, match=r"systemctl restart vllm-x\.service: Job for") as e:
        apply("x", UNIT, "/etc/vllm", reload=False, vet_timeout=5, job_timeout=30, systemctl=exe)
    assert e.value.exit_code == 2


def test_a_job_with_no_end_is_bounded(tmp_path: Path) -> None:
    exe = _failing(tmp_path, "exec sleep 600")
    with pytest.raises(WarmctlError, match="no end in 1 s"):
        apply("x", UNIT, "/etc/vllm", reload=False, vet_timeout=5, job_timeout=1, systemctl=exe)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["../x", "--unit", UNIT, "--config-dir", "/etc/vllm"], "'../x': not an instance name"),
        (["x", "--unit", UNIT, "--config-dir", "etc"], "--config-dir 'etc': not an absolute path"),
    ],
)
def test_bad_input_is_one_line_and_nothing_runs(
    systemd: Systemd, args: list[str], said: str
) -> None:
    systemd.unit(0, reload=True)
    result = CliRunner().invoke(cli, ["restart", *args, "--reload"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"warmctl: error: {said}"]
    assert systemd.calls() == []


def test_the_command_says_what_it_did(systemd: Systemd) -> None:
    systemd.unit(0, reload=True)
    result = CliRunner().invoke(cli, ["restart", "x", "--unit", UNIT, "--config-dir", "/e"])
    assert (result.exit_code, result.output) == (0, "x: restarted\n")
    result = CliRunner().invoke(
        cli, ["restart", "x", "--unit", UNIT, "--config-dir", "/e", "--json"]
    )
    doc = json.loads(result.output)
    assert doc["results"] == [
        {"instance": "x", "action": "restarted", "why": None, "generation": None, "argv": None}
    ]
