"""A single host's restart that no client notices (docs/LAUNCHER.md, "Requests held across a
restart"): the real proxy (nginx rendered from templates/, an instance without a load balancer),
`warmctl waker --holding` as a real process, the vLLM double behind them; the test plays the
role's steps and the unit's (the drain closes the holding flag, the server stops, a new one
starts and warms, the flag goes). 16 clients stream through the proxy the whole time."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.ansible.test_reload_role import RUNTIME as RELOAD_RUNTIME
from tests.ansible.test_reload_role import A
from tests.ansible.test_reload_role import Host as ReloadHost
from tests.double import VllmDouble, wait_until
from tests.hardening.fleet_load import LoadCounts, StreamLoad
from tests.hardening.proxy_support import Nginx, free_port, render_proxy
from tests.waker.support import GateFiles, Held, Waker

BODY = {"model": "double-model", "prompt": "hello", "max_tokens": 5, "stream": True}
CLIENTS = 16


def holds(waker: Waker) -> list[float]:
    """Each release the waker reported ("... released (the longest held X s)"): its longest."""
    return [float(s) for s in re.findall(r"released \(the longest held ([0-9.]+) s\)", waker.log())]


def longest_hold(waker: Waker, since: int = 0) -> float:
    """The longest hold of the releases after the first `since`, 0 if none."""
    return max(holds(waker)[since:], default=0.0)


@dataclass
class Single:
    gate: GateFiles
    double: VllmDouble
    nginx: Nginx
    waker: Waker
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def health(self) -> tuple[int, str]:
        r = requests.get(f"http://{self.address}/health", timeout=5)
        return r.status_code, (r.json().get("state", "") if r.text.strip() else "")

    def complete(self) -> requests.Response:
        r = requests.post(f"http://{self.address}/v1/completions", json=BODY, timeout=120)
        assert r.content is not None
        return r

    def stop_server(self) -> None:
        """The old server goes (its connections with it)."""
        self.double.stop()
        self.double.close_connections()

    def start_server(self) -> None:
        """A new server on the same port, as the unit's (re)start or the launcher's relaunch."""
        self.double = VllmDouble(port=self.double.port, token_delay=0.01,
                                 server_load_tracking=True).start()  # fmt: skip


@pytest.fixture
def single(nginx_bin: str, tmp_path: Path) -> Iterator[Single]:
    gate = GateFiles(tmp_path / "gate")
    gate.dir.mkdir()
    double = VllmDouble(token_delay=0.01, server_load_tracking=True).start()
    port = free_port()
    files = render_proxy(
        {"name": "tiny", "model": "/m", "port": port},
        {
            "vllm_proxy_enabled": True,
            "vllm_proxy_gate_dir": str(gate.dir),
            "vllm_proxy_upstream_port_offset": double.port - port,
            "vllm_proxy_retry_after": 7,
        },
    )
    assert f"if (-f {gate.holding})" in files["vllm-tiny.conf"]  # not load balanced: it holds
    waker = Waker(gate, double.address, tmp_path / "waker.log", hold=60, holding=True).start()
    nginx = Nginx(nginx_bin, tmp_path / "nginx", files).start(port)
    s = Single(gate, double, nginx, waker, port)
    try:
        yield s
    finally:
        nginx.stop()
        waker.stop()
        s.double.stop()


def under_load(single: Single, action: Callable[[], Any]) -> tuple[LoadCounts, LoadCounts]:
    """16 streaming clients through the proxy from before `action()` until the new server has
    served each client again; (counts before the action, counts at the end)."""
    load = StreamLoad(single.address, "double-model", clients=CLIENTS, max_tokens=24,
                      limit_s=120, pause_s=0.1).start()  # fmt: skip
    try:
        single.double.wait_for(lambda: single.double.counters.completed >= CLIENTS, "load")
        before = load.snapshot()
        action()
        single.double.wait_for(lambda: single.double.counters.completed >= CLIENTS, "served")
    finally:
        counts = load.stop()
    return before, counts


def test_a_restart_of_a_single_host_holds_its_requests_and_none_fails(run, single: Single) -> None:
    """The role's drain closes the holding flag and waits for the streams in flight; the server
    stops and a new one starts and warms (the unit's warming flag), then the role removes the
    flag: every request completes, none is cut, the new server served the held ones."""
    g = single.gate

    def restart() -> None:
        drained = run("drain", single.double.address, "--gate", str(g.holding),
                      "--drain-timeout", "30")  # fmt: skip
        assert drained.exit_code == 0, drained.output
        assert single.double.counters.in_flight == 0
        wait_until(lambda: single.waker.state()["holding"] > 0, "a request held")
        assert single.health() == (503, "holding")
        single.stop_server()
        g.warming.write_text("")  # ExecStartPre
        time.sleep(0.5)  # loading
        single.start_server()
        time.sleep(0.3)  # the warmup
        g.warming.unlink()
        g.holding.unlink()  # the role's `always`, once the unit is active

    before, counts = under_load(single, restart)
    hold = longest_hold(single.waker)
    print(f"{CLIENTS} clients through the proxy across a restart: {counts.line()}; "
          f"before it: {before.line()}; longest hold {hold:.2f} s")  # fmt: skip
    assert counts.failed == 0 and counts.cut == 0, dict(counts.errors)
    assert counts.completed == counts.started > before.started
    assert hold > 0.8  # held across the stop, the load and the warmup
    assert single.health() == (200, "")
    assert single.waker.state()["holding"] == 0


def test_a_relaunch_that_fails_releases_the_held_requests_with_a_clear_503(
    single: Single,
) -> None:
    """The server is gone when the restart ends (the role's `always`, or the unit's
    ExecStopPost after a failed start, removed the flag): each held request gets 503
    relaunch-failed at once, not at the hold's bound; the next ones 503 stopped."""
    g = single.gate
    g.holding.write_text("draining\n")
    single.stop_server()
    held = Held(single.complete).start(3, single.waker.wait_holding)
    t0 = time.monotonic()
    g.holding.unlink()
    answers = held.join()
    assert time.monotonic() - t0 < 10
    for r in answers:
        assert r.status_code == 503 and r.headers["Retry-After"] == "7", r.text
        assert r.json()["state"] == "relaunch-failed", r.text
        assert "no server answers" in r.json()["error"]["message"]
    after = single.complete()
    assert after.status_code == 503 and after.json()["state"] == "stopped"
    assert "relaunch-failed" in single.waker.log()


def test_a_hold_past_its_bound_is_503_relaunch_timeout(
    nginx_bin: str, tmp_path: Path, single: Single
) -> None:
    single.waker.stop()
    waker = Waker(single.gate, single.double.address, tmp_path / "waker2.log", hold=2,
                  holding=True).start()  # fmt: skip
    try:
        single.gate.holding.write_text("draining\n")
        r = single.complete()
        assert r.status_code == 503 and r.json()["state"] == "relaunch-timeout", r.text
        assert single.double.counters.generations == 0
    finally:
        waker.stop()


def test_behind_a_load_balancer_the_restart_drains_as_before(tmp_path: Path) -> None:
    """Only a single host's instance has the holding gate; one with an awake-only door (or
    vllm_proxy_load_balanced: true) has none: its restart takes it out of rotation (503
    draining) for the load balancer."""
    single = render_proxy(
        {"name": "tiny", "model": "/m", "port": 8000},
        {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": str(tmp_path)},
    )["vllm-tiny.conf"]
    assert f"if (-f {tmp_path}/tiny.holding)" in single and '"state": "holding"' in single
    door = render_proxy(
        {"name": "tiny", "model": "/m", "port": 8000, "awake_port": 8001,
         "idle_sleep": {"after": "1h"}},
        {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": str(tmp_path)},
    )["vllm-tiny.conf"]  # fmt: skip
    told = render_proxy(
        {"name": "tiny", "model": "/m", "port": 8000},
        {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": str(tmp_path),
         "vllm_proxy_load_balanced": True},
    )["vllm-tiny.conf"]  # fmt: skip
    for conf in (door, told):
        assert "tiny.holding" not in conf and "tiny.draining" in conf


# -- the role's restart task file with the real launcher -----------------------------------------


class ProxiedHost(ReloadHost):
    """tests/ansible/test_reload_role.py's host (the role renders into a temporary root, `a`
    runs under the real launcher serving the double, systemctl is the fake that runs a unit's
    ExecReload= lines), with `a` behind the real proxy and its waker, not load balanced."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.public = free_port()  # the clients' door (nginx); self.port is vLLM's (upstream)
        self.gate = GateFiles(tmp_path / "gate", A)
        self.gate.dir.mkdir()
        self.nginx_root = tmp_path / "nginx"

    def proxy_vars(self) -> dict[str, Any]:
        return {
            "vllm_proxy_enabled": True,
            "vllm_proxy_gate_dir": str(self.gate.dir),
            "vllm_proxy_conf_dir": str(self.nginx_root / "conf.d"),
            "vllm_proxy_upstream_port_offset": self.port - self.public,
            "vllm_preflight_device_kind": "gpu",
        }

    def variables(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = super().variables(a, b)
        a_item, b_item = out["vllm_service_instances"]
        out["vllm_service_instances"] = [{**a_item, "port": self.public},
                                         {**b_item, "port": self.public + 1}]  # fmt: skip
        return {**out, **self.proxy_vars()}


@pytest.fixture
def proxied_host(nginx_bin: str, tmp_path: Path) -> Iterator[tuple[ProxiedHost, Nginx, Waker]]:
    import os
    import shutil
    import signal
    import subprocess

    h = ProxiedHost(tmp_path)
    started: list[Any] = []
    try:
        h.deploy({"max_num_seqs": 4}, {"max_num_seqs": 4})  # the units and launch file
        h.start()  # a's launcher and its server
        files = render_proxy({"name": A, "model": "/m", "port": h.public}, h.proxy_vars())
        waker = Waker(h.gate, f"127.0.0.1:{h.port}", tmp_path / "waker.log", hold=120,
                      holding=True).start()  # fmt: skip
        started.append(waker)
        nginx = Nginx(nginx_bin, h.nginx_root, files).start(h.public)
        started.append(nginx)
        yield h, nginx, waker
    finally:
        for thing in reversed(started):
            thing.stop()
        if h.launcher and h.launcher.poll() is None:
            os.killpg(h.launcher.pid, signal.SIGTERM)
            try:
                h.launcher.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(h.launcher.pid, signal.SIGKILL)
        shutil.rmtree(RELOAD_RUNTIME, ignore_errors=True)


def test_the_roles_relaunch_and_config_reload_of_a_single_host_fail_no_request(
    proxied_host: tuple[ProxiedHost, Nginx, Waker],
) -> None:
    """16 clients stream through the proxy while the role's restart task file relaunches `a`
    (the restart playbook: vllm_service_restart_relaunch) and then while a deploy that changes
    max_num_seqs reloads it: the drain closes the holding flag and waits for the streams in
    flight, systemctl reload runs the unit's ExecReload (the launcher's relaunch and the warmup),
    the flag goes: 0 failed, 0 cut, and the held requests were served by the new server."""
    h, _, waker = proxied_host
    address = f"127.0.0.1:{h.public}"
    relaunch = json.dumps({"vllm_service_restart_names": [A],
                           "vllm_service_restart_relaunch": True})  # fmt: skip
    figures = []
    for label, change, args in [
        ("the restart playbook's relaunch", 4, ("-e", relaunch)),
        ("a deploy changing max_num_seqs (reload)", 8, ()),
    ]:
        generation = json.loads(h.state.read_text())["generation"]
        holds_before = len(holds(waker))
        load = StreamLoad(address, "double-model", clients=CLIENTS, max_tokens=24, limit_s=300,
                          pause_s=0.2).start()  # fmt: skip
        try:
            wait_until(lambda load=load: load.snapshot().completed >= CLIENTS, "the load")
            before = load.snapshot()
            t0 = time.monotonic()
            out, _ = h.deploy({"max_num_seqs": change}, {"max_num_seqs": 4}, *args)
            took = time.monotonic() - t0
            done = load.snapshot().completed + CLIENTS
            wait_until(lambda load=load, done=done: load.snapshot().completed >= done, "served")
        finally:
            counts = load.stop()
        state = json.loads(h.state.read_text())
        hold = longest_hold(waker, holds_before)
        figures.append(f"{label} ({took:.0f} s): {counts.line()}; longest hold {hold:.2f} s")
        assert counts.failed == 0 and counts.cut == 0, (label, dict(counts.errors), out[-3000:])
        assert counts.completed == counts.started > before.started
        assert state["generation"] == generation + 1, label  # relaunched by the launcher
        assert h.calls()[-1] == f"reload vllm-{A}.service", h.calls()
        assert f"gate {h.gate.holding} closed" in out  # held, not taken out of rotation
        assert not h.gate.holding.exists() and not h.gate.draining.exists()
        assert hold > 0  # requests were held, then released to the new server
        assert h.max_num_seqs() == change
    print("\n".join(figures))
