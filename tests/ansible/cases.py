"""Inventories the Ansible tests render and validate: a matrix of good hosts and bad ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NIGHTS = {"name": "nights", "sleep": "0 20 * * 1-5", "wake": "30 7 * * 1-5", "level": 1}
WEEKEND = {
    "name": "weekend",
    "sleep": "Fri *-*-* 21:00:00",
    "wake": "Mon *-*-* 07:00:00",
    "level": 2,
}


def _example_group_vars() -> dict[str, Any]:
    import yaml

    path = Path(__file__).resolve().parents[2] / "inventories/example/group_vars/vllm.yml"
    return yaml.safe_load(path.read_text())


# host name -> host vars (the test adds the paths of a temp root)
GOOD: dict[str, dict[str, Any]] = {
    "gpu_sleep": {
        "vllm_preflight_device_kind": "gpu",
        "vllm_service_compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
        "vllm_schedule_wake_args": ["--no-warmup"],
        "vllm_service_instances": [
            {
                "name": "qwen",
                "model": "/srv/models/qwen3-0.6b",
                "served_model_name": "qwen",
                "port": 8000,
                "gpus": [0, 1],
                "tensor_parallel_size": 2,
                "max_num_seqs": 64,
                "gpu_memory_utilization": 0.85,
                "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]},
                "windows": [NIGHTS, WEEKEND],
            }
        ],
    },
    "gpu_nosleep": {
        "vllm_preflight_device_kind": "gpu",
        "vllm_service_gpu_compilation_config": {},  # capture sizes unset: vLLM's own default
        "vllm_service_instances": [
            {"name": "plain", "model": "/srv/models/plain", "port": 8100, "gpus": [0]}
        ],
    },
    "gpu_sleep_off": {
        "vllm_preflight_device_kind": "gpu",
        "vllm_service_instances": [
            {
                "name": "nosleep",
                "model": "/srv/models/m",
                "sleep": False,
                "windows": [NIGHTS],
                "extra_args": ["--max-model-len", "4096"],
            }
        ],
    },
    "cpu": {
        "vllm_preflight_device_kind": "cpu",
        "vllm_service_instances": [
            {
                "name": "tiny",
                "model": "Qwen/Qwen3-0.6B",
                "port": 8000,
                "enforce_eager": True,
                "max_num_seqs": 4,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "NOTE": "a b$c"},
                "windows": [{"name": "nights", "sleep": "0 0 1,15 * 5", "wake": "@daily"}],
            }
        ],
    },
    "cpu_two": {
        "vllm_preflight_device_kind": "cpu",
        "vllm_service_launcher": True,  # both under the pre-imported launcher (the role's var)
        "vllm_service_instances": [
            {"name": "left", "model": "/srv/models/m", "port": 8000, "cpus": "0-1"},
            {"name": "right", "model": "/srv/models/m", "port": 8001, "cpus": "2,3"},
        ],
    },
    "gpu_two": {
        "vllm_preflight_device_kind": "gpu",
        "vllm_service_warmup_args": ["--prompt", "hello world"],
        "vllm_service_instances": [
            {
                "name": "chat",
                "model": "/srv/models/chat",
                "port": 8000,
                "gpus": [0],
                "bind": "127.0.0.1",
                "windows": [NIGHTS],
            },
            {
                "name": "coder",
                "model": "/srv/models/coder",
                "port": 8001,
                "gpus": [1],
                "bind": "10.0.0.5",
                "compilation_config": {"cudagraph_mode": "PIECEWISE"},
                "warmup_args": ["--max-batch", "4"],
                "launcher": True,  # the pre-imported launcher: ExecReload relaunches
            },
        ],
    },
    # idle sleep + a window a request may wake + the awake-only door (a load balancer's primary)
    "gpu_idle": {
        "vllm_preflight_device_kind": "gpu",
        "vllm_service_textfile_dir": "/var/lib/node_exporter",
        "vllm_service_instances": [
            {
                "name": "idler",
                "model": "/srv/models/m",
                "port": 8000,
                "gpus": [0],
                "idle_sleep": {"after": "15m", "level": 2},
                "awake_port": 9000,
                "windows": [{**NIGHTS, "on_request": "wake"}, WEEKEND],
            }
        ],
    },
    # CPU: the idle sleep stops the unit, a request starts it (the proxy: auto, for idle sleep)
    "cpu_idle": {
        "vllm_preflight_device_kind": "cpu",
        "vllm_service_instances": [
            {"name": "tiny", "model": "/srv/models/m", "port": 8000, "idle_sleep": {"after": 90}}
        ],
    },
    # the example fleet of inventories/example (what a user copies), on a GPU host
    "example": {
        **{
            key: value
            for key, value in _example_group_vars().items()
            if key.startswith("vllm_service_") or key.startswith("vllm_schedule_")
        },
        "vllm_preflight_device_kind": "gpu",
    },
}

OK_INSTANCE = {"name": "ok", "model": "/srv/m", "port": 8000}

# host name -> (host vars, a piece of the expected preflight message)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "instances_not_list": (
        {"vllm_service_instances": {"name": "x"}},
        'vllm_service_instances: is the mapping {"name": "x"} (a list)',
    ),
    "missing_model": ({"vllm_service_instances": [{"name": "x"}]}, "[0].model: is missing"),
    "port_not_int": (
        {"vllm_service_instances": [{**OK_INSTANCE, "port": "http"}]},
        'vllm_service_instances[0].port: is the string "http" (a whole number)',
    ),
    "unknown_key": (
        {"vllm_service_instances": [{**OK_INSTANCE, "max_num_seq": 4}]},
        "[0].max_num_seq: is not a known key (did you mean max_num_seqs?)",
    ),
    "sleep_level_3": (
        {"vllm_service_instances": [{**OK_INSTANCE, "windows": [{**NIGHTS, "level": 3}]}]},
        "windows[0].level: is the integer 3 (one of 1, 2)",
    ),
    "unknown_cudagraph_mode": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "compilation_config": {"cudagraph_mode": "ALL"}}
            ]
        },
        "cudagraph_mode must be one of",
    ),
    "capture_sizes_bad": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "compilation_config": {"cudagraph_capture_sizes": [1, -2, "x"]}}
            ]
        },
        "cudagraph_capture_sizes must be a list of positive integers",
    ),
    "verify_throttle_negative": (
        {"vllm_verify_throttle": -1},
        "vllm_verify_throttle: is -1 (0 (every host at once)",
    ),
    "verify_attempts_zero": (
        {"vllm_verify_attempts": 0},
        "vllm_verify_attempts: is 0 (1 (measure once) or more)",
    ),
    "port_clash": (
        {"vllm_service_instances": [OK_INSTANCE, {**OK_INSTANCE, "name": "other"}]},
        "[1].port: 8000 is used twice",
    ),
    "port_zero": (
        {"vllm_service_instances": [{**OK_INSTANCE, "port": 0}]},
        "vllm_service_instances[0].port: is 0 (a TCP port, 1-65535)",
    ),
    "port_is_another_instances_door": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "idle_sleep": {"after": "5m"}, "awake_port": 8001},
                {**OK_INSTANCE, "name": "other", "port": 8001},
            ]
        },
        "vllm_service_instances[1].port: 8001 is used twice (each port is one process's; "
        "the awake-only door of vllm_service_instances[0] listens on it)",
    ),
    "duplicate_names": (
        {"vllm_service_instances": [OK_INSTANCE, {**OK_INSTANCE, "port": 8001}]},
        '[1].name: "ok" is used twice',
    ),
    "malformed_cron": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "windows": [{**NIGHTS, "sleep": "0 25 * * 1-5"}]}
            ]
        },
        "hour value 25 is outside 0-23",
    ),
    "malformed_oncalendar": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "windows": [{**NIGHTS, "wake": "Mon..Fry 07:30"}]}
            ]
        },
        "Failed to parse calendar specification",
    ),
    "bad_instance_name": (
        {"vllm_service_instances": [{**OK_INSTANCE, "name": "Qwen Chat"}]},
        "lowercase letters, digits and dashes",
    ),
    "gpu_memory_over_1": (
        {"vllm_service_instances": [{**OK_INSTANCE, "gpu_memory_utilization": 1.5}]},
        "gpu_memory_utilization: is 1.5 (in (0, 1]",
    ),
    "port_out_of_range": (
        {"vllm_service_instances": [{**OK_INSTANCE, "port": 70000}]},
        "port: is 70000 (a TCP port, 1-65535)",
    ),
    "tp_vs_gpus": (
        {"vllm_service_instances": [{**OK_INSTANCE, "gpus": [0, 1], "tensor_parallel_size": 4}]},
        "must list tensor_parallel_size (4) GPUs",
    ),
    "model_src_relative": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "model": "Qwen/Qwen3", "model_src": "/data/q"}
            ]
        },
        "model must be the absolute host path to stage it to",
    ),
    "proxy_port_clash": (
        {
            "vllm_preflight_device_kind": "gpu",
            "vllm_service_instances": [
                {
                    **OK_INSTANCE,
                    "windows": [NIGHTS],
                },  # sleep on a GPU host: proxied, 127.0.0.1:18000
                {**OK_INSTANCE, "name": "other", "port": 18000},
            ],
        },
        "vLLM behind the proxy of vllm_service_instances[0] listens on it",
    ),
    "duplicate_windows": (
        {"vllm_service_instances": [{**OK_INSTANCE, "windows": [NIGHTS, NIGHTS]}]},
        "window names are unique per instance",
    ),
    "window_missing_wake": (
        {
            "vllm_service_instances": [
                {**OK_INSTANCE, "windows": [{"name": "w", "sleep": "0 1 * * *"}]}
            ]
        },
        "windows[0].wake: is missing",
    ),
    "cpus_malformed": (
        {"vllm_service_instances": [{**OK_INSTANCE, "cpus": "0-3; rm -rf /"}]},
        'cpus: is the string "0-3; rm -rf /" (a core list such as "0-15"',
    ),
    "cpu_two_without_cores": (
        {
            "vllm_preflight_device_kind": "cpu",
            "vllm_service_instances": [
                {**OK_INSTANCE, "cpus": "0-3"},
                {**OK_INSTANCE, "name": "b", "port": 8001},
                {**OK_INSTANCE, "name": "c", "port": 8002},
            ],
        },
        "[1].cpus: is missing (3 vLLM instances on a CPU host need their own cores: set cpus",
    ),
    "device_choice": (
        {"vllm_preflight_device": "tpu", "vllm_service_instances": [OK_INSTANCE]},
        'vllm_preflight_device: is the string "tpu" (one of auto, gpu, cpu)',
    ),
    "variable_typo": (
        {"vllm_service_instance": [OK_INSTANCE], "vllm_service_instances": [OK_INSTANCE]},
        "vllm_service_instance: is not a variable of any role (did you mean vllm_service_instances",
    ),
    "idle_after_malformed": (
        {"vllm_service_instances": [{**OK_INSTANCE, "idle_sleep": {"after": "soon"}}]},
        'vllm_service_instances[0].idle_sleep.after: is the string "soon" (seconds, or a duration',
    ),
    "idle_without_proxy": (
        {
            "vllm_proxy_enabled": False,
            "vllm_service_instances": [{**OK_INSTANCE, "idle_sleep": {"after": "15m"}}],
        },
        "vllm_service_instances[0].idle_sleep: is set without the proxy",
    ),
    "awake_port_without_wake": (
        {"vllm_service_instances": [{**OK_INSTANCE, "awake_port": 9000, "windows": [NIGHTS]}]},
        "vllm_service_instances[0].awake_port: is set, but no request wakes the instance",
    ),
    "find_links_not_list": (
        {"vllm_install_pip_find_links": {"url": "x"}, "vllm_service_instances": [OK_INSTANCE]},
        'vllm_install_pip_find_links: is the mapping {"url": "x"} (a list)',
    ),
}
