"""Targets from an Ansible inventory, read with ansible-core's own loader (any format and
plugin ansible-playbook accepts, group_vars/host_vars beside it included).

Per host: the address is `vllm_verify_address`, else `ansible_host`, else the inventory name.
Ports: one target per item of `vllm_service_instances` (the roles' list of dicts with `name` and
`port`; unset: `vllm_service_port`, else the roles' default: warmctl.plan.instance decides), else
`warmctl_port`, else the default port.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.plan.instance import instance_facts
from warmctl.server.target import DEFAULT_PORT, Target, parse_target

INSTANCES_VAR = "vllm_service_instances"
PORT_VAR = "warmctl_port"
# the roles' verify settings (0 or unset: warmctl's defaults) -> Target.settings keys
VERIFY_VARS = {
    "vllm_verify_max_first_ttft": "max_first_ttft",
    "vllm_verify_max_ratio": "max_ratio",
    "vllm_verify_throttle": "parallel",  # hosts measured at once
    "vllm_verify_attempts": "attempts",  # measurements of a FAILing host
}
SERVICE_PORT_VAR = "vllm_service_port"  # the roles' default port of an instance
ADDRESS_VAR = "vllm_verify_address"  # the roles' override of the address to check
WARMCTL_VENV_VAR = "vllm_install_warmctl_venv"  # where the host's own warmctl lives
DEVICE_VAR = "vllm_preflight_device"  # "cpu" hosts never sleep (their windows stop the unit)
_PLUGIN_FAIL = re.compile(r"Failed to parse inventory with '(\w+)' plugin: ([^\n]+)")


def _load(path: str, limit: str | None) -> list[tuple[str, dict[str, Any]]]:
    # an inventory source no plugin can parse must fail, not become an empty inventory
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "True")
    os.environ.setdefault("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", "True")
    try:
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager
    except ImportError:
        raise WarmctlError(
            "reading an Ansible inventory needs ansible-core: pip install 'warmctl[inventory]'",
            kind="missing_dependency",
        ) from None
    captured = io.StringIO()
    try:
        loader = DataLoader()
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            inventory = InventoryManager(loader=loader, sources=[path])
            if limit:
                inventory.subset(limit)
            variables = VariableManager(loader=loader, inventory=inventory)
            out: list[tuple[str, dict[str, Any]]] = []
            for host in inventory.get_hosts():
                hv = variables.get_vars(host=host, include_hostvars=False)
                out.append((host.name, _template(loader, hv)))
        return out
    except AnsibleError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = _plugin_reason(captured.getvalue(), path)
        raise WarmctlError(
            f"inventory {path!r} does not parse: {why or first}", kind="input"
        ) from None


def _plugin_reason(warnings: str, path: str) -> str | None:
    """The parse error of the plugin that matches the file (yaml for .yml/.yaml, else ini)."""
    reasons = dict(_PLUGIN_FAIL.findall(warnings))
    want = "yaml" if path.endswith((".yml", ".yaml")) else "ini"
    reason = reasons.get(want) or next(iter(reasons.values()), None)
    return " ".join(reason.split()) if reason else None


def _template(loader: Any, hv: dict[str, Any]) -> dict[str, Any]:
    """Resolve `{{ }}` in the few variables we read."""
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=hv)
    out: dict[str, Any] = {}
    for key in (
        ADDRESS_VAR,
        "ansible_host",
        PORT_VAR,
        INSTANCES_VAR,
        SERVICE_PORT_VAR,
        WARMCTL_VENV_VAR,
        DEVICE_VAR,
        # set: the probed kind wins (warmctl.plan.instance.inventory_facts)
        "vllm_preflight_device_kind",
        *VERIFY_VARS,
    ):
        if key in hv:
            out[key] = templar.template(hv[key])
    return out


def _port(value: Any, where: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise WarmctlError(f"{where}: port {value!r} is not a number", kind="input") from None
    if not 1 <= port <= 65535:
        raise WarmctlError(f"{where}: port {port} is out of range", kind="input")
    return port


def instance_door(address: str, plan: Mapping[str, Any], where: str = "") -> Target:
    """Where clients reach an instance at `address` (a host's name, address or URL): the
    clients' port of its plan (InstanceFacts.as_dict(), or the roles' vllm_preflight_instances
    item), unless the address names a port itself."""
    where = where or f"instance {plan.get('name', '?')}"
    return parse_target(address, default_port=_port(plan.get("port"), where))


def instance_entry(door: str) -> dict[str, Any]:
    """A new item of vllm_service_instances for a server known only by its door (a host given
    on the command line, not read from an inventory): named after it, with its port."""
    return {"name": f"port-{door}", "port": int(door) if door.isdigit() else door}


def targets_for_host(
    name: str, hv: dict[str, Any], default_port: int = DEFAULT_PORT
) -> list[Target]:
    """The targets one inventory host stands for (pure: unit-testable without Ansible)."""
    address = str(hv.get(ADDRESS_VAR) or hv.get("ansible_host") or name)
    settings = _verify_settings(name, hv)
    instances = hv.get(INSTANCES_VAR)
    if instances:
        if not isinstance(instances, list):
            raise WarmctlError(f"{name}: {INSTANCES_VAR} must be a list", kind="input")
        targets = []
        for i, inst in enumerate(instances):
            if not isinstance(inst, dict):
                raise WarmctlError(f"{name}: {INSTANCES_VAR}[{i}] is not a dict", kind="input")
            where = f"{name} {INSTANCES_VAR}[{i}]"
            try:  # the instance's plan, by the roles' own rule (warmctl.plan.instance)
                plan = instance_facts(inst, hv).as_dict()
            except ValueError as exc:  # a value the instance's plan cannot read: which, said
                raise WarmctlError(f"{where}: {exc}", kind="input") from None
            base = instance_door(address, plan, where)
            targets.append(base.with_name(f"{name}/{inst.get('name', i)}", settings))
        return targets
    port = _port(hv[PORT_VAR], f"{name} {PORT_VAR}") if PORT_VAR in hv else default_port
    target = parse_target(address, default_port=port)
    return [target.with_name(name if address == name else f"{name}:{target.port}", settings)]


def _verify_settings(name: str, hv: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for var, key in VERIFY_VARS.items():
        if hv.get(var) in (None, ""):
            continue
        try:
            value = float(hv[var])
        except (TypeError, ValueError):
            raise WarmctlError(f"{name}: {var} {hv[var]!r} is not a number", kind="input") from None
        if value > 0:
            out[key] = value
    return out


def host_vars(path: str | Path, limit: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(inventory host name, the few variables warmctl reads, templated) per host."""
    p = str(path)
    if not Path(p).exists():
        raise WarmctlError(f"inventory {p!r} not found", kind="input")
    return _load(p, limit)


def inventory_hosts(
    path: str | Path, limit: str | None = None, default_port: int = DEFAULT_PORT
) -> list[tuple[str, dict[str, Any], list[Target]]]:
    """(inventory name, the variables read, its targets) of every host of the (limited)
    inventory; raises if it is missing, unparsable or empty."""
    p = str(path)
    if not Path(p).exists():
        raise WarmctlError(f"inventory {p!r} not found", kind="input")
    hosts = _load(p, limit)
    if not hosts:
        what = f" matching --limit {limit!r}" if limit else ""
        raise WarmctlError(f"inventory {p!r} has no hosts{what}", kind="input")
    return [(name, hv, targets_for_host(name, hv, default_port)) for name, hv in hosts]


def hosts_from_inventory(
    path: str | Path, limit: str | None = None, default_port: int = DEFAULT_PORT
) -> list[Target]:
    """Every target of the (limited) inventory; raises if it is missing, unparsable or empty."""
    return [t for _, _, targets in inventory_hosts(path, limit, default_port) for t in targets]
