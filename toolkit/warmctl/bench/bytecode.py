"""Bytecode of the interpreter the benchmark starts vLLM with, measured and (optionally) made.

A host's unit runs a pip-installed venv whose modules carry compiled bytecode (the deployment
compiles it: roles/vllm_install, tag `vllm_install_bytecode`), with no PYTHONDONTWRITEBYTECODE;
the venv is read-only under the unit's sandbox, so a module without bytecode would be compiled
again at every start. A benchmark machine may differ (an image with PYTHONDONTWRITEBYTECODE=1
and packages without `__pycache__`): the bench compiles the interpreter's site-packages first
and records how much bytecode there was before and after, so its import phases are a host's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError

PACKAGES = ("vllm", "torch", "transformers")

# the folders of installed packages on the interpreter's path: site-/dist-packages, and what
# PYTHONPATH adds (a venv's platstdlib is inside the venv: prefixes cannot tell them apart)
_PATHS = (
    "import json, os, sys\n"
    "extra = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]\n"
    "print(json.dumps({'tag': sys.implementation.cache_tag, 'paths': [p for p in sys.path "
    "if p and ('-packages' in p or p in extra or os.path.abspath(p) in map(os.path.abspath, "
    "extra))]}))\n"
)


def site_dirs(python: Path, env: dict[str, str]) -> tuple[str, list[Path]]:
    """(cache tag, the folders on the interpreter's path that hold installed packages)."""
    try:
        out = subprocess.run(
            [str(python), "-c", _PATHS],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd="/",
        ).stdout
        data = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise WarmctlError(f"cannot ask {python} for its paths: {exc}", kind="input") from None
    dirs = [Path(p) for p in data["paths"] if Path(p).is_dir() and p != "/"]
    return str(data["tag"]), dirs


def coverage(tag: str, dirs: list[Path], packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """Per package: its folder, how many .py files it has, and the share with bytecode."""
    out: dict[str, Any] = {}
    for name in packages:
        pkg = next((d / name for d in dirs if (d / name / "__init__.py").is_file()), None)
        if pkg is None:
            continue
        total = cached = 0
        for py in pkg.rglob("*.py"):
            total += 1
            if (py.parent / "__pycache__" / f"{py.stem}.{tag}.pyc").is_file():
                cached += 1
        out[name] = {
            "path": str(pkg),
            "py_files": total,
            "with_bytecode": round(cached / total, 4) if total else None,
        }
    return out


def compile_dirs(python: Path, dirs: list[Path], env: dict[str, str]) -> dict[str, Any]:
    """`python -m compileall` over `dirs` (what the deployment's bytecode task does)."""
    t = time.monotonic()
    argv = [str(python), "-m", "compileall", "-q", "-j", "0", *map(str, dirs)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd="/")
    tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
    # compileall exits 1 when one file fails (test data with syntax errors): not fatal
    return {"seconds": round(time.monotonic() - t, 2), "exit": proc.returncode, "tail": tail}


def prepare(python: Path, compile_first: bool) -> dict[str, Any]:
    """What the JSON says about bytecode: the bench's own environment, the starts' environment
    (the variable dropped, as in a unit), coverage before and after compiling."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    tag, dirs = site_dirs(python, env)
    info: dict[str, Any] = {
        "bench_env_PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "starts_env_PYTHONDONTWRITEBYTECODE": None,
        "site_dirs": [str(d) for d in dirs],
        "before": coverage(tag, dirs),
    }
    if compile_first:
        info["compiled"] = compile_dirs(python, dirs, env)
        info["after"] = coverage(tag, dirs)
    return info


def describe(info: dict[str, Any] | None) -> str:
    """One line for the report."""
    if not info:
        return "bytecode: not recorded"
    state = info.get("after") or info.get("before") or {}
    shares = ", ".join(
        f"{k} {v['with_bytecode']:.0%}"
        for k, v in state.items()
        if v.get("with_bytecode") is not None
    )
    how = (
        f"site-packages compiled first ({info['compiled']['seconds']:.0f} s)"
        if "compiled" in info
        else "site-packages as found"
    )
    was = info.get("bench_env_PYTHONDONTWRITEBYTECODE")
    return (
        f"bytecode: {how}; share of modules with bytecode: {shares or '-'}; "
        f"PYTHONDONTWRITEBYTECODE unset in every start (as in the unit)"
        + (f", was {was!r} in the bench's environment" if was else "")
    )
