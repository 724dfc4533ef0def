"""Sleep and wake one running server and measure it: time to sleep, GPU memory serving vs asleep,
time to wake (with warmctl's reload + warmup, or the bare route), the first request after, and
an output check: the greedy answers of `warmctl.sleepwake.outputcheck` (token ids and logprobs, its
rule of
what "the same" is) before the sleep and again after the wake and the measured requests, for the
bare routes as for warmctl's sleep and wake (a wrong weight reload or a prefix cache that
outlived its KV blocks answers differently)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warmctl.bench import gpumem
from warmctl.bench.api import Api
from warmctl.bench.measure import Counter
from warmctl.bench.prompts import prompt
from warmctl.errors import WarmctlError
from warmctl.sleepwake import outputcheck


@dataclass(frozen=True)
class SleepCycle:
    level: int
    how: str  # "warmctl" (warmctl's sleep + wake, reload and warmup included) or "route"
    sleep_s: float
    wake_s: float  # until the wake (with its reload and warmup for "warmctl") returned
    first_ttft_ms: float  # the first user request sent right after the wake returned
    wake_to_first_token_s: float
    steady_after_ms: float  # median of the next requests
    mem_serving_mib: int | None
    mem_asleep_mib: int | None
    mem_idle_mib: int | None  # the device before the server started
    jit_events: int = 0
    sleep_detail: dict[str, Any] = field(default_factory=dict)  # warmctl's reports
    wake_detail: dict[str, Any] = field(default_factory=dict)
    output_diff: str = ""  # outputcheck.compare's reason the answers differ ("" = the same)
    output_logprob_diff: float | None = None  # the largest logprob difference on equal tokens

    @property
    def output_same(self) -> bool:
        return not self.output_diff

    @property
    def freed_fraction(self) -> float | None:
        """Share of the server's own GPU memory that sleeping gave back."""
        if self.mem_serving_mib is None or self.mem_asleep_mib is None:
            return None
        server = self.mem_serving_mib - (self.mem_idle_mib or 0)
        if server <= 0:
            return None
        return (self.mem_serving_mib - self.mem_asleep_mib) / server


def cycle(
    api: Api,
    counter: Counter,
    level: int,
    how: str,
    pids: Callable[[], list[int]],
    mem_idle_mib: int | None,
    after: int = 5,
) -> SleepCycle:
    before = api.answers()
    serving = gpumem.read(pids())
    t = time.monotonic()
    sleep_detail = api.sleep_route(level) if how == "route" else api.sleep(level)
    sleep_s = time.monotonic() - t
    if not api.is_sleeping():
        raise WarmctlError(f"the server did not report sleeping after a level-{level} sleep")
    asleep = gpumem.read(pids())

    t = time.monotonic()
    wake_detail = api.wake_route(level) if how == "route" else api.wake(level)
    wake_s = time.monotonic() - t
    first = api.complete(prompt(counter.next()), 8)
    wake_to_first = wake_s + first.ttft_s  # the request left right after the wake returned
    later = [api.complete(prompt(counter.next()), 8).ttft_s * 1000.0 for _ in range(after)]
    diff, worst = _compare(before, api.answers())
    return SleepCycle(
        level=level,
        how=how,
        sleep_s=sleep_s,
        wake_s=wake_s,
        first_ttft_ms=first.ttft_s * 1000.0,
        wake_to_first_token_s=wake_to_first,
        steady_after_ms=statistics.median(later) if later else float("nan"),
        mem_serving_mib=serving.used_mib if serving else None,
        mem_asleep_mib=asleep.used_mib if asleep else None,
        mem_idle_mib=mem_idle_mib,
        sleep_detail=sleep_detail,
        wake_detail=wake_detail,
        output_diff=diff,
        output_logprob_diff=worst,
    )


def _compare(
    before: list[outputcheck.Answer], after: list[outputcheck.Answer]
) -> tuple[str, float | None]:
    worst: float | None = None
    for n, (b, a) in enumerate(zip(before, after, strict=True), 1):
        why, diff = outputcheck.compare(b, a, outputcheck.LOGPROB_TOLERANCE)
        if diff is not None:
            worst = diff if worst is None else max(worst, diff)
        if why:
            return f"prompt {n} of {len(before)} {why}", worst
    return "", worst
