"""What warmctl does as root in the service user's folders, against what that user can plant there.

The gate folder belongs to the service user, the textfile folder is writable by its group; root
runs warmctl in both (the deploy's drain and verify, the window services' window-check and CPU
sleep). Here one user plays both (no root needed): at every name a root action touches (the
gate's flags, the old temporary names beside them, the gate's lock, the textfile and its lock
and temporary name) the test plants a link to a decoy file outside, a dangling link, a FIFO, a
link to /dev/zero or a hard link to the decoy; then each action runs in a child process with a
memory limit and a deadline. Nothing outside the folders may change (contents, modes, no new
file), nothing may hang, nothing may blow up memory, and the actions still do their job.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from warmctl.host import safefs

KINDS = ("symlink", "dangling", "fifo", "zero", "hardlink")
# the child's address space: Python with warmctl's imports fits well under it; reading /dev/zero
# into memory does not
MEMORY_LIMIT = 768 << 20
DEADLINE_S = 120  # a child that hangs (a FIFO opened blocking) is killed here: a failure

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from pathlib import Path
    kind, gate_dir, text_dir, outside, systemctl = sys.argv[1:6]
    pid, tid = os.getpid(), threading.get_ident()
    # every name a root action touches, and the temporary names the old code used
    gate_names = ["tiny.closed", "tiny.draining", "tiny.wakeable", "tiny.warming", ".tiny.lock",
                  f".tiny.closed.{pid}", f".tiny.draining.{pid}"]
    text_names = ["warmctl_tiny.prom", ".warmctl_tiny.lock", f"warmctl_tiny.prom.{pid}.{tid}"]
    decoy = os.path.join(outside, "decoy")
    for folder, names in ((gate_dir, gate_names), (text_dir, text_names)):
        for name in names:
            at = os.path.join(folder, name)
            if kind == "symlink":
                os.symlink(decoy, at)
            elif kind == "dangling":
                os.symlink(os.path.join(outside, "new-" + name), at)
            elif kind == "fifo":
                os.mkfifo(at)
            elif kind == "zero":
                os.symlink("/dev/zero", at)
            else:
                os.link(decoy, at)

    from warmctl.server.client import Client
    from warmctl.errors import WarmctlError
    from warmctl.sleepwake.actions import drain_out_of_rotation
    from warmctl.sleepwake.gate import Gate, instance_lock, read_flag
    from warmctl.server.target import parse_target
    from warmctl.observe import textfile

    results = {}
    def run(label, fn):
        try:
            fn()
            results[label] = "ok"
        except WarmctlError as err:
            results[label] = "WarmctlError: " + err.message
        except SystemExit as exc:
            results[label] = f"exit {exc.code}"

    closed = Gate(os.path.join(gate_dir, "tiny.closed"))
    draining = Gate(os.path.join(gate_dir, "tiny.draining"))
    # the reads first, while every trap is still in place
    run("read_flag", lambda: [read_flag(os.path.join(gate_dir, n)) for n in gate_names[:4]])
    run("is_closed", closed.is_closed)
    run("read_samples", lambda: textfile.read_samples(Path(text_dir, "warmctl_tiny.prom")))
    def locked():
        with instance_lock([closed]):
            pass
    run("instance_lock", locked)
    run("close", lambda: closed.close("sleep cause=window"))
    # drain: the gate closes as draining; nothing listens on port 9, nothing to wait for
    nobody = Client(parse_target("127.0.0.1:9"), timeout=5)
    run("drain", lambda: drain_out_of_rotation(nobody, draining, 1))
    run("open", closed.open)
    report = {"status": "PASS", "total_s": 1.0}
    run("verify metrics", lambda: textfile.record(text_dir, "verify", "tiny", "127.0.0.1", report))
    from warmctl.cli import cli
    run("window-check", lambda: cli.main(
        ["window-check", "vllm-tiny.service", "--action", "sleep", "--window", "nights",
         "--systemctl", systemctl, "--textfile-dir", text_dir, "--instance", "tiny"],
        standalone_mode=False))
    print(json.dumps(results))
    """
)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file outside: its content's hash and its mode."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(p.lstat().st_mode))
        for p in sorted(folder.iterdir())
    }


@pytest.mark.parametrize("kind", KINDS)
def test_root_actions_touch_nothing_through_what_the_service_user_plants(
    tmp_path: Path, kind: str
) -> None:
    gate, text, outside = tmp_path / "gate", tmp_path / "textfile", tmp_path / "outside"
    for d in (gate, text, outside):
        d.mkdir()
    decoy = outside / "decoy"
    decoy.write_text("root's secret\n")
    decoy.chmod(0o600)
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho inactive\n")
    systemctl.chmod(0o755)
    before = _snapshot(outside)
    argv = [sys.executable, "-c", CHILD, kind, str(gate), str(text), str(outside), str(systemctl)]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            preexec_fn=_limit_memory,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind}: a root action hung for {DEADLINE_S} s (a FIFO opened blocking?)")
    assert proc.returncode == 0, f"{kind}: the child failed:\n{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    print(kind, json.dumps(results, indent=1))
    assert _snapshot(outside) == before, f"{kind}: a file outside the folders changed"
    # the actions still do their job: each planted thing at a name they write is replaced
    assert results["close"] == results["drain"] == results["open"] == "ok", results
    assert results["verify metrics"] == results["instance_lock"] == "ok", results
    assert results["window-check"] == "exit 1", results  # inactive: skipped, and counted
    assert not (gate / "tiny.closed").exists()
    draining = (gate / "tiny.draining").lstat()
    assert stat.S_ISREG(draining.st_mode) and draining.st_nlink == 1
    assert stat.S_IMODE(draining.st_mode) == 0o644
    prom = text / "warmctl_tiny.prom"
    assert stat.S_ISREG(prom.lstat().st_mode) and prom.lstat().st_nlink == 1
    metrics = prom.read_text()
    assert 'warmctl_verify_result{host="' in metrics
    assert "warmctl_window_skipped_timestamp_seconds" in metrics


def test_a_folder_on_the_way_that_others_can_write_is_refused(tmp_path: Path) -> None:
    """Who may write in the folder could swap a folder above it that it may change for a link to
    /etc: root does not go through it. A link on the way that this user (root) owns is followed."""
    shared = tmp_path / "shared"
    (shared / "gate").mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(safefs.UnsafeFileError, match="can be changed by who may write"):
        safefs.open_folder(shared / "gate")
    shared.chmod(0o1777)  # sticky (/tmp): others cannot rename what is not theirs
    os.close(safefs.open_folder(shared / "gate"))
    # the folder's group may write in it: a folder above that this group may change is refused
    gid = 4242 if os.geteuid() == 0 else os.getgid()  # the service user's group, say
    os.chown(shared, -1, gid)
    os.chown(shared / "gate", -1, gid)
    (shared / "gate").chmod(0o2775)
    shared.chmod(0o775)
    if gid != 0:
        with pytest.raises(safefs.UnsafeFileError):
            safefs.open_folder(shared / "gate")
    shared.chmod(0o755)
    (tmp_path / "link").symlink_to(shared)
    with safefs.folder(tmp_path / "link" / "gate") as fd:
        assert os.fstat(fd).st_ino == (shared / "gate").stat().st_ino
    (shared / "gate" / "flag").write_text("x")
    with pytest.raises(NotADirectoryError):
        safefs.open_folder(shared / "gate" / "flag")
