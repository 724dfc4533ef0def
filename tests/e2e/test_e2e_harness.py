"""The test-host harness itself: boot two hosts, reach them, reboot one, tear down to nothing."""

from __future__ import annotations

import subprocess
import time

import pytest
from tests.lib import testhosts


@pytest.fixture
def fresh_fleet():
    if testhosts.booted_hosts():
        pytest.fail("test hosts are already up; run `bash scripts/testhosts.sh down` first")
    fleet = testhosts.up(2)
    try:
        yield fleet
    finally:
        testhosts.down()


def test_two_hosts_boot_with_own_identity_and_tear_down_to_nothing(fresh_fleet):
    fleet = fresh_fleet
    ids = set()
    for host in fleet.hosts:
        out = fleet.ssh(
            host,
            "systemctl is-system-running; hostname; cat /etc/machine-id; "
            "ip -4 -o addr show dev eth0 | awk '{print $4}'",
        ).stdout.split()
        assert out[0] == "running"
        assert out[1] == host.name
        assert out[3] == f"{host.address}/24"
        ids.add(out[2])
    assert len(ids) == 2, "each host has its own machine-id"
    keys = fleet.known_hosts.read_text().splitlines()
    assert len({line.split()[2] for line in keys}) == len(keys) >= 2, "own host keys"

    # the Ansible user: key login with StrictHostKeyChecking against our known_hosts, sudo
    first, second = fleet.hosts
    done = subprocess.run(
        ["ssh", "-n", *fleet.ssh_options(), f"ansible@{first.address}", "sudo -n id -u"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout.strip() == "0", done.stderr
    # hosts reach each other by name over the bridge; the compiler and libnuma are baked in
    reach = f"python3 -c \"import socket; socket.create_connection(('{second.name}', 22), 5)\""
    fleet.ssh(first, reach)
    headers = "test -e /usr/include/python3.11/Python.h"
    fleet.ssh(first, f"g++ --version && {headers} && ldconfig -p | grep -q libnuma.so.1")

    # a second `up` keeps running hosts as they are
    boot_id = fleet.ssh(second, "cat /proc/sys/kernel/random/boot_id").stdout
    testhosts.up(2)
    assert fleet.ssh(second, "cat /proc/sys/kernel/random/boot_id").stdout == boot_id

    # a reboot inside a host comes back (nspawn exits 133; the supervisor restarts it)
    fleet.ssh(second, "systemctl reboot", check=False)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        done = fleet.ssh(second, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=10)
        if done.returncode == 0 and done.stdout != boot_id:
            break
        time.sleep(1)
    else:
        pytest.fail("wt2 did not come back after a reboot within 90 s")
    state = fleet.ssh(second, "systemctl is-system-running --wait", check=False).stdout.strip()
    assert state == "running"

    testhosts.down()
    assert testhosts.leftovers() == []
    assert testhosts.status() == []
