"""Render an instance's systemd files from `templates/` outside Ansible.

The same template files the roles use, with the roles' own defaults (`roles/*/defaults/main.yml`)
and the same filters, so the GPU benchmark and `warmctl render` start vLLM exactly as the unit
would. `render_instance()` returns the instance's plan (warmctl.plan.instance) and every file
rendered from it: what the unit runs is the plan's (`exec_argv`, `env_lines`, `server_argv`).

    from warmctl.plan.render import render_instance
    r = render_instance({"name": "qwen", "model": "/srv/models/qwen", "port": 8001},
                        {"vllm_preflight_device_kind": "gpu"})
    subprocess.Popen(r.plan.exec_argv, env={**os.environ, **r.env})
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.plan.calendar import CalendarError, to_oncalendar
from warmctl.plan.instance import InstanceFacts, instance_facts
from warmctl.plan.roles import role_defaults, templates_dir
from warmctl.plan.unitfile import env_quote, systemd_quote
from warmctl.sleepwake.gate import nginx_gate

ANSIBLE_MANAGED = "Ansible managed"  # ansible-core's default `ansible_managed` text
DEVICE_KEY = "vllm_preflight_device_kind"
COLLECTION = "warmctl.vllm"  # the Ansible collection whose templates these are
# whose files (warmctl.plan.instance) render() writes
RENDERED_ROLES = ("vllm_service", "vllm_schedule")


class RenderError(WarmctlError, ValueError):
    """An instance that cannot be rendered, said in one line (exit code 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2, kind="input")


@dataclass(frozen=True)
class RenderedInstance:
    """One instance's plan and every file rendered from it. What the unit runs is the plan's
    (`plan.exec_argv`, `plan.server_argv`, `plan.warmup_argv`, `plan.launch_file`, ...): read
    there, never parsed back from the files."""

    device: str  # "gpu" or "cpu"
    plan: InstanceFacts  # everything derived of the instance (warmctl.plan.instance)
    files: dict[str, str] = field(default_factory=dict)  # host path -> text, every file

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def unit_text(self) -> str:
        return self.files[self.plan.unit_file]

    @property
    def env_text(self) -> str:
        return self.files[self.plan.env_file]

    @property
    def env(self) -> dict[str, str]:
        """The unit's EnvironmentFile as the service sees it (a later line wins)."""
        return dict(self.plan.env_lines)


def _combine(base: Mapping[str, Any], *others: Mapping[str, Any], recursive: bool = False) -> dict:
    result = dict(base)
    for other in others:
        for key, value in other.items():
            if recursive and isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
                result[key] = _combine(result[key], value, recursive=True)
            else:
                result[key] = value
    return result


def _oncalendar(expr: Any) -> list[str]:
    try:
        return to_oncalendar(expr)
    except CalendarError as exc:
        raise RenderError(str(exc)) from None


@cache
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(
        combine=_combine,
        to_json=lambda value, **kw: json.dumps(value, **kw),
        quote=lambda value: shlex.quote(str(value)),
        basename=lambda value: posixpath.basename(str(value)),
        regex_escape=lambda value: re.escape(str(value)),  # as Ansible's (re_type python)
    )
    # the collection's filters, by the names the templates use (plugins/filter/warmctl.py)
    env.filters.update(
        {
            f"{COLLECTION}.vllm_systemd_quote": systemd_quote,
            f"{COLLECTION}.vllm_env_quote": env_quote,
            f"{COLLECTION}.vllm_oncalendar": _oncalendar,
            f"{COLLECTION}.vllm_gate_answers": nginx_gate,
        }
    )
    return env


def _resolve(variables: dict[str, Any]) -> dict[str, Any]:
    """Template the string defaults that refer to other variables (as Ansible would, lazily)."""
    import jinja2

    env = _environment()
    for _ in range(5):
        changed = False
        for key, value in variables.items():
            if isinstance(value, str) and "{{" in value:
                try:
                    rendered = env.from_string(value).render(variables)
                except jinja2.TemplateError:  # needs Ansible-only facts/filters: not ours
                    continue
                if rendered != value:
                    variables[key], changed = rendered, True
        if not changed:
            break
    return variables


def _render(template: str, variables: Mapping[str, Any]) -> str:
    import jinja2

    try:
        return _environment().get_template(template).render(variables)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"{template}: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise RenderError(f"{template}: {exc}") from None


def host_variables(host: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The roles' defaults overlaid with `host` (inventory/host vars), templated."""
    variables = _combine(role_defaults(), {DEVICE_KEY: "gpu", "ansible_managed": ANSIBLE_MANAGED})
    variables = _combine(variables, host or {})
    if variables[DEVICE_KEY] not in ("gpu", "cpu"):
        raise RenderError(f"{DEVICE_KEY} must be 'gpu' or 'cpu', got {variables[DEVICE_KEY]!r}")
    return _resolve(variables)


class InvalidVariables(RenderError):
    """Variables `warmctl.plan.validate` refuses: `lines` holds one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def check_variables(variables: Mapping[str, Any], label: str) -> None:
    """Raise InvalidVariables unless `variables` pass `warmctl.plan.validate` (as preflight's)."""
    from warmctl.plan.validate import validate

    lines = validate(variables, label)
    if lines:
        raise InvalidVariables(lines)


def instance_plan(instance: Mapping[str, Any], base: Mapping[str, Any]) -> InstanceFacts:
    """The instance's plan (warmctl.plan.instance) on a host with `base` (host_variables)."""
    try:
        return instance_facts(instance, base)
    except ValueError as exc:
        raise RenderError(str(exc)) from None


def instance_variables(
    instance: Mapping[str, Any], base: Mapping[str, Any], plan: InstanceFacts | None = None
) -> dict[str, Any]:
    """`base` (host_variables) with the instance and its plan (warmctl.plan.instance), as
    vllm_preflight
    sets them on a host: what the templates of one instance read."""
    facts = (plan or instance_plan(instance, base)).as_dict()
    return _combine(
        base, {"vllm_instance": dict(instance), "vllm_preflight_facts": {facts["name"]: facts}}
    )


def render_instance(
    instance: Mapping[str, Any], host: Mapping[str, Any] | None = None, label: str = "render"
) -> RenderedInstance:
    """Render every file of one instance (an item of `vllm_service_instances`); the variables
    are validated first (`label` starts each problem line), so bad input is never a template
    error. What runs (argv, environment, warmup, sleep) is the plan's, not read back from the
    files."""
    base = host_variables(host)
    check_variables({**base, "vllm_service_instances": [instance]}, label)
    plan = instance_plan(instance, base)
    variables = instance_variables(instance, base, plan)
    files: dict[str, str] = {}
    for produced in plan.files:
        if produced["role"] not in RENDERED_ROLES:
            continue
        extra = {"vllm_window": produced["window"], "vllm_window_action": produced["action"],
                 "vllm_file": produced}  # fmt: skip
        files[produced["path"]] = _render(produced["template"], _combine(variables, extra))
    return RenderedInstance(variables[DEVICE_KEY], plan, files)
