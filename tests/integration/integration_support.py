"""Helpers the integration tests share (the conftest holds the fixtures)."""

from __future__ import annotations

from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families
from tests.lib.server import VllmServer

SERVED_NAME = "tiny"


def is_sleeping(server: VllmServer) -> bool:
    resp = requests.get(f"{server.url}/is_sleeping", timeout=10)
    resp.raise_for_status()
    return bool(resp.json()["is_sleeping"])


@dataclass(frozen=True)
class TtftHistogram:
    """vllm:time_to_first_token_seconds for our model: sum, count, cumulative buckets."""

    total: float
    count: float
    buckets: dict[float, float]

    def since(self, before: TtftHistogram) -> TtftHistogram:
        return TtftHistogram(
            self.total - before.total,
            self.count - before.count,
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
        )


def ttft_histogram(server: VllmServer) -> TtftHistogram:
    """vLLM's own TTFT histogram for our model, read from /metrics."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    total = count = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "vllm:time_to_first_token_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("model_name") != SERVED_NAME:
                continue
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return TtftHistogram(total, count, buckets)
