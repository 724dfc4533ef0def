"""vLLM's `/metrics` read with prometheus_client's own text parser."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from warmctl.errors import WarmctlError

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SLEEP_STATE = "vllm:engine_sleep_state"
TTFT = "vllm:time_to_first_token_seconds"
# what `warmctl tune` reads
STEP_TOKENS = "vllm:iteration_tokens_total"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
GENERATION_TOKENS = "vllm:request_generation_tokens"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
E2E_TIME = "vllm:e2e_request_latency_seconds"
PREEMPTIONS = "vllm:num_preemptions"  # counter (sample vllm:num_preemptions_total)
SUCCESS = "vllm:request_success"  # counter, per finished_reason
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_INFO = "vllm:cache_config_info"
# vllm:engine_sleep_state{sleep_state=...} == 1 -> sleep level
SLEEP_LEVELS = {"awake": 0, "weights_offloaded": 1, "discard_all": 2}


@dataclass
class Histogram:
    """A (summed over label sets) Prometheus histogram: cumulative `buckets` as (le, count)."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    count: float = 0.0
    total: float = 0.0

    def quantile(self, q: float) -> float | None:
        """Prometheus-style `histogram_quantile` (linear inside the bucket); None when empty."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if math.isinf(le):
                    return prev_le
                inside = cum - prev_count
                frac = (rank - prev_count) / inside if inside > 0 else 1.0
                return prev_le + (le - prev_le) * frac
            prev_le, prev_count = le, cum
        return prev_le

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.total,
            "buckets": [[("+Inf" if math.isinf(le) else le), c] for le, c in self.buckets],
        }


@dataclass
class Metrics:
    running: float | None = None
    waiting: float | None = None
    # "awake" / "weights_offloaded" (level 1) / "discard_all" (level 2); None: not exported
    sleep_state: str | None = None
    ttft: Histogram | None = None

    @property
    def in_flight(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)

    @property
    def sleep_level(self) -> int | None:
        return SLEEP_LEVELS.get(self.sleep_state) if self.sleep_state else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "sleep_state": self.sleep_state,
            "ttft_seconds": self.ttft.to_dict() if self.ttft else None,
        }


@dataclass
class Families:
    """One `/metrics` text as prometheus_client parses it: the histograms asked for, summed over
    label sets (engines, models), and every other family's samples."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    samples: dict[str, list[Any]] = field(default_factory=dict)  # prometheus_client Samples

    def values(self, family: str, sample: str | None = None) -> list[float]:
        """The values of `family`'s samples named `sample` (default: the family's own name)."""
        name = sample or family
        return [s.value for s in self.samples.get(family, []) if s.name == name]


def read_families(text: str, label: str = "server", histograms: Collection[str] = ()) -> Families:
    """The one `/metrics` parser (prometheus_client's): `histograms` are summed over label sets;
    text that is not Prometheus format raises (kind `protocol`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = Families()
    buckets: dict[str, dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name not in histograms:
                out.samples.setdefault(family.name, []).extend(family.samples)
                continue
            hist = out.histograms.setdefault(family.name, Histogram())
            per_le = buckets.setdefault(family.name, {})
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    per_le[le] = per_le.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    hist.count += s.value
                elif s.name.endswith("_sum"):
                    hist.total += s.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise WarmctlError(
            f"{label}: /metrics is not Prometheus text format ({exc})", kind="protocol"
        ) from None
    for name, per_le in buckets.items():
        out.histograms[name].buckets = sorted(per_le.items())
    return out


def parse_metrics(text: str, label: str = "server") -> Metrics:
    """Parse Prometheus text format; values of several label sets (engines, models) are summed."""
    families = read_families(text, label, histograms=(TTFT,))
    out = Metrics(ttft=families.histograms.get(TTFT))
    for name, attr in ((RUNNING, "running"), (WAITING, "waiting")):
        values = families.values(name)
        if values:
            setattr(out, attr, sum(values))
    sleep_flags: dict[str, float] = {}
    for s in families.samples.get(SLEEP_STATE, []):
        state = s.labels.get("sleep_state")
        if state:
            sleep_flags[state] = max(sleep_flags.get(state, 0.0), s.value)
    if sleep_flags:
        asleep = [s for s in ("discard_all", "weights_offloaded") if sleep_flags.get(s, 0) >= 1]
        if asleep:
            out.sleep_state = asleep[0]
        elif sleep_flags.get("awake", 0) >= 1:
            out.sleep_state = "awake"
        elif "awake" in sleep_flags:
            out.sleep_state = "asleep"
    return out
