"""GPU memory as `nvidia-smi` reports it: every GPU of the machine summed (a tensor-parallel
server spreads over several), each GPU's figure, and, where the driver lists them, the
benchmark's own server processes. On a machine without nvidia-smi every figure is None."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuMemory:
    used_mib: int  # every GPU of the machine, summed
    total_mib: int
    procs_mib: int | None  # sum over the given pids, None when the driver lists no processes
    per_gpu_used_mib: tuple[int, ...] = ()  # in nvidia-smi's order


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def gpu_name() -> str | None:
    out = _smi("--query-gpu=name,driver_version", "--format=csv,noheader")
    return out[0].strip() if out else None


def read(pids: list[int] | None = None) -> GpuMemory | None:
    rows = _smi("--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits")
    if not rows:
        return None
    pairs = [tuple(int(x.strip()) for x in row.split(",")[:2]) for row in rows]
    used, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    procs: int | None = None
    if pids:
        apps = _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        mine = [
            int(mem.strip())
            for pid, mem in (r.split(",")[:2] for r in apps if r.count(",") >= 1)
            if pid.strip().isdigit() and int(pid) in pids and mem.strip().isdigit()
        ]
        procs = sum(mine) if mine else None
    return GpuMemory(used, total, procs, tuple(p[0] for p in pairs))


def _smi(*args: str) -> list[str]:
    if not available():
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [ln for ln in out.splitlines() if ln.strip()]
