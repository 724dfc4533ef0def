"""Every fault the operator can meet: one line on stderr, exit 2, no traceback."""

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.double import VllmDouble

COMMANDS = {
    "status": [],
    "warmup": ["--ready-timeout", "1"],
    "sleep": [],
    "wake": ["--no-warmup"],
    "verify": ["--ready-timeout", "1"],
}


@pytest.fixture
def silent_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check_one_line(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warmctl: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


Fault = Callable[[VllmDouble, int], tuple[str, list[str], tuple[str, ...]]]
FAULTS: dict[str, Fault] = {
    "refused": lambda d, p: (f"127.0.0.1:{closed_port()}", [], ("connection refused",)),
    "dns": lambda d, p: ("no-such-host.invalid:8000", [], ("DNS failure",)),
    "timeout": lambda d, p: (f"127.0.0.1:{p}", ["--timeout", "0.3"], ("timed out",)),
    "tls": lambda d, p: (f"https://127.0.0.1:{d.port}", [], ("TLS error",)),
    "malformed": lambda d, p: ("llm-1:80x", [], ("bad host 'llm-1:80x'",)),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_transport_faults(run, vllm_double, silent_port, command: str, fault: str) -> None:
    host, extra, needles = FAULTS[fault](vllm_double, silent_port)
    check_one_line(run(command, host, *COMMANDS[command], *extra), *needles)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_auth_required(run, vllm_double: VllmDouble, command: str) -> None:
    vllm_double.config.api_key = "k"
    if command in ("sleep", "wake"):
        vllm_double.config.extra_waiting = 0
        # vLLM guards only /v1/*: sleep/wake talk to unguarded routes; wake's warmup does not
        result = run(command, vllm_double.address, "--level", "1")
        if command == "wake":
            check_one_line(run("wake", vllm_double.address), "--api-key", "VLLM_API_KEY")
        else:
            assert result.exit_code == 0
        return
    check_one_line(run(command, vllm_double.address, *COMMANDS[command]), "--api-key")


@pytest.mark.parametrize("command", ["status", "sleep", "wake"])
def test_dev_routes_missing(run, vllm_double: VllmDouble, command: str) -> None:
    vllm_double.config.dev_mode = False
    result = run(command, vllm_double.address, *COMMANDS[command])
    if command == "status":
        assert result.exit_code == 0  # status shows "unknown (dev mode off)"
        return
    check_one_line(result, "VLLM_SERVER_DEV_MODE=1", "--enable-sleep-mode")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_dead_engine(run, vllm_double: VllmDouble, command: str) -> None:
    vllm_double.config.engine_dead = True
    check_one_line(run(command, vllm_double.address, *COMMANDS[command]), "engine dead", "HTTP 5")
    assert vllm_double.counters.sleeps == [] and vllm_double.counters.wakes == []


def test_missing_prompt_file(run, vllm_double: VllmDouble) -> None:
    check_one_line(run("warmup", vllm_double.address, "--prompt-file", "nope.txt"), "not found")
    check_one_line(run("wake", vllm_double.address, "--prompt-file", "nope.txt"), "not found")


def test_inventory_problems(run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.ini"
    bad.write_text("[vllm\nhost-1 ansible_host=\n")
    check_one_line(run("verify", "--inventory", str(bad)), "does not parse")
    check_one_line(run("status", "--inventory", str(tmp_path / "none.ini")), "not found")
    check_one_line(run("verify", "--limit", "x"), "--limit needs --inventory")


def test_no_host_at_all(run) -> None:
    check_one_line(run("status"), "no host given")
    check_one_line(run("verify"), "no host given")
