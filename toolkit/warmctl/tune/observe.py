"""What an instance's traffic did between two scrapes: the histograms' differences, the gauges
sampled in between, and what the server says of its own settings (`/server_info`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server import metrics as m
from warmctl.server.client import Client
from warmctl.server.metrics import Histogram
from warmctl.tune.scrape import Scrape, delta, scrape


@dataclass
class Sample:
    at: float
    running: float | None
    waiting: float | None
    kv_usage: float | None


@dataclass
class Observation:
    """The traffic of one instance between two scrapes."""

    target: str
    seconds: float
    steps: Histogram
    prompt: Histogram
    generation: Histogram
    inference: Histogram
    queue: Histogram
    e2e: Histogram
    preemptions: float
    # gauges sampled through the window (with --since only the last scrape: no peaks)
    samples: list[Sample]
    cache_info: dict[str, str]
    sleep_metric: bool
    # from /server_info (dev mode) when the server tells
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    capture_sizes: list[int] | None = None
    device: str | None = None
    sleep_mode: bool | None = None

    @property
    def requests(self) -> int:
        return round(self.prompt.count)

    @property
    def mean_running(self) -> float | None:
        """Little's law: time all requests spent running / the window."""
        if self.seconds <= 0 or self.inference.count <= 0:
            return None
        return self.inference.total / self.seconds

    @property
    def windowed(self) -> bool:
        """Whether the gauges were sampled through the window (not with --since)."""
        return len(self.samples) >= 2

    @property
    def mean_in_system(self) -> float | None:
        """Little's law over the requests' end-to-end time (arrival at the API server to the
        last token): the concurrency the clients offered."""
        if self.seconds <= 0:
            return None
        if self.e2e.count > 0:
            return self.e2e.total / self.seconds
        if self.inference.count > 0:
            return (self.inference.total + self.queue.total) / self.seconds
        return None

    def peak(self, attr: str) -> float | None:
        if not self.windowed:
            return None
        values = [getattr(s, attr) for s in self.samples if getattr(s, attr) is not None]
        return max(values) if values else None

    def sampled(self, attr: str, q: float) -> float | None:
        values = sorted(getattr(s, attr) for s in self.samples if getattr(s, attr) is not None)
        if not values or not self.windowed:
            return None
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    @property
    def kv_capacity_tokens(self) -> int | None:
        blocks, size = self.cache_info.get("num_gpu_blocks"), self.cache_info.get("block_size")
        try:
            return int(blocks) * int(size) if blocks and size else None  # type: ignore[arg-type]
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "seconds": self.seconds,
            "requests": self.requests,
            "preemptions": self.preemptions,
            "mean_running": self.mean_running,
            "mean_in_flight": self.mean_in_system,
            "peak_running": self.peak("running"),
            "peak_waiting": self.peak("waiting"),
            "peak_kv_usage": self.peak("kv_usage"),
            "samples": len(self.samples),
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "server": {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len,
                "cudagraph_capture_sizes": self.capture_sizes,
                "device": self.device,
                "sleep_mode": self.sleep_mode,
            },
            "histograms": {
                "step_tokens": self.steps.to_dict(),
                "prompt_tokens": self.prompt.to_dict(),
                "generation_tokens": self.generation.to_dict(),
                "inference_seconds": self.inference.to_dict(),
                "queue_seconds": self.queue.to_dict(),
                "e2e_seconds": self.e2e.to_dict(),
            },
        }


def observe(
    client: Client,
    *,
    start: Scrape | None,
    window_s: float,
    every_s: float = 2.0,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    done: Callable[[], bool] | None = None,
) -> tuple[Observation, Scrape]:
    """Scrape (unless `start` is given), sample the gauges every `every_s` for `window_s` (or
    until `done()` says so), scrape again; returns what happened in between and the last
    scrape."""
    label = client.target.label
    samples: list[Sample] = []
    first = start or scrape(client)
    if start is None:
        samples.append(_sample(first))
        deadline = now() + window_s
        while True:
            left = deadline - now()
            if left <= 0 or (done is not None and done()):
                break
            sleep(min(every_s, left))
            if deadline - now() > 0:
                samples.append(_sample(scrape(client)))
    last = scrape(client)
    samples.append(_sample(last))
    missing = [n for n in (m.STEP_TOKENS, m.PROMPT_TOKENS) if n not in last.histograms]
    if missing:
        raise WarmctlError(
            f"{label}: /metrics has no {' or '.join(missing)} (not a vLLM server, or a vLLM "
            "without the V1 engine's metrics)",
            kind="protocol",
        )

    def hist(name: str) -> Histogram:
        end = last.histograms.get(name) or Histogram()
        return delta(end, first.histograms.get(name), name, label)

    obs = Observation(
        target=label,
        seconds=max(0.0, last.at - first.at),
        steps=hist(m.STEP_TOKENS),
        prompt=hist(m.PROMPT_TOKENS),
        generation=hist(m.GENERATION_TOKENS),
        inference=hist(m.INFERENCE_TIME),
        queue=hist(m.QUEUE_TIME),
        e2e=hist(m.E2E_TIME),
        preemptions=max(
            0.0, last.counters.get(m.PREEMPTIONS, 0.0) - first.counters.get(m.PREEMPTIONS, 0.0)
        ),
        samples=samples,
        cache_info=last.cache_info,
        sleep_metric=last.sleep_metric,
    )
    _server_facts(client, obs)
    if obs.max_model_len is None:
        obs.max_model_len = _served_max_model_len(client)
    return obs, last


def _served_max_model_len(client: Client) -> int | None:
    """max_model_len from /v1/models (served without dev mode)."""
    try:
        models = client.models()
    except WarmctlError:
        return None
    values = [model.get("max_model_len") for model in models]
    return min((v for v in values if isinstance(v, int)), default=None)


def _sample(s: Scrape) -> Sample:
    return Sample(s.at, s.gauges.get(m.RUNNING), s.gauges.get(m.WAITING), s.gauges.get(m.KV_USAGE))


def _server_facts(client: Client, obs: Observation) -> None:
    """What `/server_info` says (dev mode); nothing when it is not served."""
    from warmctl.server.client import capture_sizes_from_config, device_from_config

    try:
        info = client.server_info()
    except WarmctlError as err:
        if err.kind in ("dev_route", "not_found", "protocol", "bad_request", "generic", "auth"):
            return
        raise
    config = info.get("vllm_config")
    obs.device = device_from_config(config)
    obs.capture_sizes = capture_sizes_from_config(config)
    if isinstance(config, dict):
        sched = config.get("scheduler_config") if isinstance(config, dict) else None
        model = config.get("model_config")
        if isinstance(sched, dict):
            obs.max_num_seqs = _int(sched.get("max_num_seqs"))
            obs.max_num_batched_tokens = _int(sched.get("max_num_batched_tokens"))
        if isinstance(model, dict):
            obs.max_model_len = _int(model.get("max_model_len"))
            sleep = model.get("enable_sleep_mode")
            obs.sleep_mode = sleep if isinstance(sleep, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
