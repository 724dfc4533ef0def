"""Bad inventories fail in preflight, before anything changes, with a clear message; the good
ones pass. All hosts run in one ansible-playbook run (each host = one inventory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.ansible.cases import BAD, GOOD
from tests.ansible.conftest import problem_lines, run_playbook, write_inventory


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("preflight")
    hosts: dict[str, dict[str, Any]] = {f"bad_{n}": v for n, (v, _) in BAD.items()}
    hosts.update({f"good_{n}": v for n, v in GOOD.items()})
    inventory = write_inventory(root / "inventory.json", hosts)
    tree = root / "tree"
    proc = run_playbook(
        "tests/ansible/validate.yml",
        inventory,
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tree),
    )
    results = {p.name: json.loads(p.read_text()) for p in Path(tree).iterdir()}
    return {"proc": proc, "results": results}


def test_at_least_ten_kinds_of_bad_inventory():
    assert len(BAD) >= 10


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_inventory_fails_in_preflight_with_clear_message(outcome, name):
    """The host fails with one line per problem (`host: variable.path: what (right)`), each
    printed once; never a spec dump or a traceback."""
    _, expected = BAD[name]
    stdout = outcome["proc"].stdout
    assert recap(outcome)[f"bad_{name}"]["failed"] == 1
    lines = problem_lines(stdout, f"bad_{name}")
    assert lines and any(expected in line for line in lines), lines
    for line in lines:
        assert stdout.count(line) == 1, line
    assert outcome["results"][f"bad_{name}"]["msg"].startswith(f"bad_{name}: {len(lines)} problem")
    assert "Traceback" not in stdout and "argument_spec_data" not in stdout


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_inventory_passes(outcome, name):
    assert recap(outcome)[f"good_{name}"]["failed"] == 0
    result = outcome["results"][f"good_{name}"]
    assert result.get("msg") == f"good_{name}: VALID"


def recap(outcome: dict[str, Any]) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines: host -> {ok, changed, failed, ...}."""
    rows: dict[str, dict[str, int]] = {}
    for line in outcome["proc"].stdout.split("PLAY RECAP")[-1].splitlines():
        host, sep, counts = line.partition(" : ")
        if sep:
            rows[host.strip()] = {
                k: int(v) for k, v in (pair.split("=") for pair in counts.split())
            }
    return rows


def test_every_host_in_the_recap(outcome):
    assert len(recap(outcome)) == len(BAD) + len(GOOD)
    assert all(row["changed"] == 0 for row in recap(outcome).values())
