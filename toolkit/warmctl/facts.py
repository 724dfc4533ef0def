"""An instance's derived facts, computed once for the templates, the roles' tasks, the preflight
checks, `warmctl render` and the inventory reader (the Ansible side calls it through the
collection's `warmctl.vllm.vllm_instance_facts` filter, once per host in vllm_preflight, whose
`vllm_preflight_instances` every other role and template reads).

    proxied   the instance sits behind the host's nginx (vllm_proxy_enabled true, or auto and
              vLLM dev mode is on); dev mode's routes have no authentication
    sleep     vLLM sleep mode (and so dev mode) on: asked for (`sleep`, else any window) on a
              GPU host
    launcher  the pre-imported launcher runs the server (the instance's `launcher`, else
              vllm_service_launcher)
    port      the clients' port (the instance's `port`, else vllm_service_port)
    upstream  where vLLM listens: port + vllm_proxy_upstream_port_offset when proxied, else port
    bind      vLLM's bind address: 127.0.0.1 when proxied or in dev mode, else `bind`, else
              vllm_service_bind
    target    HOST:PORT that reaches vLLM from the host itself (warmup, sleep, wake, drain)
    warmctl   the host's warmctl (vllm_install_warmctl_venv/bin/warmctl)
    python    vLLM's interpreter (vllm_install_vllm_python, else vllm_install_venv/bin/python)
    unit, gate, draining, warming   the unit's name and the proxy gate's flag files
    windows   the sleep windows, each with its level (default SLEEP_LEVEL) and unit names
    files     every file the roles render for the instance: path, template, role, window, action
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from warmctl.roles import role_defaults

# The variables the facts depend on (unset: the roles' defaults); the one list of them.
SETTINGS = (
    "vllm_preflight_device_kind",
    "vllm_proxy_enabled",
    "vllm_proxy_upstream_port_offset",
    "vllm_proxy_gate_dir",
    "vllm_proxy_conf_dir",
    "vllm_service_port",
    "vllm_service_bind",
    "vllm_service_launcher",
    "vllm_service_config_dir",
    "vllm_service_unit_dir",
    "vllm_install_warmctl_venv",
    "vllm_install_venv",
    "vllm_install_vllm_python",
)
SLEEP_LEVEL = 1  # a window's vLLM sleep level unless it names one
ACTIONS = ("sleep", "wake")  # a window's two timers and services
_LOOPBACK_BINDS = ("0.0.0.0", "::", "127.0.0.1", "localhost")


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    gpu: bool
    sleep_requested: bool
    sleep: bool
    proxied: bool
    launcher: bool
    port: int
    upstream: int
    bind: str
    target: str
    warmctl: str  # the host's warmctl (the warmup, the windows, the drain)
    python: str  # vLLM's interpreter: vllm_install_vllm_python, else the role's venv's
    unit: str
    gate_dir: str
    gate: str  # flag files of the proxy's gate (warmctl.gate): asleep
    draining: str  # out of rotation for a restart
    warming: str  # starting, warmup not finished
    env_file: str
    unit_file: str
    proxy_conf: str  # the nginx server of the instance (rendered when proxied)
    window_unit: str  # the boot-time window check ("" without windows)
    window_script: str  # what it runs ("" without windows)
    windows: tuple[dict[str, Any], ...]
    files: tuple[dict[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "yes", "1", "on")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def local_address(bind: str) -> str:
    """The address that reaches a server bound to `bind` from the host itself."""
    return "127.0.0.1" if bind in _LOOPBACK_BINDS else bind


def settings_from(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The variables the facts depend on: `variables` over the roles' defaults."""
    defaults = role_defaults()
    out = {key: variables.get(key) for key in SETTINGS}
    for key, value in out.items():
        if value is None:  # unset here: the roles' default (one source)
            out[key] = defaults.get(key)
    if out["vllm_preflight_device_kind"] is None:
        out["vllm_preflight_device_kind"] = "gpu"
    return out


def _window(name: str, window: Mapping[str, Any]) -> dict[str, Any]:
    """One sleep window with its level and the names of its services and timers."""
    units = {
        action: {
            "service": f"vllm-{name}-{action}-{window.get('name')}.service",
            "timer": f"vllm-{name}-{action}-{window.get('name')}.timer",
        }
        for action in ACTIONS
    }
    return {**window, "level": window.get("level", SLEEP_LEVEL), "units": units}


def _entry(
    path: str, template: str, role: str, name: str, window: Any = None, action: str = ""
) -> dict:
    return {
        "path": path,
        "template": template,
        "role": role,
        "instance": name,
        "window": window,
        "action": action,
    }


def _files(
    name: str, paths: Mapping[str, str], unit_dir: str, windows: list[dict[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """Every file the roles render for the instance, in the order `warmctl render` lists them."""
    files = [
        _entry(paths["unit_file"], "vllm-instance.service.j2", "vllm_service", name),
        _entry(paths["env_file"], "vllm-instance.env.j2", "vllm_service", name),
    ]
    for w in windows:
        for action in ACTIONS:
            units = w["units"][action]
            files.append(_entry(f"{unit_dir}/{units['service']}", "vllm-window.service.j2",
                                "vllm_schedule", name, w, action))  # fmt: skip
            files.append(_entry(f"{unit_dir}/{units['timer']}", "vllm-window.timer.j2",
                                "vllm_schedule", name, w, action))  # fmt: skip
    if windows:
        files.append(_entry(paths["window_script"], "vllm-reconcile.sh.j2", "vllm_schedule", name))
        files.append(_entry(f"{unit_dir}/{paths['window_unit']}", "vllm-reconcile.service.j2",
                            "vllm_schedule", name))  # fmt: skip
    return tuple(files)


def instance_facts(instance: Mapping[str, Any], variables: Mapping[str, Any]) -> InstanceFacts:
    """The derived facts of one item of vllm_service_instances on a host with `variables`."""
    if not isinstance(instance, Mapping):
        raise ValueError(f"an instance must be a mapping, got {type(instance).__name__}")
    s = settings_from(variables)
    name = str(instance.get("name", ""))
    gpu = s["vllm_preflight_device_kind"] == "gpu"
    windows = instance.get("windows") or []
    asked = instance.get("sleep")
    sleep_requested = bool(windows) if asked is None else _truthy(asked)
    sleep = sleep_requested and gpu
    mode = str(s["vllm_proxy_enabled"]).strip().lower()
    proxied = _truthy(mode) or (mode == "auto" and sleep)
    launcher = bool(instance["launcher"] if "launcher" in instance else s["vllm_service_launcher"])
    port = _int(instance.get("port", s["vllm_service_port"]), f"instance {name}: port")
    offset = _int(s["vllm_proxy_upstream_port_offset"], "vllm_proxy_upstream_port_offset")
    upstream = port + offset if proxied else port
    bind = "127.0.0.1" if (proxied or sleep) else str(instance.get("bind", s["vllm_service_bind"]))
    local = local_address(bind)
    gate_dir = str(s["vllm_proxy_gate_dir"])
    window_facts = [_window(name, w) for w in windows if isinstance(w, Mapping)]
    unit_dir, config_dir = s["vllm_service_unit_dir"], s["vllm_service_config_dir"]
    paths = {
        "env_file": f"{config_dir}/{name}.env",
        "unit_file": f"{unit_dir}/vllm-{name}.service",
        "proxy_conf": f"{s['vllm_proxy_conf_dir']}/vllm-{name}.conf",
        "window_unit": f"vllm-{name}-window.service" if window_facts else "",
        "window_script": f"{config_dir}/{name}-window.sh" if window_facts else "",
    }
    return InstanceFacts(
        name=name,
        gpu=gpu,
        sleep_requested=sleep_requested,
        sleep=sleep,
        proxied=proxied,
        launcher=launcher,
        port=port,
        upstream=upstream,
        bind=bind,
        target=f"{local}:{upstream}",
        warmctl=f"{s['vllm_install_warmctl_venv']}/bin/warmctl",
        python=str(s["vllm_install_vllm_python"] or f"{s['vllm_install_venv']}/bin/python"),
        unit=f"vllm-{name}.service",
        gate_dir=gate_dir,
        gate=f"{gate_dir}/{name}.closed",
        draining=f"{gate_dir}/{name}.draining",
        warming=f"{gate_dir}/{name}.warming",
        **paths,
        windows=tuple(window_facts),
        files=_files(name, paths, unit_dir, window_facts),
    )


def inventory_facts(instance: Mapping[str, Any], variables: Mapping[str, Any]) -> InstanceFacts:
    """The facts of an instance read from an inventory, before preflight probed the host: its kind
    is vllm_preflight_device_kind when set, else vllm_preflight_device forced to cpu, else gpu
    (auto: a GPU host is assumed)."""
    kind = variables.get("vllm_preflight_device_kind")
    if kind not in ("gpu", "cpu"):
        kind = "cpu" if str(variables.get("vllm_preflight_device", "")).lower() == "cpu" else "gpu"
    return instance_facts(instance, {**variables, "vllm_preflight_device_kind": kind})
