"""The pieces `warmctl verify --inventory` and the role vllm_verify share: a host's verify argv,
the reading of what the host answered, the fleet's table; and the first-vs-steady measurement
verify and the bench share."""

from __future__ import annotations

import json

from warmctl.observe.fleet import host_results, role_options, verify_argv
from warmctl.observe.verify_table import COLUMNS, fleet_lines
from warmctl.warmth.firststeady import first_then_steady, first_vs_steady


def test_verify_argv_writes_flags_numbers_and_leaves_out_unset() -> None:
    argv = verify_argv(
        "/opt/warmctl/bin/warmctl",
        ["127.0.0.1:8000"],
        {"max_ratio": 3.0, "attempts": 2, "model": None, "asleep_ok": True, "steady": False},
        wait_ready=True,
        as_json=True,
    )
    assert argv == [
        "/opt/warmctl/bin/warmctl", "verify", "--wait-ready", "--json", "127.0.0.1:8000",
        "--max-ratio", "3", "--attempts", "2", "--asleep-ok",
    ]  # fmt: skip


def test_role_options_keep_warmctl_defaults_out() -> None:
    none = role_options({"max_first_ttft": 0, "max_ratio": 0, "attempts": 1, "asleep_ok": False})
    assert verify_argv("w", ["h:1"], none) == ["w", "verify", "h:1"]
    some = role_options(
        {"max_first_ttft": 0.5, "max_ratio": 3, "attempts": 2, "asleep_ok": True,
         "textfile_dir": "/var/lib/tf", "instance": "a"}
    )  # fmt: skip
    assert verify_argv("w", ["h:1"], some)[3:] == [
        "--max-first-ttft", "0.5", "--max-ratio", "3", "--attempts", "2", "--asleep-ok",
        "--textfile-dir", "/var/lib/tf", "--instance", "a",
    ]  # fmt: skip
    # an instance name without a textfile directory is not passed
    assert "--instance" not in verify_argv("w", [], role_options({"instance": "a"}))


def test_host_results_relabel_or_say_why_in_one_line() -> None:
    payload = {"results": [{"target": "127.0.0.1:8000", "status": "ERROR", "reasons": [],
                            "error": "127.0.0.1:8000: connection refused"}]}  # fmt: skip
    [r] = host_results("h", ["h/a"], {"rc": 2, "stdout": json.dumps(payload)})
    assert r["target"] == "h/a" and r["error"] == "h/a: connection refused"
    assert r["measured_from"] == "host"
    [r] = host_results("h", ["h/a"], {"rc": 2, "stdout": "", "stderr": "x\nwarmctl: not found\n"})
    assert r["status"] == "ERROR" and r["error"] == (
        "h: warmctl verify on the host failed: warmctl: not found"
    )
    both = host_results("h", ["h/a", "h/b"], {"stdout": json.dumps(payload)})
    assert all("answered 1 results, not 2" in r["error"] for r in both)


def test_fleet_lines_are_aligned_columns_a_row_per_instance() -> None:
    ok = {"instance": "a", "target": "good/a", "status": "PASS", "first_ttft_s": 0.0118,
          "steady_median_ttft_s": 0.0117, "ratio": 1.01, "reasons": []}  # fmt: skip
    bad = {"instance": "b", "target": "bad/b", "status": "FAIL", "first_ttft_s": 0.3,
           "ratio": 25.6, "reasons": ["first/steady TTFT 25.60x > 2x"], "attempt": 2,
           "earlier_attempts": [{"reasons": ["slow"]}]}  # fmt: skip
    header, first, second = fleet_lines({"good": [ok], "bad": [bad]})
    assert header.split()[:3] == ["HOST", "INSTANCE", "RESULT"] and COLUMNS[-1] == "WHY"
    assert first.split()[:4] == ["good", "a", "PASS", "11.8"] and "1.01x" in first
    assert second.startswith("bad ") and "FAIL (attempt 2)" in second
    assert second.endswith("attempt 1: slow | attempt 2: first/steady TTFT 25.60x > 2x")
    assert first.index("PASS") == second.index("FAIL") == header.index("RESULT")


def test_first_then_steady_sends_one_at_a_time_and_says_which() -> None:
    said: list[str] = []
    sent = iter([0.3, 0.1, 0.2, 0.1])
    results = list(first_then_steady(lambda: next(sent), 3, said.append))
    assert results == [0.3, 0.1, 0.2, 0.1]
    assert said == [
        "measuring the first request",
        "measuring steady request 1 of 3",
        "measuring steady request 2 of 3",
        "measuring steady request 3 of 3",
    ]
    assert first_vs_steady(0.3, [0.1, 0.2, 0.1]) == (0.1, 0.3 / 0.1)
    assert first_vs_steady(None, [0.1]) == (0.1, None)
    assert first_vs_steady(0.3, []) == (None, None)
