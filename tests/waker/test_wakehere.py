"""The waker's own wake is the library's (`warmctl.sleepwake.actions.wake_instance`), not the CLI
run in a
thread: a process that only imports the waker's wake wakes the double's engine, opens both
flags and writes the wake's metrics, and never loads the click commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.double import VllmDouble
from tests.waker.support import GateFiles

SCRIPT = """
import json, sys
from warmctl.waker.wakehere import WakeHere, run_wake
spec = WakeHere(sys.argv[1], (sys.argv[2], sys.argv[3]), None, sys.argv[4], "tiny")
code = run_wake(spec)
print(json.dumps({"code": code,
                  "cli": sorted(m for m in sys.modules if m.startswith("warmctl.c") and
                                m.split(".")[1] in ("cli", "commands"))}))
"""


def test_the_waker_wakes_through_the_library(vllm_double: VllmDouble, tmp_path: Path) -> None:
    gate = GateFiles(tmp_path)
    textfiles = tmp_path / "prom"
    textfiles.mkdir()
    vllm_double.put_to_sleep(2)
    gate.closed.write_text("sleep cause=window level=2\n")
    gate.wakeable.write_text("sleep cause=idle level=2\n")
    toolkit = Path(__file__).resolve().parents[2] / "toolkit"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            f"127.0.0.1:{vllm_double.port}",
            str(gate.closed),
            str(gate.wakeable),
            str(textfiles),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(toolkit), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "cli": []}, out.stdout + out.stderr
    assert not vllm_double.is_sleeping
    assert not gate.closed.exists() and not gate.wakeable.exists()
    assert "awake after level 2 (server)" in out.stdout
    prom = (textfiles / "warmctl_tiny.prom").read_text()
    assert 'warmctl_wakes_total{cause="request"' in prom, prom
