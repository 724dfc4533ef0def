"""The launcher's fork and the threads alive in it: none, nothing is said; threads shown safe
(SAFE_THREADS), one line saying why and no DeprecationWarning; any other thread, one line naming
it and Python's fork warning once. Run under this interpreter and, where there is one, a Python
>= 3.12 (whose os.fork() warns by itself, as in the GPU unit's journal; the launcher is standard
library only)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from warmctl.launcher import SCRIPT

HEAVY = """
import os, threading
if os.environ.get("THREAD"):  # a thread an import left running, waiting forever
    threading.Thread(target=threading.Event().wait, name=os.environ["THREAD"], daemon=True).start()
"""

SERVER = """
import heavy
if __name__ == "__main__":
    raise SystemExit(0)
"""

# the launcher as a module, with one thread name shown safe (the proof is the test's)
SAFE_RUNNER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("vllm_launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)
launch.SAFE_THREADS["idle-pool"] = "it only waits on an Event the server never touches"
sys.exit(launch.main(sys.argv[2:]))
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
    (d / "safe_runner.py").write_text(textwrap.dedent(SAFE_RUNNER))
    return d


def launch(python: str, mods: Path, thread: str = "", safe: bool = False) -> str:
    """Run the launcher until its server exits; its stderr."""
    head = [str(mods / "safe_runner.py"), str(SCRIPT)] if safe else [str(SCRIPT)]
    proc = subprocess.run(
        [python, "-W", "default::DeprecationWarning", *head, "--preload", "heavy",
         "--", "-m", "fakesrv"],
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
def test_an_unknown_thread_is_named_and_warned_about(python: str, mods: Path) -> None:
    err = launch(python, mods, thread="mystery")
    line = (
        "vllm-launch: forked the server with 1 other thread(s) alive (mystery): "
        "not shown fork-safe: mystery"
    )
    assert line in err.splitlines(), err
    assert err.count(WARNING) == 1, err  # Python's warning, once (not twice on 3.12)


@pytest.mark.parametrize("python", interpreters())
def test_a_thread_shown_safe_gets_one_line_and_no_warning(python: str, mods: Path) -> None:
    err = launch(python, mods, thread="idle-pool", safe=True)
    line = (
        "vllm-launch: forked the server with 1 other thread(s) alive (idle-pool): safe because "
        "idle-pool: it only waits on an Event the server never touches"
    )
    assert line in err.splitlines(), err
    assert "DeprecationWarning" not in err and "multi-threaded" not in err, err
