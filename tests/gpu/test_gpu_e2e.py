"""The collection on a real systemd GPU host (marker `gpu`): run by tests/gpu/run.sh on the lent
GPU machine, skipped anywhere else (CI has no GPU).

The host is a systemd-nspawn container (tests/gpu/gpuhost.sh) with the H200 bound in; the
controller is ansible-core inside it (local connection), the collection installed from its
tarball with ansible-galaxy; vLLM is the interpreter the host already has
(`vllm_install_vllm_python`). The tests run in order, each on what the one before left:

1. `warmctl.vllm.site`: one instance, `gpus: [0]`, the launcher, the proxy in front, two windows
   (level 1, level 2): active only after its warmup, verify passes through the proxy, the
   sandbox's exposure <= 4.0;
2. the same deploy again: changed=0;
3. the windows due in a minute or two (a deploy that moves them): the timers fire, sleep the
   real engine through the gate (GPU memory freed, /is_sleeping true, the proxy 503 "asleep"),
   then wake it with the output check passing, at level 1 and at level 2;
4. `warmctl.vllm.restart`: a relaunch under the launcher (MainPID and NRestarts unchanged),
   16 streaming clients through the proxy: none fails, none is cut (held across it);
5. a deploy that changes a vLLM argument: a reload under the launcher (MainPID and NRestarts
   unchanged), verify passes, the server has it;
6. no ERROR line in the server's journal from anything warmctl sent;
8. idle sleep at level 1 after 20 s without a request, then a request: its TTFT as the client
   sees it (the proxy holds it while the waker wakes the engine) <= 0.35 s, the output check
   passed; idle again, then 16 clients at once: all complete, none cut, no engine ERROR line.
7 (GPU_HOSTS=2, `-k lb`): two hosts behind the documented load balancer, under load.
9. the launcher under systemd: its server killed -> Restart=on-failure, warmed again; a stop
   within TimeoutStopSec, nothing left in the cgroup.

Figures go to $WARMCTL_GPU_OUT/gpu-e2e.json (and each playbook's output beside it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.lib.journal import error_lines

# "NAME:PID NAME:PID": the hosts tests/gpu/run.sh booted (the PID of each one's systemd)
HOSTS = dict(h.split(":", 1) for h in os.environ.get("WARMCTL_GPUHOSTS", "").split() if ":" in h)
OUT = Path(os.environ.get("WARMCTL_GPU_OUT", "/tmp/gpu-e2e-out"))
PROJECT = Path(os.environ.get("WARMCTL_GPU_PROJECT", "/root/gpu-project"))
ANSIBLE_PATH = os.environ.get("WARMCTL_ANSIBLE_PATH", "")
PLUGINS = Path(__file__).parent / "connection_plugins"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HOSTS, reason="no GPU host: tests/gpu/run.sh on a GPU machine"),
]
FIRST = next(iter(HOSTS), "gpuhost")
HOST_ROOT = Path(f"/tmp/{FIRST}")

NAME = "qwen"
UNIT = f"vllm-{NAME}.service"
PORT = 8000  # nginx, the clients' door
UPSTREAM = PORT + 10000  # vLLM on loopback (vllm_proxy_upstream_port_offset)
MODEL = "/srv/models/qwen3-0.6b-random"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile"
WARMCTL = "/opt/warmctl/bin/warmctl"
PATH = "/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
FIGURES: dict[str, Any] = {}


def save() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu-e2e.json").write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


def host(*argv: str, timeout: float = 600, on: str = "") -> subprocess.CompletedProcess[str]:
    """Run ARGV inside a GPU host (default: the first), as root, with a clean environment."""
    pid = HOSTS[on or FIRST]
    cmd = ["nsenter", "-t", pid, "-a", "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8"]
    return subprocess.run(
        [*cmd, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def sh(script: str, timeout: float = 600, on: str = "") -> subprocess.CompletedProcess[str]:
    return host("sh", "-c", script, timeout=timeout, on=on)


def show(unit: str, *props: str) -> dict[str, str]:
    proc = host("systemctl", "show", unit, *(f"--property={p}" for p in props))
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def journal(unit: str, since: str = "") -> str:
    extra = f" --since '{since}'" if since else ""
    return sh(f"journalctl --no-pager -o short-precise -u '{unit}'{extra}").stdout


def host_time() -> float:
    return float(host("date", "+%s.%N").stdout.strip())


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> float:
    """Poll CHECK until it returns something true; the seconds it took."""
    t0 = time.monotonic()
    last: Any = None
    while time.monotonic() - t0 < timeout:
        last = check()
        if last:
            return time.monotonic() - t0
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def get(url: str, timeout: float = 10) -> tuple[int, str]:
    import requests

    try:
        r = requests.get(url, timeout=timeout)
    except requests.RequestException as err:
        return 0, str(err)
    return r.status_code, r.text


def sleeping() -> bool | None:
    """vLLM's /is_sleeping on the upstream port; None when it does not answer."""
    code, body = get(f"http://127.0.0.1:{UPSTREAM}/is_sleeping")
    return json.loads(body).get("is_sleeping") if code == 200 else None


def gpu_memory_mib() -> int:
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(proc.stdout.strip().splitlines()[0])


def textfile() -> str:
    path = HOST_ROOT / TEXTFILE_DIR.lstrip("/") / f"warmctl_{NAME}.prom"
    return path.read_text() if path.exists() else ""


def metric(name: str, text: str | None = None) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text if text is not None else textfile()):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    return None


WINDOWS_FAR = [
    {"name": "l1", "sleep": "0 3 * * *", "wake": "5 3 * * *", "level": 1},
    {"name": "l2", "sleep": "10 3 * * *", "wake": "15 3 * * *", "level": 2},
]


def instance(port: int = PORT, **overrides: Any) -> dict[str, Any]:
    return {
        "name": NAME,
        "model": MODEL,
        "served_model_name": "m",
        "port": port,
        "gpus": [0],
        "max_num_seqs": 64,
        "windows": WINDOWS_FAR,
        **overrides,
    }


GROUP_VARS: dict[str, Any] = {
    "vllm_preflight_device": "gpu",
    "vllm_install_python": "/usr/bin/python3.12",
    "vllm_install_packages_preinstalled": True,
    "vllm_install_system_packages": [],
    "vllm_install_pip_no_index": True,
    "vllm_install_pip_find_links": ["/srv/kit/wheels/host"],
    "vllm_proxy_install_package": False,  # nginx unpacked by run.sh (no apt here)
    # the launcher: vllm_service_launcher's default (auto: on for GPU hosts)
    "vllm_service_textfile_dir": TEXTFILE_DIR,
    "vllm_service_env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "DO_NOT_TRACK": "1"},
}


def provided_vllm() -> dict[str, str]:
    """A GPU server whose image already has vLLM: checked, left alone (vllm_install_vllm_python;
    a collection from before it: the venv given as vllm_install_venv, whose pinned vLLM the role
    finds installed)."""
    defaults = PROJECT / "collections/ansible_collections/warmctl/vllm/roles/vllm_install"
    known = "vllm_install_vllm_python" in (defaults / "defaults/main.yml").read_text()
    if known:
        return {"vllm_install_vllm_python": "/opt/vllm-provided/bin/python"}
    return {"vllm_install_venv": "/opt/vllm-provided"}


def inventory(windows: list[dict[str, Any]] | None = None, **overrides: Any) -> None:
    """The first host alone, its one instance (`overrides` on it)."""
    write_inventory({FIRST: [instance(windows=windows or WINDOWS_FAR, **overrides)]})


def write_inventory(hosts: dict[str, list[dict[str, Any]]], **group: Any) -> None:
    import yaml

    data = {
        "vllm": {
            "hosts": {
                name: {
                    "ansible_connection": "nsenter",
                    "ansible_host": HOSTS.get(name, ""),
                    "ansible_python_interpreter": "/opt/torch/.venv/bin/python",
                    "ansible_become": False,  # root already (no sudo there)
                    "vllm_service_instances": items,
                }
                for name, items in hosts.items()
            },
            "vars": {**GROUP_VARS, **provided_vllm(), **group},
        }
    }
    (PROJECT / "inventory.yml").write_text(yaml.safe_dump(data, sort_keys=False))


RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def playbook(stage: str, name: str, *args: str, timeout: float = 580) -> dict[str, Any]:
    """ansible-playbook warmctl.vllm.NAME from the controller's project folder; its output is
    appended to $OUT/playbooks.log."""
    env = {
        **os.environ,
        "PYTHONPATH": ANSIBLE_PATH,
        "ANSIBLE_CONNECTION_PLUGINS": str(PLUGINS),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_FORCE_COLOR": "0",
        "LC_ALL": "C.UTF-8",
        # the modules run in the host with this PATH (nsenter keeps the environment)
        "PATH": f"{PATH}:{os.environ.get('PATH', '')}",
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ansible", "playbook", f"warmctl.vllm.{name}",
         "-i", "inventory.yml", *args],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    took = time.monotonic() - t0
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "playbooks.log").open("a") as log:
        log.write(f"===== {stage}: {name} {' '.join(args)} (rc {proc.returncode}, {took:.1f} s)\n")
        log.write(proc.stdout + proc.stderr)
    recap = RECAP.findall(proc.stdout)
    result: dict[str, Any] = {"rc": proc.returncode, "seconds": round(took, 1)}
    for host_name, ok, changed, _unreachable, failed in recap:
        result.setdefault("hosts", {})[host_name] = {
            "ok": int(ok), "changed": int(changed), "failed": int(failed)
        }  # fmt: skip
    if recap:
        result["changed"] = sum(int(r[2]) for r in recap)
    FIGURES.setdefault("playbooks", {})[stage] = result
    save()
    if proc.returncode != 0:  # what the units said, before a later step or `down` loses it
        for name_ in [h for h in HOSTS] or [FIRST]:
            text = sh("journalctl --no-pager -o short-precise -u 'vllm-*' | tail -n 400",
                      on=name_).stdout  # fmt: skip
            (OUT / f"journal-{stage}-{name_}.log").write_text(text)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {**result, "output": proc.stdout}


def verify_through_proxy() -> dict[str, Any]:
    proc = host(WARMCTL, "verify", f"127.0.0.1:{PORT}", "--json", timeout=300)
    [report] = json.loads(proc.stdout)["results"]
    assert proc.returncode == 0 and report["status"] == "PASS", proc.stdout + proc.stderr
    return {k: report.get(k) for k in ("first_ttft_s", "steady_median_ttft_s", "ratio")}


def test_1_site_deploy_on_the_gpu_host() -> None:
    inventory(WINDOWS_FAR)
    run = playbook("site", "site")
    state = show(UNIT, "ActiveState", "MainPID", "NRestarts")
    assert state["ActiveState"] == "active", state
    text = journal(UNIT)
    # active only after the warmup: systemd's "Started" comes after the warmup's "warm in"
    warm = text.find(": warm in ")
    started = text.find(f"Started {UNIT}")
    assert 0 <= warm < started, "the unit counted as started before its warmup finished"
    assert "vllm-launch: imported" in text  # under the pre-imported launcher
    assert re.search(r"PASS", run["output"]), "the deploy's verify gate did not say PASS"
    FIGURES["site"] = {"verify_through_proxy": verify_through_proxy(), **state}
    sec = host("systemd-analyze", "security", "--no-pager", UNIT)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", sec.stdout + sec.stderr)
    assert match, sec.stdout[-2000:] + sec.stderr
    FIGURES["site"]["exposure"] = float(match.group(1))
    save()
    assert float(match.group(1)) <= 4.0
    # the provided interpreter was left alone: no venv where the role would have made one
    assert host("test", "-e", "/opt/vllm/venv").returncode != 0
    FIGURES["site"]["vllm"] = provided_vllm()


def test_2_second_run_changes_nothing() -> None:
    run = playbook("second-run", "site")
    assert run["changed"] == 0, re.findall(r"^changed: .*$", run["output"], re.M)


def oncalendar(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def test_3_windows_sleep_and_wake_the_real_engine() -> None:
    # the windows move to the next minutes (a deploy that changes only the timers); each fires
    # on its own, as it would at night
    start = host_time() + 75
    steps = {"l1": (start, start + 20), "l2": (start + 40, start + 60)}
    windows = [
        {"name": n, "sleep": oncalendar(s), "wake": oncalendar(w), "level": i + 1}
        for i, (n, (s, w)) in enumerate(steps.items())
    ]
    inventory(windows)
    run = playbook("windows", "site", "--tags", "vllm_schedule")
    assert show(UNIT, "ActiveState")["ActiveState"] == "active"
    awake_mib = gpu_memory_mib()
    FIGURES["windows"] = {"deploy": run["seconds"], "gpu_mib_awake": awake_mib}
    for level, (name, (sleep_at, wake_at)) in enumerate(steps.items(), start=1):
        fig: dict[str, Any] = {}
        wait_for(f"{name}: sleep timer", lambda: sleeping() is True,
                 timeout=sleep_at - host_time() + 90)  # fmt: skip
        fig["slept_after_s"] = round(host_time() - sleep_at, 2)
        sleep_unit = f"vllm-{NAME}-sleep-{name}.service"
        wait_for(
            f"{name}: sleep service done",
            lambda u=sleep_unit: show(u, "ActiveState")["ActiveState"] == "inactive",
            timeout=60,
        )
        result = show(sleep_unit, "Result", "ExecMainStatus")
        assert result["Result"] == "success", result
        fig["gpu_mib_asleep"] = gpu_memory_mib()
        code, body = get(f"http://127.0.0.1:{PORT}/v1/models")
        assert code == 503 and '"state": "asleep"' in body, (code, body)
        fig["proxy"] = code
        assert fig["gpu_mib_asleep"] < awake_mib / 4, (fig, awake_mib)
        wait_for(f"{name}: wake timer", lambda: sleeping() is False,
                 timeout=wake_at - host_time() + 90)  # fmt: skip
        wake_unit = f"vllm-{NAME}-wake-{name}.service"
        wait_for(
            f"{name}: wake service done",
            lambda u=wake_unit: show(u, "ActiveState")["ActiveState"] == "inactive",
            timeout=120,
        )
        result = show(wake_unit, "Result", "ExecMainStatus")
        assert result["Result"] == "success", (result, journal(wake_unit)[-3000:])
        fig["woke_after_s"] = round(host_time() - wake_at, 2)
        prom = textfile()
        fig["sleep_level"] = metric("warmctl_sleep_level", prom)
        fig["sleep_s"] = metric("warmctl_sleep_duration_seconds", prom)
        fig["wake_s"] = metric("warmctl_wake_duration_seconds", prom)
        fig["wake_output_check_ok"] = metric("warmctl_wake_output_check_ok", prom)
        fig["journal"] = (
            journal(sleep_unit).splitlines()[-6:] + journal(wake_unit).splitlines()[-8:]
        )
        FIGURES["windows"][name] = fig
        save()
        assert fig["sleep_level"] == level
        assert fig["wake_output_check_ok"] == 1
        code, _ = get(f"http://127.0.0.1:{PORT}/v1/models")
        assert code == 200
    FIGURES["windows"]["verify_after"] = verify_through_proxy()
    save()


def load_across(
    address: str, label: str, action: Callable[[], Any], watch: Any = None
) -> tuple[Any, dict[str, Any]]:
    """16 streaming clients through `address` across `action` (what it returned, and the row of
    counts): a relaunch or a reload holds new requests and lets in-flight ones finish, a load
    balancer takes a host out of rotation first; none fails. `watch` (a started RotationWatch)
    adds how long each host was out of rotation."""
    from tests.hardening.fleet_load import StreamLoad

    load = StreamLoad(address, "m", clients=CLIENTS, max_tokens=TOKENS, limit_s=540,
                      pause_s=PAUSE_S).start()  # fmt: skip
    result: Any = None
    try:
        time.sleep(SETTLE_S)
        t0 = time.monotonic()
        result = action()
        took = time.monotonic() - t0
        time.sleep(SETTLE_S)
    finally:
        counts = load.stop()
        if watch is not None:
            watch.stop()
    row = {
        "took_s": round(took, 1),
        "started": counts.started,
        "completed": counts.completed,
        "failed": counts.failed,
        "cut": counts.cut,
        "longest_wait_s": round(counts.longest_wait_s, 2),
        "rate": counts.rate(),
        "errors": dict(counts.errors),
    }
    line = f"{label}: {counts.line()}; {counts.rate()}"
    if watch is not None:
        row["out_of_rotation_s"] = {k: round(v, 1) for k, v in watch.out_s.items()}
        row["all_out_at_once_s"] = round(watch.all_out_s, 1)
        line += f"; {watch.line()}"
    print(line)
    return result, row


def single_host_load(label: str, action: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """The single host's proxy (no load balancer) under load across `action`."""
    result, row = load_across(f"127.0.0.1:{PORT}", label, action)
    FIGURES.setdefault("single_host_load", {})[label] = row
    save()
    return result, row


def test_4_restart_playbook_relaunches_under_the_launcher() -> None:
    before = show(UNIT, "MainPID", "NRestarts")
    run, load = single_host_load("restart playbook", lambda: playbook("restart", "restart"))
    after = show(UNIT, "MainPID", "NRestarts", "ActiveState")
    FIGURES["restart"] = {"seconds": run["seconds"], "before": before, "after": after}
    save()
    assert_clean(load)
    assert after["ActiveState"] == "active"
    assert after["MainPID"] == before["MainPID"] and after["NRestarts"] == before["NRestarts"]
    assert "vllm-launch: relaunch" in journal(UNIT)


def test_5_a_changed_vllm_argument_reloads_and_verifies() -> None:
    before = show(UNIT, "MainPID", "NRestarts")
    inventory(WINDOWS_FAR, max_num_seqs=48)
    run, load = single_host_load("config change", lambda: playbook("config-change", "site"))
    assert_clean(load)
    after = show(UNIT, "MainPID", "NRestarts", "ActiveState")
    FIGURES["config_change"] = {"seconds": run["seconds"], "before": before, "after": after}
    # only the launch file changed: the launcher relaunched its server, the unit stayed
    assert after["ActiveState"] == "active" and after["MainPID"] == before["MainPID"]
    assert after["NRestarts"] == before["NRestarts"]
    state = json.loads(host("cat", f"/run/vllm-{NAME}/launcher.json").stdout)
    FIGURES["config_change"]["launcher"] = state
    assert re.search(r"--max-num-seqs 48\b", state["argv"]), state
    # the new server has it: vLLM logs its non-default arguments at start
    since = journal(UNIT).rsplit("vllm-launch: relaunch: old server stopped", 1)[-1]
    assert "'max_num_seqs': 48" in since, since[-3000:]
    FIGURES["config_change"]["verify_through_proxy"] = verify_through_proxy()
    save()


def test_6_no_error_line_in_the_servers_journal() -> None:
    text = sh("journalctl --no-pager -o short-precise -u 'vllm-*'").stdout
    errors, raced = error_lines(text)  # vLLM's own shutdown race (vllm#48745) apart
    FIGURES["journal_error_lines"] = errors[:20]
    FIGURES["journal_shutdown_race_lines"] = raced[:20]
    # the launcher's forks: each before its standby's imports, so never with NVML's thread (or
    # any other) alive: no line of the launcher about threads, no Python fork warning
    forks = [ln for ln in text.splitlines() if "multi-threaded" in ln or "thread(s) alive" in ln]
    FIGURES["journal_fork_thread_lines"] = forks[:20]
    save()
    assert not errors, "\n".join(errors[:20])
    assert not forks, "\n".join(forks[:20])


# ---- 9. the launcher under systemd: a server that dies, a stop (-k launcher) -----------------
def test_9_launcher_a_dead_server_restarts_the_unit_and_a_stop_is_prompt() -> None:
    """The server (the launcher's child) killed: the launcher exits with its status, systemd's
    Restart=on-failure starts the unit again (warmed before it counts as started); then
    `systemctl stop` ends within TimeoutStopSec, with no process of the unit left."""
    state = show(UNIT, "MainPID", "NRestarts", "TimeoutStopUSec")
    main_pid = state["MainPID"]
    # the server (not the standby, the next server, which the launcher also has as a child)
    launcher = json.loads(sh(f"cat /run/vllm-{NAME}/launcher.json").stdout)
    assert launcher["launcher_pid"] == int(main_pid), launcher
    server = str(launcher["server_pid"])
    assert server in sh(f"cat /proc/{main_pid}/task/*/children").stdout.split(), launcher
    fig: dict[str, Any] = {"before": state, "server_pid": server}
    FIGURES["launcher"] = fig
    t0 = time.monotonic()
    host("kill", "-KILL", server)
    restarted = lambda: show(UNIT, "NRestarts")["NRestarts"] != state["NRestarts"]  # noqa: E731
    wait_for("the unit restarted by systemd", restarted, timeout=120)
    wait_for("active again (warm)", lambda: show(UNIT, "ActiveState")["ActiveState"] == "active",
             timeout=400)  # fmt: skip
    fig["restarted_warm_s"] = round(time.monotonic() - t0, 1)
    after = show(UNIT, "MainPID", "NRestarts", "Result")
    fig["after"] = after
    fig["verify_through_proxy"] = verify_through_proxy()
    save()
    assert after["MainPID"] != main_pid and int(after["NRestarts"]) == int(state["NRestarts"]) + 1
    t0 = time.monotonic()
    host("systemctl", "stop", UNIT, timeout=300)
    fig["stop_s"] = round(time.monotonic() - t0, 2)
    left = sh(f"systemctl show -p ControlGroup --value {UNIT}").stdout.strip()
    fig["left_in_cgroup"] = sh(f"cat /sys/fs/cgroup{left}/cgroup.procs 2>/dev/null").stdout.split()
    fig["stop_journal"] = journal(UNIT).splitlines()[-6:]
    save()  # the unit is left stopped: this test runs last of the single-host ones
    span = sh(f"systemd-analyze timespan '{state['TimeoutStopUSec']}'").stdout
    limit_s = int(re.search(r"μs: (\d+)", span).group(1)) / 1e6  # type: ignore[union-attr]
    fig["timeout_stop_s"] = limit_s
    assert fig["stop_s"] < limit_s, fig
    assert fig["left_in_cgroup"] == [], fig


# ---- 8. idle sleep, and the requests that wake it (-k idle) ----------------------------------
IDLE_AFTER_S = 20
IDLE_TTFT_TARGET_S = 0.35  # issue 24: wake + warmup + first token, as the client sees it
BURST = 16


def stream_once(port: int = PORT, tokens: int = 8) -> dict[str, Any]:
    """One streamed completion through the proxy: the client's TTFT (from the request's send,
    so a hold is in it), tokens, status."""
    from warmctl.errors import WarmctlError
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    client = Client(parse_target(f"127.0.0.1:{port}"), timeout=300)
    t0 = time.monotonic()
    try:
        r = stream_completion(client, "m", "Count from one to twenty:", max_tokens=tokens,
                              ignore_eos=True)  # fmt: skip
    except WarmctlError as err:
        return {"status": err.status or 0, "error": str(err), "s": time.monotonic() - t0}
    return {"status": 200, "ttft_s": r.ttft_s, "tokens": r.tokens, "s": time.monotonic() - t0}


def test_8_idle_sleep_then_requests_wake_it() -> None:
    """Idle sleep (level 1) after IDLE_AFTER_S without a request, then one request: its TTFT as
    the client sees it (the hold: wake, output check, light warmup; then the first token);
    idle again, then BURST clients at once: all complete, none cut."""
    import threading

    inventory(WINDOWS_FAR, idle_sleep={"after": f"{IDLE_AFTER_S}s", "level": 1})
    run = playbook("idle-deploy", "site")
    fig: dict[str, Any] = {"deploy_s": run["seconds"], "idle_after_s": IDLE_AFTER_S}
    FIGURES["idle"] = fig
    awake_mib = gpu_memory_mib()
    steady = [stream_once() for _ in range(6)][1:]
    fig["steady_ttft_s"] = sorted(r["ttft_s"] for r in steady)[len(steady) // 2]
    t0 = time.monotonic()
    wait_for("the idle sleep", lambda: sleeping() is True, timeout=IDLE_AFTER_S + 180)
    fig["asleep_after_s"] = round(time.monotonic() - t0, 1)
    fig["gpu_mib"] = {"awake": awake_mib, "asleep": gpu_memory_mib()}
    fig["health_asleep"] = get(f"http://127.0.0.1:{PORT}/health")
    save()
    assert fig["asleep_after_s"] >= IDLE_AFTER_S - 1
    first = stream_once()
    fig["first_request"] = first
    fig["after_wake_ttft_s"] = [stream_once()["ttft_s"] for _ in range(3)]
    prom = textfile()
    fig["wake_output_check_ok"] = metric("warmctl_wake_output_check_ok", prom)
    fig["waker_journal"] = journal(f"vllm-{NAME}-waker.service").splitlines()[-8:]
    save()
    assert first["status"] == 200 and first["tokens"] == 8, first
    assert fig["wake_output_check_ok"] == 1
    assert first["ttft_s"] <= IDLE_TTFT_TARGET_S, first

    t0 = time.monotonic()
    wait_for("the idle sleep, again", lambda: sleeping() is True, timeout=IDLE_AFTER_S + 180)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    go = threading.Barrier(BURST)

    def client() -> None:
        go.wait()
        r = stream_once(tokens=24)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=client) for _ in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    ttfts = sorted(r.get("ttft_s") or 0 for r in results)
    fig["burst"] = {
        "clients": BURST,
        "completed": sum(r["status"] == 200 and r["tokens"] == 24 for r in results),
        "cut": sum(r["status"] == 200 and r["tokens"] != 24 for r in results),
        "failed": sum(r["status"] != 200 for r in results),
        "ttft_s": {"min": ttfts[0], "median": ttfts[len(ttfts) // 2], "max": ttfts[-1]},
        "errors": [r.get("error") for r in results if r["status"] != 200][:4],
    }
    text = journal(UNIT)
    fig["engine_error_lines"] = error_lines(text)[0][:10]
    save()
    assert fig["burst"]["completed"] == BURST, fig["burst"]
    assert not fig["engine_error_lines"]


# ---- 7. two hosts behind the documented load balancer (GPU_HOSTS=2, -k lb) ------------------
CLIENTS = 16
TOKENS = 24
PAUSE_S = 0.5  # each client after each request: a bounded load (~20 requests/s)
SETTLE_S = 5.0
# two hosts on one GPU, one network: each instance its own port, a share of the GPU, the
# KV cache sleep mode re-maps at wake (the template's default for instances that sleep)
LB_INSTANCE = {"gpu_memory_utilization": 0.4, "kv_cache_tokens": 131072}


def lb_hosts(**overrides: Any) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [instance(PORT + i, **{**LB_INSTANCE, **overrides})]
        for i, name in enumerate(list(HOSTS)[:2])
    }


@pytest.fixture(scope="module")
def balanced() -> Any:
    from tests.hardening.fleet_load import StreamLoad  # noqa: F401  (the image has requests)
    from tests.hardening.proxy_support import Nginx, free_port, lb_config

    if len(HOSTS) < 2:
        pytest.skip("the load balancer test needs two GPU hosts (GPU_HOSTS=2)")
    write_inventory(lb_hosts(), vllm_verify_max_ratio=4)
    playbook("lb-first-deploy", "site", "-e", "vllm_rollout_serial=2")
    port = free_port()
    backends = [f"127.0.0.1:{PORT + i}" for i in range(2)]
    lb = Nginx(
        f"/tmp/{FIRST}/usr/sbin/nginx", OUT / "lb", {"vllm-lb.conf": lb_config(backends, port)}
    )
    lb.start(port)
    FIGURES["lb"] = {"runs": {}}
    try:
        yield f"127.0.0.1:{port}"
    finally:
        lb.stop()
        save()


def under_load(address: str, label: str, action: Callable[[], Any]) -> dict[str, Any]:
    """The load balancer's door under load across `action`, each host's rotation watched."""
    from tests.hardening.fleet_load import RotationWatch

    urls = {name: f"http://127.0.0.1:{PORT + i}/health" for i, name in enumerate(list(HOSTS)[:2])}
    _, row = load_across(address, label, action, RotationWatch(urls).start())
    FIGURES["lb"]["runs"][label] = row
    save()
    return row


def assert_clean(row: dict[str, Any]) -> None:
    assert row["started"] > CLIENTS, row
    assert row["failed"] == 0 and row["cut"] == 0 and row["completed"] == row["started"], row


# which of the three steps run (a call of the lent machine is limited to 10 minutes): e.g. "3"
LB_STEPS = os.environ.get("WARMCTL_GPU_LB_STEPS", "123")


def test_7_lb_rolling_deploy_restart_and_a_window_lose_nothing(balanced: str) -> None:
    write_inventory(lb_hosts(max_num_seqs=48), vllm_verify_max_ratio=4)
    rows = []
    if "1" in LB_STEPS:
        rows.append(under_load(balanced, "1. deploy changing every instance, one host at a time",
                               lambda: playbook("lb-rolling-deploy", "site")))  # fmt: skip
    if "2" in LB_STEPS:
        rows.append(under_load(balanced, "2. warmctl.vllm.restart",
                               lambda: playbook("lb-restart", "restart")))  # fmt: skip

    def window() -> None:
        start = host_time() + 45
        windows = [
            {"name": "l1", "sleep": oncalendar(start), "wake": oncalendar(start + 20), "level": 1}
        ]
        hosts = lb_hosts(max_num_seqs=48)
        hosts[FIRST] = [instance(PORT, windows=windows, **LB_INSTANCE, max_num_seqs=48)]
        write_inventory(hosts, vllm_verify_max_ratio=4)
        playbook("lb-window", "site", "--tags", "vllm_schedule", "--limit", FIRST)
        wake_unit = f"vllm-{NAME}-wake-l1.service"
        wait_for("the window's wake ran", lambda: "Finished" in journal(wake_unit)
                 or "Deactivated successfully" in journal(wake_unit),
                 timeout=start + 20 - host_time() + 90)  # fmt: skip
        result = show(wake_unit, "Result")
        assert result["Result"] == "success", journal(wake_unit)[-3000:]

    if "3" in LB_STEPS:
        rows.append(under_load(balanced, "3. the first host's level-1 window: sleep, wake", window))
    for row in rows:
        assert_clean(row)
