"""systemd hardening of every rendered unit (systemd-analyze security, printed and asserted)
and the fault paths built into the units: full cache disk, a window firing while the
instance is stopped, the gate of a proxied instance."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmctl.plan.render import RenderedInstance, render_instance
from warmctl.plan.unitfile import systemd_split, unit_values

NIGHTS = {"name": "nights", "sleep": "0 20 * * 1-5", "wake": "30 7 * * 1-5", "level": 1}
MATRIX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gpu-sleep-proxied": (
        {"name": "qwen", "model": "/srv/models/qwen", "port": 8000, "gpus": [0, 1],
         "windows": [NIGHTS]},
        {"vllm_preflight_device_kind": "gpu", "vllm_proxy_enabled": "auto"},
    ),
    "gpu-plain": (
        {"name": "plain", "model": "/srv/models/plain", "port": 8100},
        {"vllm_preflight_device_kind": "gpu", "vllm_proxy_enabled": "auto"},
    ),
    "gpu-tp2-sleep": (
        {"name": "big", "model": "/srv/models/big", "port": 8200, "gpus": [0, 1],
         "tensor_parallel_size": 2, "windows": [NIGHTS]},
        {"vllm_preflight_device_kind": "gpu", "vllm_proxy_enabled": "auto"},
    ),
    "gpu-tp2-plain": (
        {"name": "big", "model": "/srv/models/big", "port": 8200, "gpus": [0, 1],
         "tensor_parallel_size": 2},
        {"vllm_preflight_device_kind": "gpu", "vllm_proxy_enabled": "auto"},
    ),
    "cpu": (
        {"name": "tiny", "model": "/srv/models/tiny", "port": 8000, "windows": [NIGHTS]},
        {"vllm_preflight_device_kind": "cpu", "vllm_proxy_enabled": "auto"},
    ),
    "cpu-proxied": (
        {"name": "tiny", "model": "/srv/models/tiny", "port": 8000, "windows": [NIGHTS]},
        {"vllm_preflight_device_kind": "cpu", "vllm_proxy_enabled": True},
    ),
    "gpu-idle": (
        {"name": "idler", "model": "/srv/models/m", "port": 8000, "gpus": [0],
         "idle_sleep": {"after": "15m"}, "windows": [{**NIGHTS, "on_request": "wake"}]},
        {"vllm_preflight_device_kind": "gpu", "vllm_proxy_enabled": "auto"},
    ),
    "cpu-idle": (
        {"name": "tiny", "model": "/srv/models/tiny", "port": 8000, "idle_sleep": {"after": 60}},
        {"vllm_preflight_device_kind": "cpu", "vllm_proxy_enabled": "auto"},
    ),
}  # fmt: skip
MAX_EXPOSURE = 4.0


def rendered(name: str) -> RenderedInstance:
    instance, host = MATRIX[name]
    return render_instance(instance, host)


def write_root(r: RenderedInstance, root: Path) -> Path:
    for path, text in r.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def exposure(root: Path, unit: str) -> float:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", f"--root={root}", "--no-pager", unit],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert match, proc.stdout[-2000:] + proc.stderr[-2000:]
    return float(match.group(1))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", sorted(MATRIX))
def test_systemd_analyze_security_exposure(name: str, tmp_path: Path) -> None:
    r = rendered(name)
    root = write_root(r, tmp_path)
    units = [Path(p).name for p in r.files if p.endswith(".service")]
    figures = {unit: exposure(root, unit) for unit in units}
    for unit, value in sorted(figures.items()):
        print(f"systemd-analyze security {unit} ({name}): {value:.1f}")
    assert figures[r.plan.unit] <= MAX_EXPOSURE
    assert all(v <= MAX_EXPOSURE for v in figures.values()), figures


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", sorted(MATRIX))
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    """Every unit and timer of the instance passes `systemd-analyze verify` without one warning.
    The venvs and the config folder point into tmp_path, where their executables exist."""
    instance, host = MATRIX[name]
    for exe in ("vllm/bin/python", "warmctl/bin/warmctl"):
        (tmp_path / exe).parent.mkdir(parents=True)
        (tmp_path / exe).write_text("#!/bin/sh\n")
        (tmp_path / exe).chmod(0o755)
    places = {
        "vllm_install_venv": str(tmp_path / "vllm"),
        "vllm_install_warmctl_venv": str(tmp_path / "warmctl"),
        "vllm_service_config_dir": str(tmp_path / "etc"),
        "vllm_service_unit_dir": str(tmp_path / "units"),
    }
    r = render_instance(instance, {**host, **places})
    for path, text in r.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        if path.endswith(".sh"):
            Path(path).chmod(0o755)
    units = sorted(p for p in r.files if p.endswith((".service", ".timer", ".path")))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units],
        capture_output=True, text=True, check=False,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path / 'units'}:"},
    )  # fmt: skip
    print(f"systemd-analyze verify ({name}): {len(units)} files, exit {proc.returncode}")
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_dev_mode_binds_loopback_and_proxy_takes_the_port() -> None:
    gpu = rendered("gpu-sleep-proxied")
    assert gpu.plan.sleep and gpu.plan.launch_env["VLLM_SERVER_DEV_MODE"] == "1"
    assert list(gpu.plan.server_argv)[list(gpu.plan.server_argv).index("--host") + 1] == "127.0.0.1"
    assert list(gpu.plan.server_argv)[list(gpu.plan.server_argv).index("--port") + 1] == "18000"
    assert list(gpu.plan.warmup_argv)[2] == "127.0.0.1:18000"
    plain = rendered("gpu-plain")  # no dev mode: the operator's bind, no proxy
    assert (
        list(plain.plan.server_argv)[list(plain.plan.server_argv).index("--host") + 1] == "0.0.0.0"
    )
    assert list(plain.plan.server_argv)[list(plain.plan.server_argv).index("--port") + 1] == "8100"
    assert "VLLM_SERVER_DEV_MODE" not in {**plain.env, **plain.plan.launch_env}
    # dev mode without the proxy still binds loopback only
    alone = render_instance(MATRIX["gpu-sleep-proxied"][0], {"vllm_proxy_enabled": False})
    assert (
        list(alone.plan.server_argv)[list(alone.plan.server_argv).index("--host") + 1]
        == "127.0.0.1"
    )
    assert list(alone.plan.server_argv)[list(alone.plan.server_argv).index("--port") + 1] == "8000"


def test_gpu_hosts_see_only_their_gpus() -> None:
    unit = rendered("gpu-sleep-proxied").unit_text
    allowed = unit_values(unit, "Service", "DeviceAllow")
    assert unit_values(unit, "Service", "DevicePolicy") == ["closed"]
    assert "/dev/nvidia0 rw" in allowed and "/dev/nvidia1 rw" in allowed
    assert not any(a.startswith("/dev/nvidia2") for a in allowed)
    cpu = rendered("cpu").unit_text
    assert unit_values(cpu, "Service", "PrivateDevices") == ["yes"]
    assert not unit_values(cpu, "Service", "DeviceAllow")


def test_window_services_gate_and_drain() -> None:
    gpu = rendered("gpu-sleep-proxied").files
    sleep = gpu["/etc/systemd/system/vllm-qwen-sleep-nights.service"]
    wake = gpu["/etc/systemd/system/vllm-qwen-wake-nights.service"]
    argv = systemd_split(unit_values(sleep, "Service", "ExecStart")[0])
    gate = argv.index("--gate")
    assert argv[gate : gate + 2] == ["--gate", "/run/vllm-gate/qwen.closed"]
    assert argv[argv.index("--output-check") + 1] == "/var/lib/warmctl/qwen.outputs.json"
    assert "--gate" in systemd_split(unit_values(wake, "Service", "ExecStart")[0])
    cpu = rendered("cpu-proxied").files
    sleep = cpu["/etc/systemd/system/vllm-tiny-sleep-nights.service"]
    pre = systemd_split(unit_values(sleep, "Service", "ExecStartPre")[0])
    assert pre[1:4] == ["sleep", "127.0.0.1:18000", "--drain-only"] and "--gate" in pre
    assert unit_values(sleep, "Service", "ExecStart") == [
        "/usr/bin/systemctl stop vllm-tiny.service"
    ]
    unit = rendered("cpu-proxied").unit_text
    assert unit_values(unit, "Service", "ExecStartPre")[-2:] == [
        "+/bin/rm -f /run/vllm-gate/tiny.closed",  # a fresh server is awake
        # out of rotation until warm; created as the service user (its folder: docs/SECURITY.md)
        "-+/usr/bin/setpriv --reuid=vllm --regid=vllm --clear-groups -- /usr/bin/touch "
        "/run/vllm-gate/tiny.warming",
    ]
    posts = unit_values(unit, "Service", "ExecStartPost")
    assert len(posts) == 2 and " warmup " in posts[0]  # the warmup, then the flag goes
    assert posts[1] == "+/bin/rm -f /run/vllm-gate/tiny.warming"
    stops = unit_values(unit, "Service", "ExecStopPost")
    assert stops[0] == posts[1]
    # a single host's: a failed unit releases the requests held across its restart at once
    assert stops[1:] == [
        '+/bin/sh -c \'[ "$$SERVICE_RESULT" = success ] || exec /bin/rm -f '
        "/run/vllm-gate/tiny.holding'"
    ]
    plain = rendered("cpu").unit_text  # not proxied: no gate at all
    assert not unit_values(plain, "Service", "ExecStopPost")
    assert len(unit_values(plain, "Service", "ExecStartPost")) == 1


def test_a_failed_unit_releases_the_held_requests_a_clean_stop_keeps_them(tmp_path: Path) -> None:
    """The single host's ExecStopPost, run as systemd runs it (its $$ is one $): the holding
    flag goes when the unit failed, stays on a clean stop (a restart's stop phase)."""
    unit = rendered("cpu-proxied").unit_text
    (line,) = [v for v in unit_values(unit, "Service", "ExecStopPost") if "holding" in v]
    flag = tmp_path / "tiny.holding"
    command = line.replace("$$", "$").replace("/run/vllm-gate/tiny.holding", str(flag))
    for result, kept in [("success", True), ("exit-code", False), ("timeout", False)]:
        flag.write_text("draining\n")
        done = run_exec(command, env={"SERVICE_RESULT": result, "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        assert flag.exists() == kept, result


def run_exec(value: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = systemd_split(value)
    argv[0] = argv[0].lstrip("+-@!:")
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=30)


def test_full_cache_disk_fails_the_start_with_one_clear_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    host = {"vllm_preflight_device_kind": "cpu", "vllm_install_cache_dir": str(cache)}
    big = render_instance(MATRIX["cpu"][0], {**host, "vllm_service_cache_min_free_mib": 1 << 40})
    check = next(v for v in unit_values(big.unit_text, "Service", "ExecStartPre") if "stat" in v)
    proc = run_exec(check)
    print(f"disk check: rc={proc.returncode} {proc.stderr.strip()}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"MiB free on {cache}" in lines[0]
    assert "reset-failed vllm-tiny.service" in lines[0]
    small = render_instance(MATRIX["cpu"][0], {**host, "vllm_service_cache_min_free_mib": 1})
    check = next(v for v in unit_values(small.unit_text, "Service", "ExecStartPre") if "stat" in v)
    assert run_exec(check).returncode == 0
    # a start that keeps failing stops retrying (no crash loop)
    assert unit_values(big.unit_text, "Unit", "StartLimitBurst") == ["5"]
    assert unit_values(big.unit_text, "Service", "Restart") == ["on-failure"]


# what a non-root `systemctl` prints on a host without D-Bus (minimal images, containers)
NO_BUS = "Failed to connect to bus: No such file or directory"


@pytest.mark.parametrize("state", ["inactive", "failed", "activating", "active", "no-bus"])
def test_window_firing_while_the_instance_is_down_does_nothing(tmp_path: Path, state: str) -> None:
    """ExecCondition (run as root: `+`, so no D-Bus is needed): a stopped, failed or starting
    instance skips the window with one warning line, exit 1 (systemd skips the service) and the
    skip in the metrics; a state that cannot be read (no bus) is an error line and exit 255
    (the service fails), never a silent skip; an active one goes ahead, silently."""
    stub = tmp_path / "systemctl"
    if state == "no-bus":
        stub.write_text(f"#!/bin/sh\necho '{NO_BUS}' >&2\nexit 1\n")
    else:
        stub.write_text(
            '#!/bin/sh\n[ "$1 $2 $3 $4" = "show --property=ActiveState --value --" ] || exit 9\n'
            f"echo {state}\n"
        )
    stub.chmod(0o755)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    warmctl = str(Path(sys.executable).with_name("warmctl"))
    for name in ("gpu-sleep-proxied", "cpu"):
        instance, host = MATRIX[name]
        r = render_instance(
            instance,
            {
                **host,
                "vllm_schedule_systemctl": str(stub),
                "vllm_service_textfile_dir": str(textfiles),
            },
        )
        sleep = next(t for p, t in r.files.items() if p.endswith("-sleep-nights.service"))
        (condition,) = unit_values(sleep, "Service", "ExecCondition")
        assert condition.startswith("+/"), condition  # root: systemd's private socket
        argv = systemd_split(condition[1:])
        argv[0] = warmctl
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        print(f"{name} {state}: rc={proc.returncode} {proc.stderr.strip()}")
        prom = textfiles / f"warmctl_{r.name}.prom"
        if state == "active":
            assert proc.returncode == 0 and not proc.stderr and not prom.exists()
            continue
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        text = prom.read_text()
        assert 'warmctl_last_run_success{command="sleep",host=' in text
        assert f'vllm_instance="{r.name}"}} 0.0' in text
        if state == "no-bus":
            assert proc.returncode == 255  # the service fails: systemctl --failed shows it
            assert lines[0] == (
                f"warmctl: error: cannot read the state of {r.plan.unit}: {stub}: {NO_BUS}: "
                "sleep of window nights not done"
            )
            assert 'reason="error",vllm_instance=' in text
        else:
            assert proc.returncode == 1  # 1-254: systemd skips the unit, it does not fail it
            assert lines[0] == (
                f"warmctl: warning: {r.plan.unit} is {state}: sleep of window nights skipped"
            )
            assert f'reason="{state}",vllm_instance=' in text
        assert 'warmctl_window_skipped_timestamp_seconds{action="sleep"' in text
        assert 'window="nights"' in text
        prom.unlink()


# What tensor parallel needs from the unit's syscall filter (docs/SECURITY.md, "Tensor parallel"):
# each call with who makes it. NCCL and torch's symmetric memory pass CUDA memory handles (file
# descriptors) over AF_UNIX sockets with SCM_RIGHTS, never with pidfd_getfd or ptrace.
TP_SYSCALLS = {
    "socket": "AF_UNIX/AF_INET sockets: ZMQ, NCCL bootstrap and proxy, gloo, TCPStore",
    "socketpair": "multiprocessing pipes",
    "sendmsg": "SCM_RIGHTS: NCCL's IPC socket, torch symmetric memory's IpcChannel",
    "recvmsg": "SCM_RIGHTS, the receiving side",
    "bind": "NCCL's abstract AF_UNIX socket, ZMQ ipc:// and tcp:// endpoints",
    "ioctl": "the CUDA driver (/dev/nvidia*)",
    "mmap": "CUDA, /dev/shm segments",
    "madvise": "allocators",
    "ftruncate": "multiprocessing.shared_memory (vLLM's MessageQueue ring buffers)",
    "fallocate": "NCCL's /dev/shm/nccl-* segments",
    "get_mempolicy": "cuMem host allocations (NCCL falls back to /dev/shm without it)",
    "sched_setaffinity": "NCCL pins its threads to the GPU's CPUs",
    "clone": "fork of the EngineCore and the TP workers",
    "clone3": "threads (glibc)",
    "futex": "locks, the workers' shared lock",
    "eventfd2": "ZMQ",
    "epoll_wait": "ZMQ, asyncio",
}
# denied: nothing of the above uses them (SystemCallErrorNumber=EPERM keeps a denial visible)
TP_DENIED = ("pidfd_getfd", "ptrace", "mount", "setuid", "bpf")


def syscall_set(groups: list[str], seen: dict[str, set[str]]) -> set[str]:
    """The system calls of `groups` (names or @groups), expanded by systemd-analyze itself."""
    out: set[str] = set()
    for item in groups:
        if not item.startswith("@"):
            out.add(item)
            continue
        if item not in seen:
            proc = subprocess.run(
                ["systemd-analyze", "syscall-filter", "--no-pager", item],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            lines = [line.strip() for line in proc.stdout.splitlines()[1:]]
            seen[item] = set()  # a group listed inside itself ends here
            seen[item] = syscall_set([w for w in lines if w and not w.startswith("#")], seen)
        out |= seen[item]
    return out


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_tensor_parallel_unit_lets_nccl_and_the_workers_talk() -> None:
    r = rendered("gpu-tp2-sleep")
    unit = r.unit_text
    assert (
        list(r.plan.server_argv)[list(r.plan.server_argv).index("--tensor-parallel-size") + 1]
        == "2"
    )
    assert r.env["CUDA_VISIBLE_DEVICES"] == "0,1" and r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    allowed = unit_values(unit, "Service", "DeviceAllow")
    for device in ("/dev/nvidia0 rw", "/dev/nvidia1 rw", "/dev/nvidiactl rw", "/dev/nvidia-uvm rw"):
        assert device in allowed, allowed
    # sockets: ZMQ ipc:// and NCCL's abstract socket (AF_UNIX), gloo/TCPStore/NCCL bootstrap
    # (AF_INET/6), getifaddrs() in NCCL's interface search (AF_NETLINK)
    families = set(unit_values(unit, "Service", "RestrictAddressFamilies")[0].split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"} <= families
    # one /tmp for all processes of the unit (ZMQ ipc:// paths, torch's symm_mem-PID sockets);
    # /dev/shm stays the host's writable tmpfs: no PrivateIPC, no PrivateDevices on GPU hosts
    assert unit_values(unit, "Service", "PrivateTmp") == ["yes"]
    assert unit_values(unit, "Service", "ProtectSystem") == ["strict"]  # /dev is exempt
    for absent in ("PrivateIPC", "PrivateDevices", "MemoryDenyWriteExecute", "PrivateNetwork"):
        assert not unit_values(unit, "Service", absent), absent
    assert unit_values(unit, "Service", "RemoveIPC") == ["yes"]  # at the user's last unit stop
    filters = unit_values(unit, "Service", "SystemCallFilter")
    seen: dict[str, set[str]] = {}
    allow = syscall_set(next(f for f in filters if not f.startswith("~")).split(), seen)
    deny = syscall_set(next(f for f in filters if f.startswith("~"))[1:].split(), seen)
    permitted = allow - deny
    missing = {call: why for call, why in TP_SYSCALLS.items() if call not in permitted}
    print(f"syscall filter: {len(permitted)} calls permitted; TP needs {len(TP_SYSCALLS)}")
    assert not missing, missing
    assert not set(TP_DENIED) & permitted


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_a_stop_signals_the_main_process_alone(name: str) -> None:
    """KillMode=mixed: SIGTERM to vLLM's API server (or the launcher, which signals the server
    alone), which stops its engine core in order (seen in the CPU e2e at a config-change
    restart: the engine core's death logged as an ERROR)."""
    r = rendered(name)
    assert unit_values(r.unit_text, "Service", "KillMode") == ["mixed"]
    # and vLLM itself stops its engine core in order, after what is in flight (--shutdown-timeout;
    # signalled or not, vLLM's default abort logged "AsyncLLM output_handler failed" as an ERROR)
    i = list(r.plan.server_argv).index("--shutdown-timeout")
    assert list(r.plan.server_argv)[i + 1] == "10"


@pytest.mark.parametrize("result", ["success", "exit-code", "timeout"])
def test_a_failed_request_wake_leaves_the_cpu_instance_asleep(tmp_path: Path, result: str) -> None:
    """The CPU request wake is a start: when it fails, the unit is stopped (its own
    Restart=on-failure would start the broken server again behind the waker's back), before the
    waker sees its request file go and refuses the held requests."""
    calls = tmp_path / "calls"
    stub = tmp_path / "systemctl"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stub.chmod(0o755)
    instance, host = MATRIX["cpu-idle"]
    r = render_instance(instance, {**host, "vllm_schedule_systemctl": str(stub)})
    wake = r.files["/etc/systemd/system/vllm-tiny-wake-request.service"]
    posts = unit_values(wake, "Service", "ExecStopPost")
    assert posts[-1].startswith("-+/bin/rm -f ") and posts[-1].endswith("tiny.wake-request")
    stop = posts[0].replace("$$", "$")  # systemd passes "$$" on as "$"
    proc = run_exec(stop, env={"SERVICE_RESULT": result, "PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    stopped = calls.read_text().split("\n")[:-1] if calls.exists() else []
    assert stopped == ([] if result == "success" else ["stop vllm-tiny.service"])
