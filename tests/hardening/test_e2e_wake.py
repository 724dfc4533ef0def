"""End to end on the real systemd test hosts (marker e2e, root): idle sleep and wake on request
(a CPU host: the idle sleep drains and stops the unit, a request starts it again).

wt1 is deployed with `idle_sleep: {after: 1m}` beside its usual window (which refuses, the
default). In order, each step building on the state the previous one left:

1. one request through the proxy, then none: the waker asks for the idle sleep a minute after
   it (its journal's time, not before, not much later), the unit is stopped (drained first),
   the gate says asleep-and-wakable and /health says a request wakes it;
2. 8 concurrent clients then send a request each through the proxy: all 8 complete with 200,
   one start happened, none was refused; the hold each saw is printed. Meanwhile a connection
   storm on the waker's socket: an unprivileged user (nobody) is refused by the kernel at every
   connect; the vLLM user (who may connect) opens thousands of idle ones, past the waker's
   bound: the waker keeps to its bound and logs the storm in a line or two, and the 8 are
   served all the same;
3. the window (on_request: refuse) still refuses: its sleep service stops the unit and a
   request gets 503 "asleep" at once, no start; its wake service brings it back;
4. asleep again (the idle sleep asked for as the waker asks: its request file), then a wake
   that fails (the model's config.json moved away: vLLM cannot start): the requests held are
   refused with 503 and say why, the instance stays asleep (the failed start's unit stopped,
   not retried behind the waker's back; still wakable); the model put back, the next request
   wakes it and is served.

Uses the hosts and the deploy of test_e2e_proxy.py (its `lab` and `deployed` fixtures); named
to run after the other modules that use them, since it leaves wt1 with idle sleep."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_support import Lab, ansible_playbook, unit_show, wait_active
from tests.hardening.e2e_hosts import PROXY_VARS
from tests.lib import testhosts
from tests.lib.testhosts import Host

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the e2e test hosts need root"),
]
UNIT = "vllm-tiny.service"
IDLE_AFTER = 60
GATE = "/run/vllm-gate"


@dataclass
class Idle:
    lab: Lab
    host: Host
    deployed_at: float
    notes: list[str] = field(default_factory=list)

    def ssh(self, command: str, **kw: Any) -> str:
        return self.lab.fleet.ssh(self.host, command, check=False, **kw).stdout

    def state(self) -> str:
        return unit_show(self.lab.fleet, self.host, UNIT, "ActiveState")["ActiveState"]

    def starts(self) -> int:
        """How many times the unit started (systemd's own count of its start jobs is not kept
        across stops, so the journal's "Started" lines)."""
        out = self.ssh(f"journalctl -u {UNIT} --no-pager -o cat")
        return sum(1 for line in out.splitlines() if line.startswith("Started vllm-tiny"))

    def flags(self) -> set[str]:
        out = self.ssh(f"ls {GATE}")
        return {n.split(".", 1)[1] for n in out.split() if n.startswith("tiny.")}

    def wait(self, what: str, predicate: Any, timeout: float) -> float:
        """Poll `predicate` until true (an event: the unit's state, a flag); seconds taken."""
        t0 = time.monotonic()
        while not predicate():
            assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
            time.sleep(1)
        return time.monotonic() - t0


def request(address: str, timeout: float = 900) -> tuple[int, str, float]:
    """One completion through the proxy (the client's view): status, body, seconds."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(
        f"http://{address}:8000/v1/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace"), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        text = f"Retry-After {e.headers.get('Retry-After')} " + e.read().decode(errors="replace")
        return e.code, text, time.monotonic() - t0


def concurrent(address: str, clients: int) -> list[tuple[int, str, float]]:
    results: list[tuple[int, str, float]] = []
    lock = threading.Lock()
    go = threading.Barrier(clients)

    def one() -> None:
        go.wait()
        answer = request(address)
        with lock:
            results.append(answer)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1200)
    assert not any(t.is_alive() for t in threads), "a client hangs"
    return results


@pytest.fixture(scope="module")
def idle(lab: Lab, deployed: Path) -> Idle:
    host = lab.fleet.hosts[0]
    instance = testhosts.lab_instance(
        lab.model, windows=[lab.window], idle_sleep={"after": f"{IDLE_AFTER}s"}
    )
    # a failed wake's backoff (step 4) shorter than its 30 s default: the test's time
    own = {"vllm_service_instances": [instance], "vllm_schedule_wake_failed_backoff_sec": 5}
    inventory = lab.inventory("idle", group_vars=PROXY_VARS, host_vars={host.name: own})
    run = ansible_playbook(inventory, "--limit", host.name, log=lab.dir / "idle.log")
    print(f"site.yml --limit {host.name} with idle_sleep after {IDLE_AFTER} s: exit {run.rc} "
          f"in {run.seconds:.0f} s")  # fmt: skip
    assert run.rc == 0, run.describe()
    return Idle(lab, host, time.monotonic())


def _idle_sleep(idle: Idle, step: str) -> float:
    """Wait for the idle sleep (the unit stopped, the wakable flag up); seconds waited."""
    waited = idle.wait(f"{step}: the idle sleep", lambda: idle.state() == "inactive", 600)
    assert "wakeable" in idle.flags(), idle.flags()
    journal = idle.ssh("journalctl -u vllm-tiny-sleep-idle.service -u vllm-tiny-waker.service "
                       "--no-pager -o cat -n 12")  # fmt: skip
    idle.notes.append(f"{step}: asleep after {waited:.0f} s of waiting; journal:\n{journal}")
    return waited


def test_1_an_idle_instance_sleeps_after_its_minute(idle: Idle) -> None:
    # one request through the proxy: served awake, and the last one the idle minute counts from
    # (the deploy's own verify requests came earlier: the minute may have begun in the deploy)
    sent = time.time()
    code, body, _ = request(idle.host.address, timeout=120)
    assert code == 200, body
    waited = _idle_sleep(idle, "1")
    asked = _idle_sleep_asked_at(idle)
    health = request_health(idle)
    print("\n".join(idle.notes[-1:]))
    print(f"the idle sleep asked {asked - sent:.1f} s after the last request was sent "
          f"(idle_sleep after {IDLE_AFTER} s); /health through the proxy: {health}")  # fmt: skip
    assert asked - sent >= IDLE_AFTER, "it slept before a minute without requests"
    assert asked - sent < IDLE_AFTER + 30, "it slept long after its idle minute"
    assert waited > 0
    assert health.startswith("200") and '"wakes_on_request": true' in health, health


def _idle_sleep_asked_at(idle: Idle) -> float:
    """When the waker asked for the last idle sleep (its journal line's time: the test hosts
    share this machine's clock)."""
    out = idle.ssh("journalctl -u vllm-tiny-waker.service --no-pager -o short-unix")
    asked = [line for line in out.splitlines() if "asked for an idle sleep" in line]
    assert asked, out[-2000:]
    return float(asked[-1].split()[0])


def request_health(idle: Idle) -> str:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{idle.host.address}:8000/health", timeout=30) as r:
            return f"{r.status} {r.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read(200).decode(errors='replace')}"


# connects to the waker's socket for SECONDS as USER, holding up to 3000 idle connections; prints
# "opened N refused {errno: count}"
STORM = r"""
import errno, resource, socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
held, opened, refused = [], 0, {}
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(10):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            break
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            name = errno.errorcode.get(e.errno, str(e.errno))
            refused[name] = refused.get(name, 0) + 1
            continue
        held.append(s)
        opened += 1
        if len(held) > 3000:
            held.pop(0).close()
    time.sleep(0.02)  # a pace the waker follows (faster would fill the kernel's backlog)
print("opened", opened, "refused", refused)
"""


def storm(idle: Idle, user: str, seconds: float) -> str:
    import shlex

    sock = f"{GATE}/tiny.waker.sock"
    drop = f"setpriv --reuid={user} --regid={user} --clear-groups"
    if user == "nobody":
        drop = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
    command = f"{drop} python3 -c {shlex.quote(STORM)} {sock} {seconds}"
    return idle.ssh(command, timeout=seconds + 120).strip()


def test_2_eight_clients_wake_it_once_and_all_are_served(idle: Idle) -> None:
    assert idle.state() == "inactive"
    before = idle.starts()
    unprivileged = storm(idle, "nobody", 2)
    storms: list[str] = []
    service_user = threading.Thread(target=lambda: storms.append(storm(idle, "vllm", 20)))
    service_user.start()
    results = concurrent(idle.host.address, 8)
    service_user.join(300)
    after = idle.starts()
    codes = sorted(code for code, _, _ in results)
    held = sorted(seconds for _, _, seconds in results)
    print(f"8 clients at a sleeping instance: statuses {codes}; each waited "
          f"{', '.join(f'{s:.1f}' for s in held)} s; starts {before} -> {after}")  # fmt: skip

    def waker_journal() -> str:
        return idle.ssh("journalctl -u vllm-tiny-waker.service --no-pager -o cat --since=-10min")

    # the storm's line comes once it has been quiet a few seconds
    idle.wait("the storm's line", lambda: "connection storm" in waker_journal(), 120)
    journal = waker_journal()
    lines = [line for line in journal.splitlines() if "connection storm" in line]
    print(f"the storm: nobody {unprivileged}; the vLLM user {storms}; the waker's lines:\n"
          + "\n".join(lines))  # fmt: skip
    assert unprivileged.startswith("opened 0 refused {'EACCES': "), unprivileged
    assert codes == [200] * 8, results
    assert after - before == 1
    assert idle.state() == "active"
    assert not {"wakeable", "closed", "warming"} & idle.flags(), idle.flags()
    assert storms and int(storms[0].split()[1]) > 1024, storms  # past the waker's bound
    assert 1 <= len(lines) <= 3 and "Traceback" not in journal, journal[-3000:]


def test_3_the_window_that_refuses_still_refuses(idle: Idle) -> None:
    window = idle.lab.window["name"]
    before = idle.starts()
    idle.ssh(f"systemctl start vllm-tiny-sleep-{window}.service", timeout=600)
    assert idle.state() == "inactive"
    code, body, seconds = request(idle.host.address, timeout=60)
    print(f"window {window} asleep: a request -> {code} in {seconds:.2f} s: {body[:120]}")
    assert code == 503 and "asleep" in body, body
    assert idle.starts() == before, "a request started an instance its window keeps asleep"
    idle.ssh(f"systemctl start vllm-tiny-wake-{window}.service", timeout=900)
    wait_active(idle.lab.fleet, idle.host)


def test_4_a_failed_wake_refuses_the_held_requests_and_stays_asleep(idle: Idle) -> None:
    # asleep as an idle sleep leaves it (step 1 waited for the idle minute itself): the request
    # file the waker creates after it, so the same path unit and sleep service act
    idle.ssh(f"touch {GATE}/tiny.sleep-request")
    _idle_sleep(idle, "4")
    model = testhosts.lab_instance(idle.lab.model)["model"]
    idle.ssh(f"mv {model}/config.json {model}/config.json.away")
    try:
        results = concurrent(idle.host.address, 4)
        flags, state = idle.flags(), idle.state()
        journal = idle.ssh("journalctl -u vllm-tiny-wake-request.service -u vllm-tiny-waker.service"
                           " --no-pager -o cat -n 10")  # fmt: skip
        print(f"a wake that fails: {[(c, b[:90], round(s, 1)) for c, b, s in results]}; "
              f"the unit is {state}, flags {sorted(flags)}\n{journal}")  # fmt: skip
        assert [code for code, _, _ in results] == [503] * 4, results
        assert all("Retry-After" in body and "wak" in body for _, body, _ in results), results
        # asleep: the failed start's unit is stopped (the wake service stops it before the
        # waker sees its request answered: not retried by the unit's own Restart=on-failure);
        # the flag stays, so clients keep getting 503 until a start succeeds
        assert state in ("inactive", "failed"), state
        assert "wakeable" in flags
    finally:
        idle.ssh(f"mv {model}/config.json.away {model}/config.json; systemctl reset-failed {UNIT}")
    # put back: the next request (once the waker's backoff after a failure is over) wakes it
    t0 = time.monotonic()
    while True:
        code, body, seconds = request(idle.host.address)
        if code == 200:
            break
        assert code == 503, body
        assert time.monotonic() - t0 < 900, f"still refused after the model came back: {body}"
        time.sleep(2)
    print(f"model back: served after {time.monotonic() - t0:.0f} s (the last request held "
          f"{seconds:.1f} s)")  # fmt: skip
    assert idle.state() == "active"
