"""`warmctl relaunch --check` as root (the deploy's): the launcher's command line is the service
user's to choose, so root reads only the instance's own files (`--launch-file`, `--state-file`
from its facts) and reads them as warmctl.host.safefs does (no link, no FIFO, bounded)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from warmctl.errors import WarmctlError
from warmctl.launcher.relaunch import LauncherFiles, check

LAUNCHER = 100
SCRIPT = "/opt/warmctl/share/warmctl/vllm_launch.py"


def fake_launcher(root: Path, launch_file: str, state_file: str = "") -> Path:
    """/proc with one launcher process whose command line names `launch_file`."""
    proc = root / "proc"
    (proc / str(LAUNCHER)).mkdir(parents=True)
    argv = ["/usr/bin/python3", SCRIPT, "--launch-file", launch_file]
    argv += ["--state-file", state_file] if state_file else []
    argv += ["--", "-m", "vllm.entrypoints.cli.main"]
    (proc / str(LAUNCHER) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    return proc


def good_launch(path: Path) -> Path:
    path.write_text('{"argv": ["serve", "/srv/m", "--port", "18000"], "env": {}}\n')
    return path


def test_a_launcher_naming_another_launch_file_is_refused_before_any_read(tmp_path: Path) -> None:
    mine = good_launch(tmp_path / "tiny.launch")
    secret = tmp_path / "root-only"
    secret.write_text('{"argv": ["x"], "env": {}, "password": "s3cret"}\n')
    secret.chmod(0o600)
    proc = fake_launcher(tmp_path, str(secret))
    with pytest.raises(WarmctlError, match="not this instance's launcher") as err:
        check(LAUNCHER, proc, LauncherFiles(None, str(mine), None))
    assert "password" not in str(err.value) and "s3cret" not in str(err.value)
    # without the expectation (the unit's own ExecReload, as the service user) it is read
    with pytest.raises(WarmctlError, match="unknown key"):
        check(LAUNCHER, proc)


def test_the_instance_own_launch_file_passes(tmp_path: Path) -> None:
    mine = good_launch(tmp_path / "tiny.launch")
    proc = fake_launcher(tmp_path, str(mine))
    checked = check(LAUNCHER, proc, LauncherFiles(None, str(mine), None))
    assert checked.launch is not None and checked.launch.args[0] == "serve"


@pytest.mark.parametrize("trap", ["link", "fifo", "zero"])
def test_a_launch_file_that_is_no_regular_file_is_refused_at_once(
    tmp_path: Path, trap: str
) -> None:
    path = tmp_path / "tiny.launch"
    if trap == "link":
        path.symlink_to(good_launch(tmp_path / "elsewhere"))
    elif trap == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    proc = fake_launcher(tmp_path, str(path))
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            check(LAUNCHER, proc, LauncherFiles(None, str(path), None))
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert done, f"check hung on a {trap}"
    assert isinstance(done[0], WarmctlError) and "cannot read it" in str(done[0]), done[0]
