"""Every template rendered through Ansible (the roles' render tasks) and through
warmctl.plan.render:
identical text, the exact ExecStart/environment/timers, and systemd accepts them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.ansible.cases import GOOD
from tests.ansible.conftest import run_playbook, write_inventory

from warmctl.launcher.vllm_launch import parse_launch
from warmctl.plan.render import RenderError, render_instance
from warmctl.plan.unitfile import systemd_split, unit_values

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")


def host_vars(hosts: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in hosts[name].items() if k != "vllm_service_instances"}


def server_env(r: Any) -> dict[str, str]:
    """What the server's environment gets from the deploy: the env file, then (under the
    launcher) the launch file's variables."""
    return {**r.env, **r.plan.launch_env}


def all_rendered(rendered_by_ansible: dict[str, Any]) -> list[tuple[str, dict, Any]]:
    hosts = rendered_by_ansible["hosts"]
    return [
        (name, instance, render_instance(instance, host_vars(hosts, name)))
        for name in hosts
        for instance in hosts[name]["vllm_service_instances"]
    ]


def test_ansible_and_warmctl_render_identical_files(rendered_by_ansible):
    root: Path = rendered_by_ansible["root"]
    checked = 0
    expected_paths: set[str] = set()
    for _name, _instance, rendered in all_rendered(rendered_by_ansible):
        for path, text in rendered.files.items():
            expected_paths.add(path)
            assert Path(path).read_text() == text, path
            checked += 1
    on_disk = {str(p) for p in root.glob("*/units/*")} | {str(p) for p in root.glob("*/etc/*")}
    assert on_disk == expected_paths  # Ansible wrote exactly the files warmctl.plan.render knows
    assert checked >= 25


def test_gpu_sleep_exact_unit_env_and_timers():
    instance = GOOD["gpu_sleep"]["vllm_service_instances"][0]
    r = render_instance(instance, host_vars(GOOD, "gpu_sleep"))
    # a GPU host: under the pre-imported launcher (auto); the unit names what it imports, the
    # launch file what the server runs
    assert list(r.plan.server_argv) == [
        "/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve",
        "/srv/models/qwen3-0.6b", "--host", "127.0.0.1", "--port", "18000",
        "--enable-server-load-tracking", "--shutdown-timeout", "10", "--served-model-name", "qwen",
        "--tensor-parallel-size", "2", "--max-num-seqs", "64",
        "--gpu-memory-utilization", "0.85", "--compilation-config",
        '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128], '
        '"cudagraph_mode": "FULL_AND_PIECEWISE"}',
        "--enable-sleep-mode",
    ]  # fmt: skip
    assert unit_values(r.unit_text, "Service", "ExecStart") == [
        "/opt/vllm/venv/bin/python /opt/warmctl/share/warmctl/vllm_launch.py --stop-timeout 90 "
        "--launch-file /etc/vllm/qwen.launch --state-file /run/vllm-qwen/launcher.json "
        "--standby-delay ready -- -m vllm.entrypoints.cli.main"
    ]
    assert r.plan.launch_file == "/etc/vllm/qwen.launch"
    assert unit_values(r.unit_text, "Service", "RuntimeDirectory") == ["vllm-qwen"]
    assert list(r.plan.warmup_argv) == [
        "/opt/warmctl/bin/warmctl", "warmup", "127.0.0.1:18000", "--wait-ready",
        "--ready-timeout", "1800",
        "--max-batch", "16", "--max-tokens", "2",  # vllm_service_gpu_warmup_args
    ]  # fmt: skip
    assert r.env == {  # the env file: what only a restart applies
        "TRITON_CACHE_DIR": "/var/cache/vllm/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/var/cache/vllm/inductor",
        "CUDA_CACHE_PATH": "/var/cache/vllm/nv",
        "CUDA_CACHE_MAXSIZE": "4294967296",
        "TORCH_EXTENSIONS_DIR": "/var/cache/vllm/torch_extensions",
        "XDG_CACHE_HOME": "/var/cache/vllm/xdg",
        "HF_HOME": "/var/cache/vllm/huggingface",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert r.plan.launch_env == {  # the launch file: vLLM's own variables, in the env file's order
        "VLLM_CACHE_ROOT": "/var/cache/vllm/vllm",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
    }
    assert r.plan.sleep and r.device == "gpu"
    for key, value in {
        "Type": "exec",
        "User": "vllm",
        "Restart": "on-failure",
        "LimitNOFILE": "65536",
        "TimeoutStartSec": "1800",
        "EnvironmentFile": "/etc/vllm/qwen.env",
    }.items():
        assert unit_values(r.unit_text, "Service", key) == [value], key
    assert r.unit_text.startswith("# Ansible managed\n")
    units = "/etc/systemd/system"
    timer = r.files[f"{units}/vllm-qwen-sleep-nights.timer"]
    assert unit_values(timer, "Timer", "OnCalendar") == ["Mon..Fri *-*-* 20:00:00"]
    assert unit_values(timer, "Timer", "Persistent") == ["true"]
    assert unit_values(timer, "Timer", "Unit") == ["vllm-qwen-sleep-nights.service"]
    wake = r.files[f"{units}/vllm-qwen-wake-nights.timer"]
    assert unit_values(wake, "Timer", "OnCalendar") == ["Mon..Fri *-*-* 07:30:00"]
    weekend = r.files[f"{units}/vllm-qwen-sleep-weekend.timer"]
    assert unit_values(weekend, "Timer", "OnCalendar") == ["Fri *-*-* 21:00:00"]
    sleep_svc = r.files[f"{units}/vllm-qwen-sleep-weekend.service"]
    assert unit_values(sleep_svc, "Service", "ExecStart") == [
        "/opt/warmctl/bin/warmctl sleep 127.0.0.1:18000 --level 2 --gate /run/vllm-gate/qwen.closed"
        " --cause window --window weekend"
        " --output-check /var/lib/warmctl/qwen.outputs.json"
    ]
    assert unit_values(sleep_svc, "Service", "StateDirectory") == ["warmctl"]
    wake_svc = r.files[f"{units}/vllm-qwen-wake-nights.service"]
    assert unit_values(wake_svc, "Service", "ExecStart") == [
        "/opt/warmctl/bin/warmctl wake 127.0.0.1:18000 --gate /run/vllm-gate/qwen.closed "
        "--cause window "
        "--output-check /var/lib/warmctl/qwen.outputs.json --no-warmup"
    ]
    assert unit_values(wake_svc, "Service", "StateDirectory") == ["warmctl"]
    assert unit_values(wake_svc, "Service", "User") == ["vllm"]
    script = r.files["/etc/vllm/qwen-window.sh"]
    assert 'calendar --in-window "$1" "$2" >/dev/null' in script
    assert "if inside '0 20 * * 1-5' '30 7 * * 1-5'; then" in script
    assert "exec /usr/bin/systemctl start vllm-qwen-sleep-weekend.service" in script
    assert script.rstrip().endswith("exec /usr/bin/systemctl start vllm-qwen-wake-nights.service")


def test_gpu_without_sleep_has_no_dev_mode_and_no_compilation_config():
    instance = GOOD["gpu_nosleep"]["vllm_service_instances"][0]
    r = render_instance(instance, host_vars(GOOD, "gpu_nosleep"))
    assert "--enable-sleep-mode" not in list(
        r.plan.server_argv
    ) and "VLLM_SERVER_DEV_MODE" not in server_env(r)
    assert "--compilation-config" not in list(
        r.plan.server_argv
    )  # capture sizes unset: vLLM's own default
    assert list(r.plan.server_argv)[-7:] == [
        "--host",
        "0.0.0.0",
        "--port",
        "8100",
        "--enable-server-load-tracking",
        "--shutdown-timeout",
        "10",
    ]
    assert r.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert set(r.files) == {
        "/etc/systemd/system/vllm-plain.service",
        "/etc/vllm/plain.env",
        "/etc/vllm/plain.launch",
    }


def test_gpu_with_sleep_off_stops_and_starts_in_windows():
    instance = GOOD["gpu_sleep_off"]["vllm_service_instances"][0]
    r = render_instance(instance, host_vars(GOOD, "gpu_sleep_off"))
    assert not r.plan.sleep and "VLLM_SERVER_DEV_MODE" not in server_env(r)
    assert list(r.plan.server_argv)[-2:] == ["--max-model-len", "4096"]
    svc = r.files["/etc/systemd/system/vllm-nosleep-sleep-nights.service"]
    assert unit_values(svc, "Service", "ExecStart") == [
        "/usr/bin/systemctl stop vllm-nosleep.service"
    ]
    assert unit_values(svc, "Service", "User") == []


def test_cpu_host_uses_api_server_and_stop_start_windows():
    instance = GOOD["cpu"]["vllm_service_instances"][0]
    r = render_instance(instance, host_vars(GOOD, "cpu"))
    assert list(r.plan.exec_argv) == [
        "/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "Qwen/Qwen3-0.6B", "--host", "0.0.0.0", "--port", "8000",
        "--enable-server-load-tracking", "--shutdown-timeout", "10", "--max-num-seqs", "4",
        "--enforce-eager",
    ]  # fmt: skip
    assert not r.plan.sleep and r.device == "cpu"
    assert r.env["HF_HUB_OFFLINE"] == "0" and "TRANSFORMERS_OFFLINE" not in r.env
    assert r.env["NOTE"] == "a b$c" and 'NOTE="a b\\$c"' in r.env_text
    assert r.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    units = "/etc/systemd/system"
    assert unit_values(
        r.files[f"{units}/vllm-tiny-wake-nights.service"], "Service", "ExecStart"
    ) == ["/usr/bin/systemctl start vllm-tiny.service"]
    # cron with both day-of-month and day-of-week: either matches, so two OnCalendar lines
    assert unit_values(r.files[f"{units}/vllm-tiny-sleep-nights.timer"], "Timer", "OnCalendar") == [
        "*-*-01,15 00:00:00",
        "Fri *-*-* 00:00:00",
    ]
    assert unit_values(r.files[f"{units}/vllm-tiny-wake-nights.timer"], "Timer", "OnCalendar") == [
        "*-*-* 00:00:00"
    ]


def test_two_instances_on_one_host():
    hosts = host_vars(GOOD, "gpu_two")
    chat, coder = (render_instance(i, hosts) for i in GOOD["gpu_two"]["vllm_service_instances"])
    assert chat.plan.unit == "vllm-chat.service" and coder.plan.unit == "vllm-coder.service"
    assert (
        list(chat.plan.server_argv)[list(chat.plan.server_argv).index("--host") + 1] == "127.0.0.1"
    )
    gpu_warmup = ["--max-batch", "16", "--max-tokens", "2"]  # vllm_service_gpu_warmup_args
    assert list(chat.plan.warmup_argv) == [
        "/opt/warmctl/bin/warmctl", "warmup", "127.0.0.1:18000", "--wait-ready",
        "--ready-timeout", "1800",
        *gpu_warmup, "--prompt", "hello world",
    ]  # fmt: skip
    assert list(coder.plan.warmup_argv) == [
        "/opt/warmctl/bin/warmctl", "warmup", "10.0.0.5:8001", "--wait-ready",
        "--ready-timeout", "1800",
        *gpu_warmup, "--prompt", "hello world",
        "--max-batch", "4",  # the instance's, last: it wins
    ]  # fmt: skip
    assert "'hello world'" in unit_values(chat.unit_text, "Service", "ExecStartPost")[0]
    sizes = "[1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]"
    assert list(chat.plan.server_argv)[
        list(chat.plan.server_argv).index("--compilation-config") + 1
    ] == (
        f'{{"cudagraph_capture_sizes": {sizes}}}'  # the GPU default
    )
    assert list(coder.plan.server_argv)[
        list(coder.plan.server_argv).index("--compilation-config") + 1
    ] == (f'{{"cudagraph_capture_sizes": {sizes}, "cudagraph_mode": "PIECEWISE"}}')
    assert chat.env["CUDA_VISIBLE_DEVICES"] == "0" and coder.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert chat.plan.sleep and not coder.plan.sleep


def test_render_rejects_bad_input():
    with pytest.raises(RenderError, match=r"\[0\]\.model: is missing \(An absolute path"):
        render_instance({"name": "x"})
    with pytest.raises(RenderError, match="hour value 25"):
        render_instance(
            {
                "name": "x",
                "model": "/m",
                "windows": [{"name": "w", "sleep": "0 25 * * *", "wake": "@daily"}],
            }
        )
    with pytest.raises(RenderError, match="must be 'gpu' or 'cpu'"):
        render_instance({"name": "x", "model": "/m"}, {"vllm_preflight_device_kind": "tpu"})


@needs_systemd
def test_rendered_units_pass_systemd_analyze_verify(rendered_by_ansible):
    root: Path = rendered_by_ansible["root"]
    for host in rendered_by_ansible["hosts"]:
        units = sorted(str(p) for p in (root / host / "units").glob("*"))
        proc = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", "--man=no", *units],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        problems = [
            line for line in proc.stderr.splitlines()
            if "/units/" in line or "vllm-" in line
        ]  # fmt: skip
        assert proc.returncode == 0 and not problems, f"{host}: {proc.stderr}"


@needs_systemd
def test_rendered_timers_pass_systemd_analyze_calendar(rendered_by_ansible):
    root: Path = rendered_by_ansible["root"]
    timers = sorted(root.glob("*/units/*.timer"))
    assert len(timers) >= 10
    for timer in timers:
        for calendar in unit_values(timer.read_text(), "Timer", "OnCalendar"):
            proc = subprocess.run(
                [SYSTEMD_ANALYZE, "calendar", calendar],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, f"{timer.name}: {calendar}: {proc.stderr}"


def test_reconcile_script_is_valid_sh(rendered_by_ansible):
    root: Path = rendered_by_ansible["root"]
    scripts = sorted(root.glob("*/etc/*-window.sh"))
    assert len(scripts) == 6  # one per host with windows, the example fleet's included
    for script in scripts:
        assert script.stat().st_mode & 0o111
        proc = subprocess.run(
            ["sh", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr


def test_prune_lists_files_of_removed_windows_and_instances(rendered_by_ansible, tmp_path):
    """Drop a window and add a leftover instance: exactly their files are stale, and files
    without the project's marker are never touched."""
    source: Path = rendered_by_ansible["root"] / "gpu_sleep"
    units, etc = tmp_path / "units", tmp_path / "etc"
    shutil.copytree(source / "units", units)
    shutil.copytree(source / "etc", etc)
    (units / "vllm-gone.service").write_text("# Ansible managed\n# warmctl instance: gone\n")
    (etc / "gone.env").write_text("# Ansible managed\n# warmctl instance: gone\n")
    (etc / "gone.launch").write_text("# Ansible managed\n# warmctl instance: gone\n{}\n")
    (units / "vllm-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    host = dict(rendered_by_ansible["hosts"]["gpu_sleep"])
    instance = dict(host["vllm_service_instances"][0])
    instance["windows"] = [w for w in instance["windows"] if w["name"] == "nights"]
    host.update(
        vllm_service_instances=[instance],
        vllm_service_unit_dir=str(units),
        vllm_service_config_dir=str(etc),
    )
    inventory = write_inventory(tmp_path / "inventory.json", {"gpu_sleep": host})
    proc = run_playbook("tests/ansible/stale.yml", inventory, ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    message = json.loads(re.search(r'"msg": (".*STALE .*")', proc.stdout).group(1))
    stale = sorted(Path(p).name for p in json.loads(message.split("STALE ", 1)[1]))
    assert stale == [
        "gone.env",
        "gone.launch",
        "vllm-gone.service",
        "vllm-qwen-sleep-weekend.service",
        "vllm-qwen-sleep-weekend.timer",
        "vllm-qwen-wake-weekend.service",
        "vllm-qwen-wake-weekend.timer",
    ]


def _run_reconcile(tmp_path: Path, windows: list[dict]) -> str:
    """Render the boot-time script with the real warmctl and a recording systemctl; run it."""
    import sys

    systemctl = tmp_path / "systemctl"
    systemctl.write_text('#!/bin/sh\necho "systemctl $*"\n')
    systemctl.chmod(0o755)
    host = {
        "vllm_install_warmctl_venv": str(Path(sys.executable).parent.parent),
        "vllm_schedule_systemctl": str(systemctl),
    }
    r = render_instance({"name": "m", "model": "/m", "windows": windows}, host)
    script = tmp_path / "m-window.sh"
    script.write_text(r.files["/etc/vllm/m-window.sh"])
    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_boot_reconcile_picks_the_window_we_are_in(tmp_path):
    import datetime as dt

    now = dt.datetime.now()

    def cron(minutes: int) -> str:
        t = now + dt.timedelta(minutes=minutes)
        return f"{t.minute} {t.hour} * * *"

    inside = {"name": "now", "sleep": cron(-90), "wake": cron(90)}
    later = {"name": "later", "sleep": cron(120), "wake": cron(180)}
    out = _run_reconcile(tmp_path, [later, inside])
    assert out.splitlines() == [
        "inside window now: asleep",
        "systemctl start vllm-m-sleep-now.service",
    ]
    out = _run_reconcile(tmp_path, [later])
    assert out.splitlines() == [
        "outside every sleep window: awake",
        "systemctl start vllm-m-wake-later.service",
    ]


def test_cpu_instances_get_their_own_cores_gpu_instances_ignore_cpus():
    left, right = GOOD["cpu_two"]["vllm_service_instances"]
    assert (
        server_env(render_instance(left, host_vars(GOOD, "cpu_two")))["VLLM_CPU_OMP_THREADS_BIND"]
        == "0-1"
    )
    assert (
        server_env(render_instance(right, host_vars(GOOD, "cpu_two")))["VLLM_CPU_OMP_THREADS_BIND"]
        == "2,3"
    )
    gpu = {**GOOD["gpu_nosleep"]["vllm_service_instances"][0], "cpus": "0-3"}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_env(
        render_instance(gpu, host_vars(GOOD, "gpu_nosleep"))
    )


def test_gpu_units_fork_the_engine_core_cpu_units_leave_it_to_vllm():
    """vLLM's CLI spawns the EngineCore unless VLLM_WORKER_MULTIPROC_METHOD is set (a second
    import of torch and vLLM: 10-15 s of every start on an H200); GPU units set fork, an
    instance's env can still ask for spawn, and CPU units (vLLM's CPU platform sets spawn
    itself) get nothing. The short warmup is the GPU hosts' too."""
    for case in ("gpu_sleep", "gpu_nosleep", "gpu_sleep_off"):
        instance = GOOD[case]["vllm_service_instances"][0]
        r = render_instance(instance, host_vars(GOOD, case))
        assert r.plan.launch_env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork", case  # the launcher's
        plain = render_instance({**instance, "launcher": False}, host_vars(GOOD, case))
        assert "VLLM_WORKER_MULTIPROC_METHOD=fork" in plain.env_text
        assert list(r.plan.warmup_argv)[6:10] == ["--max-batch", "16", "--max-tokens", "2"], case
    spawn = {**GOOD["gpu_nosleep"]["vllm_service_instances"][0]}
    spawn["env"] = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    r = render_instance(spawn, host_vars(GOOD, "gpu_nosleep"))
    assert server_env(r)["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # the instance's env wins
    r = render_instance({**spawn, "launcher": False}, host_vars(GOOD, "gpu_nosleep"))
    lines = [ln for ln in r.env_text.splitlines() if "MULTIPROC" in ln]
    assert lines[-1].endswith("spawn")  # systemd: the last assignment of a variable counts
    cpu = render_instance(GOOD["cpu"]["vllm_service_instances"][0], host_vars(GOOD, "cpu"))
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in cpu.env
    assert "--max-batch" not in list(cpu.plan.warmup_argv)


def test_output_check_can_be_turned_off_and_cpu_windows_have_none():
    instance = GOOD["gpu_sleep"]["vllm_service_instances"][0]
    off = {**host_vars(GOOD, "gpu_sleep"), "vllm_schedule_output_check": False}
    r = render_instance(instance, off)
    units = "/etc/systemd/system"
    for name in ("sleep-weekend", "wake-nights"):
        text = r.files[f"{units}/vllm-qwen-{name}.service"]
        assert "--output-check" not in text and "StateDirectory" not in text
    cpu = render_instance(GOOD["cpu"]["vllm_service_instances"][0], host_vars(GOOD, "cpu"))
    assert not [t for t in cpu.files.values() if "--output-check" in t]


def test_textfile_dir_reaches_the_warmup_and_the_window_services():
    """vllm_service_textfile_dir set: the unit's warmup and both window services write the
    instance's metrics there (the sleep with its window's wake time), and the sandboxes may."""
    instance = GOOD["gpu_sleep"]["vllm_service_instances"][0]
    variables = {**host_vars(GOOD, "gpu_sleep"), "vllm_service_textfile_dir": "/var/lib/tf"}
    r = render_instance(instance, variables)
    metrics = ["--textfile-dir", "/var/lib/tf", "--instance", "qwen"]
    assert (
        list(r.plan.warmup_argv)[list(r.plan.warmup_argv).index("--textfile-dir") :][:4] == metrics
    )
    assert "-/var/lib/tf" in unit_values(r.unit_text, "Service", "ReadWritePaths")
    sleep = r.files["/etc/systemd/system/vllm-qwen-sleep-nights.service"]
    wake = r.files["/etc/systemd/system/vllm-qwen-wake-nights.service"]
    [sleep_cmd] = unit_values(sleep, "Service", "ExecStart")
    [wake_cmd] = unit_values(wake, "Service", "ExecStart")
    assert " ".join(metrics) + " --next-wake '30 7 * * 1-5'" in sleep_cmd
    assert " ".join(metrics) in wake_cmd
    for text in (sleep, wake):
        assert "-/var/lib/tf" in unit_values(text, "Service", "ReadWritePaths")
    # off by default: nothing about metrics anywhere
    plain = render_instance(instance, host_vars(GOOD, "gpu_sleep"))
    assert all("--textfile-dir" not in text for text in plain.files.values())


def test_textfile_dir_reaches_the_drain_of_a_proxied_cpu_window():
    """CPU: the sleep window stops the unit; behind the proxy it drains first with warmctl,
    which records the sleep (and the window's wake) in the metrics."""
    instance = GOOD["cpu"]["vllm_service_instances"][0]
    variables = {
        **host_vars(GOOD, "cpu"),
        "vllm_service_textfile_dir": "/var/lib/tf",
        "vllm_proxy_enabled": True,
    }
    r = render_instance(instance, variables)
    sleep = next(t for f, t in r.files.items() if "-sleep-" in f and f.endswith(".service"))
    [drain] = unit_values(sleep, "Service", "ExecStartPre")
    assert "--drain-only" in drain and "--textfile-dir /var/lib/tf --instance" in drain
    assert "--next-wake" in drain
    assert "-/var/lib/tf" in unit_values(sleep, "Service", "ReadWritePaths")


def _kv_flag(argv: list[str]) -> str | None:
    return (
        argv[argv.index("--num-gpu-blocks-override") + 1]
        if ("--num-gpu-blocks-override" in argv)
        else None
    )


@pytest.mark.parametrize(
    ("extra", "host", "blocks"),
    [
        # a sleeping GPU instance that sizes nothing gets vllm_service_sleep_kv_cache_tokens
        ({}, {}, "8192"),
        ({}, {"vllm_service_sleep_kv_cache_tokens": 40000}, "2500"),
        ({}, {"vllm_service_sleep_kv_cache_tokens": 40001}, "2501"),  # whole blocks, rounded up
        ({}, {"vllm_service_sleep_kv_cache_tokens": 0}, None),  # 0: vLLM's own sizing
        ({"kv_cache_tokens": 1000}, {}, "63"),
        ({"kv_cache_tokens": 0}, {}, None),
        # an instance that sizes its own KV cache keeps it
        ({"gpu_memory_utilization": 0.5}, {}, None),
        ({"extra_args": ["--kv-cache-memory-bytes", "8G"]}, {}, None),
        ({"extra_args": ["--num-gpu-blocks-override=100"]}, {}, None),
        ({}, {"vllm_service_extra_args": ["--gpu-memory-utilization", "0.3"]}, None),
        # only instances that sleep get the default; kv_cache_tokens applies to any GPU instance
        ({"sleep": False}, {}, None),
        ({"sleep": False, "kv_cache_tokens": 160}, {}, "10"),
    ],
)
def test_kv_cache_of_sleeping_instances(extra, host, blocks):
    """/wake_up re-maps the whole KV cache (H200 level 1: 0.55 s at vLLM's 0.9 of the GPU,
    0.08 s at 0.2): instances that sleep get a KV cache sized in tokens by default."""
    instance = {"name": "kv", "model": "/srv/models/m", "port": 18000, "sleep": True, **extra}
    r = render_instance(instance, {"vllm_preflight_device_kind": "gpu", **host})
    assert _kv_flag(list(r.plan.server_argv)) == blocks
    cpu = render_instance(
        {"name": "kv", "model": "/srv/models/m", "port": 18000, "kv_cache_tokens": 160},
        {"vllm_preflight_device_kind": "cpu"},
    )
    assert (
        _kv_flag(list(cpu.plan.exec_argv)) is None
    )  # CPU hosts size theirs with VLLM_CPU_KVCACHE_SPACE


@pytest.mark.parametrize("bad", [-1, 5, 2**40])
def test_kv_cache_tokens_out_of_range_is_one_line(bad):
    instance = {"name": "kv", "model": "/srv/models/m", "port": 18000, "kv_cache_tokens": bad}
    with pytest.raises(RenderError) as exc:
        render_instance(instance, {"vllm_preflight_device_kind": "gpu"})
    assert "kv_cache_tokens" in str(exc.value) and "131072" in str(exc.value)


def test_launcher_wraps_the_server_and_reload_relaunches():
    """launcher: ExecStart runs the pre-imported launcher (from warmctl's venv, by vLLM's
    interpreter) on `-m MODULE`, what it imports once; vLLM's arguments and variables are in the
    launch file, the rest of the environment in the env file; ExecReload checks the launch file
    first (`warmctl relaunch --check`), then relaunches with the warmup's options."""
    host = host_vars(GOOD, "gpu_two")
    coder = GOOD["gpu_two"]["vllm_service_instances"][1]
    r = render_instance(coder, host)
    plain = render_instance({**coder, "launcher": False}, host)
    assert list(r.plan.exec_argv) == [
        "/opt/vllm/venv/bin/python",
        "/opt/warmctl/share/warmctl/vllm_launch.py",
        "--stop-timeout",
        "90",
        "--launch-file",
        "/etc/vllm/coder.launch",
        "--state-file",
        "/run/vllm-coder/launcher.json",
        "--standby-delay",  # the next standby imports once the server is ready
        "ready",
        "--",
        "-m",
        "vllm.entrypoints.cli.main",
    ]
    assert list(r.plan.server_argv) == list(
        plain.plan.exec_argv
    )  # `python -m vllm.entrypoints.cli.main serve ...`
    launch = parse_launch(r.files[r.plan.launch_file].encode())
    assert launch.args == list(plain.plan.exec_argv)[3:]
    assert server_env(r) == plain.env  # the same environment, split in two files
    assert all(n.startswith("VLLM_") for n in r.plan.launch_env) and r.plan.launch_env
    assert not [n for n in r.env if n.startswith("VLLM_")]
    reloads = unit_values(r.unit_text, "Service", "ExecReload")
    assert [systemd_split(c.removesuffix(" --main-pid $MAINPID")) for c in reloads] == [
        [
            "/opt/warmctl/bin/warmctl",
            "relaunch",
            "10.0.0.5:8001",
            "--check",
            "--launch-file",
            "/etc/vllm/coder.launch",
            "--state-file",
            "/run/vllm-coder/launcher.json",
        ],
        ["/opt/warmctl/bin/warmctl", "relaunch", *list(r.plan.warmup_argv)[2:]],
    ]
    assert all(c.endswith(" --main-pid $MAINPID") for c in reloads)
    assert "--max-batch 4" in reloads[1]  # the instance's warmup_args, as ExecStartPost's
    assert unit_values(r.unit_text, "Service", "RuntimeDirectory") == ["vllm-coder"]
    assert not unit_values(plain.unit_text, "Service", "ExecReload")
    assert not unit_values(plain.unit_text, "Service", "RuntimeDirectory")
    assert not plain.plan.launch_file and "/etc/vllm/coder.launch" not in plain.files
    # proxied (chat sleeps behind the proxy): the check comes before the warming flag is set;
    # a single host (no load balancer): the holding flag too, removed after the relaunch
    chat = render_instance(GOOD["gpu_two"]["vllm_service_instances"][0], host)
    steps = unit_values(chat.unit_text, "Service", "ExecReload")
    assert [c.split()[0] for c in steps] == [
        "/opt/warmctl/bin/warmctl", "-+/usr/bin/setpriv", "-+/usr/bin/setpriv",
        "/opt/warmctl/bin/warmctl", "+/bin/rm", "+/bin/rm",
    ]  # fmt: skip
    assert " --check " in steps[0] and " --check " not in steps[3]
    assert [c.split()[-1].rsplit(".", 1)[-1] for c in steps[1:3] + steps[4:]] == [
        "warming", "holding", "warming", "holding",
    ]  # fmt: skip
    balanced = render_instance(
        GOOD["gpu_two"]["vllm_service_instances"][0], {**host, "vllm_proxy_load_balanced": True}
    )
    assert "holding" not in balanced.unit_text  # behind a load balancer: the drain as before
    # a role-level switch, a CPU host
    left = render_instance(GOOD["cpu_two"]["vllm_service_instances"][0], host_vars(GOOD, "cpu_two"))
    assert list(left.plan.exec_argv)[1].endswith("/share/warmctl/vllm_launch.py")
    assert list(left.plan.exec_argv)[-3:] == ["--", "-m", "vllm.entrypoints.openai.api_server"]
    assert left.plan.launch_env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


@pytest.mark.parametrize(
    "change",
    [
        {"max_num_seqs": 96},
        {"max_model_len": 8192},
        {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}},
        {"extra_args": ["--enable-prefix-caching"]},
        {"enforce_eager": True},
        {"kv_cache_tokens": 32768},
        {"served_model_name": "coder-v2"},
        {"env": {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_LOGGING_LEVEL": "DEBUG"}},
        {"model": "/srv/models/coder-2"},  # a path as before: HF_HUB_OFFLINE stays
    ],
)
def test_a_change_the_launcher_applies_keeps_the_unit_and_env_file(change):
    """vLLM's arguments and VLLM_* variables: only the launch file changes (a reload)."""
    host = host_vars(GOOD, "gpu_two")
    coder = GOOD["gpu_two"]["vllm_service_instances"][1]
    before, after = render_instance(coder, host), render_instance({**coder, **change}, host)
    assert after.unit_text == before.unit_text
    assert after.env_text == before.env_text
    assert after.files[after.plan.launch_file] != before.files[before.plan.launch_file]


@pytest.mark.parametrize(
    ("change", "file"),
    [
        ({"env": {"HF_TOKEN": "t"}}, "env"),  # read by huggingface_hub: the env file
        ({"env": {"OMP_NUM_THREADS": "4"}}, "env"),  # read by native code at load
        ({"env": {"VLLM_API_KEY": "k"}}, "env"),  # warmctl's warmup reads it too
        ({"gpus": [2]}, "unit"),  # the sandbox's DeviceAllow
        ({"port": 8002}, "unit"),  # the warmup's target
        ({"model": "Qwen/Qwen3-0.6B"}, "env"),  # a hub id: HF_HUB_OFFLINE=0
    ],
)
def test_a_change_the_launcher_cannot_apply_changes_the_unit_or_env_file(change, file):
    host = host_vars(GOOD, "gpu_two")
    coder = GOOD["gpu_two"]["vllm_service_instances"][1]
    before, after = render_instance(coder, host), render_instance({**coder, **change}, host)
    changed = {
        "unit": after.unit_text != before.unit_text,
        "env": after.env_text != before.env_text,
    }
    assert changed[file], change
