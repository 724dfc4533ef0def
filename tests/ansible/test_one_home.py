"""One home for an instance's derived facts: no role task or template derives them itself.

Ports, bind, target, gate flags, proxied, sleep, launcher, the sleep level's default, unit names
and the files an instance produces are computed by warmctl.plan.instance only (the roles read
`vllm_preflight_instances` / `vllm_preflight_facts` / `vllm_preflight_files`, set once per host by
vllm_preflight; the templates read `vllm_preflight_facts`). A role reads another role's variable
as it is (the roles' defaults are the one source of defaults, warmctl.plan.roles.role_defaults),
never
through its own `| default(...)` copy. Grep-level: each rule is a pattern that a copy of a rule
would match.

The plan (warmctl.plan.instance with warmctl.plan.server) also holds the server's argv and
environment, the
launch and env files' content, warmctl's and the launcher's paths: the templates of the instance
(PLAN_TEMPLATES) only print its fields (no list built, no default, no instance key that chooses an
argument, no vLLM flag written), and no other Python module builds those (PY_RULES).
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
        "instance address",
        re.compile(r"(127\.0\.0\.1|localhost):\{\{\s*item\.(port|upstream)"),
        "the plan's target (where the instance's own commands reach vLLM)",
    ),
    (
        "launcher path",
        re.compile(r"share/warmctl"),
        "the plan's exec_argv / launcher_script",
    ),
    (
        "warmctl path",
        re.compile(r"bin/warmctl"),
        "the plan's warmctl",
    ),
    (
        "instance port",
        re.compile(r"\.port\s*\|\s*default\(|default\(vllm_service_port"),
        "the facts' port",
    ),
]
# the templates of an instance's unit and env file, the plan's documents (the launch file), and the
# names they share: they print the plan's fields
PLAN_TEMPLATES = ("vllm-common.j2", "vllm-instance.service.j2", "vllm-instance.env.j2",
                  "vllm-document.j2")  # fmt: skip
PLAN_RULES: list[tuple[str, re.Pattern[str], str]] = [
    ("list built", re.compile(r"\{%-?\s*set\s+\w+\s*=[^%]*\+"), "a plan field (serverplan)"),
    ("default", re.compile(r"\|\s*default\("), "the plan (it has every default)"),
    (
        "instance key chooses",
        re.compile(r"\b(i|vllm_instance)\.\w+\s+is\s+(not\s+)?defined|\bif\s+i\.\w+"),
        "the plan's argv / env (serverplan.FLAGS, server_env)",
    ),
    ("vLLM flag", re.compile(r"['\"]--[a-z][\w-]*['\"]"), "the plan's server_argv / exec_argv"),
    ("merge", re.compile(r"\|\s*combine\(|vllm_launch_env"), "the plan's env / launch_env"),
]
# Python: what only the plan builds (path: the modules allowed to)
PY_RULES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    (
        "gate file",
        re.compile(
            r"\}\.(closed|wakeable|holding|warming|draining|wake-request|sleep-request)\b|"
            r"['\"]\.(closed|wakeable|holding|warming|draining)['\"]"
        ),
        ("toolkit/warmctl/sleepwake/gate.py",),
    ),
    (
        "unit name",
        re.compile(r"['\"]vllm-\{|\}\.service['\"]|['\"]vllm-['\"]\s*\+"),
        ("toolkit/warmctl/plan/instance.py",),
    ),
    (
        "server argv",
        re.compile(r"['\"]-m['\"],\s*['\"]vllm\.|['\"]--enable-sleep-mode['\"]"),
        ("toolkit/warmctl/plan/server.py",),
    ),
    (
        "launcher path",
        re.compile(r"share/warmctl/vllm_launch"),
        ("toolkit/warmctl/plan/server.py",),
    ),
    (
        "warmctl path",
        re.compile(r"/bin/warmctl['\"]|['\"]/opt/warmctl['\"]"),
        ("toolkit/warmctl/plan/instance.py",),
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


def plan_problems(path: Path, text: str) -> list[str]:
    """Every line of an instance's template (PLAN_TEMPLATES) that does more than print the plan."""
    if path.name not in PLAN_TEMPLATES:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern, instead in PLAN_RULES:
            if pattern.search(line):
                found.append(f"templates/{path.name}:{number}: {name}: {line.strip()} "
                             f"(print {instead})")  # fmt: skip
    return found


def python_problems(rel: str, text: str) -> list[str]:
    """Every line of a Python module (`rel`) that builds what only the plan builds."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern, homes in PY_RULES:
            if rel not in homes and pattern.search(line):
                found.append(f"{rel}:{number}: {name}: {line.strip()} (read it from the plan: "
                             f"{', '.join(homes)})")  # fmt: skip
    return found


def test_instance_templates_only_print_the_plan():
    found = []
    for name in PLAN_TEMPLATES:
        path = ROOT / "templates" / name
        found += plan_problems(path, path.read_text())
    assert not found, "\n".join(found)


def test_only_the_plan_builds_the_server_argv_and_the_paths():
    found = []
    for path in sorted([*(ROOT / "toolkit").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        found += python_problems(path.relative_to(ROOT).as_posix(), path.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("vllm-common.j2", "{% set argv = argv + ['--enforce-eager'] %}"),
        ("vllm-common.j2", "{% set user_args = x + (i.extra_args | default([])) %}"),
        ("vllm-common.j2", "{% if i.served_model_name is defined %}"),
        ("vllm-common.j2", "{% set offline = i.offline if i.offline is defined else x %}"),
        ("vllm-common.j2", "{% set cc = {} | combine(vllm_service_compilation_config) %}"),
        ("vllm-common.j2", "{% set launch_env = env | warmctl.vllm.vllm_launch_env %}"),
        ("vllm-instance.service.j2", "ExecStart={{ c.argv + ['--enable-sleep-mode'] }}"),
        ("vllm-instance.env.j2", "{% for key, value in (i.env | default({})).items() %}"),
    ],
)  # fmt: skip
def test_each_plan_rule_catches_a_copy(name, line):
    """A line that chooses or builds in an instance's template is caught (the rules can fail)."""
    assert plan_problems(ROOT / "templates" / name, line)


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("toolkit/warmctl/plan/render.py", 'sleep="--enable-sleep-mode" in server_argv,'),
        ("toolkit/warmctl/bench/configs.py",
         'return [python, "-m", "vllm.entrypoints.cli.main", "serve", site.model, *tail]'),
        ("toolkit/warmctl/observe/fleet.py", 'f"{venv}/bin/warmctl",'),
        ("toolkit/warmctl/observe/fleet.py", 'DEFAULT_WARMCTL_VENV = "/opt/warmctl"'),
        ("toolkit/warmctl/observe/status.py", 'closed = Path(f"{gate_dir}/{name}.closed")'),
        ("toolkit/warmctl/waker/service.py", 'flag = gate_dir / (name + ".wakeable")'),
        ("toolkit/warmctl/commands/sleep.py", 'unit = f"vllm-{name}.service"'),
        ("toolkit/warmctl/plan/render.py", 'script = f"{venv}/share/warmctl/vllm_launch.py"'),
    ],
)  # fmt: skip
def test_each_python_rule_catches_a_copy(rel, line):
    assert python_problems(rel, line)


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
        ("roles/vllm_service/tasks/windows.yml",
         "- \"{{ vllm_install_warmctl_venv }}/bin/warmctl\""),
        ("playbooks/warmup.yml", "- \"127.0.0.1:{{ item.port }}\""),
        ("templates/vllm-common.j2",
         "{% set x = [python, vllm_install_warmctl_venv ~ '/share/warmctl/vllm_launch.py'] %}"),
    ],
)  # fmt: skip
def test_each_rule_catches_a_copy(rel, line):
    """A line that derives a fact is caught in the file it would sit in (the rules can fail)."""
    assert problems(ROOT / rel, line, _owners())
