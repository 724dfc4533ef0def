"""Ansible connection to the GPU e2e's hosts: systemd-nspawn containers on the lent GPU machine
(tests/gpu/gpuhost.sh), which run no sshd. Test bed only, never shipped: a command runs in all
the namespaces of the container's init (`nsenter -t PID -a`), as root, exactly what ssh to a
host as root would run; files travel through the command's stdin/stdout."""

from __future__ import annotations

import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.connection import ConnectionBase

DOCUMENTATION = """
name: nsenter
short_description: run commands inside a container's namespaces (the GPU e2e's hosts)
description:
  - Runs each command with C(nsenter -t PID -a), PID being the container's init.
author: warmctl developers
options:
  remote_addr:
    description: The PID of the container's init (systemd) on the controller.
    vars:
      - name: inventory_hostname
      - name: ansible_host
  remote_user:
    description: Ignored (commands run as root).
    vars:
      - name: ansible_user
extends_documentation_fragment:
  - connection_pipelining
"""


class Connection(ConnectionBase):
    transport = "nsenter"
    has_pipelining = True

    def _connect(self) -> Connection:
        self._connected = True
        return self

    def _argv(self, cmd: str) -> list[str]:
        pid = str(self.get_option("remote_addr"))
        if not pid.isdigit():
            raise AnsibleConnectionFailure(f"nsenter: ansible_host must be a PID, got {pid!r}")
        return ["nsenter", "-t", pid, "-a", "/bin/sh", "-c", cmd]

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        proc = subprocess.run(self._argv(cmd), input=in_data or b"", capture_output=True)
        return proc.returncode, proc.stdout, proc.stderr

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        with open(in_path, "rb") as f:
            data = f.read()
        rc, _, err = self.exec_command(f"cat > {shlex.quote(out_path)}", in_data=data)
        if rc != 0:
            raise AnsibleError(f"nsenter: cannot write {out_path}: {err.decode(errors='replace')}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        rc, out, err = self.exec_command(f"cat {shlex.quote(in_path)}")
        if rc != 0:
            raise AnsibleError(f"nsenter: cannot read {in_path}: {err.decode(errors='replace')}")
        with open(out_path, "wb") as f:
            f.write(out)

    def close(self) -> None:
        self._connected = False
