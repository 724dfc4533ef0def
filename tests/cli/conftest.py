"""CLI tests: click's CliRunner against the loopback vLLM double (tests/double)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401


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
