"""vllm_verify runs `warmctl verify` on the controller with every instance's HOST:PORT and the
thresholds, passes the token only through the environment, and fails the host on FAIL."""

from __future__ import annotations

from pathlib import Path

from tests.ansible.conftest import run_playbook, write_inventory

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
    args = next(line for line in proc.stdout.splitlines() if "ARGS " in line)
    assert (
        args.split("ARGS ", 1)[1]
        == "verify 10.0.0.9:8000 10.0.0.9:8001 --max-ratio 3 --attempts 2 --asleep-ok"
    )
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
    args = next(line for line in proc.stdout.splitlines() if "ARGS " in line)
    assert args.split("ARGS ", 1)[1] == "verify 10.0.0.9:8001 --asleep-ok"
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
