"""The pre-imported launcher (warmctl/launcher/vllm_launch.py), run for real: a forked server
per generation, SIGHUP relaunches without importing again, the old server and everything it
started are gone before the new one starts, SIGTERM stops all, a server that exits takes the
launcher with it. vLLM stands in as two small modules (an import that is logged, and a server
that forks a child of its own, as vLLM's API process starts its EngineCore)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmctl.launcher import SCRIPT

HEAVY = """
import os
with open(os.environ["LOG"], "a") as f:
    f.write(f"imported {os.getpid()}\\n")
"""

SERVER = """
import os, signal, sys, time
import heavy  # preloaded by the launcher: imported once for every generation


def write(line):
    with open(os.environ["LOG"], "a") as f:
        f.write(line + "\\n")


def main():
    engine = os.fork()
    if engine == 0:  # the "EngineCore": outlives the server by a moment on SIGTERM
        def engine_stop(*_):
            time.sleep(0.3)
            write(f"engine-stopped {os.getpid()}")
            os._exit(0)

        signal.signal(signal.SIGTERM, engine_stop)
        while True:
            time.sleep(0.1)

    def stop(*_):
        os.kill(engine, signal.SIGTERM)
        os.waitpid(engine, 0)
        write(f"stopped {os.getpid()}")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    write(f"run {os.getpid()} engine {engine} args {' '.join(sys.argv[1:])} main {__name__}")
    if os.environ.get("EXIT_WITH"):
        sys.exit(int(os.environ["EXIT_WITH"]))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":  # as vLLM's entry modules: importing it runs nothing
    main()
"""

FAKE_TORCH = """
class cuda:
    @staticmethod
    def is_initialized():
        return True
"""


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir()
    (d / "heavy.py").write_text(textwrap.dedent(HEAVY))
    (d / "fakesrv.py").write_text(textwrap.dedent(SERVER))
    (d / "torch.py").write_text(textwrap.dedent(FAKE_TORCH))
    return d


class Launched:
    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc, self.log = proc, log

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wait_for(self, prefix: str, count: int, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [ln for ln in self.lines() if ln.startswith(prefix)]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {count} x {prefix!r} in {self.lines()}: {self.stderr()}")

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read() if self.proc.stderr else ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return stat[0] != "Z"


@pytest.fixture
def launch(modules: Path, tmp_path: Path) -> Iterator:
    started: list[Launched] = []

    def run(*args: str, env: dict[str, str] | None = None) -> Launched:
        log = tmp_path / "events.log"
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            env={**os.environ, "PYTHONPATH": str(modules), "LOG": str(log), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(Launched(proc, log))
        return started[-1]

    yield run
    for lp in started:
        if lp.proc.poll() is None:
            os.killpg(lp.proc.pid, signal.SIGKILL)
            lp.proc.wait()


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
