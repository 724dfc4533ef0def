"""Request-side measurements against a ready server, all through warmctl's client (`api.Api`):
the first request and steady TTFT at c = 1, the first and steady 16-wide bursts, decode speed."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from warmctl.bench.api import Api, Sample
from warmctl.bench.prompts import prompt
from warmctl.warmth.firststeady import first_then_steady, first_vs_steady


class Counter:
    """Hands out prompt indexes, so every request of a run has its own prompt."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._n += 1
            return self._n


@dataclass(frozen=True)
class Single:
    first_ms: float
    steady_ms: float  # median of the requests after the first
    samples_ms: list[float]
    prompt_tokens: int | None
    # one more request after the server sat idle for `idle_gap_s`: what idleness alone costs
    after_idle_ms: float | None = None
    idle_gap_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.first_ms / self.steady_ms


@dataclass(frozen=True)
class Bursts:
    width: int
    first_mean_ms: float
    first_max_ms: float
    steady_mean_ms: float  # median over the later bursts of each burst's mean TTFT
    steady_max_ms: float
    bursts_ms: list[list[float]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.first_mean_ms / self.steady_mean_ms


@dataclass(frozen=True)
class Decode:
    ms_per_token: float  # median over the runs
    runs: list[float]
    tokens: int


def _ms(s: Sample) -> float:
    return s.ttft_s * 1000.0


def single(
    api: Api, counter: Counter, n: int = 11, max_tokens: int = 8, idle_gap_s: float = 0.0
) -> Single:
    """`n` sequential requests; the first is "the first user request". The connection is
    opened first (as a load balancer's is), so no request pays a TCP handshake. With
    `idle_gap_s`, one more request follows that long a pause (a warm server, only idle)."""
    api.connect()
    samples = list(
        first_then_steady(lambda: api.complete(prompt(counter.next()), max_tokens), n - 1)
    )
    ms = [_ms(s) for s in samples]
    steady_ms, _ = first_vs_steady(ms[0], ms[1:])
    after_idle = None
    if idle_gap_s > 0:
        time.sleep(idle_gap_s)
        after_idle = _ms(api.complete(prompt(counter.next()), max_tokens))
    return Single(
        ms[0], float("nan") if steady_ms is None else steady_ms, ms, samples[0].prompt_tokens,
        after_idle, idle_gap_s,
    )  # fmt: skip


class BurstPool:
    """`width` client threads that live across bursts, each with its own open keep-alive
    connection, released together by a barrier for every burst."""

    def __init__(self, api: Api, width: int) -> None:
        self.api, self.width = api, width
        self.pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="burst")
        self._all(lambda _i: api.connect())

    def _all(self, fn: Callable[[int], float | None]) -> list[float | None]:
        gate = threading.Barrier(self.width)

        def run(i: int) -> float | None:
            gate.wait(timeout=60)  # one task per thread: none may start before all are taken
            return fn(i)

        futures = [self.pool.submit(run, i) for i in range(self.width)]
        return [f.result(timeout=600) for f in futures]

    def burst(self, counter: Counter, max_tokens: int = 8) -> list[float]:
        """One burst: every thread sends one request at once; their TTFTs in ms."""
        indexes = [counter.next() for _ in range(self.width)]
        out = self._all(lambda i: _ms(self.api.complete(prompt(indexes[i]), max_tokens)))
        return [float(x) for x in out if x is not None]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def bursts(api: Api, counter: Counter, width: int = 16, n: int = 5) -> Bursts:
    """`n` bursts one after the other; the first is "the first burst" after warmup."""
    pool = BurstPool(api, width)
    try:
        runs = [pool.burst(counter) for _ in range(n)]
    finally:
        pool.close()
    means = [statistics.fmean(r) for r in runs]
    maxes = [max(r) for r in runs]
    return Bursts(
        width,
        means[0],
        maxes[0],
        statistics.median(means[1:]),
        statistics.median(maxes[1:]),
        [[round(x, 2) for x in r] for r in runs],
    )


def decode(api: Api, counter: Counter, tokens: int = 128, n: int = 3) -> Decode:
    """Inter-token time of long generations (first to last token over the tokens after it)."""
    runs = []
    for _ in range(n):
        s = api.complete(prompt(counter.next()), tokens, ignore_eos=True)
        if s.decode_ms_per_token is not None:
            runs.append(s.decode_ms_per_token)
    return Decode(
        statistics.median(runs) if runs else float("nan"), [round(r, 3) for r in runs], tokens
    )
