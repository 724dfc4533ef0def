"""End to end on a real systemd test host (marker e2e, root): the tensor-parallel unit.

The test hosts have no GPU, so the TP=2 unit (gpus [0, 1], tensor_parallel_size 2) is not
started: its rendered files are copied onto a deployed host (where the unit's user, venvs and
cache folder exist) and judged there by the host's own systemd: `systemd-analyze verify`
without a warning and `systemd-analyze security` exposure <= 4.0, with and without sleep
windows. The files are removed afterwards. Uses the hosts and the deploy of
test_e2e_proxy.py (its `lab` and `deployed` fixtures)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.hardening.test_e2e_proxy import deployed, lab  # noqa: F401
from tests.hardening.test_units import MATRIX, MAX_EXPOSURE
from warmctl.render import render_instance

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the e2e test hosts need root"),
]


def install(lab: Any, host: Any, files: dict[str, str]) -> None:  # noqa: F811 (the fixture)
    """Write the rendered files onto the host (mode 0644, scripts 0755), then daemon-reload."""
    for path, text in files.items():
        mode = "0755" if path.endswith(".sh") else "0644"
        target = shlex.quote(path)
        lab.fleet.ssh(
            host,
            f"mkdir -p {shlex.quote(str(Path(path).parent))} && "
            f"cat > {target} <<'WARMCTL_EOF' && chmod {mode} {target}\n{text}WARMCTL_EOF",
        )
    lab.fleet.ssh(host, "systemctl daemon-reload")


@pytest.mark.parametrize("name", ["gpu-tp2-sleep", "gpu-tp2-plain"])
def test_tensor_parallel_unit_on_a_live_host(lab: Any, deployed: Path, name: str) -> None:  # noqa: F811
    instance, host_vars = MATRIX[name]
    r = render_instance(instance, host_vars)  # the roles' paths: the deploy created them
    host = lab.fleet.hosts[0]
    units = sorted(Path(p).name for p in r.files if p.endswith((".service", ".timer")))
    install(lab, host, r.files)
    try:
        verify = lab.fleet.ssh(
            host, f"systemd-analyze verify --man=no {' '.join(units)}", check=False
        )
        lines = []
        figures = {}
        for unit in (u for u in units if u.endswith(".service")):
            out = lab.fleet.ssh(host, f"systemd-analyze security --no-pager {unit} | tail -1")
            figures[unit] = float(out.stdout.split(":")[1].split()[0])
            lines.append(f"{unit}: {figures[unit]:.1f}")
        print(
            f"{name} on {host.name}: systemd-analyze verify exit {verify.returncode} "
            f"{verify.stderr.strip() or '(no warning)'}; security " + ", ".join(lines)
        )
    finally:
        paths = " ".join(shlex.quote(p) for p in r.files)
        lab.fleet.ssh(host, f"rm -f {paths}; systemctl daemon-reload", check=False)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    assert figures[r.unit_name] <= MAX_EXPOSURE
    assert all(v <= MAX_EXPOSURE for v in figures.values()), figures
