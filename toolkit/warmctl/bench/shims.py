"""Venv-shaped folders so the rendered unit's paths work on the benchmark machine: the unit runs
`<vllm venv>/bin/python` and `<warmctl venv>/bin/warmctl`; the bench points those role variables
at the Python that has vLLM here and at this checkout's warmctl."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import warmctl
from warmctl.errors import WarmctlError


def vllm_venv(python: Path, where: Path) -> Path:
    """A folder whose `bin/python` is `python`: its own venv if it is one, else a wrapper."""
    python = python.expanduser().absolute()
    if not python.exists():
        raise WarmctlError(f"--python {python}: no such interpreter", kind="input")
    venv = python.parent.parent
    if (venv / "pyvenv.cfg").is_file() and (venv / "bin" / "python").exists():
        return venv
    # a wrapper, not a symlink: a symlinked interpreter outside its venv loses the venv
    _script(where / "bin" / "python", f'#!/bin/sh\nexec {shlex.quote(str(python))} "$@"\n')
    return where


def warmctl_venv(where: Path) -> Path:
    """A folder whose `bin/warmctl` runs this checkout's warmctl with this interpreter."""
    toolkit = Path(warmctl.__file__).resolve().parent.parent
    _script(
        where / "bin" / "warmctl",
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(toolkit)!r})\n"
        "from warmctl.cli import main\n"
        "main()\n",
    )
    # the pre-imported launcher where the wheel puts it (a unit with vllm_service_launcher),
    # with what its standby checks and prepares the next server with
    from warmctl.launcher import SCRIPT

    _script(where / "share" / "warmctl" / "vllm_launch.py", SCRIPT.read_text())
    args = SCRIPT.with_name("vllm_args.py")
    _script(where / "share" / "warmctl" / args.name, args.read_text())
    return where


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
