"""`verify --inventory --from host` (the default): each inventory host runs its own warmctl
through ansible-playbook and the controller tabulates. Here the "hosts" are local-connection
inventory hosts, each in front of a loopback vLLM double, their warmctl this checkout's."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import yaml

VENV = Path(sys.executable).parent.parent
pytestmark = pytest.mark.skipif(
    not (VENV / "bin" / "warmctl").exists() or not (VENV / "bin" / "ansible-playbook").exists(),
    reason="needs the dev venv (scripts/venv.sh): warmctl and ansible-playbook",
)


def local_host(port: int, **more: object) -> dict[str, object]:
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ansible_host": "10.255.255.1",  # the controller could not reach this: the host can
        "vllm_install_warmctl_venv": str(VENV),
        **more,
        "vllm_service_instances": [{"name": "llm", "port": port}],
    }


def write_inventory(path: Path, hosts: dict[str, dict]) -> Path:
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def test_each_host_measures_itself(run, vllm_double_factory, tmp_path: Path) -> None:
    fast = vllm_double_factory(ttft=0.01)
    slow = vllm_double_factory(first_ttft=1.0, ttft=0.01)  # over 2x unless steady took 0.5 s
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    inv = write_inventory(
        tmp_path / "fleet.yml",
        {
            "fast": local_host(fast.port, vllm_verify_max_ratio=100),
            "slow": local_host(slow.port),  # 1 s first token vs 10 ms: FAIL at ratio 2
            "nothing": local_host(closed),  # the host's own warmctl finds nobody listening
            # Ansible cannot reach this one at all
            "gone": {"ansible_host": "127.0.0.1", "ansible_port": closed, "warmctl_port": 1},
        },
    )
    result = run("verify", "--inventory", str(inv), "--steady", "2", "--json")
    payload = json.loads(result.stdout)
    by = {r["target"]: r for r in payload["results"]}
    assert set(by) == {"fast/llm", "slow/llm", "nothing/llm", "gone:1"}
    assert result.exit_code == 2 == payload["exit_code"]
    assert by["fast/llm"]["status"] == "PASS" and by["fast/llm"]["measured_from"] == "host"
    assert by["slow/llm"]["status"] == "FAIL"
    assert by["slow/llm"]["first_ttft_s"] >= 1.0 and by["slow/llm"]["ratio"] > 2
    assert by["slow/llm"]["thresholds"]["max_ratio"] == 2
    assert by["fast/llm"]["thresholds"]["max_ratio"] == 100  # the host's own inventory limit
    assert by["nothing/llm"]["status"] == "ERROR"
    assert by["nothing/llm"]["error"].startswith("nothing/llm: connection refused")
    assert by["gone:1"]["status"] == "ERROR" and "not measured: Ansible" in by["gone:1"]["error"]
    # each measurement was made on its host: the doubles saw first + 2 steady + decode
    assert fast.counters.generations == 4 and slow.counters.generations == 4
    # one line per failed host on stderr
    assert result.stderr.count("\n") == 2


def test_controller_mode_measures_from_here(run, vllm_double_factory, tmp_path: Path) -> None:
    fast = vllm_double_factory(ttft=0.01)
    inv = write_inventory(
        tmp_path / "fleet.yml", {"h": local_host(fast.port, vllm_verify_address="127.0.0.1")}
    )
    result = run("verify", "-i", str(inv), "--from", "controller", "--max-ratio", "100", "--json")
    [r] = json.loads(result.stdout)["results"]
    assert result.exit_code == 0 and r["target"] == "h/llm" and "measured_from" not in r


def test_host_mode_table_and_api_key_stays_out_of_argv(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    secured = vllm_double_factory(ttft=0.01, api_key="s3cret-key")
    inv = write_inventory(tmp_path / "fleet.yml", {"h": local_host(secured.port)})
    result = run("verify", "-i", str(inv), "--max-ratio", "100", env={"VLLM_API_KEY": "s3cret-key"})
    assert result.exit_code == 0, result.output
    assert "h/llm" in result.stdout and "PASS" in result.stdout
    assert "s3cret-key" not in result.output
