"""The Ansible content is lint-clean (ansible-lint production profile, yamllint), parses as
playbooks, and docs/ROLES.md is current with the argument specs."""

from __future__ import annotations

import subprocess
import sys

from tests.ansible.conftest import BIN, ROOT, ansible_env

ANSIBLE_PATHS = ["galaxy.yml", "meta", "playbooks", "roles", "inventories", "tests/ansible"]
# the collection's playbooks, by the names a user runs them with
PLAYBOOKS = [
    f"warmctl.vllm.{name}" for name in ("site", "verify", "restart", "sleep", "wake", "warmup")
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=ROOT, env=ansible_env(), capture_output=True, text=True, check=False,
        timeout=600,
    )  # fmt: skip


def test_ansible_lint_production_profile():
    proc = run(str(BIN / "ansible-lint"), "--profile", "production", "--offline")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stderr + proc.stdout


def test_yamllint():
    proc = run(str(BIN / "yamllint"), "--strict", ".yamllint", ".ansible-lint", *ANSIBLE_PATHS)
    assert proc.returncode == 0, proc.stdout


def test_playbooks_parse():
    inventory = str(ROOT / "inventories" / "example")
    proc = run(str(BIN / "ansible-playbook"), "--syntax-check", "-i", inventory, *PLAYBOOKS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_example_inventory_passes_preflight_validation():
    """The example fleet must itself be a valid inventory (argument specs + preflight rules)."""
    proc = run(
        str(BIN / "ansible-playbook"), "-i", str(ROOT / "inventories" / "example"),
        "-e", f"ansible_connection=local ansible_python_interpreter={sys.executable}",
        "tests/ansible/validate.yml",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in ("gpu-01", "gpu-02", "gpu-03"):
        assert f"{host}: VALID" in proc.stdout


def test_roles_doc_is_current():
    proc = run(sys.executable, "scripts/roles_doc.py", "--check")
    assert proc.returncode == 0, proc.stdout


def _listed_roles(*tags: str) -> set[str]:
    inventory = str(ROOT / "inventories" / "example")
    proc = run(str(BIN / "ansible-playbook"), "--list-tasks", "-i", inventory,
               "warmctl.vllm.site", *tags)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {
        line.strip().split(" : ")[0].rsplit(".", 1)[-1]
        for line in proc.stdout.splitlines()
        if " : " in line and "Validating arguments" not in line
    }


def test_tags_select_role_stages():
    assert _listed_roles() >= {"vllm_preflight", "vllm_install", "vllm_service", "vllm_verify"}
    # the preflight runs whatever the tags: nothing changes on a host before it
    assert _listed_roles("--tags", "vllm_install") == {"vllm_preflight", "vllm_install"}
    assert _listed_roles("--tags", "vllm_install_venv") == {"vllm_preflight", "vllm_install"}
    assert "vllm_verify" not in _listed_roles("--skip-tags", "vllm_verify")
