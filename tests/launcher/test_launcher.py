"""The pre-imported launcher (warmctl/launcher/vllm_launch.py), run for real: each generation's
server is a standby forked before the imports, which imported vLLM while the previous one
served; SIGHUP relaunches without importing after the signal, the old server and everything it
started are gone before the new one starts, SIGTERM stops all, a server that exits takes the
launcher with it. vLLM stands in as two small modules (an import that is logged, and a server
that forks a child of its own, as vLLM's API process starts its EngineCore)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launcher.fakes import Launched, alive, wait_state
from warmctl.launcher import ARGS_SCRIPT, SCRIPT


def _imports(lp: Launched) -> list[int]:
    """The pids that imported the fake vLLM, in order (the standbys)."""
    return [int(ln.split()[1]) for ln in lp.lines() if ln.startswith("imported ")]


def test_relaunch_runs_the_standby_that_imported_before_the_sighup(launch) -> None:
    lp = launch("--preload", "heavy", "--", "-m", "fakesrv", "serve", "m", "--port", "1")
    (first,) = lp.wait_for("run ", 1)
    assert first.endswith("args serve m --port 1 main __main__")
    pid1, engine1 = int(first.split()[1]), int(first.split()[3])
    # the server is the process that imported vLLM (the first standby), not the launcher
    assert _imports(lp)[0] == pid1 != lp.proc.pid
    # the next standby imports while the first server serves, before any SIGHUP
    lp.wait_for("imported ", 2)
    standby = _imports(lp)[1]
    assert standby not in (pid1, lp.proc.pid) and alive(standby)

    lp.proc.send_signal(signal.SIGHUP)
    runs = lp.wait_for("run ", 2)
    pid2 = int(runs[1].split()[1])
    assert pid2 == standby  # nothing imported between the SIGHUP and the new server
    lines = lp.lines()
    # the old server and its engine were gone before the new server ran
    order = [ln.split()[0] for ln in lines]
    run2 = next(i for i, ln in enumerate(lines) if ln == runs[1])
    assert order.index("engine-stopped") < order.index("stopped") < run2
    assert not alive(pid1) and not alive(engine1)
    lp.wait_for("imported ", 3)  # and the standby of the next relaunch
    third = _imports(lp)[2]

    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0
    assert not alive(pid2) and not alive(third)
    err = lp.stderr()
    assert "generation 2" in err and "stopped the server" in err


def test_a_standby_that_cannot_import_refuses_the_relaunch_and_the_server_serves_on(
    launch, tmp_path: Path
) -> None:
    broken, state = tmp_path / "broken", tmp_path / "state.json"
    lp = launch("--preload", "heavy", "--state-file", str(state), "--", "-m", "fakesrv",
                env={"BREAK_IMPORT": str(broken)})  # fmt: skip
    (first,) = lp.wait_for("run ", 1)
    lp.wait_for("imported ", 2)
    standby = _imports(lp)[1]
    # vLLM broken on disk, and the standby gone (the OOM killer): the relaunch needs another
    broken.touch()
    os.kill(standby, signal.SIGKILL)
    while alive(standby):  # an event: gone (or a zombie), not a sleep
        time.sleep(0.02)
    lp.proc.send_signal(signal.SIGHUP)
    doc = wait_state(state, 1)
    assert doc["last"] == "refused", doc
    assert "the standby could not import fakesrv: ImportError: heavy is broken" in doc["reason"]
    assert len(lp.wait_for("run ", 1)) == 1 and alive(int(first.split()[1]))  # serving on
    # repaired: the next SIGHUP's standby imports, then the relaunch happens
    broken.unlink()
    lp.proc.send_signal(signal.SIGHUP)
    doc = wait_state(state, 2)
    lp.wait_for("run ", 2)
    doc = wait_state(state, 2)
    assert doc["last"] == "relaunched" and doc["generation"] == 2, doc


def test_a_server_that_exits_takes_the_launcher_with_it(launch) -> None:
    lp = launch("--preload", "heavy", "--", "-m", "fakesrv", env={"EXIT_WITH": "3"})
    assert lp.proc.wait(timeout=20) == 3  # systemd's Restart=on-failure sees the server's status
    assert "server exited with status 3" in lp.stderr()


@pytest.mark.parametrize(
    "args",
    [
        ["--", "fakesrv"],
        ["--bogus", "--", "-m", "fakesrv"],
        ["--stop-timeout", "soon", "--", "-m", "fakesrv"],
        ["--prepare", "everything", "--", "-m", "fakesrv"],
        [],
    ],
)
def test_bad_usage_is_one_line_and_exit_2(launch, args: list[str]) -> None:
    lp = launch(*args)
    assert lp.proc.wait(timeout=20) == 2
    err = lp.stderr().strip()
    assert err.startswith("vllm-launch: ") and "\n" not in err and "Traceback" not in err


def test_a_missing_module_is_one_line_and_exit_1(launch) -> None:
    lp = launch("--", "-m", "no_such_server_module")
    assert lp.proc.wait(timeout=20) == 1
    err = lp.stderr().strip()
    assert "cannot import no_such_server_module" in err and "Traceback" not in err


def test_a_preload_that_initialises_cuda_still_starts_and_is_said(launch) -> None:
    # the imports run in the process that becomes the server (nothing is forked after them),
    # as in a plain start: CUDA initialised by an import is the server's own; but a standby
    # that holds a CUDA context while it waits is said
    lp = launch("--preload", "torch", "--", "-m", "fakesrv", env={"EXIT_WITH": "0"})
    assert lp.proc.wait(timeout=20) == 0
    assert len(lp.wait_for("run ", 1)) == 1
    assert "its imports initialised CUDA (it holds a CUDA context" in lp.stderr()


def test_a_stop_during_the_first_import_stops_at_once(launch) -> None:
    lp = launch("--preload", "heavy", "--", "-m", "fakesrv", env={"SLOW_IMPORT": "120"})
    (importing,) = lp.wait_for("importing ", 1)
    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0  # not after the 120 s import
    assert "stopped before a server ran" in lp.stderr()
    assert not [ln for ln in lp.lines() if ln.startswith("run")]
    assert not alive(int(importing.split()[1]))  # the standby is gone with it


@pytest.mark.parametrize("script", [SCRIPT, ARGS_SCRIPT], ids=lambda p: p.name)
def test_the_script_is_stdlib_only(script: Path) -> None:
    """vLLM's interpreter runs it by path: it may import nothing of warmctl's (vllm_args.py
    imports vLLM only inside its functions, in the standby)."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import runpy; runpy.run_path({str(script)!r})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
