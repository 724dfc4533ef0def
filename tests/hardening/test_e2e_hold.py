"""End to end on a single proxied host (marker e2e, root): 16 clients stream fixed-length
completions through wt1's proxy while the restart playbook relaunches its instance and while a
deploy that changes max_num_seqs reloads it (the pre-imported launcher, turned on for wt1 here;
no load balancer: the instance's restarts hold requests, docs/LAUNCHER.md). Each prints
requests started / completed / failed / cut, the longest wait and the waker's longest hold, and
asserts 0 failed and 0 cut (today's main: more than half refused with 503).

Builds on the tier's hosts and proxied deploy (tests/hardening/e2e_hosts.py); its own deploy
turns the launcher on for wt1 (a restart, which still drains: the proxy that holds is published
after it). Runs last in the e2e stage: it leaves wt1 under the launcher."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.e2e_support import Lab, PlayRun, ansible_playbook
from tests.hardening.e2e_hosts import PROXY_VARS
from tests.hardening.fleet_load import LoadCounts, StreamLoad
from tests.hardening.test_e2e_lb import CLIENTS, DEPRIORITIZE, PAUSE_S, TOKENS
from tests.lib.testhosts import Host

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the e2e test hosts need root"),
]
HOLD_VARS = {**PROXY_VARS, "vllm_service_launcher": True, "vllm_verify_max_ratio": 25}
# a client waits longer than the proxy holds (vllm_schedule_wake_hold_sec auto: 600 s on CPU):
# the first run on a 2-core machine shared with other work (load average 14-18) held requests up
# to 116 s, and 44 clients that gave up at 120 s counted as failed though none was refused
CLIENT_TIMEOUT_S = 660.0
RELEASED = re.compile(r"released \(the longest held ([0-9.]+) s\)")


@dataclass
class Single:
    lab: Lab
    host: Host
    inventory: Path
    rows: list[str] = field(default_factory=list)

    def holds(self) -> list[float]:
        """Each release of held requests the waker logged: its longest hold (s)."""
        out = self.lab.fleet.ssh(self.host, "journalctl -u vllm-tiny-waker --no-pager -o cat")
        return [float(s) for s in RELEASED.findall(out.stdout)]


@pytest.fixture(scope="module")
def single(lab: Lab, deployed: Path) -> Iterator[Single]:
    host = lab.fleet.hosts[0]
    lab.fleet.ssh(
        host,
        "systemctl stop warmctl-testbed-nice 2>/dev/null; systemd-run --quiet "
        f"--unit=warmctl-testbed-nice /bin/sh -c {shlex.quote(DEPRIORITIZE)}",
    )
    inventory = lab.inventory("hold", group_vars=HOLD_VARS)
    run = ansible_playbook(inventory, "--limit", host.name, log=lab.dir / "hold.log")
    print(f"site.yml (wt1 under the launcher, not load balanced): exit {run.rc} in "
          f"{run.seconds:.0f} s")  # fmt: skip
    assert run.rc == 0, run.describe()
    conf = lab.fleet.ssh(host, "cat /etc/nginx/conf.d/vllm-tiny.conf").stdout
    assert "if (-f /run/vllm-gate/tiny.holding)" in conf
    assert lab.fleet.ssh(host, "systemctl is-active vllm-tiny-waker").stdout.strip() == "active"
    single = Single(lab, host, inventory)
    try:
        yield single
    finally:
        lab.fleet.ssh(host, "systemctl stop warmctl-testbed-nice", check=False)
        head = "| run | took | started | completed | failed | cut | longest wait | longest hold |"
        print("\n".join([head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
                         *single.rows]))  # fmt: skip


def under_load(single: Single, action: Callable[[], PlayRun], label: str) -> LoadCounts:
    """`action()` with 16 clients streaming through wt1's proxy from before it until each was
    served again after it."""
    before_holds = len(single.holds())
    load = StreamLoad(f"{single.host.address}:8000", "tiny", clients=CLIENTS, max_tokens=TOKENS,
                      limit_s=1200, pause_s=PAUSE_S, timeout=CLIENT_TIMEOUT_S).start()  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while load.snapshot().completed < CLIENTS and time.monotonic() < deadline:
            time.sleep(0.5)
        t0 = time.monotonic()
        run = action()
        took = time.monotonic() - t0
        done = load.snapshot().completed + CLIENTS
        deadline = time.monotonic() + 300
        while load.snapshot().completed < done and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        counts = load.stop()
    hold = max(single.holds()[before_holds:], default=0.0)
    print(f"{label} ({took:.0f} s), {CLIENTS} clients x {TOKENS} tokens through wt1's proxy, "
          f"{PAUSE_S:.0f} s pause: {counts.line()}; longest hold {hold:.2f} s\n"
          f"  load: {counts.rate()}")  # fmt: skip
    if counts.errors:
        print(f"  errors: {dict(counts.errors)}")
    single.rows.append(f"| {label} | {took:.0f} s | {counts.started} | {counts.completed} | "
                       f"{counts.failed} | {counts.cut} | {counts.longest_wait_s:.2f} s | "
                       f"{hold:.2f} s |")  # fmt: skip
    assert run.rc == 0, run.describe()
    said = " ".join(run.output.split())
    assert "gate /run/vllm-gate/tiny.holding closed" in said, run.tail(60)  # held, not drained
    assert "tiny: reloaded (launcher generation" in said, run.tail(60)
    assert counts.failed == 0 and counts.cut == 0, (counts.line(), dict(counts.errors))
    assert counts.completed == counts.started > CLIENTS
    assert hold > 0, "no request was held"
    return counts


def test_1_the_restart_playbooks_relaunch_fails_no_request(single: Single) -> None:
    under_load(
        single,
        lambda: ansible_playbook(
            single.inventory,
            "--limit",
            single.host.name,
            log=single.lab.dir / "hold.log",
            playbook="warmctl.vllm.restart",
        ),
        "the restart playbook's relaunch",
    )


def test_2_a_config_change_reload_fails_no_request(single: Single) -> None:
    changed = single.lab.inventory("hold-changed", instance={"max_num_seqs": 6},
                                   group_vars=HOLD_VARS)  # fmt: skip
    under_load(
        single,
        lambda: ansible_playbook(
            changed, "--limit", single.host.name, log=single.lab.dir / "hold.log"
        ),
        "a deploy changing max_num_seqs (reload)",
    )
    state = single.lab.fleet.ssh(single.host, "cat /run/vllm-tiny/launcher.json").stdout
    assert "--max-num-seqs 6" in json.loads(state)["argv"]
