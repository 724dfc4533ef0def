"""A configuration change is a relaunch: the launcher reads the server's arguments and vLLM's
variables from its launch file at every (re)launch, says what it runs in its state file, and
refuses (one line, the old server keeps running) a file it cannot apply: not a launch file, a
variable other than VLLM_*, or a variable the imports read. Real processes, fake vLLM modules
(tests/launcher/fakes.py)."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest

from tests.launcher.fakes import alive, wait_state, write_launch
from warmctl.launcher import vllm_launch


def _launch(launch, tmp_path: Path, argv: list[str], env: dict[str, str] | None = None):
    path = write_launch(tmp_path / "t.launch", argv, env)
    state = tmp_path / "state.json"
    lp = launch("--preload", "heavy", "--launch-file", str(path), "--state-file", str(state),
                "--", "-m", "fakesrv")  # fmt: skip
    return lp, path, state


def _pid(line: str) -> int:
    return int(line.split()[1])


def test_a_relaunch_runs_the_launch_file_as_it_is_now(launch, tmp_path: Path) -> None:
    lp, path, state = _launch(
        launch, tmp_path, ["serve", "m", "--max-num-seqs", "4"], {"VLLM_TUNE": "a"}
    )
    (run1,) = lp.wait_for("run ", 1)
    assert run1.endswith("args serve m --max-num-seqs 4 main __main__")
    assert lp.wait_for("env ", 1)[0].endswith(" VLLM_TUNE=a")
    first = wait_state(state, 0)
    assert first["generation"] == 1 and first["server_pid"] == _pid(run1)
    assert first["argv"] == "-m fakesrv serve m --max-num-seqs 4"
    assert first["launch_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

    # a deploy changed an argument and a variable: the next server runs them, not imported again
    write_launch(path, ["serve", "m", "--max-num-seqs", "8"], {"VLLM_TUNE": "b", "VLLM_NEW": "1"})
    lp.proc.send_signal(signal.SIGHUP)
    run2 = lp.wait_for("run ", 2)[1]
    assert run2.endswith("args serve m --max-num-seqs 8 main __main__")
    assert lp.wait_for("env ", 2)[1].endswith(" VLLM_NEW=1 VLLM_TUNE=b")
    second = wait_state(state, 1)
    assert second["last"] == "relaunched" and second["generation"] == 2
    assert second["server_pid"] == _pid(run2) and not alive(_pid(run1))
    assert second["argv"] == "-m fakesrv serve m --max-num-seqs 8"
    assert second["launch_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert second["env_sha256"] == vllm_launch.env_digests({"VLLM_TUNE": "b", "VLLM_NEW": "1"})
    assert "VLLM_TUNE=b" not in state.read_text() and '"b"' not in state.read_text()

    # a variable the file no longer sets is unset in the next server
    write_launch(path, ["serve", "m"], {})
    lp.proc.send_signal(signal.SIGHUP)
    assert lp.wait_for("env ", 3)[2] == f"env {_pid(lp.wait_for('run ', 3)[2])}"
    # each server is a standby that imported vLLM (never the launcher), none imported twice
    imports = [_pid(ln) for ln in lp.lines() if ln.startswith("imported")]
    runs = [_pid(ln) for ln in lp.wait_for("run ", 3)]
    assert set(runs) <= set(imports) and lp.proc.pid not in imports
    assert len(imports) == len(set(imports))

    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0
    err = lp.stderr()
    # the argv each generation was launched with, one line each
    assert "server started (pid" in err
    assert "generation 1): -m fakesrv serve m --max-num-seqs 4" in err
    assert "generation 2): -m fakesrv serve m --max-num-seqs 8" in err


BAD_FILES = {
    "not JSON": "# warmctl instance: t\n{argv: nope}\n",
    "no argv": '{"env": {}}',
    "argv not strings": '{"argv": ["serve", 8]}',
    "unknown key": '{"argv": [], "args": []}',
    "another variable": '{"argv": [], "env": {"HF_HUB_OFFLINE": "1"}}',
    "a value not a string": '{"argv": [], "env": {"VLLM_TUNE": 1}}',
}


@pytest.mark.parametrize("bad", [*BAD_FILES, "missing"])
def test_a_bad_launch_file_keeps_the_old_server(launch, tmp_path: Path, bad: str) -> None:
    lp, path, state = _launch(launch, tmp_path, ["serve", "m"], {"VLLM_TUNE": "a"})
    (run1,) = lp.wait_for("run ", 1)
    wait_state(state, 0)
    if bad == "missing":
        path.unlink()
    else:
        path.write_text(BAD_FILES[bad])
    lp.proc.send_signal(signal.SIGHUP)
    refused = wait_state(state, 1)
    assert refused["last"] == "refused" and refused["generation"] == 1
    assert refused["server_pid"] == _pid(run1) and alive(_pid(run1))
    assert str(path) in refused["reason"] and "\n" not in refused["reason"]
    assert len(lp.wait_for("run ", 1)) == 1  # no second server

    # fixed, the next reload relaunches
    write_launch(path, ["serve", "m", "--fixed"], {"VLLM_TUNE": "a"})
    lp.proc.send_signal(signal.SIGHUP)
    assert lp.wait_for("run ", 2)[1].endswith("args serve m --fixed main __main__")
    assert wait_state(state, 2)["generation"] == 2
    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0
    lines = [ln for ln in lp.stderr().splitlines() if "relaunch refused" in ln]
    assert len(lines) == 1 and "keeps running" in lines[0] and "Traceback" not in lp.stderr()


def test_a_variable_the_imports_read_is_not_changed_by_a_relaunch(launch, tmp_path: Path) -> None:
    """The fake vLLM reads VLLM_AT_IMPORT when it is imported (as vLLM's logging reads
    VLLM_LOGGING_LEVEL) and scans the whole environment (as tqdm does): the first counts, the
    scan does not. Changing VLLM_AT_IMPORT is refused; VLLM_TUNE, read only by the server, is
    applied."""
    env = {"VLLM_AT_IMPORT": "1", "VLLM_TUNE": "a"}
    lp, path, state = _launch(launch, tmp_path, ["serve", "m"], env)
    (run1,) = lp.wait_for("run ", 1)
    first = wait_state(state, 0)
    assert first["env_imported"] == ["VLLM_AT_IMPORT"]  # not VLLM_TUNE, whatever the scan saw
    assert vllm_launch.refusal(first, {**env, "VLLM_TUNE": "b"}) is None

    write_launch(path, ["serve", "m"], {**env, "VLLM_AT_IMPORT": "2"})
    lp.proc.send_signal(signal.SIGHUP)
    refused = wait_state(state, 1)
    assert refused["last"] == "refused" and alive(_pid(run1))
    assert (
        "VLLM_AT_IMPORT changed, and vLLM read it when the launcher imported vLLM"
        in (refused["reason"])
    )
    # unsetting it is a change too
    assert vllm_launch.refusal(first, {"VLLM_TUNE": "a"}) is not None

    write_launch(path, ["serve", "m"], {**env, "VLLM_TUNE": "b"})
    lp.proc.send_signal(signal.SIGHUP)
    assert wait_state(state, 2)["last"] == "relaunched"
    assert lp.wait_for("env ", 2)[1].endswith("VLLM_AT_IMPORT=1 VLLM_TUNE=b")


def test_the_first_start_applies_the_variables_before_the_imports(launch, tmp_path: Path) -> None:
    """What a plain start would see: the imports read the launch file's value."""
    probe = tmp_path / "mods" / "probe.py"
    probe.write_text(
        "import os\n"
        "with open(os.environ['LOG'], 'a') as f:\n"
        "    f.write('at-import ' + os.environ.get('VLLM_AT_IMPORT', '-') + '\\n')\n"
    )
    path = write_launch(tmp_path / "t.launch", ["serve"], {"VLLM_AT_IMPORT": "7"})
    lp = launch("--preload", "probe", "--launch-file", str(path), "--", "-m", "fakesrv")
    lp.wait_for("run ", 1)
    # and every standby's imports after it (the next server's) see the same
    seen = lp.wait_for("at-import ", 2)
    assert set(seen) == {"at-import 7"}, seen


def test_a_bad_launch_file_at_start_is_one_line_and_exit_2(launch, tmp_path: Path) -> None:
    path = tmp_path / "t.launch"
    path.write_text(BAD_FILES["another variable"])
    lp = launch("--launch-file", str(path), "--", "-m", "fakesrv")
    assert lp.proc.wait(timeout=20) == 2
    err = lp.stderr().strip()
    assert err.startswith(f"vllm-launch: {path}: env 'HF_HUB_OFFLINE'") and "\n" not in err


def test_the_arguments_come_from_the_file_alone(launch, tmp_path: Path) -> None:
    path = write_launch(tmp_path / "t.launch", ["serve"])
    lp = launch("--launch-file", str(path), "--", "-m", "fakesrv", "--port", "1")
    assert lp.proc.wait(timeout=20) == 2
    assert "from the file alone" in lp.stderr()


def test_secret_arguments_are_masked_in_the_log_and_the_state(launch, tmp_path: Path) -> None:
    argv = ["serve", "m", "--api-key", "s3cret", "--hf-token=hf_s3cret", "--port", "1"]
    lp, _path, state = _launch(launch, tmp_path, argv)
    lp.wait_for("run ", 1)
    doc = wait_state(state, 0)
    assert doc["argv"] == "-m fakesrv serve m --api-key '***' '--hf-token=***' --port 1"
    lp.proc.send_signal(signal.SIGTERM)
    lp.proc.wait(timeout=20)
    assert "s3cret" not in lp.stderr() and "s3cret" not in state.read_text()


def test_an_unwritable_state_file_is_said_and_the_server_runs(launch, tmp_path: Path) -> None:
    path = write_launch(tmp_path / "t.launch", ["serve"])
    lp = launch("--launch-file", str(path), "--state-file", str(tmp_path / "no/such/state.json"),
                "--", "-m", "fakesrv")  # fmt: skip
    lp.wait_for("run ", 1)
    lp.proc.send_signal(signal.SIGTERM)
    assert lp.proc.wait(timeout=20) == 0
    assert "cannot write the state file" in lp.stderr()


def test_a_delayed_standby_is_forked_when_a_check_or_a_relaunch_asks(launch, tmp_path) -> None:
    """--standby-delay: no standby imports while the new server starts; a check (SIGUSR1, as
    `warmctl relaunch --check` sends) forks it at once and is answered once it has imported,
    and the relaunch then runs it."""
    path = write_launch(tmp_path / "t.launch", ["serve", "m"])
    state = tmp_path / "state.json"
    lp = launch("--preload", "heavy", "--standby-delay", "3600", "--launch-file", str(path),
                "--state-file", str(state), "--", "-m", "fakesrv")  # fmt: skip
    first = wait_state(state, 0)
    assert first["standby"] == "none" and first["standby_pid"] == 0
    assert len([ln for ln in lp.lines() if ln.startswith("imported")]) == 1  # the server's only
    lp.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    doc: dict = {}
    while time.monotonic() < deadline:
        doc = json.loads(state.read_text())
        if doc.get("checks") == 1:
            break
        time.sleep(0.05)
    assert doc["checks"] == 1 and doc["check"]["ok"] and not doc["check"]["checked"], doc
    assert doc["standby"] == "ready" and doc["standby_pid"] > 0
    write_launch(path, ["serve", "m", "--max-num-seqs", "8"])
    lp.proc.send_signal(signal.SIGHUP)
    assert wait_state(state, 1)["last"] == "relaunched"
    assert lp.wait_for("run ", 2)[1].endswith("args serve m --max-num-seqs 8 main __main__")
    assert _pid(lp.wait_for("run ", 2)[1]) == doc["standby_pid"]
