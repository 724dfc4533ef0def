"""A refused inventory prints at most one line per problem: spec failures (types, unknown
keys) and rule failures (names, ports) alike, each line once, never the argument spec dumped
back (Ansible's own role-entry check does that; the deploy runs preflight's check first)."""

from __future__ import annotations

import pytest
from tests.ansible.conftest import problem_lines, run_playbook, write_inventory

from warmctl.plan.validate import validate

HOSTS = {
    "four_problems": {
        "vllm_service_hardening": "no",  # spec: a bool, not a string
        "vllm_service_instances": [
            {"name": "Bad Name", "model": "/m", "port": "http", "max_num_seq": 4},
        ],
    },
    "clash": {  # rules between instances
        "vllm_service_instances": [
            {"name": "a", "model": "/m", "port": 8000},
            {"name": "a", "model": "/m", "port": 8000},
        ],
    },
}
EXPECTED = {
    "four_problems": [
        'four_problems: vllm_service_hardening: is the string "no" (true or false, without quotes)',
        "four_problems: vllm_service_instances[0].max_num_seq: is not a known key "
        "(did you mean max_num_seqs?)",
        'four_problems: vllm_service_instances[0].name: is the string "Bad Name" '
        "(lowercase letters, digits and dashes, 1-63 characters, e.g. qwen-chat)",
        'four_problems: vllm_service_instances[0].port: is the string "http" (a whole number)',
    ],
    "clash": [
        'clash: vllm_service_instances[1].name: "a" is used twice '
        "(names are unique on a host; vllm_service_instances[0] has it too)",
        "clash: vllm_service_instances[1].port: 8000 is used twice "
        "(each port is one process's; vllm_service_instances[0].port listens on it)",
    ],
}


@pytest.fixture(scope="module", params=["tests/ansible/validate.yml", "tests/ansible/entry.yml"])
def stdout(request, tmp_path_factory: pytest.TempPathFactory) -> str:
    inventory = write_inventory(tmp_path_factory.mktemp("lines") / "inventory.json", HOSTS)
    proc = run_playbook(request.param, inventory)
    assert proc.returncode != 0
    return proc.stdout


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_one_line_per_problem_and_nothing_else(stdout: str, host: str) -> None:
    lines = problem_lines(stdout, host)
    print("\n".join(lines))
    assert lines == EXPECTED[host]
    for line in lines:
        assert stdout.count(line) == 1
    assert f"{host}: {len(lines)} problem(s) in the role variables" in stdout
    assert "argument_spec_data" not in stdout and "Validation of arguments failed" not in stdout
    assert "Traceback" not in stdout


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_warmctl_render_gives_the_same_lines(host: str) -> None:
    assert validate(HOSTS[host], host) == EXPECTED[host]
