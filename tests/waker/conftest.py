"""The waker's tests: `warmctl waker` as a real process on real sockets and files in a gate
folder, the test playing systemd (it creates and removes the flags, or runs the wake and sleep
the path units would)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401
from tests.waker.support import GateFiles, Waker


@pytest.fixture
def gate(tmp_path: Path) -> GateFiles:
    folder = tmp_path / "gate"
    folder.mkdir()
    return GateFiles(folder)


@pytest.fixture
def start_waker(gate: GateFiles, tmp_path: Path) -> Iterator[Callable[..., Waker]]:
    """`start(target="127.0.0.1:PORT", **options)` -> a running waker; stopped at teardown."""
    started: list[Waker] = []

    def start(target: str = "127.0.0.1:9", **options: Any) -> Waker:
        log = tmp_path / f"waker-{len(started)}.log"
        waker = Waker(gate, target, log, **options).start()
        started.append(waker)
        return waker

    yield start
    for waker in started:
        waker.stop()


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    """`run(*args)` -> click Result of `warmctl ARGS` (stderr kept apart)."""
    from warmctl.cli import cli

    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def invoke(*args: str):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke
