"""`warmctl sleep --output-check FILE` records greedy answers; `warmctl wake --output-check FILE`
replays them after the reload and before the gate opens, and fails loudly when they differ."""

from __future__ import annotations

import json
from pathlib import Path

from tests.double import VllmDouble

from warmctl.server.client import Client
from warmctl.server.target import parse_target
from warmctl.sleepwake.outputcheck import PROMPTS, ask


def _sleep(run, srv: VllmDouble, check: Path, *extra: str):
    return run("sleep", srv.address, "--output-check", str(check), *extra)


def test_sleep_records_the_greedy_answers_before_sleeping(run, vllm_double, tmp_path) -> None:
    check = tmp_path / "state" / "outputs.json"
    result = _sleep(run, vllm_double, check, "--json")
    assert result.exit_code == 0, result.output
    rec = json.loads(check.read_text())
    assert rec["model"] == "double-model" and len(rec["answers"]) == len(PROMPTS)
    assert [a["prompt"] for a in rec["answers"]] == list(PROMPTS)
    assert all(len(a["token_ids"]) == rec["max_tokens"] for a in rec["answers"])
    assert all(len(a["logprobs"]) == rec["max_tokens"] for a in rec["answers"])
    assert oct(check.stat().st_mode & 0o777) == "0o600"
    # recorded on the drained server, before /sleep: every answer came while awake
    assert vllm_double.counters.answers == len(PROMPTS) and vllm_double.counters.sleeps == [1]
    [report] = json.loads(result.stdout)["results"]
    assert report["output_check"]["status"] == "recorded"
    assert [s["name"] for s in report["steps"]][:2] == ["drain", "record outputs"]


def test_wake_replays_them_and_opens_the_gate(run, vllm_double, tmp_path) -> None:
    check, gate = tmp_path / "outputs.json", tmp_path / "m.closed"
    assert _sleep(run, vllm_double, check, "--level", "2", "--gate", str(gate)).exit_code == 0
    assert gate.exists()
    result = run(
        "wake", vllm_double.address, "--output-check", str(check), "--gate", str(gate), "--json"
    )
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    oc = report["output_check"]
    assert oc["status"] == "passed" and oc["prompts"] == len(PROMPTS)
    assert oc["max_logprob_diff"] == 0.0
    names = [s["name"] for s in report["steps"]]
    # after the level-2 reload, before the warmup
    assert names.index("reload_weights") < names.index("check outputs") < names.index("warmup")
    assert not gate.exists()
    assert vllm_double.counters.garbage_outputs == 0


def test_a_corrupted_answer_fails_the_wake_and_keeps_the_gate_closed(
    run, vllm_double, tmp_path
) -> None:
    check, gate = tmp_path / "outputs.json", tmp_path / "m.closed"
    assert _sleep(run, vllm_double, check, "--gate", str(gate)).exit_code == 0
    vllm_double.config.corrupt_answers = True  # the woken engine answers one token differently
    result = run("wake", vllm_double.address, "--output-check", str(check), "--gate", str(gate))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "answers differently than before the sleep" in lines[0]
    assert "prompt 1 of 3 token 3 is id" in lines[0] and "the gate stays closed" in lines[0]
    assert "Traceback" not in result.output
    assert gate.exists()  # clients keep getting 503 + Retry-After, not corrupted text
    assert not vllm_double.is_sleeping  # awake, but not let through


def test_weights_not_reloaded_after_level_2_are_caught(run, vllm_double, tmp_path) -> None:
    """The double answers garbage after a level-2 sleep until reload_weights: a wake that
    skips the reload (the bare /wake_up) is what the check is for."""
    check = tmp_path / "outputs.json"
    assert _sleep(run, vllm_double, check, "--level", "2").exit_code == 0
    client = Client(parse_target(vllm_double.address))
    client.wake_up()  # no reload: the weights are garbage
    result = run("wake", vllm_double.address, "--output-check", str(check), "--no-warmup")
    assert result.exit_code == 2
    assert "answers differently" in result.stderr
    assert vllm_double.counters.garbage_outputs == len(PROMPTS) - 2  # stopped at the first


def test_logprobs_moved_beyond_the_tolerance_fail(run, vllm_double, tmp_path) -> None:
    check = tmp_path / "outputs.json"
    assert _sleep(run, vllm_double, check).exit_code == 0
    vllm_double.config.logprob_drift = 0.2  # same tokens, different numbers
    failed = run("wake", vllm_double.address, "--output-check", str(check), "--no-warmup")
    assert failed.exit_code == 2 and "logprobs moved by up to 0.2" in failed.stderr
    vllm_double.config.logprob_drift = 0.01
    ok = run("wake", vllm_double.address, "--output-check", str(check), "--no-warmup")
    assert ok.exit_code == 0, ok.output
    assert "outputs checked: 3 greedy answers as before the sleep" in ok.stdout
    loose = "--output-tolerance"
    vllm_double.config.logprob_drift = 0.2
    assert (
        run(
            "wake", vllm_double.address, "--output-check", str(check), loose, "0.5", "--no-warmup"
        ).exit_code
        == 0
    )


def test_no_recording_is_said_not_hidden(run, vllm_double, tmp_path) -> None:
    vllm_double.put_to_sleep(1)
    check = tmp_path / "never-written.json"
    result = run("wake", vllm_double.address, "--output-check", str(check), "--no-warmup")
    assert result.exit_code == 0, result.output
    assert "outputs NOT checked: no recording: not checked" in result.stdout


def test_the_file_comes_from_the_environment_too(run, vllm_double, tmp_path) -> None:
    check = tmp_path / "env.json"
    env = {"WARMCTL_OUTPUT_CHECK": str(check)}
    assert run("sleep", vllm_double.address, env=env).exit_code == 0
    assert check.exists()
    result = run("wake", vllm_double.address, "--no-warmup", env=env)
    assert result.exit_code == 0 and "outputs checked" in result.stdout


def test_bad_inputs_are_one_line(run, vllm_double, vllm_double_factory, tmp_path) -> None:
    other = vllm_double_factory()
    result = run("sleep", vllm_double.address, other.address, "--output-check", str(tmp_path / "x"))
    assert result.exit_code == 2 and "exactly one HOST" in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = run("wake", vllm_double.address, "--output-check", str(broken), "--no-warmup")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    unwritable = tmp_path / "file-not-dir"
    unwritable.write_text("")
    result = run("sleep", vllm_double.address, "--output-check", str(unwritable / "x.json"))
    assert result.exit_code == 2 and "the output recording" in result.stderr
    assert "Not a directory" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not vllm_double.is_sleeping  # not put to sleep without its recording


def test_ask_returns_what_vllm_returns(vllm_double) -> None:
    client = Client(parse_target(vllm_double.address))
    a = ask(client, "double-model", "same prompt", 5)
    b = ask(client, "double-model", "same prompt", 5)
    assert a == b and a.token_ids is not None and len(a.token_ids) == 5
    assert a.text.startswith(" t")


def test_after_a_failed_check_no_sleep_records_until_a_check_passes(
    run, vllm_double, tmp_path
) -> None:
    """A server that woke wrong would record its wrong answers at the next sleep and pass the
    next wake: the failed check is kept in the file, and sleeps refuse until a check passes."""
    check, gate = tmp_path / "outputs.json", tmp_path / "m.closed"
    assert _sleep(run, vllm_double, check, "--gate", str(gate)).exit_code == 0
    vllm_double.config.corrupt_answers = True
    woke = run("wake", vllm_double.address, "--output-check", str(check), "--gate", str(gate))
    assert woke.exit_code == 2
    assert "prompt 1 of 3 token 3" in json.loads(check.read_text())["failed"]
    refused = _sleep(run, vllm_double, check, "--gate", str(gate))
    assert refused.exit_code == 2 and "the last wake failed its output check" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not vllm_double.is_sleeping and gate.exists()  # still awake, still gated
    vllm_double.config.corrupt_answers = False  # the operator restarted the instance
    again = run("wake", vllm_double.address, "--output-check", str(check), "--gate", str(gate))
    assert again.exit_code == 0, again.output
    assert "outputs checked" in again.stdout and not gate.exists()
    assert json.loads(check.read_text())["failed"] == ""
    assert _sleep(run, vllm_double, check).exit_code == 0  # sleeps record again


def test_a_recording_that_cannot_be_written_keeps_the_server_awake(
    run, vllm_double, tmp_path, monkeypatch
) -> None:
    import os

    from warmctl.sleepwake import outputcheck

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputcheck.os, "replace", refuse)
    check = tmp_path / "outputs.json"
    result = run("sleep", vllm_double.address, "--output-check", str(check))
    assert result.exit_code == 2
    assert "cannot write the output recording" in result.stderr and "not put to sleep" in (
        result.stderr
    )
    assert not vllm_double.is_sleeping and not check.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".outputs")]  # no temp left
