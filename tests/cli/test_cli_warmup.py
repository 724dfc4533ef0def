import json
import socket
import threading
import time
from pathlib import Path

from tests.double import VllmDouble


def warm_json(run, *args: str, env: dict[str, str] | None = None) -> dict:
    result = run("warmup", *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    return report


def test_warmup_phases_and_ramp_from_server_sizes(run, vllm_double: VllmDouble) -> None:
    # long enough for each burst to overlap on the server: a loaded machine spreads a burst's
    # sends over tens of ms, never 300
    vllm_double.config.ttft = 0.3
    vllm_double.config.capture_sizes = [1, 2, 4, 8]
    report = warm_json(run, vllm_double.address)
    assert report["batch_sizes"] == [1, 2, 4, 8] and report["batch_sizes_source"] == "server"
    phases = {p["name"]: p for p in report["phases"]}
    assert list(phases) == ["ready", "prompts", "ramp", "chat"]
    assert phases["ramp"]["requests"] == 15
    assert phases["prompts"]["requests"] == report["prompts"] == 3
    assert report["prompt_source"] == "default" and report["chat"] is True
    assert all(p["seconds"] >= 0 for p in report["phases"])
    assert len(phases["ramp"]["ttfts_s"]) == 15  # raw samples kept
    c = vllm_double.counters
    assert c.max_in_flight == 8 and {1, 2, 4, 8} <= c.concurrency_seen
    assert c.chat_generations == 3 and c.completed == c.generations == 3 + 15 + 3


def test_warmup_batch_sizes_option_and_defaults(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.ttft = 0.3  # a burst overlaps on the server, even on a loaded machine
    report = warm_json(run, vllm_double.address, "--batch-sizes", "3,1", "--no-chat")
    assert report["batch_sizes"] == [1, 3] and report["batch_sizes_source"] == "--batch-sizes"
    assert vllm_double.counters.max_in_flight == 3 and vllm_double.counters.chat_generations == 0
    vllm_double.config.ttft = 0.0
    vllm_double.config.dev_mode = False  # no /server_info: the defaults
    report = warm_json(run, vllm_double.address, "--no-chat", "--max-tokens", "2")
    assert (
        report["batch_sizes"] == [1, 2, 4, 8, 16, 32] and report["batch_sizes_source"] == "default"
    )


def test_warmup_prompt_sources(run, vllm_double: VllmDouble, tmp_path: Path) -> None:
    def prompts_sent(*args: str, env: dict[str, str] | None = None) -> set[str]:
        vllm_double.counters.prompts.clear()
        warm_json(run, vllm_double.address, "--batch-sizes", "1", "--no-chat", *args, env=env)
        return {p.split("] ", 1)[-1] for p in vllm_double.counters.prompts}

    assert prompts_sent("--prompt", "alpha", "--prompt", "beta") == {"alpha", "beta"}
    f = tmp_path / "prompts.txt"
    f.write_text("from file one\n\nfrom file two\n")
    assert prompts_sent("--prompt-file", str(f)) == {"from file one", "from file two"}
    assert prompts_sent(env={"WARMCTL_PROMPTS": '["env a", "env b"]'}) == {"env a", "env b"}
    assert prompts_sent(env={"VLLM_PREWARM_PROMPT": "copied from an article"}) == {
        "copied from an article"
    }


def test_warmup_default_prompts_fit_a_small_model(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.max_model_len = 300  # the double answers 400 to anything longer
    report = warm_json(run, vllm_double.address, "--batch-sizes", "1")
    assert report["max_model_len"] == 300 and report["prompts"] >= 2


def test_warmup_skips_chat_without_template(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.chat_template = False
    report = warm_json(run, vllm_double.address, "--batch-sizes", "1")
    assert report["chat"] is False and "no chat template" in report["chat_note"]
    forced = run("warmup", vllm_double.address, "--batch-sizes", "1", "--chat")
    assert forced.exit_code == 2 and "chat template" in forced.stderr


def test_warmup_waits_until_models_listed(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.not_ready_until = time.monotonic() + 1.0
    t0 = time.monotonic()
    report = warm_json(run, vllm_double.address, "--batch-sizes", "1")
    assert time.monotonic() - t0 >= 1.0
    assert report["phases"][0]["name"] == "ready" and report["phases"][0]["seconds"] >= 0.9
    # nothing was generated while the server said it was not ready
    assert vllm_double.counters.generations == report["requests"]


def test_warmup_waits_for_a_server_that_is_not_listening_yet(run) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    holder: dict[str, VllmDouble] = {}

    def start_later() -> None:
        time.sleep(1.0)
        holder["srv"] = VllmDouble(port=port).start()

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        result = run(
            "warmup", f"127.0.0.1:{port}", "--wait-ready", "--batch-sizes", "1", "--no-chat"
        )
        assert result.exit_code == 0, result.output
        assert "warm in" in result.stdout
    finally:
        thread.join()
        holder["srv"].stop()


def test_warmup_reports_a_refused_port_at_once_without_wait_ready(run) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    result = run("warmup", f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 10
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "connection refused" in result.stderr
    assert "--wait-ready" in result.stderr  # says how to wait for a starting server


def test_warmup_gives_up_after_ready_timeout(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.not_ready_until = time.monotonic() + 60
    result = run("warmup", vllm_double.address, "--ready-timeout", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith("warmctl: error: ") and "not ready after 1 s" in result.stderr
    assert result.stderr.count("\n") == 1


def test_warmup_table_and_no_progress_when_not_a_terminal(run, vllm_double: VllmDouble) -> None:
    result = run("warmup", vllm_double.address, "--batch-sizes", "1,2")
    assert result.exit_code == 0
    for needle in ("PHASE", "ready", "prompts", "ramp", "chat", "batch sizes 1,2 (--batch-sizes)"):
        assert needle in result.stdout
    assert result.stderr == ""


def test_warmup_missing_prompt_file_contacts_nobody(run, vllm_double: VllmDouble) -> None:
    result = run("warmup", vllm_double.address, "--prompt-file", "/nonexistent/prompts.txt")
    assert result.exit_code == 2
    assert result.stderr == "warmctl: error: prompt file '/nonexistent/prompts.txt' not found\n"
    assert vllm_double.counters.requests == []


def test_warmup_on_cpu_ignores_capture_sizes(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.device = "cpu"
    vllm_double.config.capture_sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    vllm_double.config.max_num_seqs = 8
    report = warm_json(run, vllm_double.address, "--no-chat", "--max-tokens", "2")
    assert report["batch_sizes"] == [1, 2, 4, 8] and report["batch_sizes_source"] == "default"


def test_warmup_progress_on_a_terminal(vllm_double: VllmDouble) -> None:
    """On a terminal, rich progress goes to stderr (the summary table still goes to stdout)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from warmctl.cli import main; main()",
            "warmup",
            vllm_double.address,
            "--batch-sizes",
            "1,2",
            "--no-chat",
        ],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    seen = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0
    assert "ramp" in seen and "127.0.0.1" in seen  # the progress line named host and phase
    assert b"PHASE" in out


def test_warmup_stops_when_the_server_process_is_gone(monkeypatch):
    """systemd's ExecStartPost gets $MAINPID: a server killed during its warmup must not keep
    the warmup (and so the unit) waiting for the whole ready timeout."""
    import socket
    import subprocess
    import time

    from click.testing import CliRunner

    from warmctl.cli import cli

    dead = subprocess.Popen(["true"])
    dead.wait()
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MAINPID", str(dead.pid))
    t0 = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["warmup", f"127.0.0.1:{port}", "--wait-ready", "--ready-timeout", "120"],
        catch_exceptions=False,
    )
    took = time.monotonic() - t0
    assert result.exit_code == 2, result.output
    assert "the server process exited before it was ready" in result.output
    assert "Traceback" not in result.output
    assert took < 30, took


def test_warmup_prompt_tokens_from_tune(run, vllm_double: VllmDouble) -> None:
    """`--prompt-tokens` (what `warmctl tune` writes into warmup_args): one prompt per length,
    after any --prompt, each sent once and then over the ramp."""
    report = warm_json(
        run, vllm_double.address, "--prompt", "hi", "--prompt-tokens", "100,500", "--no-chat"
    )
    assert report["prompts"] == 3
    assert report["prompt_source"] == (
        "--prompt + --prompt-tokens 100,500 (1.00 tokens/word from /tokenize)"
    )
    # sized with the server's tokenizer (the double's: one token a word)
    sent = vllm_double.counters.prompts[:3]
    assert [len(p.split()) for p in sent] == [1, 100, 500]
    # never longer than max_model_len allows (4096 - 16 generated - 16)
    warm_json(run, vllm_double.address, "--prompt-tokens", "9000", "--no-chat")
    assert 4096 - 16 - 16 in [len(p.split()) for p in vllm_double.counters.prompts]
    result = run("warmup", vllm_double.address, "--prompt-tokens", "0")
    assert result.exit_code == 2 and "bad prompt tokens '0'" in result.stderr
