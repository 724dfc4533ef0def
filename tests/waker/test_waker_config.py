"""The waker's configuration file as the role renders it from the instance's plan
(warmctl.plan.units) and `warmctl waker --config` reads it (warmctl.waker.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmctl.plan.render import render_instance
from warmctl.waker.config import load_config

NIGHTS = {"name": "nights", "sleep": "0 20 * * *", "wake": "0 7 * * *", "on_request": "wake"}


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_rendered_config_is_the_plan_and_wakes_as_the_wake_service(
    device: str, tmp_path: Path
) -> None:
    instance = {"name": "idler", "model": "/m", "port": 8000, "idle_sleep": {"after": "15m"},
                "windows": [NIGHTS]}  # fmt: skip
    host = {"vllm_preflight_device_kind": device, "vllm_proxy_enabled": True,
            "vllm_service_textfile_dir": str(tmp_path)}  # fmt: skip
    r = render_instance(instance, host)
    path = tmp_path / "idler.waker.json"
    path.write_text(r.files["/etc/vllm/idler.waker.json"])
    cfg = load_config(path)
    gate = "/run/vllm-gate/idler"
    assert (cfg.name, cfg.target, str(cfg.socket)) == (
        "idler",
        "127.0.0.1:18000",
        f"{gate}.waker.sock",
    )
    assert str(cfg.activity_socket) == f"{gate}.activity.sock"
    # the idle sleep's trigger: its detector's settings and request file (the path unit's)
    assert [(t.kind.cause, str(t.request), dict(t.settings)) for t in cfg.triggers] == [
        ("idle", f"{gate}.sleep-request", {"after": 900})
    ]
    assert [str(p) for p in cfg.flags.paths()] == [
        f"{gate}.{suffix}"
        for suffix in (
            "wakeable",
            "closed",
            "warming",
            "draining",
            "wake-request",
            "sleep-request",
            "holding",
        )
    ]
    assert (cfg.hold, cfg.failed_backoff, cfg.max_connections) == (
        (120.0 if device == "gpu" else 600.0),
        30.0,
        1024,
    )
    assert cfg.socket_group == "www-data" and cfg.textfile_dir == str(tmp_path)
    if device == "cpu":  # a CPU host's wake is the unit's start: systemd's
        assert cfg.wake is None
        return
    # vLLM sleep mode: the waker wakes it itself, exactly as the window's wake service would,
    # but for its cause
    from warmctl.plan.unitfile import systemd_split, unit_values

    unit = r.files["/etc/systemd/system/vllm-idler-wake-nights.service"]
    service = systemd_split(unit_values(unit, "Service", "ExecStart")[0])[1:]
    assert service[:2] == ["wake", cfg.wake.target]
    gates = tuple(service[i + 1] for i, a in enumerate(service) if a == "--gate")
    assert cfg.wake.gates == gates
    check = service[service.index("--output-check") + 1] if "--output-check" in service else None
    assert cfg.wake.check_file == check
    assert cfg.wake.textfile_dir == service[service.index("--textfile-dir") + 1]
    assert cfg.wake.instance == service[service.index("--instance") + 1] == "idler"
