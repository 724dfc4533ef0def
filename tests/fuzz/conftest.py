"""Property-based tests (hypothesis): generated input, never a traceback.

Every test here runs in the fast tier with a fixed example budget (`budget(N)` on each test)
and no deadline (the shared CI cores make per-example timing noise); derandomize=True keeps CI
runs reproducible, and the inputs that once found a bug are kept as `@example`s so they run
every time. WARMCTL_FUZZ_SCALE=10 tries ten times the examples with a random seed (a longer hunt
by hand, not CI).
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, settings

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401

SCALE = float(os.environ.get("WARMCTL_FUZZ_SCALE", "1"))
settings.register_profile(
    "warmctl",
    deadline=None,
    derandomize=SCALE == 1,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("warmctl")


def budget(examples: int) -> int:
    """The number of examples a test tries (times WARMCTL_FUZZ_SCALE)."""
    return max(1, int(examples * SCALE))


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """`warmctl ARGS` in CliRunner, exceptions left to the CLI's own handlers."""
    from warmctl.cli import cli

    clean = {"VLLM_API_KEY": None, "WARMCTL_PROMPTS": None, "WARMCTL_DEBUG": None}
    return CliRunner().invoke(cli, list(args), env={**clean, **(env or {})}, catch_exceptions=False)


def one_line(result: Result, code: int = 2) -> str:
    """Failed with `code` and exactly one `warmctl: error:` line that is not the last-resort
    handler's (which would mean a bug: an exception no code path turned into a message)."""
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warmctl: error: "), lines[0]
    assert ": internal error: " not in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def cli():
    return invoke
