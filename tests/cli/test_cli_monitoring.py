"""Prometheus textfiles (--textfile-dir), journald priorities, and waits that end at once for a
host that refuses connections. Real HTTP against the loopback vLLM double."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.double import VllmDouble

from warmctl.observe.textfile import METRICS, Instance, file_name, update


def free_port() -> int:
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(path: Path) -> dict[tuple[str, frozenset], float]:
    """Every sample of a textfile, read with prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    hits = [v for (n, lbl), v in found.items() if n == name and set(labels.items()) <= lbl]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_verify_of_a_refused_port_is_one_line_within_seconds(run) -> None:
    t0 = time.monotonic()
    result = run("verify", f"127.0.0.1:{free_port()}")
    took = time.monotonic() - t0
    assert took < 10, took
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "connection refused" in result.stderr and "--wait-ready" in result.stderr


def test_verify_wait_ready_waits_for_a_starting_server(run) -> None:
    port = free_port()
    holder: dict[str, VllmDouble] = {}

    def start_later() -> None:
        time.sleep(1.0)
        holder["srv"] = VllmDouble(port=port).start()

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        args = ["--wait-ready", "--steady", "2", "--max-ratio", "100", "--json"]  # about waiting
        result = run("verify", f"127.0.0.1:{port}", *args)
        assert result.exit_code == 0, result.output
    finally:
        thread.join()
        holder["srv"].stop()


def test_help_says_which_waits(run) -> None:
    for command in ("verify", "warmup", "wake"):
        text = run(command, "--help").stdout
        assert "--wait-ready" in text and "WARMCTL_WAIT_READY" in text
    assert "WARMCTL_TEXTFILE_DIR" in run("sleep", "--help").stdout


def test_textfile_holds_what_verify_sleep_and_wake_printed(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    vllm_double.config.ttft = 0.01  # steady enough that the first/steady ratio is about 1
    tf = ["--textfile-dir", str(tmp_path), "--instance", "llm-a"]
    verify = run(
        "verify", vllm_double.address, "--steady", "3", "--max-ratio", "100", "--json", *tf
    )
    assert verify.exit_code == 0, verify.output
    [v] = json.loads(verify.stdout)["results"]
    path = tmp_path / file_name("llm-a")
    found = samples(path)
    labels = {"vllm_instance": "llm-a", "model": "double-model"}
    assert value(found, "warmctl_verify_first_ttft_seconds", **labels) == v["first_ttft_s"]
    assert value(found, "warmctl_verify_first_steady_ratio", **labels) == v["ratio"]
    assert value(found, "warmctl_verify_steady_ttft_median_seconds") == (v["steady_median_ttft_s"])
    assert value(found, "warmctl_verify_steady_ttft_p90_seconds") == (v["steady_p90_ttft_s"])
    assert value(found, "warmctl_verify_decode_seconds_per_token") == pytest.approx(
        v["decode_ms_per_token"] / 1000
    )
    assert value(found, "warmctl_verify_result", result="pass") == 1
    assert value(found, "warmctl_verify_result", result="fail") == 0
    assert value(found, "warmctl_state", state="awake") == 1

    sleep = run("sleep", vllm_double.address, "--level", "2", "--json", *tf)
    assert sleep.exit_code == 0, sleep.output
    [s] = json.loads(sleep.stdout)["results"]
    found = samples(path)
    assert value(found, "warmctl_sleep_duration_seconds") == s["total_s"]
    assert value(found, "warmctl_sleep_drain_seconds") == s["drain"]["seconds"]
    assert value(found, "warmctl_sleep_level") == 2
    assert value(found, "warmctl_state", state="asleep") == 1
    # the sleep kept what verify wrote, under the same model label
    assert value(found, "warmctl_verify_first_ttft_seconds", **labels) == v["first_ttft_s"]

    wake = run("wake", vllm_double.address, "--json", *tf)
    assert wake.exit_code == 0, wake.output
    [w] = json.loads(wake.stdout)["results"]
    found = samples(path)
    assert value(found, "warmctl_wake_duration_seconds") == w["total_s"]
    assert value(found, "warmctl_wake_level") == w["level"] == 2
    assert value(found, "warmctl_state", state="awake") == 1
    for command in ("verify", "sleep", "wake"):
        assert value(found, "warmctl_last_run_success", command=command) == 1
        assert value(found, "warmctl_last_success_timestamp_seconds", command=command) > 0
    assert "warmctl_wake_output_check_ok" not in {n for n, _ in found}  # no check ran


def test_a_failed_sleep_is_written_and_keeps_the_rest(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    vllm_double.config.ttft = 0.01
    tf = ["--textfile-dir", str(tmp_path), "--instance", "llm-a"]
    assert (
        run("verify", vllm_double.address, "--steady", "2", "--max-ratio", "100", *tf).exit_code
        == 0
    )
    assert run("sleep", vllm_double.address, *tf).exit_code == 0
    assert run("wake", vllm_double.address, "--no-warmup", *tf).exit_code == 0
    vllm_double.config.extra_waiting = 2  # a drain that never ends
    failed = run("sleep", vllm_double.address, "--drain-timeout", "0.3", *tf)
    assert failed.exit_code == 2
    found = samples(tmp_path / file_name("llm-a"))
    assert value(found, "warmctl_last_run_success", command="sleep") == 0
    last_fail = value(found, "warmctl_last_failure_timestamp_seconds", command="sleep")
    last_ok = value(found, "warmctl_last_success_timestamp_seconds", command="sleep")
    assert last_fail > last_ok
    assert value(found, "warmctl_state", state="awake") == 1  # the drain left it awake
    assert not any(n == "warmctl_sleep_duration_seconds" for n, _ in found)  # no stale value
    assert value(found, "warmctl_verify_result", result="pass") == 1


def test_verify_error_leaves_no_stale_measurement(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    vllm_double.config.ttft = 0.01
    tf = ["--textfile-dir", str(tmp_path), "--instance", "llm-a"]
    assert (
        run("verify", vllm_double.address, "--steady", "2", "--max-ratio", "100", *tf).exit_code
        == 0
    )
    assert run("verify", f"127.0.0.1:{free_port()}", *tf).exit_code == 2
    found = samples(tmp_path / file_name("llm-a"))
    assert value(found, "warmctl_verify_result", result="error") == 1
    assert value(found, "warmctl_state", state="error") == 1
    assert not any(n == "warmctl_verify_first_ttft_seconds" for n, _ in found)
    # the model the instance served is kept (the error did not tell one)
    assert value(found, "warmctl_verify_result", result="pass", model="double-model") == 0


def test_textfile_bad_input_is_one_line(run, vllm_double: VllmDouble, tmp_path: Path) -> None:
    two = run("verify", vllm_double.address, "localhost:1", "--instance", "x")
    assert two.exit_code == 2 and two.stderr.count("\n") == 1 and "--instance" in two.stderr
    not_dir = tmp_path / "file"
    not_dir.write_text("")
    for where in (not_dir, tmp_path / "missing"):
        bad = run("sleep", vllm_double.address, "--textfile-dir", str(where))
        assert bad.exit_code == 2 and "--textfile-dir" in bad.stderr
    assert not vllm_double.is_sleeping  # refused before anything was done


def test_concurrent_commands_keep_each_others_metrics(tmp_path: Path) -> None:
    who = Instance("llm-a", "h1", "m")
    commands = ["verify", "warmup", "sleep", "wake"] * 5
    threads = [
        threading.Thread(target=update, args=(tmp_path, who, c, {}), kwargs={"ok": True})
        for c in commands
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = samples(tmp_path / file_name("llm-a"))
    ran = {dict(lbl)["command"] for n, lbl in found if n == "warmctl_last_run_success"}
    assert ran == {"verify", "warmup", "sleep", "wake"}
    assert not list(tmp_path.glob("*.prom.*"))  # no temporary file left behind


def test_every_written_metric_is_declared_and_readable_by_node_exporter(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    tf = ["--textfile-dir", str(tmp_path)]
    assert run("warmup", vllm_double.address, "--batch-sizes", "1", *tf).exit_code == 0
    [path] = tmp_path.glob("*.prom")
    assert path.name == file_name(vllm_double.address)  # default instance name: HOST:PORT
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    names = {n for n, _ in samples(path)}
    assert names <= set(METRICS) and "warmctl_warmup_duration_seconds" in names


def _journal_run(args: list[str], journal: bool) -> str:
    """warmctl as systemd runs it: stdout+stderr on one stream, JOURNAL_STREAM naming it
    (or naming another stream: a child whose output was redirected)."""
    with open(os.devnull) as other, __import__("tempfile").TemporaryFile("w+") as out:
        st = os.fstat((out if journal else other).fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        code = [sys.executable, "-c", "from warmctl.cli import main; main()", *args]
        subprocess.run(code, stdout=out, stderr=out, env=env, check=False, timeout=60)
        out.seek(0)
        return out.read()


def test_journal_lines_carry_priorities(vllm_double: VllmDouble) -> None:
    vllm_double.config.extra_waiting = 1
    failed = _journal_run(["sleep", vllm_double.address, "--drain-timeout", "0.3"], True)
    assert failed.startswith("<3>warmctl: error: ") and "not put to sleep" in failed
    vllm_double.config.extra_waiting = 0
    ok = _journal_run(["sleep", vllm_double.address], True)
    assert ok.startswith("<6>") and "asleep at level 1" in ok
    asleep = _journal_run(["verify", vllm_double.address], True)
    lines = asleep.splitlines()
    assert any(line.startswith("<4>warmctl: warning: ") and "ASLEEP" in line for line in lines)
    assert all(line[:3] in ("<4>", "<6>") for line in lines), lines
    # not the journal's stream: plain lines
    plain = _journal_run(["status", vllm_double.address], False)
    assert plain and "<6>" not in plain
