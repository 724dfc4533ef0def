"""--standby-delay ready: the launcher forks the next standby once its server answers /health
(the vLLM double, told when to be ready), not beside the server's start; a relaunch asked before
that still relaunches (its standby forked at once), and the next one waits for the new server."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.launcher.fakes import wait_state
from tests.lib.server import free_port
from warmctl.launcher import vllm_launch

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.launcher.double_main"


def _start(launch, tmp_path: Path) -> tuple[Any, Path, Path]:
    """The launcher on the double with --standby-delay ready (the last --standby-delay wins),
    the double not ready until the test creates `ready`."""
    port, ready, state = free_port(), tmp_path / "ready", tmp_path / "state.json"
    lp = launch("--preload", MODULE, "--standby-delay", "0", "--standby-delay", "ready",
                "--state-file", str(state), "--", "-m", MODULE, "--port", str(port),
                env={"PYTHONPATH": f"{ROOT}:{ROOT / 'toolkit'}",
                     "DOUBLE_READY_FILE": str(ready)})  # fmt: skip
    return lp, ready, state


def _asked(ready: Path, server: int, count: int, timeout: float = 30.0) -> None:
    """Wait until the double of pid `server` has answered `count` /health requests (503: not
    ready)."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        try:
            seen = Path(f"{ready}.asked").read_text().strip()
        except OSError:
            seen = ""
        pid, _, asked = seen.partition(" ")
        if pid == str(server) and int(asked) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"server {server} not asked /health {count} times: {seen!r}")


def _state(path: Path, done, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
        if doc and done(doc):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"{path}: {doc}")


def test_the_next_standby_is_forked_once_the_server_is_ready(launch, tmp_path: Path) -> None:
    lp, ready, state = _start(launch, tmp_path)
    doc = wait_state(state, 0)
    server = doc["server_pid"]
    assert doc["last"] == "started" and doc["standby"] == "none" and doc["standby_pid"] == 0
    _asked(ready, server, 3)  # the launcher asked, the server said 503 (still starting): no standby
    doc = json.loads(state.read_text())
    assert doc["standby"] == "none" and doc["standby_pid"] == 0, doc
    ready.touch()
    doc = _state(state, lambda d: d["standby"] == "ready")  # forked, then imported
    assert doc["standby_pid"] not in (0, server, lp.proc.pid) and doc["server_pid"] == server
    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=30) == 0
    err = lp.stderr()
    assert "server ready" in err and "after its start: the next standby imports now" in err
    assert "forking a standby with" not in err  # asking /health left no thread behind


def test_a_relaunch_before_the_server_is_ready_still_relaunches(launch, tmp_path: Path) -> None:
    lp, ready, state = _start(launch, tmp_path)  # the double never says it is ready
    first = wait_state(state, 0)
    _asked(ready, first["server_pid"], 1)
    lp.proc.send_signal(signal.SIGHUP)  # the standby is forked at once for it
    doc = wait_state(state, 1)
    assert doc["last"] == "relaunched" and doc["generation"] == 2, doc
    assert doc["server_pid"] != first["server_pid"]
    # the next standby waits for the new server to be ready, as after the first start
    _asked(ready, doc["server_pid"], 2)
    doc = json.loads(state.read_text())
    assert doc["standby"] == "none" and doc["standby_pid"] == 0, doc


@pytest.mark.parametrize(
    ("args", "target"),
    [
        (["serve", "m"], ("127.0.0.1", 8000, False)),  # vLLM's defaults: every address, 8000
        (["--host", "0.0.0.0", "--port", "9"], ("127.0.0.1", 9, False)),
        (["--host=::", "--port=9", "--port", "10"], ("::1", 10, False)),  # the last one counts
        (["--host", "10.77.0.5", "--port", "9", "--ssl-keyfile", "k"], ("10.77.0.5", 9, True)),
        (["--uds", "/run/v.sock", "--port", "9"], None),  # no TCP port: forked at once
    ],
)
def test_where_the_server_answers_health(args: list[str], target: Any) -> None:
    assert vllm_launch.health_target(args) == target


def test_standby_delay_takes_a_number_or_ready() -> None:
    opts = vllm_launch.parse(["--standby-delay", "ready", "--", "-m", "srv"])
    assert opts.standby_ready and opts.standby_delay == 0.0
    opts = vllm_launch.parse(["--standby-delay", "ready", "--standby-delay", "60", "--", "-m", "x"])
    assert not opts.standby_ready and opts.standby_delay == 60.0  # E's delay over the unit's
    with pytest.raises(vllm_launch.UsageError, match="not a number or 'ready'"):
        vllm_launch.parse(["--standby-delay", "soon", "--", "-m", "srv"])
