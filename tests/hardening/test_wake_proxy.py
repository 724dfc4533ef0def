"""Wake on request and idle sleep through the real proxy: nginx rendered from templates/ (an
instance with idle_sleep and an awake-only door), `warmctl waker` as a real process, the vLLM
double behind them; the test plays systemd (or runs `warmctl wake`/`sleep` as the path units'
services do). Dev-mode routes stay unreachable on both doors."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.double import VllmDouble, wait_until
from tests.hardening.proxy_support import Nginx, free_port, render_proxy
from tests.hardening.test_proxy import DEV_ROUTES, TOKEN
from tests.waker.support import GateFiles, Held, PathUnits, Waker

BODY = {"model": "double-model", "prompt": "hello", "max_tokens": 5, "stream": True}


def wake_instance(port: int, awake_port: int = 0, **extra: Any) -> dict[str, Any]:
    inst = {"name": "tiny", "model": "/m", "port": port, "idle_sleep": {"after": "1h"}, **extra}
    return {**inst, "awake_port": awake_port} if awake_port else inst


@pytest.mark.parametrize(
    "case",
    ["idle+door", "idle+tokens+ipv6", "idle+tls", "window-wakes", "cpu-idle"],
)
def test_wake_configs_pass_nginx_t(nginx_bin: str, tmp_path: Path, case: str) -> None:
    from tests.hardening.test_proxy import self_signed

    host: dict[str, Any] = {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": str(tmp_path),
                            "vllm_proxy_access_log": str(tmp_path / "access.log")}  # fmt: skip
    inst = wake_instance(8123, 9123)
    if "tokens" in case:
        host |= {"vllm_proxy_api_keys": [TOKEN], "vllm_proxy_listen_ipv6": True}
    if "tls" in case:
        host["vllm_proxy_tls_cert"], host["vllm_proxy_tls_key"] = self_signed(tmp_path)
    if case == "window-wakes":
        window = {"name": "night", "sleep": "0 20 * * *", "wake": "0 7 * * *"}
        inst = {"name": "tiny", "model": "/m", "port": 8123,
                "windows": [{**window, "on_request": "wake"}]}  # fmt: skip
    if case == "cpu-idle":
        host["vllm_preflight_device_kind"] = "cpu"
    files = render_proxy(inst, host)
    conf = files["vllm-tiny.conf"]
    assert "auth_request /_warmctl_wake;" in conf
    assert ("syslog:server=unix:" in conf) == (case != "window-wakes")  # activity: idle only
    proc = Nginx(nginx_bin, tmp_path / "nginx", files).test_config()
    assert proc.returncode == 0, proc.stderr


@dataclass
class Proxied:
    gate: GateFiles
    double: VllmDouble
    nginx: Nginx
    waker: Waker
    port: int
    awake_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def door(self) -> str:
        return f"http://127.0.0.1:{self.awake_port}"

    def asleep(self) -> None:
        """What an idle sleep leaves: vLLM asleep, the wakeable flag."""
        self.double.put_to_sleep(1)
        self.gate.wakeable.write_text("sleep cause=idle level=1 at now\n")

    def complete(self, url: str | None = None, **headers: str) -> requests.Response:
        r = requests.post((url or self.url) + "/v1/completions", json=BODY, headers=headers,
                          timeout=120)  # fmt: skip
        assert r.content is not None  # the whole stream read
        return r


@pytest.fixture
def make_proxied(
    nginx_bin: str, vllm_double_factory: Callable[..., VllmDouble], tmp_path: Path
) -> Iterator[Callable[..., Proxied]]:
    made: list[Proxied] = []

    def make(hold: float = 60, idle_after: float = 0, waker: dict[str, Any] | None = None,
             **host: Any) -> Proxied:  # fmt: skip
        gate = GateFiles(tmp_path / "gate")
        gate.dir.mkdir()
        double = vllm_double_factory(server_load_tracking=True, token_delay=0.01)
        port, awake_port = free_port(), free_port()
        variables = {
            "vllm_proxy_enabled": True,
            "vllm_proxy_gate_dir": str(gate.dir),
            "vllm_proxy_upstream_port_offset": double.port - port,
            "vllm_proxy_retry_after": 7,
            "vllm_proxy_access_log": str(tmp_path / "nginx" / "access.log"),
            **host,
        }
        files = render_proxy(wake_instance(port, awake_port), variables)
        process = Waker(gate, double.address, tmp_path / "waker.log", hold=hold,
                        idle_after=idle_after, **(waker or {})).start()  # fmt: skip
        nginx = Nginx(nginx_bin, tmp_path / "nginx", files).start(port)
        made.append(Proxied(gate, double, nginx, process, port, awake_port))
        return made[-1]

    yield make
    for p in made:
        p.nginx.stop()
        p.waker.stop()


def test_eight_requests_to_a_sleeping_instance_wake_it_once_and_are_served(
    run, make_proxied: Callable[..., Proxied]
) -> None:
    p = make_proxied()
    p.asleep()
    held = Held(p.complete).start(8, p.waker.wait_holding)
    assert p.gate.wake_request.exists()  # one wake asked
    assert p.double.counters.generations == 0 and held.answers == []
    # systemd: the path unit's service wakes it and opens both flags, then its ExecStopPost
    woke = run("wake", p.double.address, "--gate", str(p.gate.closed), "--gate",
               str(p.gate.wakeable), "--cause", "request", "--no-warmup")  # fmt: skip
    assert woke.exit_code == 0, woke.output
    p.gate.wake_request.unlink()
    answers = held.join()
    assert [r.status_code for r in answers] == [200] * 8
    assert all(r.text.rstrip().endswith("data: [DONE]") for r in answers)
    assert {r.headers["X-Warmctl-Wake"] for r in answers} == {"woke"}
    assert all(float(r.headers["X-Warmctl-Held"]) > 0 for r in answers)
    assert p.double.counters.generations == 8 and p.double.counters.completed == 8
    assert p.double.counters.wakes == [()]  # one /wake_up
    # awake: the next request passes without the waker
    r = p.complete()
    assert r.status_code == 200 and "X-Warmctl-Wake" not in r.headers


def test_a_failed_wake_refuses_the_held_requests_and_it_stays_asleep(
    make_proxied: Callable[..., Proxied],
) -> None:
    p = make_proxied()
    p.asleep()
    held = Held(p.complete).start(3, p.waker.wait_holding)
    p.gate.wake_request.unlink()  # the wake service ended; the instance is still asleep
    answers = held.join()
    for r in answers:
        assert r.status_code == 503 and r.headers["Retry-After"] == "7", r.text
        assert r.json()["state"] == "waking-failed"
        assert "could not be woken" in r.json()["error"]["message"]
    assert p.gate.wakeable.exists() and p.double.is_sleeping
    assert p.double.counters.generations == 0
    again = p.complete()  # within the backoff: refused at once, no new wake
    assert again.status_code == 503 and again.json()["state"] == "waking-failed"
    assert not p.gate.wake_request.exists()


def test_a_hold_past_its_bound_answers_503_wake_timeout(
    make_proxied: Callable[..., Proxied],
) -> None:
    p = make_proxied(hold=0.5)
    p.asleep()
    r = p.complete()
    assert r.status_code == 503 and r.headers["Retry-After"] == "7"
    assert r.json()["state"] == "wake-timeout"
    assert p.gate.wake_request.exists() and p.double.counters.generations == 0


def test_the_closed_flag_still_refuses_and_asks_no_wake(
    make_proxied: Callable[..., Proxied],
) -> None:
    """A window that refuses (its closed flag) wins over wakeable: today's 503 asleep."""
    p = make_proxied()
    p.asleep()
    p.gate.closed.write_text("sleep cause=window level=1\n")
    r = p.complete()
    assert r.status_code == 503 and r.json()["state"] == "asleep"
    assert requests.get(p.url + "/health", timeout=5).status_code == 503
    assert not p.gate.wake_request.exists() and p.waker.state()["holding"] == 0


def test_a_waker_that_does_not_answer_is_waking_failed(
    make_proxied: Callable[..., Proxied],
) -> None:
    p = make_proxied()
    p.asleep()
    p.waker.stop()
    r = p.complete()
    assert r.status_code == 503 and r.json()["state"] == "waking-failed"
    assert r.headers["Retry-After"] == "7"


def test_the_awake_only_door_refuses_and_health_tells_the_doors_apart(
    make_proxied: Callable[..., Proxied],
) -> None:
    p = make_proxied()
    assert requests.get(p.door + "/health", timeout=5).status_code == 200  # awake: both serve
    assert p.complete(p.door).status_code == 200
    p.asleep()
    r = p.complete(p.door)
    assert r.status_code == 503 and r.json()["state"] == "asleep" and r.headers["Retry-After"]
    health = requests.get(p.door + "/health", timeout=5)
    assert health.status_code == 503 and health.json()["state"] == "asleep"
    main = requests.get(p.url + "/health", timeout=5)
    assert main.status_code == 200  # a request through this door is served
    assert main.json() == {**main.json(), "state": "asleep", "wakes_on_request": True}
    assert not p.gate.wake_request.exists() and p.waker.state()["holding"] == 0


@pytest.mark.parametrize("asleep", [False, True])
def test_dev_routes_stay_unreachable_on_both_doors(
    make_proxied: Callable[..., Proxied], asleep: bool
) -> None:
    p = make_proxied(vllm_proxy_api_keys=[TOKEN])
    if asleep:
        p.asleep()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for base in (p.url, p.door):
        for method, path in [*DEV_ROUTES, ("GET", "/_warmctl_wake"), ("GET", "/hold")]:
            r = requests.request(method, base + path, headers=auth, json={}, timeout=5)
            assert r.status_code == 404, (base, method, path, r.status_code)
    seen = {path.split("?")[0] for _, path in p.double.counters.requests}
    assert not seen & {path.split("?")[0] for _, path in DEV_ROUTES}
    # no token: 401 before the gate, so an unauthorised request wakes nothing
    r = requests.post(p.url + "/v1/completions", json=BODY, timeout=5)
    assert r.status_code == 401
    assert not p.gate.wake_request.exists()


def test_idle_through_the_proxy(run, make_proxied: Callable[..., Proxied]) -> None:
    """nginx's access log of /v1/ is the waker's idle clock (health and metrics polls are not
    activity); no sleep while a stream is in flight; the sleep and the wake a request brings,
    played by the path units' commands; status and verify do not wake it."""
    p = make_proxied(idle_after=1)
    waker = p.waker
    before = waker.state()["activities"]
    for _ in range(3):
        assert requests.get(p.url + "/health", timeout=5).status_code == 200
        assert requests.get(p.url + "/metrics", timeout=5).status_code == 200
    assert p.complete().status_code == 200
    # one worker, one socket: its datagrams arrive in order, so the /v1/ one arriving last and
    # alone proves the polls sent none
    wait_until(lambda: waker.state()["activities"] >= before + 1, "the request's datagram")
    assert waker.state()["activities"] == before + 1
    # a stream in flight (vLLM holds it before its first token): no sleep while /load > 0
    release = threading.Event()
    p.double.config.admission_hold = release
    stream = threading.Thread(target=p.complete, daemon=True)
    stream.start()
    p.double.wait_for(lambda: p.double.counters.admitted == 1, "a stream in flight")
    looks = sum(1 for _, path in p.double.counters.requests if path.startswith("/load"))
    p.double.wait_for(
        lambda: sum(1 for _, x in p.double.counters.requests if x.startswith("/load")) >= looks + 2,
        "two more looks at /load",
    )
    assert not p.gate.sleep_request.exists()
    released = time.time()
    release.set()
    stream.join(30)
    p.double.config.admission_hold = None
    units = PathUnits(p.gate, p.double.address).start()  # systemd from here on
    try:
        wait_until(lambda: ("sleep", 0) in units.runs, "the idle sleep done")
        assert p.gate.wakeable.stat().st_mtime > released + 1.0
        assert "cause=idle" in p.gate.wakeable.read_text() and p.double.is_sleeping
        # status and verify see it asleep and wake nothing
        status = run("status", f"127.0.0.1:{p.port}", "--json")
        [report] = json.loads(status.stdout)["results"]
        assert status.exit_code == 0, status.output
        assert report["sleeping"] and report["wakes_on_request"], report
        local = run("status", p.double.address, "--gate-dir", str(p.gate.dir),
                    "--instance", "tiny")  # fmt: skip
        assert (
            "asleep (level 1) since" in local.stdout
            and "(idle; a request wakes it)" in local.stdout
        )
        verify = run("verify", f"127.0.0.1:{p.port}", "--json")
        assert json.loads(verify.stdout)["results"][0]["status"] == "ASLEEP"
        assert not p.gate.wake_request.exists() and p.double.is_sleeping
        # a request wakes it and is served
        r = p.complete()
        assert r.status_code == 200 and r.headers["X-Warmctl-Wake"] == "woke"
        assert not p.double.is_sleeping and not p.gate.wakeable.exists()
    finally:
        units.stop()
    assert units.runs[:2] == [("sleep", 0), ("wake", 0)], units.runs


def test_a_connection_storm_on_the_waker_does_not_stop_a_wake(
    run, make_proxied: Callable[..., Proxied], tmp_path: Path
) -> None:
    """Idle connections pour onto the waker's socket, far past its bound (256) and its
    descriptor limit (640, as a unit's LimitNOFILE), before and while a real request reaches
    the instance asleep: the request is held, the wake runs, it is served. The waker keeps to
    its bound and logs the storm in one line (two if it lasted past a quiet spell), no
    traceback; its metrics count the connections the bound closed."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    p = make_proxied(waker={"max_connections": 256, "nofile": 640, "textfile_dir": metrics})
    p.asleep()
    stop, served = threading.Event(), threading.Event()
    opened: list[int] = [0]
    peak: list[int] = [0]

    def storm() -> None:
        held: list[socket.socket] = []
        try:
            while not stop.is_set():
                for _ in range(10):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        s.connect(str(p.gate.socket))
                    except OSError:
                        s.close()
                        continue
                    held.append(s)
                    opened[0] += 1
                while len(held) > 1200:  # the test's own descriptors: the oldest let go
                    held.pop(0).close()
                # a pace the waker follows on a loaded machine (a storm faster than it accepts
                # fills the kernel's backlog: then any connect waits or fails, nginx's too)
                stop.wait(0.005)
        finally:
            for s in held:
                s.close()

    storming = threading.Thread(target=storm, daemon=True)
    storming.start()
    try:
        wait_until(lambda: opened[0] > 1000, "a storm past the bound and the descriptor limit")
        peak[0] = p.waker.state()["connections"]
        held = Held(p.complete).start(1, p.waker.wait_holding)
        assert p.gate.wake_request.exists() and opened[0] > 1000
        woke = run("wake", p.double.address, "--gate", str(p.gate.closed), "--gate",
                   str(p.gate.wakeable), "--cause", "request", "--no-warmup")  # fmt: skip
        assert woke.exit_code == 0, woke.output
        p.gate.wake_request.unlink()
        [answer] = held.join()
        served.set()
        during = opened[0]
    finally:
        stop.set()
        storming.join(60)
    assert answer.status_code == 200 and answer.headers["X-Warmctl-Wake"] == "woke", answer.text
    assert answer.text.rstrip().endswith("data: [DONE]")
    assert peak[0] <= 256
    wait_until(lambda: "connection storm" in p.waker.log(), "the storm's line", timeout=60)
    log = p.waker.log()
    lines = [line for line in log.splitlines() if "connection storm" in line]
    print(f"{opened[0]} idle connections ({during} by the time the request was served) on a "
          f"waker bound to 256 with 640 descriptors; its log: {len(log.splitlines())} lines:\n"
          + "\n".join(lines))  # fmt: skip
    assert 1 <= len(lines) <= 2 and "Traceback" not in log, log[-3000:]
    assert len(log.splitlines()) < 20, log[-3000:]

    def closed_for_room() -> float:
        found = list(metrics.glob("*.waker.prom"))
        if not found:
            return 0.0
        for family in text_string_to_metric_families(found[0].read_text()):
            for sample in family.samples:
                if sample.name == "warmctl_waker_past_bound_connections_total" and (
                    sample.labels.get("what") == "idle"
                ):
                    return sample.value
        return 0.0

    wait_until(lambda: closed_for_room() > 0, "the storm in the waker's metrics", timeout=60)
    print(f"warmctl_waker_past_bound_connections_total{{what=idle}} {closed_for_room():g}")
