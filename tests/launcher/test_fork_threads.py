"""The launcher forks with no other thread alive, ever: each standby is forked before it imports
anything, so a thread an import starts (NVML's, started by vLLM's platform probe on a GPU host;
Arrow's jemalloc background thread) lives only in the process that becomes the server, as in a
plain start, and no fork follows it: no line about threads, no DeprecationWarning, at the first
start and across relaunches. Run under this interpreter and, where there is one, a Python >= 3.12
(whose os.fork() warns by itself when other threads are alive, as the GPU unit's journal showed
with the launcher that forked after its imports; the launcher is standard library only)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from warmctl.launcher import SCRIPT

HEAVY = """
import os, threading
if os.environ.get("THREAD"):  # a thread an import left running, waiting forever
    threading.Thread(target=threading.Event().wait, name=os.environ["THREAD"], daemon=True).start()
"""

SERVER = """
import os, signal, sys, threading, time
import heavy
if __name__ == "__main__":
    alive = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    print(f"server {os.getpid()} threads {alive}", file=sys.stderr, flush=True)
    if os.environ.get("STAY"):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(0.1)
    raise SystemExit(0)
"""

WARNING = "DeprecationWarning: This process (pid="


def interpreters() -> list[str]:
    """This interpreter and one Python >= 3.12 (PATH, or pyenv's) if this one is older."""
    found = [sys.executable]
    if sys.version_info >= (3, 12):
        return found
    candidates = [shutil.which(n) for n in ("python3.12", "python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    for path in filter(None, candidates):
        probe = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if probe.stdout.strip() == "True":
            return [*found, path]
    return found


@pytest.fixture
def mods(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir()
    (d / "heavy.py").write_text(textwrap.dedent(HEAVY))
    (d / "fakesrv.py").write_text(textwrap.dedent(SERVER))
    return d


def command(python: str, *extra: str) -> list[str]:
    return [python, "-W", "default::DeprecationWarning", str(SCRIPT), "--preload", "heavy",
            *extra, "--", "-m", "fakesrv"]  # fmt: skip


def launch(python: str, mods: Path, thread: str = "") -> str:
    """Run the launcher until its server exits; its stderr."""
    proc = subprocess.run(
        command(python),
        env={**os.environ, "PYTHONPATH": str(mods), "THREAD": thread},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("python", interpreters())
def test_no_other_thread_nothing_said(python: str, mods: Path) -> None:
    err = launch(python, mods)
    assert "other thread" not in err and WARNING not in err, err
    assert "vllm-launch: server started" in err


@pytest.mark.parametrize("python", interpreters())
def test_a_thread_an_import_starts_is_never_forked_with(python: str, mods: Path) -> None:
    err = launch(python, mods, thread="cuda00001800007")
    assert "alive" not in "\n".join(ln for ln in err.splitlines() if "vllm-launch" in ln), err
    assert WARNING not in err and "multi-threaded" not in err, err
    # the server has it, as a plain start of vLLM has it: it ran in the importing process
    assert "threads ['cuda00001800007']" in err, err


def _state(path: Path, predicate, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < deadline:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
        if doc and predicate(doc):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"{path}: {doc}")


@pytest.mark.parametrize("python", interpreters())
def test_relaunches_fork_with_no_other_thread_either(python: str, mods: Path, tmp_path: Path):
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        command(python, "--state-file", str(state)),
        env={**os.environ, "PYTHONPATH": str(mods), "THREAD": "jemalloc_bg_thd", "STAY": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        for n in (1, 2):
            _state(state, lambda d: d.get("standby") == "ready")
            proc.send_signal(signal.SIGHUP)
            _state(state, lambda d, n=n: d.get("signals") == n and d.get("last") == "relaunched")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert err.count("threads ['jemalloc_bg_thd']") == 3, err  # three servers
    assert "generation 3" in err and "other thread" not in err, err
    assert WARNING not in err and "multi-threaded" not in err, err
