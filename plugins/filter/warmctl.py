"""Jinja2 filters of the collection's templates, shared with `warmctl.plan.render` (one
implementation).

vllm_systemd_quote / vllm_env_quote: quoting for unit files and environment files;
vllm_oncalendar: cron or OnCalendar -> list of OnCalendar expressions (checked);
vllm_calendar_error: '' or the reason an expression is unusable (for preflight asserts);
vllm_instance_facts: an instance's plan (warmctl.plan.instance, warmctl.plan.server: its names,
ports,
paths, the server's argv and environment, the launch and env files' content; vllm_preflight
sets them once per host);
vllm_gate_answers: an instance's proxy gate, its flags strongest first and what the proxy answers
in each state (warmctl.sleepwake.gate: the nginx template prints it);
vllm_validate: every problem of a host's role variables, one line each (warmctl.plan.validate);
vllm_role_var: a role variable as the host has it, else the collection's default
(warmctl.plan.roles);
vllm_support: the vLLM release a host runs, judged against the support matrix
(warmctl.plan.vllmmatrix);
vllm_verify_argv / vllm_verify_results / vllm_verify_table: the vllm_verify role's host-side
warmctl verify, what it answered and the fleet's table, as `warmctl verify --inventory` has them
(warmctl.observe.fleet, warmctl.observe.verify_table).

The code is warmctl's own: in an installed collection it comes from the warmctl wheel the
collection ships in files/ (the wheel the roles install on the hosts); in a checkout, from the
source tree beside this file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_COLLECTION = Path(__file__).resolve().parents[2]


def _warmctl_path() -> str | None:
    source = _COLLECTION / "toolkit"
    if (source / "warmctl").is_dir():
        return str(source)
    wheels = sorted((_COLLECTION / "files").glob("warmctl-*-py3-none-any.whl"))
    return str(wheels[-1]) if wheels else None


_PATH = _warmctl_path()
if _PATH and _PATH not in sys.path:
    sys.path.insert(0, _PATH)
if _PATH and _PATH.endswith(".whl"):
    # ansible-core's collection loader puts a path hook first that claims every sys.path entry;
    # under Python 3.12 its finder does not read zip files, so the wheel is given its
    # zipimporter directly (the cache is where Python's path finder looks first)
    import zipfile
    import zipimport

    with zipfile.ZipFile(_PATH) as _wheel:
        _packages = {n.rsplit("/", 1)[0] for n in _wheel.namelist() if n.endswith("/__init__.py")}
    for _entry in [_PATH, *(f"{_PATH}/{p}" for p in sorted(_packages))]:
        sys.path_importer_cache[_entry] = zipimport.zipimporter(_entry)

from ansible.errors import AnsibleFilterError  # noqa: E402

from warmctl.errors import WarmctlError  # noqa: E402
from warmctl.observe.fleet import host_results, role_options, verify_argv  # noqa: E402
from warmctl.observe.verify_table import fleet_lines  # noqa: E402
from warmctl.plan.calendar import CalendarError, calendar_error, to_oncalendar  # noqa: E402
from warmctl.plan.instance import instance_facts  # noqa: E402
from warmctl.plan.inventory import instance_door  # noqa: E402
from warmctl.plan.roles import role_defaults  # noqa: E402
from warmctl.plan.unitfile import env_quote, systemd_quote  # noqa: E402
from warmctl.plan.validate import validate  # noqa: E402
from warmctl.plan.vllmmatrix import judge  # noqa: E402
from warmctl.sleepwake.gate import nginx_gate  # noqa: E402


def vllm_oncalendar(expr: Any) -> list[str]:
    try:
        return to_oncalendar(expr)
    except CalendarError as exc:
        raise AnsibleFilterError(str(exc)) from None


def vllm_instance_facts(instance: Any, settings: Any) -> dict[str, Any]:
    try:
        return instance_facts(instance, settings).as_dict()
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def vllm_validate(variables: Any, host: str, device: str | None = None) -> list[str]:
    """`variables` (e.g. `vars`) checked as `warmctl render` checks them: one line per problem."""
    return validate(variables, host, device)


def vllm_role_var(variables: Any, name: str) -> Any:
    """`variables[name]` (e.g. of `vars`), else its default in the collection's roles (one
    source: roles/*/defaults/main.yml), not a copy of it in the reading role."""
    value = variables.get(name) if hasattr(variables, "get") else None
    return role_defaults().get(name) if value is None else value


def vllm_support(variables: Any, host: str, device: str, installed: Any = None) -> dict[str, Any]:
    """The vLLM release `host` runs (`installed`: what its interpreter has, {package, version}),
    judged against warmctl's support matrix: {package, version, source, supported, refuse, line}."""
    found = installed if isinstance(installed, dict) else None
    return judge(variables, str(host), str(device), found)


def vllm_verify_argv(
    instances: Any,
    address: str,
    warmctl: str,
    settings: Any,
    wait_ready: bool = False,
    as_json: bool = False,
) -> list[str]:
    """The argv of `warmctl verify` for the role: each instance of `instances` (their plans) at
    its door on `address`; `settings` its vllm_verify_* (see warmctl.observe.fleet.role_options),
    built as `warmctl verify --inventory` builds a host's."""
    try:
        urls = [instance_door(str(address), dict(i)).base_url for i in instances]
    except WarmctlError as exc:
        raise AnsibleFilterError(f"vllm_verify_argv: {exc}") from None
    options = role_options(dict(settings))
    return verify_argv(warmctl, urls, options, wait_ready=wait_ready, as_json=as_json)


def vllm_verify_results(results: Any, host: str, vllm: Any = None) -> list[dict[str, Any]]:
    """A looped verify task's registered results -> one result per instance, with `instance`
    (and `vllm`: "PACKAGE VERSION" of `vllm`, vllm_support's answer, when given)."""
    release = None
    if isinstance(vllm, dict) and vllm.get("version"):
        release = f"{vllm.get('package')} {vllm['version']}"
    rows: list[dict[str, Any]] = []
    for res in results or []:
        if not isinstance(res, dict) or not isinstance(res.get("item"), dict):
            continue
        name = str(res["item"].get("name", ""))
        for r in host_results(host, [f"{host}/{name}"], res):
            rows.append({**r, "instance": name, **({"vllm": release} if release else {})})
    return rows


def vllm_verify_table(hostvars: Any, hosts: Any, key: str = "__vllm_verify_rows") -> list[str]:
    """The fleet's table, a line each (warmctl's own): every host of `hosts` whose `key` is set."""
    rows = {}
    for host in hosts:
        found = hostvars[host].get(key)
        if isinstance(found, list):
            rows[str(host)] = found
    return fleet_lines(rows)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_systemd_quote": systemd_quote,
            "vllm_env_quote": env_quote,
            "vllm_oncalendar": vllm_oncalendar,
            "vllm_calendar_error": calendar_error,
            "vllm_instance_facts": vllm_instance_facts,
            "vllm_gate_answers": nginx_gate,
            "vllm_validate": vllm_validate,
            "vllm_role_var": vllm_role_var,
            "vllm_support": vllm_support,
            "vllm_verify_argv": vllm_verify_argv,
            "vllm_verify_results": vllm_verify_results,
            "vllm_verify_table": vllm_verify_table,
        }
