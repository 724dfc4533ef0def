"""The bad-input catalogue: the CLI, the cron windows and the server states an operator can
meet. Each case: non-zero exit, ONE clear line on stderr, no traceback, and nothing changed
(the server was not put to sleep, woken, or sent a generation; no gate flag appeared).

Inventories (argument_specs and the proxy's checks) are in test_bad_inventory.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.double import VllmDouble

TOKEN = "k-0123456789abcdef"


@dataclass
class Case:
    args: Callable[[VllmDouble, Path], list[str]]  # the warmctl command line
    needles: tuple[str, ...]  # in the one error line
    config: dict[str, Any] = field(default_factory=dict)  # the double's knobs
    code: int = 2
    usage: bool = False  # a click usage error ("Error: ..." after the usage lines)


CASES: dict[str, Case] = {
    # --- the CLI's own input
    "sleep_level_3": Case(lambda d, t: ["sleep", d.address, "--level", "3"],
                          ("'--level'", "1<=x<=2"), usage=True),
    "sleep_level_text": Case(lambda d, t: ["sleep", d.address, "--level", "deep"],
                             ("'--level'",), usage=True),
    "sleep_negative_drain": Case(lambda d, t: ["sleep", d.address, "--drain-timeout", "-1"],
                                 ("'--drain-timeout'",), usage=True),
    "wake_level_3": Case(lambda d, t: ["wake", d.address, "--level", "3"], ("'--level'",),
                         usage=True),
    "timeout_zero": Case(lambda d, t: ["status", d.address, "--timeout", "0"], ("'--timeout'",),
                         usage=True),
    "unknown_option": Case(lambda d, t: ["sleep", d.address, "--now"], ("--now",), usage=True),
    "no_host": Case(lambda d, t: ["sleep"], ("no host given",)),
    "bad_host_port": Case(lambda d, t: ["sleep", "llm-1:80x"], ("bad host 'llm-1:80x'",)),
    "port_out_of_range": Case(lambda d, t: ["wake", "llm-1:70000"], ("70000",)),
    "limit_without_inventory": Case(lambda d, t: ["status", d.address, "--limit", "web"],
                                    ("--limit needs --inventory",)),
    "missing_inventory": Case(lambda d, t: ["status", "-i", str(t / "nope.ini")], ("nope.ini",)),
    "gate_two_hosts_sleep": Case(
        lambda d, t: ["sleep", d.address, "127.0.0.1:9", "--gate", str(t / "g")],
        ("--gate belongs to one instance", "not 2")),
    "gate_two_hosts_wake": Case(
        lambda d, t: ["wake", d.address, "127.0.0.1:9", "--gate", str(t / "g")],
        ("--gate belongs to one instance",)),
    "gate_missing_folder": Case(
        lambda d, t: ["sleep", d.address, "--gate", str(t / "absent" / "g")],
        ("cannot lock the gate", "No such file")),
    "gate_is_a_folder": Case(lambda d, t: ["sleep", d.address, "--gate", str(t)],
                             ("cannot close the gate",)),
    "sleep_bad_window": Case(lambda d, t: ["sleep", d.address, "--window", "a b;c"],
                             ("--window 'a b;c'",)),
    "status_upstream_two_hosts": Case(
        lambda d, t: ["status", d.address, "127.0.0.1:9", "--upstream", d.address],
        ("--upstream belongs to one HOST",)),
    "drain_without_gate": Case(lambda d, t: ["drain", d.address], ("'--gate'",), usage=True),
    "drain_two_hosts": Case(
        lambda d, t: ["drain", d.address, "127.0.0.1:9", "--gate", str(t / "g.draining")],
        ("--gate belongs to one instance", "not 2")),
    "drain_missing_folder": Case(
        lambda d, t: ["drain", d.address, "--gate", str(t / "absent" / "g.draining")],
        ("cannot close the gate", "No such file")),
    "drain_negative_timeout": Case(
        lambda d, t: ["drain", d.address, "--gate", str(t / "g"), "--drain-timeout", "-1"],
        ("'--drain-timeout'",), usage=True),
    "warmup_zero_max_batch": Case(lambda d, t: ["warmup", d.address, "--max-batch", "0"],
                                  ("'--max-batch'",), usage=True),
    "warmup_missing_prompt_file": Case(
        lambda d, t: ["warmup", d.address, "--prompt-file", str(t / "none.txt")],
        ("prompt file", "not found")),
    "verify_negative_steady": Case(lambda d, t: ["verify", d.address, "--steady", "-2"],
                                   ("'--steady'",), usage=True),
    # --- cron windows
    "cron_minute_61": Case(lambda d, t: ["calendar", "61 * * * *"], ("minute value 61",)),
    "cron_three_fields": Case(lambda d, t: ["calendar", "0 20 *"], ("0 20 *",)),
    "cron_hour_25": Case(lambda d, t: ["calendar", "0 25 * * *"], ("hour",)),
    "cron_bad_day_name": Case(lambda d, t: ["calendar", "0 20 * * mon-xyz"], ("xyz",)),
    "cron_step_zero": Case(lambda d, t: ["calendar", "*/0 * * * *"], ("*/0",)),
    "cron_month_13": Case(lambda d, t: ["calendar", "0 0 1 13 *"], ("13",)),
    "oncalendar_garbage": Case(lambda d, t: ["calendar", "every tuesday-ish"],
                               ("every tuesday-ish",)),
    "window_bad_wake": Case(lambda d, t: ["calendar", "--in-window", "0 20 * * *", "bad"],
                            ("'bad'",)),
    # --- server states
    "sleep_cpu_server": Case(lambda d, t: ["sleep", d.address],
                             ("sleep mode is not enabled",),
                             {"device": "cpu", "sleep_mode": False}),
    "sleep_without_dev_mode": Case(lambda d, t: ["sleep", d.address], ("VLLM_SERVER_DEV_MODE",),
                                   {"dev_mode": False}),
    "wake_without_dev_mode": Case(lambda d, t: ["wake", d.address, "--no-warmup"],
                                  ("VLLM_SERVER_DEV_MODE",), {"dev_mode": False}),
    "status_needs_api_key": Case(lambda d, t: ["status", d.address], ("401",),
                                 {"api_key": TOKEN}),
    "verify_wrong_api_key": Case(
        lambda d, t: ["verify", d.address, "--api-key", "wrong", "--ready-timeout", "1"],
        ("401",), {"api_key": TOKEN}),
    "sleep_dead_engine": Case(lambda d, t: ["sleep", d.address], ("503",),
                              {"engine_dead": True}),
    "wake_dead_engine": Case(lambda d, t: ["wake", d.address], ("503",), {"engine_dead": True}),
    "warmup_asleep": Case(lambda d, t: ["warmup", d.address], ("asleep",), {"asleep": 1}),
    "sleep_drain_timeout_gate_reopened": Case(
        lambda d, t: ["sleep", d.address, "--gate", str(t / "g"), "--drain-timeout", "0.4"],
        ("not put to sleep", "--drain-timeout 0.4"), {"extra_waiting": 1}),
    "drain_only_timeout": Case(
        lambda d, t: ["sleep", d.address, "--drain-only", "--gate", str(t / "g"),
                      "--drain-timeout", "0.4"],
        ("not drained",), {"extra_waiting": 2}),
}  # fmt: skip


def test_catalogue_has_at_least_30_cases() -> None:
    print(f"bad-input catalogue: {len(CASES)} CLI/cron/server cases")
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_clear_line(run, vllm_double, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    config = dict(case.config)
    asleep = config.pop("asleep", None)
    for key, value in config.items():
        setattr(vllm_double.config, key, value)
    if asleep:
        vllm_double.put_to_sleep(asleep)
    before = snapshot(vllm_double, tmp_path)
    result = run(*case.args(vllm_double, tmp_path))
    assert result.exit_code == case.code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if case.usage:  # click: "Usage: ..." / "Try ..." / "" / "Error: <one line>"
        errors = [line for line in lines if line.startswith("Error: ")]
        assert len(errors) == 1, result.stderr
        line = errors[0]
    else:
        assert len(lines) == 1, result.stderr
        line = lines[0]
        assert line.startswith("warmctl: error: "), line
    for needle in case.needles:
        assert needle in line, (needle, line)
    assert snapshot(vllm_double, tmp_path) == before, "something changed"


def snapshot(d: VllmDouble, root: Path) -> tuple[Any, ...]:
    c = d.counters
    # an instance's sleep/wake lock (`.NAME.lock`, warmctl.sleepwake.gate.lock_path) is a
    # rendezvous that
    # stays once made (removing a lock file others may wait on races), holding no state
    files = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if not p.name.endswith(".lock")
    )
    return (d.is_sleeping, list(c.sleeps), list(c.wakes), list(c.rpcs), c.generations,
            c.prefix_resets, files)  # fmt: skip
