"""The drain before a restart (roles/vllm_service/tasks/drain.yml) with the real `warmctl drain`
against a vLLM double: only instances behind the proxy are drained, on their upstream port,
their draining flag is left closed; a stream in flight finishes first; a drain that times out
is reported and does not fail the host. Then vllm_verify's rejoin: flags removed only after a
verify that passed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from tests.ansible.conftest import run_playbook, write_inventory
from tests.ansible.test_verify_role import host as verify_host

VENV = Path(sys.executable).parent.parent  # holds bin/warmctl, as vllm_install_warmctl_venv


def drain_host(tmp_path: Path, double, **extra) -> dict:
    conf, gate = tmp_path / "conf.d", tmp_path / "gate"
    conf.mkdir()
    gate.mkdir()
    # both are proxied (warmctl.plan.instance), but only a's nginx server is published yet
    (conf / "vllm-a.conf").write_text("# warmctl instance: a\n")
    return {
        "vllm_install_warmctl_venv": str(VENV),
        "vllm_proxy_enabled": True,
        "vllm_proxy_conf_dir": str(conf),
        "vllm_proxy_gate_dir": str(gate),
        "vllm_proxy_upstream_port_offset": double.port - 8000,
        "vllm_service_instances": [
            {"name": "a", "model": "/m", "port": 8000},
            {"name": "b", "model": "/m", "port": 8001},
        ],
        "vllm_service_restart_names": ["a", "b"],
        **extra,
    }


def test_drain_waits_for_the_stream_in_flight_and_leaves_the_gate_closed(tmp_path, vllm_double):
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    vllm_double.config.token_delay = 0.05
    done: list[int] = []

    def stream() -> None:
        client = Client(parse_target(vllm_double.address))
        done.append(stream_completion(client, "double-model", "hi", max_tokens=300).tokens)

    inventory = write_inventory(tmp_path / "inv.json", {"h": drain_host(tmp_path, vllm_double)})
    t = threading.Thread(target=stream)
    t.start()
    vllm_double.wait_for(lambda: vllm_double.counters.in_flight == 1, "the stream in flight")
    proc = run_playbook("tests/ansible/drain.yml", inventory)
    t.join(30)
    assert proc.returncode == 0, proc.stdout[-3000:]
    said = [line for line in proc.stdout.splitlines() if "drained in" in line]
    print(said)
    assert said and f"127.0.0.1:{vllm_double.port}: drained in" in said[0]
    waited = float(said[0].split("drained in ")[1].split(" s")[0])
    # the 15 s stream outlived the play's start-up: the drain waited for it, then returned
    assert waited > 1.0
    assert done == [300] and vllm_double.counters.aborted == 0
    assert sorted(p.name for p in (tmp_path / "gate").iterdir()) == ["a.draining"]


def test_a_drain_that_times_out_is_reported_and_the_restart_goes_on(tmp_path, vllm_double):
    vllm_double.config.extra_waiting = 1  # a request that never finishes
    inventory = write_inventory(
        tmp_path / "inv.json",
        {"h": drain_host(tmp_path, vllm_double, vllm_service_drain_timeout=1)},
    )
    proc = run_playbook("tests/ansible/drain.yml", inventory)
    assert proc.returncode == 0, proc.stdout[-3000:]
    said = " ".join(proc.stdout.split())  # the play's output wraps long lines
    assert (
        "NOT drained after --drain-timeout 1 s: still 0 running, 1 waiting, "
        "0 in flight at the API server"
    ) in said
    assert (tmp_path / "gate" / "a.draining").exists()


def test_a_failing_drain_fails_the_host(tmp_path, vllm_double):
    """The gate folder is missing (the proxy was never published): one clear error, the host
    fails before any restart."""
    host = drain_host(tmp_path, vllm_double, vllm_proxy_gate_dir=str(tmp_path / "absent"))
    inventory = write_inventory(tmp_path / "inv.json", {"h": host})
    proc = run_playbook("tests/ansible/drain.yml", inventory)
    assert proc.returncode != 0
    assert "cannot close the gate" in proc.stdout


def test_verify_puts_the_instances_back_into_rotation_only_when_it_passed(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    for name in ("a", "b"):
        (gate / f"{name}.draining").write_text("draining\n")
    inventory = write_inventory(
        tmp_path / "inv.json", {"h": verify_host(tmp_path, vllm_proxy_gate_dir=str(gate))}
    )
    failed = run_playbook("tests/ansible/verify.yml", inventory, STUB_EXIT="1")
    assert failed.returncode != 0
    assert sorted(p.name for p in gate.iterdir()) == ["a.draining", "b.draining"]
    passed = run_playbook("tests/ansible/verify.yml", inventory)
    assert passed.returncode == 0, passed.stdout[-3000:]
    assert list(gate.iterdir()) == []


def test_the_restart_handler_drains_then_restarts(tmp_path, vllm_double):
    """vllm_service's handler (what a deploy notifies) runs the role's restart task file: the
    drain first, then the restart. This machine runs no vllm-a.service, so the restart itself
    fails, after the drain closed the gate."""
    host = drain_host(
        tmp_path,
        vllm_double,
        vllm_service_restart_names=["a"],
        vllm_service_unit_dir=str(tmp_path),
        vllm_service_config_dir=str(tmp_path),
    )
    inventory = write_inventory(tmp_path / "inv.json", {"h": host})
    proc = run_playbook("tests/ansible/restart_handler.yml", inventory)
    out = proc.stdout
    assert proc.returncode != 0
    assert out.count("drained in") == 1, out[-3000:]  # by the handler only
    drained = out.index(f"127.0.0.1:{vllm_double.port}: drained in")
    restart = out.index("vllm_service : Restart each instance")
    assert drained < restart, out[-3000:]
    assert "failed=1" in out[restart:]
    assert (tmp_path / "gate" / "a.draining").exists()


def test_restart_playbook_check_mode_selects_the_named_instances(tmp_path, vllm_double):
    """warmctl.vllm.restart --check: the instances named in vllm_restart_names (only those)
    are looked at; nothing is drained, restarted or changed."""
    import subprocess

    from tests.ansible.conftest import BIN, ROOT, ansible_env

    host = drain_host(tmp_path, vllm_double)
    (tmp_path / "conf.d" / "vllm-b.conf").write_text("# warmctl instance: b\n")
    inventory = write_inventory(tmp_path / "inv.json", {"h": host})
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "warmctl.vllm.restart",
         "--check", "-e", "vllm_rollout_hosts=all", "-e", '{"vllm_restart_names": ["b"]}'],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    looked = out[out.index("Find the instances to restart") :].split("TASK [", 2)[0]
    assert "(item=b)" in looked and "(item=a)" not in looked, looked
    assert list((tmp_path / "gate").iterdir()) == []
    assert vllm_double.counters.requests == []


def test_verify_playbook_measures_only(tmp_path):
    """warmctl.vllm.verify (vllm_verify_rejoin: false): a passing verify leaves the draining
    flags alone, so an instance drained by hand or by a failed deploy stays out of rotation."""
    import subprocess

    from tests.ansible.conftest import BIN, ROOT, ansible_env

    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "a.draining").write_text("draining\n")
    inventory = write_inventory(
        tmp_path / "inv.json", {"h": verify_host(tmp_path, vllm_proxy_gate_dir=str(gate))}
    )
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "warmctl.vllm.verify",
         "-e", "vllm_rollout_hosts=all"],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ARGS verify --wait-ready http://10.0.0.9:8000 http://10.0.0.9:8001" in proc.stdout
    assert (gate / "a.draining").exists()


def test_a_single_hosts_restart_holds_then_releases_even_when_it_fails(tmp_path, vllm_double):
    """Not load balanced, and its proxy and waker can hold (the nginx server tests the holding
    flag, the waker's socket is there): the drain closes the holding flag instead of the
    draining one; the restart fails here (no vllm-a.service), and the role's `always` still
    removes the flag, so the held requests get their answer at once (503 relaunch-failed from
    the waker) instead of waiting for the hold's bound. Nothing is left out of rotation."""
    import socket

    host = drain_host(
        tmp_path,
        vllm_double,
        vllm_service_restart_names=["a"],
        vllm_service_unit_dir=str(tmp_path),
        vllm_service_config_dir=str(tmp_path),
    )
    gate = tmp_path / "gate"
    (tmp_path / "conf.d" / "vllm-a.conf").write_text(f"if (-f {gate}/a.holding) {{}}\n")
    waker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waker.bind(str(gate / "a.waker.sock"))
    waker.listen(1)
    try:
        inventory = write_inventory(tmp_path / "inv.json", {"h": host})
        proc = run_playbook("tests/ansible/restart_handler.yml", inventory)
    finally:
        waker.close()
    out = proc.stdout
    assert proc.returncode != 0
    said = " ".join(out.split())  # the play's output wraps long lines
    assert "drained in" in said and f"gate {gate}/a.holding closed" in said, out[-3000:]
    released = out.index("Release the requests held across the restart")
    assert out.index("vllm_service : Restart each instance") < released, out[-3000:]
    assert sorted(p.name for p in gate.iterdir()) == ["a.waker.sock"]
    failed = out[out.index("Fail the host if a reload or restart failed") :]
    assert "System has not been booted with systemd" in failed, failed[:2000]  # its reason
