"""Behind a load balancer: docs/examples/nginx-lb.conf (the file docs/LOAD-BALANCER.md gives a
user, only its host lines and listen port changed) on a real nginx on loopback, in front of two
per-host proxies rendered from templates/ (real nginx), each in front of a vLLM double. 16
streaming clients go through the load balancer while one host is drained, restarted, warmed,
verified and put back, as a deploy does: no request fails, none is cut. With idle sleep (each
host's awake-only door a primary, its port a backup, its waker running): requests go to the
awake host and wake no other; with every host asleep, a request wakes one and is served."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.double.server import VllmDouble, wait_until
from tests.hardening.fleet_load import RotationWatch, StreamLoad
from tests.hardening.proxy_support import Nginx, free_port, lb_config, render_proxy
from tests.waker.support import GateFiles, PathUnits, Waker


@dataclass
class Host:
    name: str
    double: VllmDouble
    proxy: Nginx
    port: int  # the proxy's (the instance's `port`)
    gate_dir: Path
    awake_port: int  # the awake-only door (the LB's primary)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def door(self) -> str:
        return f"127.0.0.1:{self.awake_port}"

    def flag(self, state: str) -> Path:
        return self.gate_dir / f"tiny.{state}"


@dataclass
class Fleet:
    hosts: list[Host]
    lb: Nginx
    lb_port: int

    @property
    def lb_address(self) -> str:
        return f"127.0.0.1:{self.lb_port}"


@pytest.fixture
def fleet(nginx_bin: str, tmp_path: Path) -> Iterator[Fleet]:
    hosts: list[Host] = []
    started: list[Nginx] = []
    try:
        for name in ("h1", "h2"):
            # the unit always passes --enable-server-load-tracking (the drain reads /load)
            double = VllmDouble(token_delay=0.01, server_load_tracking=True).start()
            port, awake_port, gate = free_port(), free_port(), tmp_path / name / "gate"
            gate.mkdir(parents=True)
            files = render_proxy(
                {"name": "tiny", "model": "/m", "port": port, "awake_port": awake_port},
                {
                    "vllm_proxy_enabled": True,
                    "vllm_proxy_gate_dir": str(gate),
                    "vllm_proxy_upstream_port_offset": double.port - port,
                    "vllm_proxy_retry_after": 3,
                },
            )
            proxy = Nginx(nginx_bin, tmp_path / name / "nginx", files)
            started.append(proxy.start(port))
            hosts.append(Host(name, double, proxy, port, gate, awake_port))
        lb_port = free_port()
        conf = lb_config([(h.door, h.address) for h in hosts], lb_port)
        lb = Nginx(nginx_bin, tmp_path / "lb", {"vllm-lb.conf": conf})
        started.append(lb.start(lb_port))
        yield Fleet(hosts, lb, lb_port)
    finally:
        for n in started:
            n.stop()
        for h in hosts:
            h.double.stop()


def test_the_example_is_the_docs_file_with_only_hosts_and_port_changed() -> None:
    from tests.hardening.proxy_support import LB_EXAMPLE

    original = LB_EXAMPLE.read_text()
    applied = lb_config([("127.0.0.1:1001", "127.0.0.1:1111"), "127.0.0.1:2222"], 9999)
    changed = [
        (a, b) for a, b in zip(original.splitlines(), applied.splitlines(), strict=True) if a != b
    ]
    assert [b.strip() for _, b in changed] == [
        "server 127.0.0.1:1001 max_fails=1 fail_timeout=5s;",
        "server 127.0.0.1:2222 max_fails=1 fail_timeout=5s;",
        "server 127.0.0.1:1111 max_fails=1 fail_timeout=5s backup;",
        "server 127.0.0.1:2222 max_fails=1 fail_timeout=5s backup;",
        "listen 9999;",
    ]
    docs = (LB_EXAMPLE.parents[1] / "LOAD-BALANCER.md").read_text()
    assert "docs/examples/nginx-lb.conf" in docs
    assert original.rstrip() in docs  # the page shows the whole file, as it stands


def health(host: Host, **headers: str) -> tuple[int, str]:
    r = requests.get(f"http://{host.address}/health", headers=headers, timeout=5)
    state = "serving" if r.status_code == 200 else r.json()["state"]
    return r.status_code, state


def test_health_tells_serving_draining_asleep_warming_and_stopped_apart(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    seen = {"serving": health(host)}
    for state in ("draining", "warming", "closed"):  # each flag on top of the ones before
        host.flag(state).write_text("test\n")
        seen[state] = health(host)
        r = requests.post(
            f"http://{host.address}/v1/completions",
            json={"model": "double-model", "prompt": "x", "max_tokens": 2, "stream": True},
            timeout=5,
        )
        assert r.status_code == 503 and r.headers["Retry-After"] == "3", (state, r.text)
    # the strongest flag wins: asleep over warming over draining
    host.flag("closed").unlink()
    assert health(host, **{"X-Warmctl-Verify": "1"}) == (503, "warming")
    host.flag("warming").unlink()
    assert health(host) == (503, "draining")
    # warmctl verify's header passes the draining flag (nothing else)
    assert health(host, **{"X-Warmctl-Verify": "1"}) == (200, "serving")
    host.flag("closed").write_text("test\n")
    assert health(host, **{"X-Warmctl-Verify": "1"}) == (503, "asleep")
    host.flag("closed").unlink()
    host.flag("draining").unlink()
    host.double.stop()
    host.double.close_connections()
    seen["stopped"] = health(host)
    print(json.dumps(seen))
    assert seen == {
        "serving": (200, "serving"),
        "draining": (503, "draining"),
        "warming": (503, "warming"),
        "closed": (503, "asleep"),
        "stopped": (503, "stopped"),
    }


def test_the_lb_strips_the_verify_header(fleet: Fleet) -> None:
    for host in fleet.hosts:
        host.flag("draining").write_text("test\n")
    r = requests.get(
        f"http://{fleet.lb_address}/health", headers={"X-Warmctl-Verify": "1"}, timeout=10
    )
    assert r.status_code == 503 and r.json()["state"] == "draining", r.text


def restart(host: Host, warm_s: float) -> None:
    """What the unit does on a restart: the server goes away (its connections with it), the
    start marks it warming, the new server comes up and warms, the warming flag goes."""
    port = host.double.port
    host.double.stop()
    host.double.close_connections()
    host.flag("warming").write_text("")
    time.sleep(0.5)  # loading
    host.double = VllmDouble(port=port, token_delay=0.01, server_load_tracking=True).start()
    time.sleep(warm_s)  # ExecStartPost: the warmup
    host.flag("warming").unlink()


def both_serving(fleet: Fleet) -> None:
    """Wait (the event, not a time) until the load reaches both hosts through the LB."""
    for h in fleet.hosts:
        h.double.wait_for(lambda h=h: h.double.counters.generations > 0, f"{h.name} serving")


def rejoined(host: Host, timeout: float = 60.0) -> None:
    """Wait until the host back in rotation serves more requests through the LB (it is tried
    again after the LB's fail_timeout): fails, saying so, if it never rejoins."""
    before = host.double.counters.generations
    host.double.wait_for(
        lambda: host.double.counters.generations > before, f"{host.name} rejoining", timeout
    )


def test_drain_restart_verify_rejoin_under_load_through_the_lb(run, fleet: Fleet) -> None:
    """16 clients stream through the load balancer while h1 is drained (`warmctl drain`),
    restarted, warmed and verified through its proxy (`warmctl verify`), then rejoins: every
    request completes, none is cut; h1 is served again afterwards. Each stream spends 0.2 s
    in the API server (its 200 sent) before the engine gauges count it: the drain waits for
    those too (/load)."""
    h1, h2 = fleet.hosts
    for h in (h1, h2):
        h.double.config.token_delay = 0.01
        h.double.config.admission_delay = 0.2
    watch = RotationWatch({h.name: f"http://{h.address}/health" for h in fleet.hosts}).start()
    load = StreamLoad(fleet.lb_address, "double-model", clients=16, max_tokens=30, limit_s=120)
    load.start()
    both_serving(fleet)
    before = load.snapshot()

    t0 = time.monotonic()
    drained = run("drain", h1.double.address, "--gate", str(h1.flag("draining")),
                  "--drain-timeout", "30")  # fmt: skip
    assert drained.exit_code == 0, drained.output
    assert "drained in" in drained.output
    assert h1.double.counters.in_flight == 0 and h1.double.counters.admitted == 0
    restart(h1, warm_s=0.5)
    verified = run("verify", h1.address, "--steady", "3", "--max-ratio", "50",
                   "--max-first-ttft", "5")  # fmt: skip
    assert verified.exit_code == 0, verified.output
    # still out of rotation for everyone else until the deploy opens the gate
    assert health(h1) == (503, "draining")
    h1.flag("draining").unlink()
    out_s = time.monotonic() - t0
    rejoined(h1)  # past the load balancer's fail_timeout: h1 is tried and serves again
    counts = load.stop()
    watch.stop()
    print(
        f"16 clients through the LB, h1 drained/restarted/verified ({out_s:.1f} s out): "
        f"{counts.line()}; before the drain: {before.line()}\n{watch.line()}\n"
        f"{drained.output.strip()}"
    )
    assert counts.failed == 0 and counts.cut == 0, dict(counts.errors)
    assert counts.completed == counts.started > before.started
    assert h1.double.counters.aborted == 0 and h2.double.counters.aborted == 0
    assert watch.out_s["h1"] > 1.0 and watch.out_s["h2"] == 0.0


def test_drain_of_a_server_that_is_not_serving_does_not_wait(run, tmp_path: Path) -> None:
    gate = tmp_path / "tiny.draining"
    t0 = time.monotonic()
    result = run("drain", f"127.0.0.1:{free_port()}", "--gate", str(gate), "--drain-timeout", "30")
    assert result.exit_code == 0, result.output
    assert "not serving, nothing to drain" in result.output and gate.exists()
    assert time.monotonic() - t0 < 5


def test_drain_timeout_exits_1_and_keeps_the_gate_closed(run, vllm_double, tmp_path) -> None:
    gate = tmp_path / "tiny.draining"
    vllm_double.config.extra_waiting = 1  # a request that never finishes
    result = run("drain", vllm_double.address, "--gate", str(gate), "--drain-timeout", "0.5",
                 "--json")  # fmt: skip
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    [report] = payload["results"]
    assert payload["exit_code"] == 1
    assert report["serving"] and not report["drained"] and report["drain"]["waiting"] == 1
    assert gate.exists()


def test_without_the_drain_a_restart_cuts_streams(fleet: Fleet) -> None:
    """The control: the same restart without `warmctl drain` cuts the streams h1 was serving
    (the load's counters see them), which is what the drain is for."""
    h1 = fleet.hosts[0]
    h1.double.config.token_delay = fleet.hosts[1].double.config.token_delay = 0.02
    load = StreamLoad(fleet.lb_address, "double-model", clients=16, max_tokens=30, limit_s=60)
    load.start()
    h1.double.wait_for(lambda: h1.double.counters.in_flight > 0, "h1 serving streams")
    restart(h1, warm_s=0.5)
    # the clients of the streams h1 was serving see them end
    wait_until(lambda: (c := load.snapshot()).failed + c.cut > 0, "a stream cut", timeout=60)
    counts = load.stop()
    print(f"restart without a drain: {counts.line()}; {dict(counts.errors)}")
    assert counts.failed + counts.cut > 0


def test_status_and_verify_say_out_of_rotation(run, fleet: Fleet) -> None:
    """Through a host's proxy: `status` of a draining instance says so (not "engine dead");
    `verify` passes the draining flag and measures it."""
    host = fleet.hosts[0]
    host.flag("draining").write_text("test\n")
    status = run("status", host.address)
    assert "draining (out of rotation for a restart)" in status.output, status.output
    assert status.exit_code == 0, status.output  # the proxy answered: a state, no error
    assert "engine dead" not in status.output
    verified = run("verify", host.address, "--steady", "3", "--max-ratio", "50",
                   "--max-first-ttft", "5")  # fmt: skip
    assert verified.exit_code == 0, verified.output
    assert host.flag("draining").exists()


def test_a_sleep_window_and_its_wake_under_load_through_the_lb(run, fleet: Fleet) -> None:
    """What h1's sleep window runs (`warmctl sleep --gate`: closed, drained, asleep) and its
    wake (`warmctl wake --gate`: awake, warm, open), with 16 clients through the LB."""
    h1 = fleet.hosts[0]
    watch = RotationWatch({h.name: f"http://{h.address}/health" for h in fleet.hosts}).start()
    load = StreamLoad(fleet.lb_address, "double-model", clients=16, max_tokens=30, limit_s=120)
    load.start()
    both_serving(fleet)
    slept = run("sleep", h1.double.address, "--gate", str(h1.flag("closed")))
    assert slept.exit_code == 0, slept.output
    time.sleep(2.0)  # a 2 s window: the LB serves through h2 alone (a duration, no event)
    asleep = health(h1)
    woke = run("wake", h1.double.address, "--gate", str(h1.flag("closed")))
    assert woke.exit_code == 0, woke.output
    rejoined(h1)  # past the LB's fail_timeout: h1 serves again
    counts = load.stop()
    watch.stop()
    print(f"16 clients through the LB across h1's sleep and wake: {counts.line()}\n{watch.line()}")
    assert asleep == (503, "asleep")
    assert counts.failed == 0 and counts.cut == 0, dict(counts.errors)
    assert h1.double.counters.aborted == 0 and h1.double.counters.sleep_with_in_flight == 0
    assert watch.out_s["h1"] > 1.0 and watch.out_s["h2"] == 0.0


@dataclass
class WakeHost:
    name: str
    double: VllmDouble
    gate: GateFiles
    waker: Waker
    units: PathUnits
    port: int
    awake_port: int

    def asleep(self) -> None:
        """What an idle sleep leaves: vLLM asleep, the wakeable flag."""
        self.double.put_to_sleep(1)
        self.gate.wakeable.write_text("sleep cause=idle level=1 at now\n")

    @property
    def woke(self) -> bool:
        return ("wake", 0) in self.units.runs


@pytest.fixture
def wake_fleet(nginx_bin: str, tmp_path: Path) -> Iterator[tuple[list[WakeHost], str]]:
    """Two hosts with idle sleep (its clock far off: the test puts them to sleep), each with its
    waker and systemd's request wake (PathUnits), and the documented LB in front."""
    hosts: list[WakeHost] = []
    started: list[Nginx] = []
    try:
        for name in ("h1", "h2"):
            double = VllmDouble(token_delay=0.01, server_load_tracking=True).start()
            port, awake_port = free_port(), free_port()
            gate = GateFiles(tmp_path / name / "gate")
            gate.dir.mkdir(parents=True)
            instance = {"name": "tiny", "model": "/m", "port": port, "awake_port": awake_port,
                        "idle_sleep": {"after": "1h"}}  # fmt: skip
            files = render_proxy(instance, {
                "vllm_proxy_enabled": True,
                "vllm_proxy_gate_dir": str(gate.dir),
                "vllm_proxy_upstream_port_offset": double.port - port,
                "vllm_proxy_retry_after": 3,
                "vllm_proxy_access_log": str(tmp_path / name / "nginx" / "access.log"),
            })  # fmt: skip
            waker = Waker(gate, double.address, tmp_path / name / "waker.log", hold=60).start()
            units = PathUnits(gate, double.address, sleep=False).start()
            hosts.append(WakeHost(name, double, gate, waker, units, port, awake_port))
            started.append(Nginx(nginx_bin, tmp_path / name / "nginx", files).start(port))
        lb_port = free_port()
        pairs = [(f"127.0.0.1:{h.awake_port}", f"127.0.0.1:{h.port}") for h in hosts]
        lb = Nginx(nginx_bin, tmp_path / "lb", {"vllm-lb.conf": lb_config(pairs, lb_port)})
        started.append(lb.start(lb_port))
        yield hosts, f"http://127.0.0.1:{lb_port}"
    finally:
        for n in started:
            n.stop()
        for h in hosts:
            h.units.stop()
            h.waker.stop()
            h.double.stop()


def complete(lb: str) -> requests.Response:
    body = {"model": "double-model", "prompt": "x", "max_tokens": 4, "stream": True}
    return requests.post(f"{lb}/v1/completions", json=body, timeout=120)


def test_an_asleep_host_is_not_woken_while_another_is_awake(
    wake_fleet: tuple[list[WakeHost], str],
) -> None:
    (h1, h2), lb = wake_fleet
    h2.asleep()
    answers = [complete(lb) for _ in range(12)]
    assert [r.status_code for r in answers] == [200] * 12
    assert h1.double.counters.completed == 12 and h2.double.counters.generations == 0
    # the LB tried h2's awake-only door (503 asleep) and moved on; its port, a backup, never
    assert h2.waker.state()["holding"] == 0 and not h2.gate.wake_request.exists()
    assert h2.units.runs == [] and h2.double.is_sleeping and h2.gate.wakeable.exists()


def test_with_every_host_asleep_a_request_wakes_one_and_is_served(
    wake_fleet: tuple[list[WakeHost], str],
) -> None:
    hosts, lb = wake_fleet
    for h in hosts:
        h.asleep()
    r = complete(lb)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert r.headers["X-Warmctl-Wake"] == "woke"
    # the wake's service ends after it opened the gate (the request may be served first)
    wait_until(lambda: any(h.woke for h in hosts), "the wake service's end")
    woken = [h for h in hosts if h.woke]
    asleep = [h for h in hosts if not h.woke]
    assert len(woken) == 1 and len(asleep) == 1, [h.units.runs for h in hosts]
    assert not woken[0].double.is_sleeping and woken[0].double.counters.completed == 1
    assert asleep[0].double.is_sleeping and asleep[0].gate.wakeable.exists()
    assert asleep[0].units.runs == [] and asleep[0].double.counters.generations == 0
