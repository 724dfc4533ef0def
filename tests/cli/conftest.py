"""CLI tests: click's CliRunner against the loopback vLLM double (tests/double)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # so `tests.double` imports however pytest was started
    sys.path.insert(0, str(ROOT))

from click.testing import CliRunner  # noqa: E402
from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: E402, F401


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    """`run(*args, env=None)` -> click Result of `warmctl ARGS` (stderr kept apart)."""
    from warmctl.cli import cli

    for var in ("VLLM_API_KEY", "WARMCTL_PROMPTS", "VLLM_PREWARM_PROMPT"):
        monkeypatch.delenv(var, raising=False)

    def invoke(*args: str, env: dict[str, str] | None = None):
        runner = CliRunner()
        return runner.invoke(cli, list(args), env=env, catch_exceptions=False)

    return invoke
