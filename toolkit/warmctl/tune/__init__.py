"""`warmctl tune`: what an instance's own traffic says its capture sizes, scheduler limits, warmup
and KV cache should be, read from two `/metrics` scrapes (only the traffic between them counts).

The data is what vLLM exports anyway: the histograms of tokens per engine step
(`vllm:iteration_tokens_total`), prompt and generation tokens per request, the time requests
spent running and queued, the preemption counter, the KV cache usage gauge and
`vllm:cache_config_info`. Between the two scrapes the gauges (running, waiting, KV usage) are
sampled, so peaks are seen too. Nothing here changes a server.

One job a module: `scrape` (read /metrics, differences, saved scrapes), `observe` (the traffic
of a window), `propose` (the settings it calls for), `write` (the inventory snippet).
"""

from __future__ import annotations

from warmctl.tune.observe import Observation, Sample, observe
from warmctl.tune.propose import (
    CAPTURE,
    DEFAULT_CAPTURE_SIZES,
    KV_BLOCKS,
    MAX_BATCHED,
    MAX_NUM_SEQS,
    WARMUP_PROMPTS,
    WARMUP_RAMP,
    Choice,
    Knobs,
    Proposal,
    capture_sizes,
    propose,
    size_grid,
)
from warmctl.tune.scrape import Scrape, delta, load_scrapes, parse_scrape, save_scrapes, scrape
from warmctl.tune.write import instance_changes, snippet

__all__ = [
    "CAPTURE",
    "DEFAULT_CAPTURE_SIZES",
    "KV_BLOCKS",
    "MAX_BATCHED",
    "MAX_NUM_SEQS",
    "WARMUP_PROMPTS",
    "WARMUP_RAMP",
    "Choice",
    "Knobs",
    "Observation",
    "Proposal",
    "Sample",
    "Scrape",
    "capture_sizes",
    "delta",
    "instance_changes",
    "load_scrapes",
    "observe",
    "parse_scrape",
    "propose",
    "save_scrapes",
    "scrape",
    "size_grid",
    "snippet",
]
