"""warmctl.plan.instance: the one computation of an instance's derived facts (the roles, the
templates,
`warmctl render`, tune and the inventory reader read it)."""

from __future__ import annotations

import pytest

from warmctl.plan.instance import SLEEP_LEVEL, instance_facts, inventory_facts, local_address
from warmctl.plan.render import render_instance

WINDOWED = {
    "name": "qwen",
    "model": "/srv/models/qwen",
    "port": 8001,
    "windows": [
        {"name": "night", "sleep": "0 22 * * *", "wake": "0 6 * * *", "level": 2},
        {"name": "lunch", "sleep": "0 12 * * *", "wake": "0 13 * * *"},
    ],
}


def test_launcher_the_instance_wins_over_the_host_default():
    host = {"vllm_service_launcher": True, "vllm_preflight_device_kind": "cpu"}
    assert instance_facts({"name": "a"}, host).launcher is True
    assert instance_facts({"name": "a", "launcher": False}, host).launcher is False
    assert (
        instance_facts({"name": "a"}, {**host, "vllm_service_launcher": "false"}).launcher is False
    )


@pytest.mark.parametrize(("kind", "on"), [("gpu", True), ("cpu", False)])
def test_launcher_auto_is_on_for_gpu_hosts_off_for_cpu_hosts(kind, on):
    """The role's default, auto: the launcher saves 13-16 s of imports per restart on a GPU
    host; CPU hosts keep plain units unless asked."""
    base = {"vllm_preflight_device_kind": kind}
    for host in (base, {**base, "vllm_service_launcher": "auto"}):
        f = instance_facts({"name": "a"}, host)
        assert f.launcher is on
        assert (f.launch_file, f.runtime_dir, f.launch_state) == (
            ("/etc/vllm/a.launch", "vllm-a", "/run/vllm-a/launcher.json") if on else ("", "", "")
        )
        launch = [p for p in f.files if p["path"].endswith(".launch")]
        assert [p["path"] for p in launch] == ([f.launch_file] if on else [])
    assert instance_facts(
        {"name": "a", "launcher": True}, {"vllm_preflight_device_kind": "cpu"}
    ).launcher


def test_windows_carry_their_level_and_unit_names():
    f = instance_facts(WINDOWED, {"vllm_preflight_device_kind": "gpu"})
    assert [w["level"] for w in f.windows] == [2, SLEEP_LEVEL]
    assert f.windows[1]["units"] == {
        "sleep": {
            "service": "vllm-qwen-sleep-lunch.service",
            "timer": "vllm-qwen-sleep-lunch.timer",
        },
        "wake": {"service": "vllm-qwen-wake-lunch.service", "timer": "vllm-qwen-wake-lunch.timer"},
    }
    assert f.window_unit == "vllm-qwen-window.service"
    assert f.window_script == "/etc/vllm/qwen-window.sh"
    plain = instance_facts({"name": "b"}, {})
    assert (plain.windows, plain.window_unit, plain.window_script) == ((), "", "")


def test_files_are_what_warmctl_render_writes_and_follow_the_folders():
    host = {"vllm_service_unit_dir": "/u", "vllm_service_config_dir": "/c"}
    f = instance_facts(WINDOWED, host)
    assert {p["role"] for p in f.files} == {"vllm_service", "vllm_schedule"}
    assert [p["path"] for p in f.files] == list(render_instance(WINDOWED, host).files)
    assert f.files[0]["path"] == f.unit_file == "/u/vllm-qwen.service"
    assert f.files[1]["path"] == f.env_file == "/c/qwen.env"
    assert f.files[2]["path"] == f.launch_file == "/c/qwen.launch"  # GPU host: the launcher
    assert f.proxy_conf == "/etc/nginx/conf.d/vllm-qwen.conf"


@pytest.mark.parametrize(
    ("variables", "sleep"),
    [
        ({}, True),  # auto: a GPU host is assumed
        ({"vllm_preflight_device": "cpu"}, False),
        ({"vllm_preflight_device": "CPU"}, False),
        ({"vllm_preflight_device": "auto", "vllm_preflight_device_kind": "cpu"}, False),
        ({"vllm_preflight_device": "cpu", "vllm_preflight_device_kind": "gpu"}, True),
    ],
)
def test_inventory_facts_read_the_probed_kind_first(variables, sleep):
    f = inventory_facts(WINDOWED, variables)
    assert (f.sleep, f.gpu) == (sleep, sleep)


def test_local_address_reaches_a_wildcard_bind_on_loopback():
    assert [local_address(b) for b in ("0.0.0.0", "::", "localhost", "10.0.0.5")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.0.0.5",
    ]  # fmt: skip


IDLE = {"name": "idler", "model": "/srv/m", "idle_sleep": {"after": "15m", "level": 2}}


@pytest.mark.parametrize(
    ("after", "seconds"), [(90, 90), ("90s", 90), ("15m", 900), ("15min", 900), ("2h", 7200)]
)
def test_idle_sleep_after_reads_seconds_and_durations(after, seconds):
    f = instance_facts(
        {**IDLE, "idle_sleep": {"after": after}}, {"vllm_preflight_device_kind": "cpu"}
    )
    assert f.triggers[0]["settings"]["after"] == seconds


@pytest.mark.parametrize("after", ["soon", "15 minutes", 0, -5, True, "1d"])
def test_idle_sleep_after_refuses_what_is_not_a_duration(after):
    with pytest.raises(ValueError, match=r"idle_sleep\.after"):
        instance_facts({**IDLE, "idle_sleep": {"after": after}}, {})


def test_idle_sleep_puts_the_proxy_in_front_and_adds_the_waker_and_its_two_triggers():
    cpu = instance_facts(IDLE, {"vllm_preflight_device_kind": "cpu"})
    # the door every request passes: auto puts the proxy in front of a CPU instance too
    assert cpu.proxied and not cpu.sleep and cpu.wake_on_request
    assert (cpu.triggers[0]["settings"], cpu.wake_hold) == ({"after": 900, "level": 2}, 600)
    assert [(t["action"], t["cause"]) for t in cpu.triggers] == [
        ("sleep", "idle"),
        ("wake", "request"),
    ]
    assert cpu.triggers[0]["file"] == "/run/vllm-gate/idler.sleep-request"
    assert [t["level"] for t in cpu.triggers] == [2, 2]  # the wake's: the sleep's level
    assert cpu.triggers[1]["units"]["wake"] == {
        "service": "vllm-idler-wake-request.service",
        "path": "vllm-idler-wake-request.path",
    }
    assert cpu.waker_unit == "vllm-idler-waker.service"
    templates = [p["template"] for p in cpu.files]
    assert templates.count("vllm-trigger.path.j2") == 2
    assert templates.count("vllm-waker.service.j2") == 1
    gpu = instance_facts(IDLE, {"vllm_preflight_device_kind": "gpu"})
    assert gpu.sleep and gpu.wake_hold == 120  # vLLM sleep mode: the wake is a /wake_up
    assert [t["cause"] for t in gpu.triggers] == ["idle"]  # the waker wakes it itself
    held = instance_facts(IDLE, {"vllm_schedule_wake_hold_sec": 30})
    assert held.wake_hold == 30
    assert held.wake_failed_backoff == 30  # the role's default
    quick = instance_facts(IDLE, {"vllm_schedule_wake_failed_backoff_sec": 5})
    assert quick.wake_failed_backoff == 5
    with pytest.raises(ValueError, match="vllm_schedule_wake_failed_backoff_sec must be >= 0"):
        instance_facts(IDLE, {"vllm_schedule_wake_failed_backoff_sec": -1})


def test_windows_refuse_by_default_and_only_a_waking_one_needs_the_waker():
    balanced = {"vllm_preflight_device_kind": "gpu", "vllm_proxy_load_balanced": True}
    f = instance_facts(WINDOWED, balanced)
    assert [w["on_request"] for w in f.windows] == ["refuse", "refuse"]
    assert (f.wake_on_request, f.triggers, f.waker_unit) == (False, (), "")
    # a single host (not load balanced): the waker holds requests across its restarts
    single = instance_facts(WINDOWED, {"vllm_preflight_device_kind": "gpu"})
    assert (single.wake_on_request, single.restart_hold) == (False, True)
    assert single.waker_unit == "vllm-qwen-waker.service"
    waking = {**WINDOWED, "windows": [{**WINDOWED["windows"][0], "on_request": "wake"}]}
    w = instance_facts(waking, {"vllm_preflight_device_kind": "gpu"})
    # vLLM sleep mode: the waker wakes it itself (no request trigger); a CPU host's start is
    # systemd's (the request trigger's path unit)
    assert w.wake_on_request and w.triggers == () and w.waker_unit == "vllm-qwen-waker.service"
    cpu = instance_facts(waking, {"vllm_preflight_device_kind": "cpu", "vllm_proxy_enabled": True})
    assert [t["cause"] for t in cpu.triggers] == ["request"]


def test_a_single_hosts_restarts_hold_requests_a_load_balanced_ones_drain():
    """restart_hold: proxied and not load balanced; vllm_proxy_load_balanced auto = an
    instance with an awake-only door (the door only a load balancer uses) is load balanced."""
    plain = {"name": "a", "model": "/m", "port": 8000}
    on = {"vllm_preflight_device_kind": "cpu", "vllm_proxy_enabled": True}
    f = instance_facts(plain, on)
    assert (f.proxied, f.load_balanced, f.restart_hold) == (True, False, True)
    assert f.holding == "/run/vllm-gate/a.holding" and f.waker_unit == "vllm-a-waker.service"
    door = {**plain, "idle_sleep": {"after": "5m"}, "awake_port": 8001}
    assert instance_facts(door, on).load_balanced and not instance_facts(door, on).restart_hold
    told = instance_facts(plain, {**on, "vllm_proxy_load_balanced": "true"})
    assert (told.restart_hold, told.waker_unit) == (False, "")
    forced = instance_facts(door, {**on, "vllm_proxy_load_balanced": False})
    assert forced.restart_hold
    direct = instance_facts(plain, {"vllm_preflight_device_kind": "cpu"})  # not proxied
    assert (direct.proxied, direct.restart_hold, direct.waker_unit) == (False, False, "")
