"""The pre-imported launcher (warmctl/launcher/vllm_launch.py), run for real: a forked server
per generation, SIGHUP relaunches without importing again, the old server and everything it
started are gone before the new one starts, SIGTERM stops all, a server that exits takes the
launcher with it. vLLM stands in as two small modules (an import that is logged, and a server
that forks a child of its own, as vLLM's API process starts its EngineCore)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.launcher.fakes import alive
from warmctl.launcher import SCRIPT


def test_relaunch_forks_from_the_imported_interpreter(launch) -> None:
    lp = launch("--preload", "heavy", "--", "-m", "fakesrv", "serve", "m", "--port", "1")
    (first,) = lp.wait_for("run ", 1)
    assert first.endswith("args serve m --port 1 main __main__")
    pid1, engine1 = int(first.split()[1]), int(first.split()[3])
    assert pid1 != lp.proc.pid

    lp.proc.send_signal(signal.SIGHUP)
    runs = lp.wait_for("run ", 2)
    pid2 = int(runs[1].split()[1])
    assert pid2 not in (pid1, lp.proc.pid)
    lines = lp.lines()
    # imported once, by the launcher, before the first server: no generation imported again
    assert [ln for ln in lines if ln.startswith("imported")] == [f"imported {lp.proc.pid}"]
    # the old server and its engine were gone before the new server ran
    order = [ln.split()[0] for ln in lines]
    assert order.index("engine-stopped") < order.index("stopped") < len(order) - 1
    assert lines[-1].startswith("run ") and not alive(pid1) and not alive(engine1)

    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0
    assert not alive(pid2)
    err = lp.stderr()
    assert "generation 2" in err and "stopped the server" in err


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


def test_no_fork_once_cuda_is_initialised(launch) -> None:
    # a preload that initialised CUDA would make every fork unsafe: the launcher refuses
    lp = launch("--preload", "torch", "--", "-m", "fakesrv")
    assert lp.proc.wait(timeout=20) == 1
    assert "CUDA is initialised in the launcher" in lp.stderr()
    assert not [ln for ln in lp.lines() if ln.startswith("run ")]


def test_the_script_is_stdlib_only() -> None:
    """vLLM's interpreter runs it by path: it may import nothing of warmctl's."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import runpy; runpy.run_path({str(SCRIPT)!r})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
