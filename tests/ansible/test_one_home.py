"""One home for an instance's derived facts: no role task or template derives them itself.

Ports, bind, target, gate flags, proxied, sleep, launcher, the sleep level's default, unit names
and the files an instance produces are computed by warmctl.facts only (the roles read
`vllm_preflight_instances` / `vllm_preflight_facts` / `vllm_preflight_files`, set once per host by
vllm_preflight; the templates read `vllm_preflight_facts`). A role reads another role's variable
as it is (the roles' defaults are the one source of defaults, warmctl.roles.role_defaults), never
through its own `| default(...)` copy. Grep-level: each rule is a pattern that a copy of a rule
would match.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tests.ansible.conftest import ROOT

# (name, pattern, what to read instead)
RULES: list[tuple[str, re.Pattern[str], str]] = [
    (
        "upstream port",
        re.compile(r"vllm_proxy_upstream_port_offset"),
        "the facts' upstream / target",
    ),
    (
        "gate flag path",
        re.compile(r"(\}\}|['\"])\.(closed|draining|warming)\b"),
        "the facts' gate / draining / warming",
    ),
    (
        "unit or file name",
        re.compile(
            r"'vllm-'\s*~|~\s*'\.(service|timer|conf|env)'|"
            r"vllm-\{\{[^}]*\}\}[\w{}.' ~-]*\.(service|timer|conf)\b|"
            r"\}\}(\.env|-window\.sh|-window\.service)\b|"
            r"'\^', 'vllm-'|'\$', '\.(service|timer|env)'"
        ),
        "the facts' unit, unit_file, env_file, proxy_conf, window_unit, windows[].units, files",
    ),
    (
        "file path from a folder",
        re.compile(r"\{\{\s*vllm_\w+_dir\s*\}\}/\{\{|vllm_\w+_dir\s*~\s*'/'\s*~"),
        "the facts' paths (env_file, unit_file, proxy_conf, window_script, files)",
    ),
    (
        "windows' files",
        re.compile(r"subelements\('windows'[^)]*\)\s*\|\s*product|product\(\['sleep', 'wake'\]\)"),
        "vllm_preflight_files (every file of every window)",
    ),
    (
        "launcher rule",
        re.compile(r"launcher\s+is\s+defined|vllm_service_launcher"),
        "the facts' launcher",
    ),
    (
        "sleep rule",
        re.compile(
            r"vllm_preflight_device_kind[^\n]*sleep|sleep[^\n]*vllm_preflight_device_kind|"
            r"sleep\s*\|\s*default\(|"
            r"\.sleep\s+is\s+defined|level'?,?\s*(\|\s*)?default"
        ),
        "the facts' sleep, gpu and windows[].level",
    ),
    (
        "instance port",
        re.compile(r"\.port\s*\|\s*default\(|default\(vllm_service_port"),
        "the facts' port",
    ),
]
ROLE_VAR = re.compile(r"\b(vllm_[a-z]+_\w+)\s*\|\s*default\(")


def _role_of(variable: str, owners: dict[str, str]) -> str | None:
    return owners.get(variable)


def _owners() -> dict[str, str]:
    """Every role default -> the role that owns it (roles/<role>/defaults/main.yml)."""
    owners: dict[str, str] = {}
    for path in sorted((ROOT / "roles").glob("*/defaults/main.yml")):
        for name in yaml.safe_load(path.read_text()) or {}:
            owners[name] = path.parts[-3]
    return owners


def checked_files() -> list[Path]:
    roles = ROOT / "roles"
    files = [
        *roles.glob("*/tasks/*.yml"),
        *roles.glob("*/handlers/*.yml"),
        *roles.glob("*/vars/*.yml"),
    ]
    files += (ROOT / "templates").glob("*.j2")
    files += (ROOT / "playbooks").glob("*.yml")
    return sorted(files)


def problems(path: Path, text: str, owners: dict[str, str]) -> list[str]:
    """Every line of `text` (the file at `path`) that derives a fact or defaults another role's
    variable: `path:line: rule: the line (read ... instead)`."""
    rel = path.relative_to(ROOT).as_posix()
    role = path.parts[-3] if rel.startswith("roles/") else None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern, instead in RULES:
            if pattern.search(line):
                found.append(f"{rel}:{number}: {name}: {line.strip()} (read {instead})")
        for match in ROLE_VAR.finditer(line):
            owner = _role_of(match.group(1), owners)
            if owner is not None and owner != role:
                found.append(
                    f"{rel}:{number}: default of {owner}'s {match.group(1)}: {line.strip()} "
                    f"(read it as it is: its default is {owner}'s defaults/main.yml)"
                )
    return found


def test_no_role_task_or_template_derives_an_instance_fact():
    owners = _owners()
    found = []
    for path in checked_files():
        found += problems(path, path.read_text(), owners)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("roles/vllm_service/tasks/drain.yml",
         "- \"127.0.0.1:{{ p + (vllm_proxy_upstream_port_offset | int) }}\""),
        ("roles/vllm_service/tasks/drain.yml", "- \"{{ gate_dir }}/{{ item }}.draining\""),
        ("roles/vllm_service/tasks/main.yml", "name: \"vllm-{{ item.name }}.service\""),
        ("roles/vllm_service/tasks/main.yml", "name: \"{{ 'vllm-' ~ item.name ~ '.service' }}\""),
        ("roles/vllm_schedule/tasks/install.yml",
         "name: \"vllm-{{ item.0.0.name }}-{{ item.1 }}-{{ item.0.1.name }}.timer\""),
        ("roles/vllm_service/tasks/restart.yml", "| default(vllm_service_launcher))"),
        ("templates/vllm-common.j2",
         "{% set launcher = i.launcher if i.launcher is defined else x %}"),
        ("roles/vllm_schedule/tasks/install.yml",
         "if (vllm_preflight_device_kind == 'gpu' and item.sleep | default(true))"),
        ("roles/vllm_schedule/tasks/install.yml", "map(attribute='level', default=1)"),
        ("templates/vllm-reconcile.service.j2",
         "ExecStart={{ vllm_service_config_dir }}/{{ c.name }}-window.sh"),
        ("roles/vllm_service/tasks/render.yml",
         "dest: \"{{ vllm_service_config_dir }}/{{ vllm_instance.name }}.env\""),
        ("roles/vllm_service/tasks/drain.yml", "- {{ vllm_install_warmctl_venv | default('') }}"),
        ("roles/vllm_service/tasks/drain.yml",
         "__p: \"{{ (i | first).port | default(vllm_service_port) }}\""),
    ],
)  # fmt: skip
def test_each_rule_catches_a_copy(rel, line):
    """A line that derives a fact is caught in the file it would sit in (the rules can fail)."""
    assert problems(ROOT / rel, line, _owners())
