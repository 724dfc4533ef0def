"""Why an instance sleeps or wakes: `--cause` in the metrics and the gate flag's text, `wake
--gate` repeated (the asleep and the wakeable flag), and `status --gate-dir` reading it back.
Against the loopback vLLM double."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tests.double import VllmDouble


def samples(path: Path) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }


def test_cause_labels_the_metrics_and_the_counters_add_up(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    tf = ["--textfile-dir", str(tmp_path), "--instance", "tiny"]
    a = vllm_double.address
    assert run("sleep", a, "--cause", "idle", *tf).exit_code == 0
    assert run("wake", a, "--cause", "request", "--no-warmup", *tf).exit_code == 0
    assert run("sleep", a, "--cause", "idle", *tf).exit_code == 0
    assert run("wake", a, "--no-warmup", *tf).exit_code == 0  # by hand: manual
    vllm_double.config.extra_waiting = 1
    assert run("sleep", a, "--cause", "window", "--drain-timeout", "0.2", *tf).exit_code == 2
    found = samples(tmp_path / "warmctl_tiny.prom")

    def counted(name: str, cause: str, result: str) -> float:
        return next((v for (n, lbl), v in found.items() if n == name
                     and ("cause", cause) in lbl and ("result", result) in lbl), 0.0)  # fmt: skip

    assert counted("warmctl_sleeps_total", "idle", "ok") == 2
    assert counted("warmctl_sleeps_total", "window", "failed") == 1
    assert counted("warmctl_wakes_total", "request", "ok") == 1
    assert counted("warmctl_wakes_total", "manual", "ok") == 1
    # the last wake's figures carry its cause (the failed sleep left no sleep figures)
    [(wake_labels, _)] = [(lbl, v) for (n, lbl), v in found.items()
                          if n == "warmctl_wake_duration_seconds"]  # fmt: skip
    assert ("cause", "manual") in wake_labels
    assert not any(n == "warmctl_sleep_duration_seconds" for n, _ in found)
    bad = run("sleep", a, "--cause", "sometimes")
    assert bad.exit_code == 2 and "sometimes" in bad.stderr


def test_the_sleep_writes_why_into_its_flag_and_status_reads_it(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    gates = tmp_path / "gate"
    gates.mkdir()
    wakeable = gates / "tiny.wakeable"
    before = time.time()
    slept = run("sleep", vllm_double.address, "--gate", str(wakeable), "--cause", "idle")
    assert slept.exit_code == 0, slept.output
    text = wakeable.read_text()
    assert text.startswith("sleep cause=idle level=1 at "), text
    local = ["--gate-dir", str(gates), "--instance", "tiny"]
    status = run("status", vllm_double.address, *local, "--json")
    [report] = json.loads(status.stdout)["results"]
    assert status.exit_code == 0, status.output
    assert report["gate"]["state"] == "asleep" and report["gate"]["cause"] == "idle"
    assert report["gate"]["since"] >= before - 1 and report["wakes_on_request"]
    table = run("status", vllm_double.address, *local)
    assert (
        "asleep (level 1) since " in table.stdout and "(idle; a request wakes it)" in table.stdout
    )
    # a window that refuses: the closed flag, stronger
    closed = gates / "tiny.closed"
    assert (
        run("sleep", vllm_double.address, "--gate", str(closed), "--cause", "window").exit_code == 0
    )
    table = run("status", vllm_double.address, *local)
    assert "(window; requests refused)" in table.stdout, table.stdout
    # the wake opens both, only after it succeeded
    woke = run("wake", vllm_double.address, "--gate", str(closed), "--gate", str(wakeable),
               "--cause", "request", "--no-warmup")  # fmt: skip
    assert woke.exit_code == 0, woke.output
    assert not closed.exists() and not wakeable.exists()
    assert "awake" in run("status", vllm_double.address, *local).stdout


def test_wake_gates_stay_closed_when_the_wake_fails_and_open_when_already_awake(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    flags = [tmp_path / "tiny.closed", tmp_path / "tiny.wakeable"]
    for f in flags:
        f.write_text("sleep\n")
    vllm_double.put_to_sleep(1)
    vllm_double.config.engine_dead = True
    gates = [x for f in flags for x in ("--gate", str(f))]
    failed = run("wake", vllm_double.address, *gates, "--no-warmup")
    assert failed.exit_code == 2
    assert all(f.exists() for f in flags)
    vllm_double.config.engine_dead = False
    with vllm_double.lock:
        vllm_double.awake_tags = {"weights", "kv_cache"}  # awake already (woken by hand)
    again = run("wake", vllm_double.address, *gates, "--no-warmup")
    assert again.exit_code == 0 and "already awake" in again.stdout
    assert not any(f.exists() for f in flags)


def test_gates_belong_to_one_instance(run, vllm_double_factory, tmp_path: Path) -> None:
    one, two = vllm_double_factory(), vllm_double_factory()
    result = run("wake", one.address, two.address, "--gate", str(tmp_path / "a"), "--gate",
                 str(tmp_path / "b"))  # fmt: skip
    assert result.exit_code == 2 and "exactly one HOST" in result.stderr
    status = run("status", one.address, two.address, "--gate-dir", str(tmp_path))
    assert status.exit_code == 2 and "--gate-dir needs --instance" in status.stderr


def test_status_of_an_instance_asleep_the_cpu_way_is_no_error(run, tmp_path: Path) -> None:
    """CPU: asleep is the unit stopped; its flag says so and since when."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "tiny.wakeable").write_text("sleep cause=idle at now\n")
    result = run("status", f"127.0.0.1:{port}", "--gate-dir", str(tmp_path), "--instance", "tiny")
    assert result.exit_code == 0, result.output
    assert "asleep (stopped)" in result.stdout and "(idle; a request wakes it)" in result.stdout


def test_one_sleep_or_wake_of_an_instance_at_a_time(
    vllm_double: VllmDouble, tmp_path: Path
) -> None:
    """A wake asked while the instance's sleep still runs (a request during an idle sleep's
    drain) waits for it: it then finds the server asleep and wakes it, instead of opening the
    gate of a server the sleep is about to put to sleep."""
    import fcntl
    import os
    import subprocess
    import sys

    from tests.double import wait_until

    wakeable = tmp_path / "tiny.wakeable"
    wakeable.write_text("sleep cause=idle\n")
    lock = os.open(tmp_path / ".tiny.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a sleep of tiny runs
    warmctl = str(Path(sys.executable).parent / "warmctl")
    wake = subprocess.Popen(
        [warmctl, "wake", vllm_double.address, "--gate", str(wakeable), "--no-warmup"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wake.stderr is not None
        said = wake.stderr.readline()
        assert "waiting for another sleep or wake of this instance" in said, said
        vllm_double.put_to_sleep(1)  # the sleep ends: asleep
        assert wakeable.exists() and vllm_double.counters.wakes == []
    finally:
        os.close(lock)
    out, err = wake.communicate(timeout=60)
    assert wake.returncode == 0, out + err
    wait_until(lambda: not wakeable.exists(), "the gate opened")
    assert vllm_double.counters.wakes == [()] and not vllm_double.is_sleeping
    assert "awake after level 1" in out
