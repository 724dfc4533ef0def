"""Hosts measured at once: `per_host`'s worker bound and the inventory's vllm_verify_throttle."""

import threading
import time

from warmctl.commands.options import DEFAULT_WORKERS, inventory_parallel, per_host
from warmctl.errors import WarmctlError
from warmctl.plan.inventory import targets_for_host
from warmctl.server.target import parse_target


def most_at_once(workers: int, hold_s: float, n: int = 4) -> int:
    """The most calls running at once. Each call waits (a condition, not a sleep) until all
    `n` run together or `hold_s` has passed since the start: a pool that runs them all shows
    it at once however slow the machine; one that runs fewer shows at most that many."""
    cond, running, peak = threading.Condition(), [0], [0]
    deadline = time.monotonic() + hold_s

    def fn(_target):
        with cond:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            cond.notify_all()
            cond.wait_for(lambda: peak[0] >= n, timeout=max(0.0, deadline - time.monotonic()))
            running[0] -= 1
        return "ok"

    targets = [parse_target(f"h{i}") for i in range(n)]
    assert per_host(targets, fn, workers=workers) == ["ok"] * n
    return peak[0]


def test_one_worker_measures_one_host_at_a_time() -> None:
    assert most_at_once(1, hold_s=1.0) == 1  # a second call would have joined the first
    assert most_at_once(4, hold_s=30.0) == 4


def test_an_error_stays_in_its_slot() -> None:
    def fn(t):
        if t.host == "bad":
            raise WarmctlError("bad: connection refused")
        return t.host

    out = per_host([parse_target("a"), parse_target("bad")], fn, workers=1)
    assert out[0] == "a" and isinstance(out[1], WarmctlError)


def test_inventory_throttle_sets_the_hosts_measured_at_once() -> None:
    one = targets_for_host("gpu-1", {"vllm_verify_throttle": 1})
    three = targets_for_host("gpu-2", {"vllm_verify_throttle": "3"})
    unset = targets_for_host("gpu-3", {"vllm_verify_throttle": 0})
    assert inventory_parallel([*three, *unset]) == 3
    assert inventory_parallel([*one, *three]) == 1  # the strictest host wins
    assert inventory_parallel(unset) == DEFAULT_WORKERS
