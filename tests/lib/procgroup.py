"""What is left of a process group: the tests' check that a server left nothing behind."""

from __future__ import annotations

import os
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid`, zombies included (nothing may be left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)
