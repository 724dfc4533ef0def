"""The launcher run for real: fake vLLM modules on PYTHONPATH, a log of what they did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.fakes import FAKE_TORCH, HEAVY, SERVER, Launched
from warmctl.launcher import SCRIPT


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir()
    (d / "heavy.py").write_text(textwrap.dedent(HEAVY))
    (d / "fakesrv.py").write_text(textwrap.dedent(SERVER))
    (d / "torch.py").write_text(textwrap.dedent(FAKE_TORCH))
    return d


@pytest.fixture
def launch(modules: Path, tmp_path: Path) -> Iterator:
    started: list[Launched] = []

    def run(*args: str, env: dict[str, str] | None = None, script: Path = SCRIPT) -> Launched:
        log = tmp_path / "events.log"
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            env={**os.environ, "PYTHONPATH": str(modules), "LOG": str(log), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(Launched(proc, log))
        return started[-1]

    yield run
    for lp in started:
        if lp.proc.poll() is None:  # SIGTERM: the launcher stops the server's whole group
            lp.proc.send_signal(signal.SIGTERM)
            try:
                lp.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lp.proc.pid, signal.SIGKILL)
                lp.proc.wait()
