"""`warmctl relaunch` against real processes: the launcher running the vLLM double (a real HTTP
server speaking vLLM's routes) as its server module; SIGHUP, a new server process, its warmup.
With a launch file (as the units have it): the new server runs the file as it is now (its
/server_info says so, the launcher's state file proves it), and what a relaunch cannot apply is
refused before any signal (exit 3: a restart is needed; exit 2: not a launch file)."""

from __future__ import annotations

import json
import os
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
from click.testing import CliRunner

from tests.launcher.fakes import wait_state, write_launch
from tests.lib.server import free_port
from warmctl.cli import cli
from warmctl.launcher import SCRIPT
from warmctl.launcher.relaunch import children

ROOT = Path(__file__).resolve().parents[2]


def _start(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'toolkit'}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("the double did not start under the launcher")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def launched() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    argv = [sys.executable, str(SCRIPT), "--", "-m", "tests.launcher.double_main",
            "--port", str(port)]  # fmt: skip
    proc = _start(argv, port)
    yield proc, port
    _stop(proc)


class Unit:
    """The launcher as the unit runs it: its launch file and state file."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, launch: Path, state: Path):
        self.proc, self.port, self.launch, self.state = proc, port, launch, state

    def write(self, *args: str, env: dict[str, str] | None = None) -> None:
        base = {"VLLM_DOUBLE_AT_IMPORT": "1", "VLLM_TUNE": "a"}
        write_launch(self.launch, ["--port", str(self.port), *args], {**base, **(env or {})})

    def relaunch(self, *extra: str) -> Any:
        return CliRunner().invoke(
            cli,
            ["relaunch", f"127.0.0.1:{self.port}", "--main-pid", str(self.proc.pid),
             "--wait-ready", "--ready-timeout", "30", *extra],
        )  # fmt: skip

    def max_num_seqs(self) -> int:
        url = f"http://127.0.0.1:{self.port}/server_info?config_format=json"
        info = requests.get(url, timeout=5).json()
        return int(info["vllm_config"]["scheduler_config"]["max_num_seqs"])


@pytest.fixture
def unit(tmp_path: Path) -> Iterator[Unit]:
    """Under the launcher with --launch-file and --state-file, from a copy of its script (a test
    changes the copy as an upgrade of warmctl would change the installed one)."""
    port = free_port()
    script = tmp_path / "share" / "vllm_launch.py"
    script.parent.mkdir()
    shutil.copy(SCRIPT, script)
    shutil.copy(SCRIPT.with_name("vllm_args.py"), script.parent)  # as the wheel installs both
    u = Unit(None, port, tmp_path / "t.launch", tmp_path / "state.json")  # type: ignore[arg-type]
    u.write("--max-num-seqs", "4")
    u.proc = _start(
        [sys.executable, str(script), "--launch-file", str(u.launch), "--state-file",
         str(u.state), "--", "-m", "tests.launcher.double_main"],
        port,
    )  # fmt: skip
    wait_state(u.state, 0)
    yield u
    _stop(u.proc)


def test_relaunch_replaces_the_server_and_warms_it(launched) -> None:
    proc, port = launched
    (before,) = children(proc.pid)
    result = CliRunner().invoke(
        cli,
        ["relaunch", f"127.0.0.1:{port}", "--main-pid", str(proc.pid), "--wait-ready",
         "--ready-timeout", "30", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)["results"]
    assert doc["launcher_pid"] == proc.pid and doc["old_server_pids"] == [before]
    (after,) = doc["new_server_pids"]
    assert after != before and children(proc.pid) == (after,)
    assert doc["warmup"]["prompts"] > 0 and doc["warmup"]["total_s"] > 0
    assert proc.poll() is None  # the launcher (systemd's main process) stayed
    # the human form: one line
    again = CliRunner().invoke(
        cli, ["relaunch", f"127.0.0.1:{port}", "--main-pid", str(proc.pid), "--wait-ready"]
    )
    assert again.exit_code == 0, again.output
    assert "relaunched in" in again.output and f"{after} ->" in again.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--main-pid", str(os.getpid())], "is not the pre-imported launcher"),
        (["--main-pid", "999999999"], "is not the pre-imported launcher"),
        ([], "needs the launcher's process"),
    ],
)
def test_relaunch_refuses_what_is_not_a_launcher(args, says, monkeypatch) -> None:
    monkeypatch.delenv("MAINPID", raising=False)
    # our own pid: refused before any signal (pytest would otherwise get SIGHUP)
    result = CliRunner().invoke(cli, ["relaunch", "127.0.0.1:9", *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.output


def test_relaunch_takes_one_host(launched) -> None:
    proc, port = launched
    result = CliRunner().invoke(
        cli,
        ["relaunch", f"127.0.0.1:{port}", "127.0.0.1:9", "--main-pid", str(proc.pid)],
    )
    assert result.exit_code == 2 and "exactly one HOST" in result.output
    assert len(children(proc.pid)) == 1  # nothing was signalled


def test_a_relaunch_applies_the_launch_file_as_it_is_now(unit: Unit) -> None:
    """A deploy changed one vLLM argument: the relaunch's new server runs it (vLLM's own
    /server_info says so), and the answer names the generation and the argv from the state."""
    assert unit.max_num_seqs() == 4
    (before,) = children(unit.proc.pid)
    unit.write("--max-num-seqs", "8", env={"VLLM_TUNE": "b"})
    result = unit.relaunch("--json")
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)["results"]
    (after,) = doc["new_server_pids"]
    assert after != before and children(unit.proc.pid) == (after,)
    assert doc["generation"] == 2
    assert doc["argv"].endswith(f"--port {unit.port} --max-num-seqs 8")
    assert unit.max_num_seqs() == 8  # the new configuration took effect
    state = json.loads(unit.state.read_text())
    assert state["server_pid"] == after and state["last"] == "relaunched"
    assert unit.proc.poll() is None  # the launcher (systemd's main process) stayed


def test_check_says_whether_a_relaunch_can_apply_the_file(unit: Unit) -> None:
    pid = str(unit.proc.pid)
    (server,) = children(unit.proc.pid)
    ok = CliRunner().invoke(
        cli, ["relaunch", f"127.0.0.1:{unit.port}", "--check", "--main-pid", pid]
    )
    assert ok.exit_code == 0, ok.output
    assert f"launcher {pid} (generation 1) can relaunch with {unit.launch}" in ok.output

    # a variable the server module read at import: only a restart applies it
    unit.write("--max-num-seqs", "8", env={"VLLM_DOUBLE_AT_IMPORT": "2"})
    for extra in (["--check"], []):
        result = unit.relaunch(*extra)
        assert result.exit_code == 3, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "VLLM_DOUBLE_AT_IMPORT changed" in lines[0], result.output
        assert "only a restart applies that" in lines[0]
    assert children(unit.proc.pid) == (server,) and unit.max_num_seqs() == 4  # untouched
    assert json.loads(unit.state.read_text())["signals"] == 0  # nothing was signalled


@pytest.mark.parametrize(
    "bad", ['{"argv": "--port"}', '{"argv": [], "env": {"CUDA_VISIBLE_DEVICES": "1"}}', "nope"]
)
def test_a_bad_launch_file_is_refused_before_any_signal(unit: Unit, bad: str) -> None:
    (server,) = children(unit.proc.pid)
    unit.launch.write_text(bad)
    result = unit.relaunch()
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(unit.launch) in lines[0] and "Traceback" not in result.output
    assert children(unit.proc.pid) == (server,)
    assert json.loads(unit.state.read_text())["signals"] == 0


def test_a_launcher_upgraded_on_disk_needs_a_restart(unit: Unit, tmp_path: Path) -> None:
    """warmctl upgraded since the unit started: the running launcher is the old code; only a
    restart runs the new one."""
    script = tmp_path / "share" / "vllm_launch.py"
    script.write_text(script.read_text() + "\n# a newer launcher\n")
    unit.write("--max-num-seqs", "8")
    result = unit.relaunch("--check")
    assert result.exit_code == 3, result.output
    assert "changed since it started (warmctl upgraded)" in result.output


def test_a_refusal_after_the_signal_is_the_launchers_line(unit: Unit, monkeypatch) -> None:
    """The file changed between the check and the SIGHUP (or a hand's `kill -HUP`): the
    launcher refuses, keeps its server, and relaunch reports its line at once."""
    from warmctl.launcher import relaunch as relaunch_module

    (server,) = children(unit.proc.pid)
    real_check = relaunch_module.check

    def check_then_break(pid: int, proc: Path = Path("/proc"), expect: Any = None) -> Any:
        checked = real_check(pid, proc, expect)
        unit.launch.write_text('{"argv": 1}')
        return checked

    monkeypatch.setattr(relaunch_module, "check", check_then_break)
    result = unit.relaunch()
    assert result.exit_code == 2, result.output
    assert f"launcher {unit.proc.pid} refused the relaunch" in result.output
    assert f"server {server} keeps running" in result.output
    assert children(unit.proc.pid) == (server,)


def test_a_launch_file_vllm_rejects_is_refused_and_the_old_server_serves_on(unit: Unit) -> None:
    """`--max-model-len abc`: a launch file in shape whose arguments vLLM's parser rejects (the
    double's parser rejects as vLLM's does, exit 2). `--check` says so in one line; the reload's
    SIGHUP is refused by the launcher before the old server is stopped, which keeps serving;
    the standby that checked it still becomes the next server once the file is good."""
    (server,) = children(unit.proc.pid)
    unit.write("--max-num-seqs", "8", "--max-model-len", "abc")
    result = unit.relaunch()  # systemctl reload without the check (a hand's kill -HUP): refused
    assert result.exit_code == 2, result.output
    assert f"launcher {unit.proc.pid} refused the relaunch" in result.output
    assert "vLLM rejects it: argument --max-model-len" in result.output
    assert children(unit.proc.pid) == (server,) and unit.max_num_seqs() == 4  # still serving
    state = json.loads(unit.state.read_text())
    assert state["last"] == "refused" and state["signals"] == 1
    assert unit.proc.poll() is None

    check = unit.relaunch("--check")
    assert check.exit_code == 2, check.output
    lines = [ln for ln in check.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in check.output, check.output
    assert (
        f"{unit.launch}: vLLM rejects it: argument --max-model-len: invalid int value" in lines[0]
    )
    state = json.loads(unit.state.read_text())
    assert state["checks"] == 1 and not state["check"]["ok"] and state["signals"] == 1

    assert children(unit.proc.pid) == (server,)

    # vLLM's validation after the parse: the same (the double, as vLLM, wants max_num_seqs >= 1)
    unit.write("--max-num-seqs", "0")
    refused = unit.relaunch("--check")
    assert refused.exit_code == 2 and "max_num_seqs (0) must be at least 1" in refused.output

    unit.write("--max-num-seqs", "8")
    ok = unit.relaunch("--check")
    assert ok.exit_code == 0 and "(vLLM accepts it)" in ok.output, ok.output
    done = unit.relaunch()
    assert done.exit_code == 0, done.output
    assert unit.max_num_seqs() == 8 and children(unit.proc.pid) != (server,)


def test_standbys_that_die_while_they_check_are_replaced_then_given_up(unit: Unit) -> None:
    """A standby that dies while it checks the file (out of memory) is replaced and the next
    one asked; after three in a row the check says so in one line, and the server serves on."""
    (server,) = children(unit.proc.pid)
    unit.write("--max-num-seqs", "99999")
    check = unit.relaunch("--check")
    assert check.exit_code == 2, check.output
    assert "3 standbys in a row ended after their imports" in check.output
    assert children(unit.proc.pid) == (server,) and unit.max_num_seqs() == 4
    assert json.loads(unit.state.read_text())["standby"] == "none"  # none forked again
    unit.write("--max-num-seqs", "8")
    done = unit.relaunch()  # the relaunch asks for a standby again
    assert done.exit_code == 0, done.output
    assert unit.max_num_seqs() == 8


def test_a_launcher_that_does_not_answer_checks_is_never_sent_sigusr1(tmp_path: Path) -> None:
    """A launcher from before the checks (its state has no "checks") or without a state file is
    not asked: SIGUSR1's default action would end it. vet() answers None, the process lives."""
    from warmctl.launcher.relaunch import Checked, LauncherFiles, vet

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"launcher_pid": sleeper.pid, "signals": 0}))
        old = Checked(LauncherFiles("x/vllm_launch.py", None, str(state)), {"signals": 0}, None)
        assert vet(sleeper.pid, old, timeout=1) is None
        none = Checked(LauncherFiles("x/vllm_launch.py", None, None), None, None)
        assert vet(sleeper.pid, none, timeout=1) is None
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
