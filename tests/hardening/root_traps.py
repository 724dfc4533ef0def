"""What the service user can plant for root in its folders, on a live test host (the e2e check of
docs/SECURITY.md's "What runs as root").

`plant` runs as the service user (`setpriv`, as the unit's own lines do) and puts at every name a
root action touches in the gate folder and the textfile folder a link to a root-only decoy, a
dangling link into /etc, a FIFO or a link to /dev/zero (hard links to root's files are refused by
the kernel's protected_hardlinks; the fast tier covers them), plus links at the temporary names
the old code used (`.NAME.FLAG.<pid>` for the next pids). Only things nginx's `-f` tests read as
absent stand at the flags' names, so the proxy keeps answering as it would. `root_actions` then
runs, as root and each under a deadline, what the deploy runs on the host: a drain, a verify with
a textfile (a FIFO there), window-check's textfile use (/dev/zero, under a memory limit); the
window services and the unit's start and stop run in the calling test. `snapshot` hashes the
root files the links point at before and after.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

from tests.lib.testhosts import Fleet, Host

GATE = "/run/vllm-gate"
TEXTFILE = "/var/lib/node_exporter/textfile_collector"
DECOYS = ("/etc/warmctl-decoy-a", "/etc/warmctl-decoy-b")
# files root must not create through a dangling link, nor anything else in /etc
PLANTED = ("/etc/warmctl-planted-warming", "/etc/warmctl-planted-lock", "/etc/nologin")
WATCHED = (*DECOYS, "/etc/passwd", "/etc/shadow", "/etc/group")
PIDS_AHEAD = 3000  # temporary names of the old code, planted for the next pids
DEADLINE_S = 120  # no root action may take longer (a FIFO opened blocking hangs)
MEMORY = 1 << 30  # window-check's address space when /dev/zero stands at the textfile

_SNAPSHOT = """
import hashlib, json, os, stat, sys
out = {}
for path in sys.argv[1:]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        out[path] = None
        continue
    data = open(path, "rb").read() if stat.S_ISREG(st.st_mode) else b""
    out[path] = [hashlib.sha256(data).hexdigest(), oct(st.st_mode), st.st_uid, st.st_nlink]
print(json.dumps(out))
"""

_PLANT = """
import os, sys
gate, textfile, instance, decoy_a, decoy_b = sys.argv[1:6]
def put(path, kind, target=None):
    if os.path.lexists(path):
        os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(target, path)
j = lambda *p: os.path.join(*p)
# at the flags' names: what nginx's -f reads as absent (the proxy answers as before)
put(j(gate, instance + ".closed"), "link", "/etc/warmctl-planted-closed/x")
put(j(gate, instance + ".warming"), "link", "/etc/warmctl-planted-warming")
put(j(gate, instance + ".draining"), "link", "/dev/zero")
put(j(gate, "." + instance + ".lock"), "fifo")
last = int(open("/proc/sys/kernel/ns_last_pid").read())
for pid in range(last + 1, last + int(sys.argv[6])):
    put(j(gate, f".{instance}.closed.{pid}"), "link", decoy_a)
    put(j(gate, f".{instance}.draining.{pid}"), "link", decoy_b)
if os.path.isdir(textfile):
    put(j(textfile, f".warmctl_{instance}.lock"), "link", "/etc/warmctl-planted-lock")
    put(j(textfile, f"warmctl_{instance}.prom"), "fifo")
print("planted")
"""


def _python(script: str, *args: str) -> str:
    return "python3 -c " + shlex.join([script, *args])


def prepare(fleet: Fleet, host: Host) -> dict[str, Any]:
    """Root's decoys (0600, root only) and the textfile folder (root:vllm 2775, as the role
    makes it); the snapshot before anything is planted."""
    decoys = " && ".join(
        f"printf 'root only\\n' > {d} && chmod 0600 {d} && chown root:root {d}" for d in DECOYS
    )
    fleet.ssh(
        host,
        f"{decoys} && rm -f {' '.join(PLANTED)} && install -d -m 2775 -g vllm {TEXTFILE}",
    )
    return snapshot(fleet, host)


def snapshot(fleet: Fleet, host: Host) -> dict[str, Any]:
    out = fleet.ssh(host, _python(_SNAPSHOT, *WATCHED, *PLANTED)).stdout
    return json.loads(out)


def plant(fleet: Fleet, host: Host, instance: str = "tiny") -> None:
    """As the service user: a trap at every name (see the module's docstring)."""
    as_user = "setpriv --reuid=vllm --regid=vllm --clear-groups -- "
    args = (GATE, TEXTFILE, instance, *DECOYS, str(PIDS_AHEAD))
    done = fleet.ssh(host, as_user + _python(_PLANT, *args), timeout=DEADLINE_S)
    assert "planted" in done.stdout, done.stderr


def _root(fleet: Fleet, host: Host, command: str) -> tuple[int, float, str]:
    t0 = time.monotonic()
    done = fleet.ssh(host, f"timeout -k 5 {DEADLINE_S} {command}", check=False, timeout=300)
    return done.returncode, time.monotonic() - t0, (done.stderr or done.stdout).strip()


def root_actions(fleet: Fleet, host: Host, warmctl: str, instance: str = "tiny") -> list[str]:
    """The deploy's root actions on the host, with the traps in place; one line each. Leaves the
    gate as it found it (no draining flag)."""
    lines: list[str] = []

    def run(label: str, command: str, want: int) -> None:
        rc, seconds, said = _root(fleet, host, command)
        lines.append(f"{label}: exit {rc} in {seconds:.1f} s")
        assert rc == want, f"{label}: exit {rc} (want {want}, 124: hung): {said[-500:]}"

    tf = f"--textfile-dir {TEXTFILE} --instance {instance}"
    run("drain (root)", f"{warmctl} drain 127.0.0.1:18000 --gate {GATE}/{instance}.draining", 0)
    run(
        "verify, a FIFO at its textfile and a dangling link at its lock (root)",
        f"{warmctl} verify 127.0.0.1:8000 --steady 2 --max-ratio 100 {tf}",
        0,
    )
    # the deploy's rejoin (Ansible's file: state=absent is an unlink)
    fleet.ssh(host, f"rm -f {GATE}/{instance}.draining")
    # window-check counts a skipped window in the textfile: /dev/zero there, under a memory limit
    skip = f"{warmctl} window-check vllm-absent.service --action sleep --window w {tf}"
    as_user = "setpriv --reuid=vllm --regid=vllm --clear-groups -- "
    fleet.ssh(host, f"{as_user} ln -sfn /dev/zero {TEXTFILE}/warmctl_{instance}.prom")
    run("window-check, /dev/zero at the textfile (root)", f"prlimit --as={MEMORY} {skip}", 1)
    return lines


def check_and_clean(
    fleet: Fleet, host: Host, before: dict[str, Any], instance: str = "tiny"
) -> dict[str, Any]:
    """The root files as they were, nothing created through a link; the traps left removed."""
    after = snapshot(fleet, host)
    kinds = fleet.ssh(
        host,
        f"stat -c '%n %F' {GATE}/.{instance}.lock {TEXTFILE}/warmctl_{instance}.prom",
        check=False,
    ).stdout
    fleet.ssh(
        host,
        f"find {GATE} -maxdepth 1 -name '.{instance}.*.[0-9]*' -delete; "
        f"rm -f {' '.join(DECOYS)} {GATE}/{instance}.draining",
    )
    changed = {p: (before[p], after[p]) for p in before if before[p] != after[p]}
    assert not changed, f"root files changed through the service user's links: {changed}"
    assert "regular" in kinds and "fifo" not in kinds, kinds
    return after
