"""`verify --inventory --from host`: each host measures itself through its own door.

One controller cannot measure a thousand hosts both fast and honestly: its own CPU becomes part
of every TTFT it measures. Here each inventory host runs its own warmctl
(`vllm_install_warmctl_venv`/bin/warmctl, installed by the roles) against its instances' public
ports on 127.0.0.1 (the proxy when there is one, else vLLM), all hosts at once through
ansible-playbook; each host's `verify --json` comes back to the controller as a file, and the
controller only tabulates. The network path from the controller is not measured: that is what
`--from controller` is for.

The role warmctl.vllm.vllm_verify measures the same way and reads the same output: the argv of a
host's verify (`verify_argv`) and the reading of what came back (`host_results`) are this
module's, for both (the role through the collection's filters).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.plan.instance import warmctl_path
from warmctl.plan.roles import truthy
from warmctl.server.target import Target

# run by ansible-playbook; its variables come from a 0600 extra-vars file
PLAYBOOK = """\
- name: warmctl verify, measured on each host through its own door
  hosts: all
  gather_facts: false
  become: false
  tasks:
    - name: Measure the host's instances from the host
      ansible.builtin.command:
        argv: "{{ __warmctl_argv[inventory_hostname] }}"
      environment: "{{ {'VLLM_API_KEY': __warmctl_api_key} if __warmctl_api_key else {} }}"
      register: __warmctl_verify
      changed_when: false
      failed_when: false
      no_log: true  # the environment holds the API key
      vars:
        ansible_become: false

    - name: Bring the result back to the controller
      ansible.builtin.copy:
        content: "{{ {'rc': __warmctl_verify.rc | default(None),
                      'stdout': __warmctl_verify.stdout | default(''),
                      'stderr': __warmctl_verify.stderr | default(''),
                      'msg': __warmctl_verify.msg | default('')} | to_json }}"
        dest: "{{ __warmctl_out }}/{{ inventory_hostname }}.json"
        mode: "0600"
      delegate_to: localhost
      vars:
        ansible_become: false
"""


@dataclass(frozen=True)
class HostPlan:
    """One inventory host: its targets as the inventory names them, and the argv of the
    host's own `warmctl verify --json` over the same instances on 127.0.0.1."""

    name: str
    targets: list[Target]
    argv: list[str]


def local_url(t: Target) -> str:
    """The instance's door as seen from its own host."""
    return Target(t.scheme, "127.0.0.1", t.port, t.prefix).base_url


def verify_argv(
    warmctl: str,
    urls: Sequence[str],
    options: Mapping[str, Any],
    *,
    wait_ready: bool = False,
    as_json: bool = False,
) -> list[str]:
    """The command line of a `warmctl verify` run on others' behalf (a host's own, the role's):
    `options` maps an option's name (max_ratio) to its value; None and False leave it out, True
    is a flag, numbers are written as `%g`."""
    argv = [warmctl, "verify"] + (["--wait-ready"] if wait_ready else [])
    argv += (["--json"] if as_json else []) + [str(u) for u in urls]
    for name, value in options.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(f"{value:g}" if isinstance(value, float) else str(value))
    return argv


def role_options(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The role's vllm_verify_* as `verify_argv` options (max_first_ttft, max_ratio, attempts,
    asleep_ok, textfile_dir, instance): a threshold of 0 and one attempt are warmctl's own
    defaults, left out; the textfile options only with a directory."""
    first = float(variables.get("max_first_ttft") or 0)
    ratio = float(variables.get("max_ratio") or 0)
    attempts = int(variables.get("attempts") or 1)
    textfile_dir = str(variables.get("textfile_dir") or "")
    return {
        "max_first_ttft": first if first > 0 else None,
        "max_ratio": ratio if ratio > 0 else None,
        "attempts": attempts if attempts > 1 else None,
        "asleep_ok": truthy(variables.get("asleep_ok")),
        "textfile_dir": textfile_dir or None,
        "instance": str(variables.get("instance") or "") or None if textfile_dir else None,
    }


def plan(
    hosts: Sequence[tuple[str, dict[str, Any], list[Target]]],
    options_for: Callable[[Target], Mapping[str, Any]],
    *,
    wait_ready: bool = False,
) -> list[HostPlan]:
    """`options_for(first target of the host)`: the options the host's verify gets (its
    thresholds come from the inventory host, the same for all its instances)."""
    out = []
    for name, hv, targets in hosts:
        if not targets:
            continue
        argv = verify_argv(
            warmctl_path(hv),
            [local_url(t) for t in targets],
            options_for(targets[0]),
            wait_ready=wait_ready,
            as_json=True,
        )
        out.append(HostPlan(name, list(targets), argv))
    return out


def _ansible_playbook() -> str:
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise WarmctlError(
            "verify --from host runs ansible-playbook: pip install 'warmctl[inventory]' "
            "(or measure from here: --from controller)",
            kind="missing_dependency",
        )
    return found


def _failure_line(output: str, host: str) -> str:
    """Ansible's own one line about `host` (unreachable, failed), if it printed one."""
    for line in output.splitlines():
        m = re.match(rf"^(fatal|failed): \[{re.escape(host)}\].*?(\{{.*)$", line.strip())
        if m:
            try:
                return " ".join(str(json.loads(m.group(2)).get("msg", "")).split())[:300]
            except ValueError:
                return " ".join(m.group(2).split())[:300]
    return "no result came back (see ansible-playbook's output with -v)"


def host_results(host: str, labels: Sequence[str], raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a host's `warmctl verify --json` run answered (`raw`: its rc, stdout, stderr, msg as
    Ansible's command module registers them), one result per target, relabelled with `labels`
    (the inventory's names of its targets, in the argv's order); a run without its JSON: an
    ERROR per target with the last line it printed."""
    try:
        payload = json.loads(raw.get("stdout") or "")
        results = list(payload["results"])
    except (ValueError, KeyError, TypeError):
        why = str(raw.get("stderr") or raw.get("msg") or "").strip().splitlines()
        last = why[-1] if why else f"exit {raw.get('rc')}, no JSON"
        err = f"{host}: warmctl verify on the host failed: {last}"
        return [_error(label, err) for label in labels]
    if len(results) != len(labels):
        err = f"{host}: the host's verify answered {len(results)} results, not {len(labels)}"
        return [_error(label, err) for label in labels]
    out = []
    for label, r in zip(labels, results, strict=True):
        local = str(r.get("target", ""))
        r = {**r, "target": label, "measured_from": "host"}
        if isinstance(r.get("error"), str):
            r["error"] = r["error"].replace(local, label, 1)
        out.append(r)
    return out


def _error(label: str, message: str) -> dict[str, Any]:
    return {
        "target": label,
        "status": "ERROR",
        "error": message,
        "reasons": [],
        "measured_from": "host",
    }


def verify_on_hosts(
    inventory_path: str,
    plans: Sequence[HostPlan],
    *,
    api_key: str | None,
    forks: int,
) -> list[dict[str, Any]]:
    """Run every plan on its host at once; one result dict per target, in plan order (a host
    Ansible could not reach: an ERROR per target, with Ansible's reason)."""
    if not plans:
        return []
    playbook = _ansible_playbook()
    with tempfile.TemporaryDirectory(prefix="warmctl-verify-") as tmp:
        work = Path(tmp)
        out_dir = work / "results"
        out_dir.mkdir()
        (work / "verify.yml").write_text(PLAYBOOK)
        variables = {
            "__warmctl_argv": {p.name: p.argv for p in plans},
            "__warmctl_api_key": api_key or "",
            "__warmctl_out": str(out_dir),
        }
        vars_file = work / "vars.json"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(variables, f)
        env = {**os.environ, "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_NOCOLOR": "1"}
        cmd = [
            playbook,
            "-i",
            inventory_path,
            "--limit",
            ",".join(p.name for p in plans),
            "--forks",
            str(max(1, forks)),
            "-e",
            f"@{vars_file}",
            str(work / "verify.yml"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        output = proc.stdout + proc.stderr
        results: list[dict[str, Any]] = []
        for p in plans:
            path = out_dir / f"{p.name}.json"
            if not path.exists():
                err = f"{p.name}: not measured: Ansible: {_failure_line(output, p.name)}"
                results.extend(_error(t.label, err) for t in p.targets)
                continue
            labels = [t.label for t in p.targets]
            results.extend(host_results(p.name, labels, json.loads(path.read_text())))
        return results
