"""Who can reach the waker's sockets: its configuration's `socket_group` (nginx's group) makes
both 0660 with that group, so nginx's workers and the service user connect and any other user
is refused by the kernel (connect: EACCES) before the waker sees anything; without a group they
are 0600. Another uid is played by a child that drops to `nobody` (the tests run as root)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.waker.support import GateFiles, Waker

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root to play")
NOBODY = 65534
SOCKET_GID = 65534  # nogroup: the socket's group here (nginx's on a host)
OTHER_GID = 4242  # a group the socket is not given


def as_user(uid: int, gid: int, files: GateFiles) -> str:
    """A forked child drops to uid/gid (no other groups), connects to the stream socket and
    sends one datagram: what each did ("ok"/the answer's start, or the errno's name). A fork,
    not a new interpreter: this one may sit where another user cannot run it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: system calls only, then _exit
        out = []
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(30)
                    s.connect(str(files.socket))
                    s.sendall(b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n")
                    out.append("stream:" + s.recv(12).decode())
            except OSError as err:
                out.append("stream:" + errno.errorcode.get(err.errno or 0, str(err)))
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(b"<190>warmctl: activity", str(files.activity))
                    out.append("dgram:ok")
            except OSError as err:
                out.append("dgram:" + errno.errorcode.get(err.errno or 0, str(err)))
            os.write(write, " ".join(out).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def open_gate() -> Iterator[GateFiles]:
    """A gate folder every user may look into (0755 up to /tmp), as /run/vllm-gate is: only the
    sockets' own mode keeps others out (pytest's tmp_path is 0700, which would hide that)."""
    root = Path(tempfile.mkdtemp(prefix="wk-", dir="/tmp"))
    try:
        root.chmod(0o755)
        (root / "gate").mkdir(mode=0o755)
        yield GateFiles(root / "gate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def waker_in(open_gate: GateFiles, tmp_path: Path, vllm_double) -> Iterator[Callable[..., Waker]]:
    started: list[Waker] = []

    def start(**options: object) -> Waker:
        waker = Waker(open_gate, vllm_double.address, tmp_path / "waker.log", idle_after=3600,
                      **options).start()  # fmt: skip
        started.append(waker)
        return waker

    yield start
    for waker in started:
        waker.stop()


@as_root
def test_only_the_socket_group_and_the_owner_connect(
    waker_in: Callable[..., Waker], open_gate: GateFiles
) -> None:
    waker = waker_in(socket_group=str(SOCKET_GID))
    for path in (open_gate.socket, open_gate.activity):
        st = path.lstat()
        assert (oct(st.st_mode & 0o777), st.st_uid, st.st_gid) == ("0o660", 0, SOCKET_GID), path
    refused = as_user(NOBODY, OTHER_GID, open_gate)
    allowed = as_user(NOBODY, SOCKET_GID, open_gate)
    print(f"another user: {refused}; a user of the socket's group: {allowed}")
    assert refused == "stream:EACCES dgram:EACCES"
    assert allowed == "stream:HTTP/1.1 200 dgram:ok"
    assert waker.state()["activities"] == 1  # the group's datagram, not the other's


@as_root
def test_without_a_group_only_the_owner_connects(
    waker_in: Callable[..., Waker], open_gate: GateFiles
) -> None:
    waker_in()
    assert oct(open_gate.socket.lstat().st_mode & 0o777) == "0o600"
    assert as_user(NOBODY, SOCKET_GID, open_gate) == "stream:EACCES dgram:EACCES"


def test_a_group_the_waker_is_not_in_is_one_line_and_nothing_bound(
    open_gate: GateFiles, vllm_double, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that is not root and not in the group cannot give it its sockets: one line,
    exit 2, nothing bound (the ids of such a process played in this one)."""
    from click.testing import CliRunner

    from tests.waker.support import waker_argv
    from warmctl.cli import cli

    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)
    monkeypatch.setattr(os, "getegid", lambda: NOBODY)
    monkeypatch.setattr(os, "getgroups", lambda: [NOBODY])
    for group, why in (("root", "not in that group"), ("no-such-group-x", "no such group")):
        argv = waker_argv(open_gate, vllm_double.address, socket_group=group)[1:]
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and f"socket_group {group}" in lines[0] and why in lines[0]
        assert not open_gate.socket.exists()


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_unit_gives_its_sockets_nginx_group_and_descriptors_for_its_bound(device: str) -> None:
    """The rendered waker unit and its configuration: nginx's group as a supplementary group and
    the sockets' group, chown back in its system call filter, and a descriptor limit that holds
    the door's bound (max_connections)."""
    from warmctl.plan.render import render_instance
    from warmctl.plan.unitfile import systemd_split, unit_values
    from warmctl.waker.service import FD_RESERVE

    instance = {"name": "tiny", "model": "/m", "port": 8000, "idle_sleep": {"after": "1m"}}
    host = {"vllm_proxy_enabled": True, "vllm_proxy_nginx_group": "nginx-workers",
            "vllm_preflight_device_kind": device}  # fmt: skip
    files = render_instance(instance, host).files
    unit = files["/etc/systemd/system/vllm-tiny-waker.service"]
    [start] = unit_values(unit, "Service", "ExecStart")
    assert systemd_split(start)[1:] == ["waker", "--config", "/etc/vllm/tiny.waker.json"]
    config = json.loads(files["/etc/vllm/tiny.waker.json"])
    bound = config["max_connections"]
    assert config["socket_group"] == "nginx-workers"
    assert unit_values(unit, "Service", "SupplementaryGroups") == ["nginx-workers"]
    [limit] = unit_values(unit, "Service", "LimitNOFILE")
    assert int(limit) >= bound + FD_RESERVE, (limit, bound)
    filters = unit_values(unit, "Service", "SystemCallFilter")
    assert filters.index("@chown") > filters.index("~@privileged @resources"), filters
