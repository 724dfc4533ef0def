"""A server started with die_with_parent does not outlive the process that started it, and the
/proc lookups find a process by group and session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.lib.procgroup import group_members

from warmctl.host.procs import die_with_parent, session_pids

ROOT = Path(__file__).resolve().parents[2]
STARTER = (
    "import subprocess; from warmctl.host.procs import die_with_parent; "
    "p = subprocess.Popen(['sleep', '60'], start_new_session=True, preexec_fn=die_with_parent); "
    "print(p.pid, flush=True)"
)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_child_is_killed_when_its_starter_exits() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "toolkit")}
    done = subprocess.run(
        [sys.executable, "-c", STARTER], capture_output=True, text=True, env=env, timeout=30
    )
    pid = int(done.stdout)
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"sleep {pid} outlived its starter"


def test_group_and_session_lookups() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True, preexec_fn=die_with_parent)
    try:
        assert group_members(child.pid) == [child.pid]
        assert session_pids(child.pid) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert group_members(child.pid) == [] and session_pids(child.pid) == []
