"""Child processes that must not outlive their starter, and finding what is left of them.

Used by the lab's vLLM server and the benchmark's: each runs in its own session, gets SIGKILL
when the process that started it dies, and is found through /proc by its session.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# fields of /proc/PID/stat after the command name: state ppid pgrp session ...
_SESSION = 3


def die_with_parent() -> None:
    """In the child before exec (`preexec_fn`; only a prctl, safe between fork and exec):
    SIGKILL when the parent dies (Linux). Not SIGTERM: vLLM catches it and, in the middle of
    its start (compiling, capturing), keeps running as an orphan."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _members(index: int, value: int, *, live_only: bool) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ...; comm may hold spaces and parentheses: split after the last ')'
        fields = stat.rsplit(")", 1)[1].split()
        zombie = fields[0] == "Z"
        if len(fields) > index and int(fields[index]) == value and not (live_only and zombie):
            found.append(int(entry.name))
    return sorted(found)


def session_pids(sid: int) -> list[int]:
    """Every live (non-zombie) process of session `sid`: a server and its EngineCore."""
    return _members(_SESSION, sid, live_only=True)
