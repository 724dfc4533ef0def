"""`warmctl relaunch` against real processes: the launcher running the vLLM double (a real HTTP
server speaking vLLM's routes) as its server module; SIGHUP, a new server process, its warmup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.lib.server import free_port
from warmctl.cli import cli
from warmctl.launcher import SCRIPT
from warmctl.relaunch import children

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def launched() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--",
            "-m",
            "tests.launcher.double_main",
            "--port",
            str(port),
        ],
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'toolkit'}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the double did not start under the launcher")
    yield proc, port
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


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
