"""An instance's derived facts, computed once for the templates, the proxy role, the preflight
checks and the inventory reader (the Ansible side calls it through the collection's
`warmctl.vllm.vllm_instance_facts` filter).

    proxied   the instance sits behind the host's nginx (vllm_proxy_enabled true, or auto and
              vLLM dev mode is on); dev mode's routes have no authentication
    sleep     vLLM sleep mode (and so dev mode) on: asked for (`sleep`, else any window) on a
              GPU host
    port      the clients' port (the instance's `port`, else vllm_service_port)
    upstream  where vLLM listens: port + vllm_proxy_upstream_port_offset when proxied, else port
    bind      vLLM's bind address: 127.0.0.1 when proxied or in dev mode, else `bind`, else
              vllm_service_bind
    target    HOST:PORT that reaches vLLM from the host itself (warmup, sleep, wake)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from warmctl.roles import role_defaults

SETTINGS = (
    "vllm_preflight_device_kind",
    "vllm_proxy_enabled",
    "vllm_proxy_upstream_port_offset",
    "vllm_proxy_gate_dir",
    "vllm_service_port",
    "vllm_service_bind",
)
_LOOPBACK_BINDS = ("0.0.0.0", "::", "127.0.0.1", "localhost")


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    gpu: bool
    sleep_requested: bool
    sleep: bool
    proxied: bool
    port: int
    upstream: int
    bind: str
    target: str
    unit: str
    gate_dir: str
    gate: str  # flag files of the proxy's gate (warmctl.gate): asleep
    draining: str  # out of rotation for a restart
    warming: str  # starting, warmup not finished

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
    port = _int(instance.get("port", s["vllm_service_port"]), f"instance {name}: port")
    offset = _int(s["vllm_proxy_upstream_port_offset"], "vllm_proxy_upstream_port_offset")
    upstream = port + offset if proxied else port
    bind = "127.0.0.1" if (proxied or sleep) else str(instance.get("bind", s["vllm_service_bind"]))
    local = "127.0.0.1" if bind in _LOOPBACK_BINDS else bind
    return InstanceFacts(
        name=name,
        gpu=gpu,
        sleep_requested=sleep_requested,
        sleep=sleep,
        proxied=proxied,
        port=port,
        upstream=upstream,
        bind=bind,
        target=f"{local}:{upstream}",
        unit=f"vllm-{name}.service",
        gate_dir=str(s["vllm_proxy_gate_dir"]),
        gate=f"{s['vllm_proxy_gate_dir']}/{name}.closed",
        draining=f"{s['vllm_proxy_gate_dir']}/{name}.draining",
        warming=f"{s['vllm_proxy_gate_dir']}/{name}.warming",
    )
