"""Hardening tests: CliRunner against the vLLM double, rendered units, nginx config."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401

# the e2e tier's shared hosts: session fixtures, registered once here for every module
from tests.hardening.e2e_hosts import deployed, lab  # noqa: F401


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    """`run(*args)` -> click Result of `warmctl ARGS` (stderr kept apart)."""
    from warmctl.cli import cli

    for var in ("VLLM_API_KEY", "WARMCTL_PROMPTS", "VLLM_PREWARM_PROMPT"):
        monkeypatch.delenv(var, raising=False)

    def invoke(*args: str):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke


def one_error_line(result, *needles: str, code: int = 2) -> str:
    """The result failed with exactly one `warmctl: error:` line holding every needle."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warmctl: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def nginx_bin() -> str:
    """A real nginx for the proxy, wake and LB tests (installed with apt-get when root)."""
    from tests.hardening.proxy_support import ensure_nginx

    found = ensure_nginx()
    if not found:
        pytest.skip("nginx is not installed and cannot be installed here (needs root + apt-get)")
    return found
