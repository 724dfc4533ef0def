"""The acceptance test of a host: is the first request as fast as the steady ones?

First request (streamed): TTFT and total time. Then N steady requests, one at a time: median
and p90 TTFT. Then one longer generation: decode ms/token. Each request gets a unique prefix so
the prefix cache cannot flatter the steady numbers. PASS when the first TTFT is within
`max_first_ttft` and first/steady-median is within `max_ratio` (plus optional limits).

`verify_attempts` measures again after a FAIL, up to N times, keeping every earlier attempt in
the report: for hosts whose cores are shared, where one descheduling of the server during the
single first request can fail a host that is warm.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import StreamResult, percentile, stream_completion
from warmctl.sleepwake.gate import WAKEABLE_HEALTH
from warmctl.warmth.firststeady import first_then_steady, first_vs_steady

PASS, FAIL, ASLEEP, ERROR = "PASS", "FAIL", "ASLEEP", "ERROR"
# the one rule of a result: what passes (ASLEEP: not measured, and nothing failed: with
# `asleep_ok`, and always in the metrics' `ok`), and the instance's state it tells
PASSING = (PASS, ASLEEP)
STATE_OF = {PASS: "awake", FAIL: "awake", ASLEEP: "asleep"}


def passes(status: str, asleep_ok: bool = True) -> bool:
    return status in (PASSING if asleep_ok else (PASS,))


VERIFY_PROMPT = (
    "Write a short status note for the on-call engineer about the inference service: which "
    "hosts were deployed today, whether the first request after the deploy was fast, and what "
    "to check if it was not."
)


@dataclass(frozen=True)
class Thresholds:
    max_first_ttft_s: float = 1.0
    max_ratio: float = 2.0
    max_steady_ttft_s: float | None = None
    max_decode_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def evaluate(
    first_ttft_s: float | None,
    steady_median_s: float | None,
    decode_ms: float | None,
    limits: Thresholds,
) -> list[str]:
    """Why the host fails (empty list: it passes)."""
    reasons: list[str] = []
    if first_ttft_s is None:
        return ["the first request streamed no text"]
    if first_ttft_s > limits.max_first_ttft_s:
        reasons.append(
            f"first TTFT {first_ttft_s * 1000:.0f} ms > {limits.max_first_ttft_s * 1000:.0f} ms"
        )
    if steady_median_s is None:
        reasons.append("no steady request streamed text")
    else:
        ratio = first_ttft_s / steady_median_s if steady_median_s > 0 else float("inf")
        if ratio > limits.max_ratio:
            reasons.append(f"first/steady TTFT {ratio:.2f}x > {limits.max_ratio:g}x")
        if limits.max_steady_ttft_s is not None and steady_median_s > limits.max_steady_ttft_s:
            reasons.append(
                f"steady TTFT {steady_median_s * 1000:.0f} ms > "
                f"{limits.max_steady_ttft_s * 1000:.0f} ms"
            )
    if (
        limits.max_decode_ms is not None
        and decode_ms is not None
        and decode_ms > limits.max_decode_ms
    ):
        reasons.append(f"decode {decode_ms:.1f} ms/token > {limits.max_decode_ms:g} ms/token")
    return reasons


@dataclass
class VerifyReport:
    target: str
    status: str = ERROR
    reasons: list[str] = field(default_factory=list)
    model: str = ""
    first: StreamResult | None = None
    steady: list[StreamResult] = field(default_factory=list)
    decode: StreamResult | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    error: str | None = None
    total_s: float = 0.0
    earlier: list[VerifyReport] = field(default_factory=list)  # failed attempts before this one

    @property
    def attempt(self) -> int:
        return len(self.earlier) + 1

    @property
    def first_ttft_s(self) -> float | None:
        return self.first.ttft_s if self.first else None

    @property
    def steady_ttfts_s(self) -> list[float]:
        return [r.ttft_s for r in self.steady if r.ttft_s is not None]

    @property
    def steady_median_s(self) -> float | None:
        return first_vs_steady(self.first_ttft_s, self.steady_ttfts_s)[0]

    @property
    def steady_p90_s(self) -> float | None:
        return percentile(self.steady_ttfts_s, 90)

    @property
    def ratio(self) -> float | None:
        return first_vs_steady(self.first_ttft_s, self.steady_ttfts_s)[1]

    @property
    def decode_ms_per_token(self) -> float | None:
        return self.decode.decode_ms_per_token if self.decode else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "status": self.status,
            "reasons": self.reasons,
            "error": self.error,
            "model": self.model,
            "first_ttft_s": self.first_ttft_s,
            "first_total_s": self.first.total_s if self.first else None,
            "steady_median_ttft_s": self.steady_median_s,
            "steady_p90_ttft_s": self.steady_p90_s,
            "ratio": self.ratio,
            "decode_ms_per_token": self.decode_ms_per_token,
            "thresholds": self.thresholds.to_dict(),
            "total_s": self.total_s,
            "attempt": self.attempt,
            "earlier_attempts": [e.to_dict() for e in self.earlier],
            "samples": {
                "first": self.first.to_dict() if self.first else None,
                "steady": [r.to_dict() for r in self.steady],
                "decode": self.decode.to_dict() if self.decode else None,
            },
        }


def is_asleep(client: Client) -> bool:
    """`/is_sleeping` when dev mode is on, else `vllm:engine_sleep_state`, else False."""
    try:
        return client.is_sleeping()
    except WarmctlError as err:
        if err.kind != "dev_route":
            raise
    try:
        state = client.metrics().sleep_state
    except WarmctlError:
        return False
    return state not in (None, "awake")


def _wakes_on_request(client: Client) -> bool:
    """The proxy's /health says the instance sleeps until a request wakes it: a measurement
    would wake it and time the wake (any other answer, or none: the usual wait decides)."""
    try:
        return client.health() == WAKEABLE_HEALTH
    except WarmctlError:
        return False


def _asleep_now(client: Client) -> bool:
    try:
        return is_asleep(client)
    except WarmctlError:
        return False


def verify(
    client: Client,
    *,
    steady: int = 10,
    max_tokens: int = 16,
    decode_tokens: int = 128,
    thresholds: Thresholds | None = None,
    ready_timeout: float = 600.0,
    model: str | None = None,
    prompt: str = VERIFY_PROMPT,
    wait_start: bool = True,
    on_wait: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Measure one host. Never raises `WarmctlError`: failures land in `status`/`error`.
    `wait_start`: wait for a server that refuses connections (still starting), else report it
    at once. `on_wait(text)`: told what is measured or awaited."""

    def say(text: str) -> None:
        if on_wait is not None:
            on_wait(text)

    limits = thresholds or Thresholds()
    report = VerifyReport(target=client.target.label, thresholds=limits)
    t0 = time.monotonic()
    run = uuid.uuid4().hex[:8]
    counter = itertools.count()

    def unique(p: str) -> str:
        return f"[verify {run}-{next(counter)}] {p}"

    try:
        if _wakes_on_request(client):  # asleep behind the proxy: a request would wake it
            report.status = ASLEEP
            report.reasons = ["asleep (a request wakes it: not woken to be measured)"]
            return report
        models = client.wait_ready(timeout=ready_timeout, wait_start=wait_start, on_wait=on_wait)
        chosen = next((m for m in models if m["id"] == model), None) if model else models[0]
        if chosen is None:
            raise WarmctlError(f"{client.target.label}: model {model!r} not served")
        report.model = str(chosen["id"])
        client.health()
        if is_asleep(client):
            report.status = ASLEEP
            report.reasons = ["the server is asleep: run `warmctl wake` first"]
            return report
        requests = first_then_steady(
            lambda: stream_completion(client, report.model, unique(prompt), max_tokens=max_tokens),
            steady,
            on_wait,
        )
        report.first = next(requests)
        for result in requests:
            report.steady.append(result)
        if decode_tokens >= 2:
            say(f"measuring decode speed ({decode_tokens} tokens)")
            report.decode = stream_completion(
                client, report.model, unique(prompt), max_tokens=decode_tokens, ignore_eos=True
            )
    except WarmctlError as err:
        report.status, report.error = ERROR, err.message
        if err.kind == "asleep":  # the proxy's gate is closed: the instance sleeps
            report.status, report.error = ASLEEP, None
            report.reasons = ["asleep (the proxy's sleep gate is closed): wake it first"]
        elif (
            err.kind in ("server", "bad_request", "timeout")
            and report.model
            and _asleep_now(client)
        ):
            # put to sleep while we measured (a sleep timer fired): not an engine failure
            report.status, report.error = ASLEEP, None
            report.reasons = ["the server went to sleep during the measurement"]
        return report
    finally:
        report.total_s = time.monotonic() - t0
    report.reasons = evaluate(
        report.first_ttft_s, report.steady_median_s, report.decode_ms_per_token, limits
    )
    report.status = FAIL if report.reasons else PASS
    return report


def verify_attempts(
    client: Client,
    *,
    attempts: int = 1,
    pause_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> VerifyReport:
    """`verify`, measured again after a FAIL (`pause_s` later), at most `attempts` times.

    The host passes when an attempt passes. A later attempt's first request follows the earlier
    attempt's requests: it tells a passing stall (a descheduled server on shared cores) from a
    host that stays slow, not a cold server from a warm one, so 1 (the default) is the strict
    gate. ERROR and ASLEEP are not measured again. Earlier attempts stay in `report.earlier`.
    """
    earlier: list[VerifyReport] = []
    on_wait: Callable[[str], None] | None = kwargs.get("on_wait")
    while True:
        report = verify(client, **kwargs)
        if report.status != FAIL or len(earlier) + 1 >= attempts:
            report.earlier = earlier
            return report
        earlier.append(report)
        if on_wait is not None:
            on_wait(
                f"attempt {len(earlier)} of {attempts} FAILed; attempt {len(earlier) + 1} "
                f"in {pause_s:g} s"
            )
        sleep(pause_s)


def exit_code(
    reports: Sequence[VerifyReport | Mapping[str, Any]], *, asleep_ok: bool = False
) -> int:
    """0 all PASS (or ASLEEP with `asleep_ok`); 2 any ERROR (unreachable, HTTP failure);
    else 1 (FAIL, or ASLEEP without `asleep_ok`). Reports, or their `to_dict()`s."""
    statuses = [r["status"] if isinstance(r, Mapping) else r.status for r in reports]
    if ERROR in statuses:
        return 2
    if all(passes(s, asleep_ok) for s in statuses):
        return 0
    return 1
