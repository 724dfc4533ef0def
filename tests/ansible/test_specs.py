"""The roles' argument specs carry their real defaults (ansible-doc shows them), equal to
defaults/main.yml, and ansible-doc reads the collection's roles by their FQCN."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from tests.ansible.conftest import BIN, ROOT, ansible_env

from warmctl.plan.roles import argument_specs, role_names, roles_dir


@pytest.mark.parametrize("role", role_names())
def test_every_default_is_in_the_spec_and_equal(role):
    defaults = yaml.safe_load((roles_dir() / role / "defaults/main.yml").read_text()) or {}
    for entry, spec in argument_specs(role).items():
        options = spec["options"]
        for name, value in defaults.items():
            assert name in options, f"{role} {entry}: {name} has a default but no spec"
            assert "default" in options[name], f"{role} {entry}: {name} spec has no default"
            assert options[name]["default"] == value, f"{role} {entry}: {name}"
        own = [n for n in options if n.startswith(f"{role}_")]
        assert sorted(own) == sorted(n for n in defaults), f"{role}: spec without a default"


def test_ansible_doc_shows_the_real_defaults():
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "role", "--json", "warmctl.vllm.vllm_verify",
         "warmctl.vllm.vllm_service"],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    verify = doc["warmctl.vllm.vllm_verify"]["entry_points"]["main"]["options"]
    assert verify["vllm_verify_asleep_ok"]["default"] is True
    service = doc["warmctl.vllm.vllm_service"]["entry_points"]["main"]["options"]
    assert service["vllm_service_port"]["default"] == 8000
    assert service["vllm_service_timeout_start_sec"]["default"] == 1800
