"""Every action that runs as root on a service user's path is in docs/SECURITY.md's list.

The list ("What runs as root") is the one home: each row names where (a template or a role's task
file) and the action, in the form this test derives it. The test renders every unit of the test
and example inventories (tests/ansible/cases.py: each host as it is, and proxied with a textfile
folder, so that every branch of the templates shows) and reads every role's tasks; each root line
or task that touches a folder the service user or its group can write (the gate folder, the
textfile folder, the unit's runtime folder, the caches, its home, the models) must have its row.
A template that gains such a root line, or a role such a task, fails here until the list says
why it is safe.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.ansible.cases import GOOD
from warmctl.plan.render import host_variables, instance_variables, render_instance
from warmctl.plan.unitfile import systemd_split

REPO = Path(__file__).resolve().parents[2]
SECURITY = REPO / "docs" / "SECURITY.md"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
EXEC = re.compile(r"^Exec(Condition|StartPre|Start|StartPost|Reload|Stop|StopPost)$")
WATCH = ("PathExists", "PathExistsGlob", "PathChanged", "PathModified", "DirectoryNotEmpty")
# a role's task on a service user's path: the variables that name one, `warmctl relaunch` (its
# check argv names the launcher's state file in the unit's runtime folder) and `warmctl restart`
# (its --reload runs that check)
ROLE_PATHS = re.compile(
    r"gate_dir|\.(draining|warming|wakeable|gate|closed)\b|wake_request|sleep_request|"
    r"waker_socket|activity_socket|textfile|cache_dir|install_home|launch_state|runtime_dir|"
    r"relaunch_check_argv|restart_argv|outputs|\bmodel\b|^\s*- relaunch$",
    re.MULTILINE,
)


# modules that run nothing on the host
CONTROLLER_ONLY = tuple(
    f"ansible.builtin.{m}"
    for m in ("set_fact", "debug", "assert", "fail", "meta", "include_tasks", "import_tasks",
              "include_role", "import_role", "include_vars")
)  # fmt: skip


def _variants() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for host, hostvars in GOOD.items():
        base = {k: v for k, v in hostvars.items() if k != "vllm_service_instances"}
        proxied = {**base, "vllm_proxy_enabled": True, "vllm_service_textfile_dir": TEXTFILE_DIR}
        for variant in (base, proxied):
            for instance in hostvars["vllm_service_instances"]:
                yield host, instance, variant


def _user_folders(facts: Mapping[str, Any], variables: Mapping[str, Any]) -> dict[str, str]:
    """The folders the service user (or its group) can write, and the word the list uses."""
    folders = {
        facts["gate_dir"]: "GATE",
        variables["vllm_install_cache_dir"]: "CACHE",
        variables["vllm_install_home"]: "HOME",
        str(Path(facts["outputs"]).parent): "STATE",
    }
    if facts["runtime_dir"]:
        folders[f"/run/{facts['runtime_dir']}"] = "RUNTIME"
    if variables.get("vllm_service_textfile_dir"):
        folders[variables["vllm_service_textfile_dir"]] = "TEXTFILE"
    return folders


def _paths(argv: list[str], folders: Mapping[str, str], name: str) -> list[str]:
    out = []
    words = []
    for arg in argv:  # a shell script's words too (`sh -c '... rm -f PATH'`)
        try:
            words += shlex.split(arg) if " " in arg else [arg]
        except ValueError:
            words.append(arg)
    for arg in words:
        for folder, word in folders.items():
            if arg == folder or arg.startswith(folder + "/"):
                out.append(word + arg[len(folder) :].replace(f"/{name}.", "/NAME."))
    return out


def _program(argv: list[str]) -> str:
    prog = Path(argv[0]).name
    if prog == "setpriv":
        return f"setpriv {Path(argv[argv.index('--') + 1]).name}"
    if prog == "warmctl":
        return f"warmctl {argv[1]}"
    return prog


def _sections(text: str) -> Iterator[tuple[str, str, str]]:
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            yield section, key, value


def root_unit_actions() -> dict[str, str]:
    """'TEMPLATE DIRECTIVE=PREFIXPROGRAM PATH...' of every root line on a service user's path,
    from every rendering -> one rendered line it came from (for the failure message)."""
    found: dict[str, str] = {}
    for host, instance, hostvars in _variants():
        rendered = render_instance(instance, hostvars)
        variables = instance_variables(instance, host_variables(hostvars))
        facts = variables["vllm_preflight_facts"][instance["name"]]
        templates = {
            f["path"]: Path(f["template"]).name.removesuffix(".j2") for f in facts["files"]
        }
        folders = _user_folders(facts, variables)
        for path, text in rendered.files.items():
            entries = list(_sections(text))
            users = [v for s, k, v in entries if s == "Service" and k == "User"]
            unit_is_root = not users or users == ["root"]
            for section, key, value in entries:
                if section == "Path" and key in WATCH:
                    argv, prefix = [value], ""
                    action = f"{key}="
                elif section == "Service" and EXEC.match(key):
                    prefix = re.match(r"^[-+!@:|]*", value).group(0)  # type: ignore[union-attr]
                    if not (unit_is_root or "+" in prefix or "!" in prefix):
                        continue
                    argv = systemd_split(value[len(prefix) :])
                    action = f"{key}={prefix}{_program(argv)}"
                else:
                    continue
                touched = _paths(argv, folders, instance["name"])
                if touched:
                    row = f"{templates[path]} {' '.join([action, *touched]).replace('= ', '=')}"
                    found.setdefault(row, f"{host}/{instance['name']}: {key}={value}")
    return found


def _tasks(tasks: Any) -> Iterator[dict[str, Any]]:
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))
        if not any(k in task for k in ("block", "rescue", "always")):
            yield task


def root_role_tasks() -> dict[str, str]:
    """'ROLE/FILE TASK NAME' of every task run as root that names a service user's path."""
    found: dict[str, str] = {}
    for path in sorted(REPO.glob("roles/*/tasks/*.yml")) + sorted(
        REPO.glob("roles/*/handlers/*.yml")
    ):
        for task in _tasks(yaml.safe_load(path.read_text())):
            if task.get("become") is False or task.get("delegate_to") in ("localhost", "127.0.0.1"):
                continue
            if any(k in task for k in CONTROLLER_ONLY):
                continue
            body = {k: v for k, v in task.items() if k not in ("name", "tags")}
            if ROLE_PATHS.search(yaml.safe_dump(body)):
                role = path.parts[-3]
                found[f"{role}/{path.name} {task['name']}"] = str(path.relative_to(REPO))
    return found


def documented() -> dict[str, str]:
    """The rows of SECURITY.md's list, `WHERE` | `ACTION` | PATH | WHY -> {'WHERE ACTION': PATH}."""
    text = SECURITY.read_text()
    start = text.index("## What runs as root")
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start : end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`") and cells[1].startswith("`"):
            rows[f"{cells[0].strip('`')} {cells[1].strip('`')}"] = cells[2]
    return rows


def _missing(found: Mapping[str, str]) -> str:
    return "\n".join(
        f"  | `{row.split(' ', 1)[0]}` | `{row.split(' ', 1)[1]}` | ... |  ({line})"
        for row, line in sorted(found.items())
    )


def test_every_root_line_of_the_units_on_a_service_users_path_is_listed() -> None:
    found = root_unit_actions()
    listed = documented()
    missing = {row: line for row, line in found.items() if row not in listed}
    assert not missing, (
        f"root lines on the service user's paths not in SECURITY.md:\n{_missing(missing)}"
    )
    print(f"{len(found)} root lines of the units on the service user's paths, all listed")


def test_every_root_task_of_the_roles_on_a_service_users_path_is_listed() -> None:
    found = root_role_tasks()
    listed = documented()
    missing = {row: where for row, where in found.items() if row not in listed}
    assert not missing, (
        f"root tasks on the service user's paths not in SECURITY.md:\n{_missing(missing)}"
    )
    print(f"{len(found)} root tasks of the roles on the service user's paths, all listed")


def test_the_list_has_no_row_nothing_produces() -> None:
    """A row whose line or task is gone goes too: the list stays what runs. Rows whose path is
    `none` are root actions on no service user's path, listed so that the list is whole."""
    produced = set(root_unit_actions()) | set(root_role_tasks())
    listed = documented()
    stale = sorted(row for row, path in listed.items() if row not in produced and path != "none")
    assert not stale, f"rows of SECURITY.md's root list that nothing produces: {stale}"
    print(f"{len(listed)} root actions listed, {len(produced)} of them on the service user's paths")
