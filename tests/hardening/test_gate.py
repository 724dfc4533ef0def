"""The traffic gate: `warmctl sleep/wake --gate FILE` and `warmctl.sleepwake.gate`."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.hardening.conftest import one_error_line
from warmctl.errors import WarmctlError
from warmctl.sleepwake.gate import Gate, behind_closed_gate


def test_gate_open_close_is_idempotent(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "tiny.closed")
    assert not gate.is_closed()
    assert gate.close("sleep") is True
    assert gate.close("sleep") is False
    assert gate.is_closed()
    assert "sleep at " in gate.path.read_text()
    assert gate.open() is True
    assert gate.open() is False
    assert not gate.is_closed()
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_gate_in_missing_folder_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WarmctlError, match=r"cannot close the gate .*No such file"):
        Gate(tmp_path / "absent" / "x.closed").close()


def test_failed_action_puts_the_gate_back(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "g")

    def boom() -> None:
        assert gate.is_closed()  # closed while the action runs
        raise WarmctlError("drain timed out", kind="drain_timeout")

    with pytest.raises(WarmctlError):
        behind_closed_gate(gate, boom)
    assert not gate.is_closed()
    gate.close()  # closed before: stays closed after a failure
    with pytest.raises(WarmctlError):
        behind_closed_gate(gate, boom)
    assert gate.is_closed()


def test_sleep_closes_the_gate_before_draining_and_wake_opens_it(
    run, vllm_double, tmp_path: Path
) -> None:
    gate = tmp_path / "tiny.closed"
    vllm_double.config.token_delay = 0.05
    seen: list[bool] = []
    original = vllm_double.metrics_text

    def spy() -> bytes:  # the drain polls /metrics: the gate must already be closed
        seen.append(gate.exists())
        return original()

    vllm_double.metrics_text = spy  # type: ignore[method-assign]
    result = run("sleep", vllm_double.address, "--gate", str(gate))
    assert result.exit_code == 0, result.output
    assert seen and all(seen)
    assert gate.exists() and vllm_double.is_sleeping
    result = run("wake", vllm_double.address, "--gate", str(gate), "--no-warmup")
    assert result.exit_code == 0, result.output
    assert not gate.exists() and not vllm_double.is_sleeping


def test_sleep_when_asleep_and_wake_when_awake_are_no_ops(run, vllm_double, tmp_path) -> None:
    gate = tmp_path / "g"
    assert run("sleep", vllm_double.address, "--gate", str(gate)).exit_code == 0
    again = run("sleep", vllm_double.address, "--gate", str(gate))
    assert again.exit_code == 0 and "already asleep" in again.output
    assert vllm_double.counters.sleeps == [1] and gate.exists()
    assert run("wake", vllm_double.address, "--gate", str(gate), "--no-warmup").exit_code == 0
    again = run("wake", vllm_double.address, "--gate", str(gate), "--no-warmup")
    assert again.exit_code == 0 and "already awake" in again.output
    assert len(vllm_double.counters.wakes) == 1 and not gate.exists()


def test_drain_timeout_reopens_the_gate_and_leaves_the_server_awake(
    run, vllm_double, tmp_path
) -> None:
    gate = tmp_path / "g"
    vllm_double.config.extra_waiting = 1  # a request that never finishes
    result = run("sleep", vllm_double.address, "--gate", str(gate), "--drain-timeout", "0.5")
    one_error_line(result, "not put to sleep", "--drain-timeout 0.5")
    assert not gate.exists()
    assert not vllm_double.is_sleeping and vllm_double.counters.sleeps == []


def test_drain_only_closes_the_gate_and_never_posts_sleep(run, vllm_double_factory, tmp_path):
    cpu = vllm_double_factory(device="cpu", sleep_mode=False, dev_mode=False)
    gate = tmp_path / "g"
    result = run("sleep", cpu.address, "--gate", str(gate), "--drain-only")
    assert result.exit_code == 0, result.output
    assert "drained" in result.output and gate.exists()
    assert cpu.counters.sleeps == [] and not any(
        p.startswith("/sleep") for _, p in cpu.counters.requests
    )


def test_failed_wake_keeps_the_gate_closed(run, vllm_double, tmp_path) -> None:
    gate = tmp_path / "g"
    Gate(gate).close()
    vllm_double.config.engine_dead = True
    one_error_line(run("wake", vllm_double.address, "--gate", str(gate), "--no-warmup"))
    assert gate.exists()


def test_in_flight_stream_finishes_while_the_gate_is_closed(run, vllm_double, tmp_path) -> None:
    """The sleep waits for a live stream: it completes, then the server sleeps."""
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    vllm_double.config.token_delay = 0.05
    done: list[int] = []

    def client_stream() -> None:
        r = stream_completion(
            Client(parse_target(vllm_double.address)), "double-model", "hi", max_tokens=30
        )
        done.append(r.tokens)

    t = threading.Thread(target=client_stream)
    t.start()
    vllm_double.wait_for(lambda: vllm_double.counters.in_flight == 1, "the stream in flight")
    result = run("sleep", vllm_double.address, "--gate", str(tmp_path / "g"))
    t.join(30)
    assert result.exit_code == 0, result.output
    assert done == [30]
    assert vllm_double.counters.aborted == 0 and vllm_double.counters.sleep_with_in_flight == 0
