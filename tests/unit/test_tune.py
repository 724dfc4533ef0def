"""`warmctl.tune`: capture-size grid and its padding bound, histogram deltas, proposals."""

from __future__ import annotations

import math

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from warmctl.errors import WarmctlError
from warmctl.server.metrics import Histogram as Hist
from warmctl.tune import (
    CAPTURE,
    KV_BLOCKS,
    MAX_BATCHED,
    MAX_NUM_SEQS,
    WARMUP_PROMPTS,
    WARMUP_RAMP,
    Knobs,
    Observation,
    Sample,
    capture_sizes,
    delta,
    instance_changes,
    parse_scrape,
    propose,
    size_grid,
    snippet,
)

STEP_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TOKEN_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


def hist(bounds: tuple[float, ...], values: list[float]) -> Hist:
    """A cumulative histogram as vLLM exports it (with +Inf)."""
    les = [*bounds, math.inf]
    return Hist(
        buckets=[(le, float(sum(1 for v in values if v <= le))) for le in les],
        count=float(len(values)),
        total=float(sum(values)),
    )


def obs(
    prompts: list[float],
    gens: list[float],
    steps: list[float],
    *,
    seconds: float = 60.0,
    running: list[float] | None = None,
    kv: list[float] | None = None,
    preemptions: float = 0,
    queue: list[float] | None = None,
    **server: object,
) -> Observation:
    runs = running or []
    kvs = kv or []
    samples = [
        Sample(float(i), runs[i] if i < len(runs) else None, 0.0, kvs[i] if i < len(kvs) else None)
        for i in range(max(len(runs), len(kvs)))
    ]
    o = Observation(
        target="h:8000",
        seconds=seconds,
        steps=hist(STEP_BOUNDS, steps),
        prompt=hist(TOKEN_BOUNDS, prompts),
        generation=hist(TOKEN_BOUNDS, gens),
        inference=hist((1.0, 10.0), [2.0] * len(prompts)),
        queue=hist((0.01, 0.1, 1.0), queue or [0.001] * len(prompts)),
        e2e=hist((1.0, 10.0), [2.001] * len(prompts)),
        preemptions=preemptions,
        samples=samples,
        cache_info={"num_gpu_blocks": "10000", "block_size": "16"},
        sleep_metric=False,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=40960,
        sleep_mode=True,  # /server_info: --enable-sleep-mode
    )
    for key, value in server.items():
        setattr(o, key, value)
    return o


def padding_bound(n: int, max_padding: float) -> int:
    """The largest graph a step of `n` tokens may be padded to, as `size_grid` promises."""
    return max(math.floor(n * (1 + max_padding)), n + 7)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.2, 0.25, 0.33, 0.5, 1.0])
def test_every_step_fits_a_grid_size_within_the_bound(p: float) -> None:
    grid = size_grid(4096, p)
    assert grid == sorted(set(grid)) and grid[-1] == 4096
    for n in range(1, 4097):  # every step size, exhaustively
        padded = next(g for g in grid if g >= n)
        assert padded <= padding_bound(n, p), (n, padded)


def test_grid_includes_the_power_of_two_bucket_bounds() -> None:
    grid = size_grid(2048, 0.25)
    assert {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048} <= set(grid)
    assert grid[:8] == [1, 2, 4, 8, 16, 24, 32, 40]
    assert [g for g in grid if 512 <= g <= 1024] == [512, 640, 768, 896, 1024]


def test_capture_sizes_only_in_reached_buckets() -> None:
    # decode steps of 4-24 tokens and prefill steps of 300-900: nothing between 32 and 256
    steps = [4, 12, 24] * 1000 + [300, 600, 900] * 20
    sizes, reached, note = capture_sizes(hist(STEP_BOUNDS, steps), 0.25, 2048)
    assert [(lo, hi) for lo, hi, _ in reached] == [
        (1, 8),
        (8, 16),
        (16, 32),
        (256, 512),
        (512, 1024),
    ]
    assert sizes == [2, 4, 8, 16, 24, 32, 320, 384, 448, 512, 640, 768, 896, 1024]
    assert note == ""
    # a bucket below 0.1 % of the steps is not reached
    sizes2, _, _ = capture_sizes(hist(STEP_BOUNDS, [*steps, 3000]), 0.25, 2048)
    assert sizes2 == sizes


def test_capture_sizes_respect_the_limit() -> None:
    sizes, _, _ = capture_sizes(hist(STEP_BOUNDS, [600] * 10 + [3000] * 10), 0.25, 1024)
    assert sizes == [640, 768, 896, 1024]


def test_parse_scrape_sums_engines_and_reads_counters() -> None:
    reg = CollectorRegistry()
    h = Histogram("vllm:iteration_tokens_total", "x", ["engine"], buckets=[8, 16], registry=reg)
    h.labels("0").observe(5)
    h.labels("1").observe(12)
    Counter("vllm:num_preemptions", "x", ["engine"], registry=reg).labels("0").inc(3)
    Gauge("vllm:kv_cache_usage_perc", "x", ["engine"], registry=reg).labels("0").set(0.4)
    info = Gauge("vllm:cache_config_info", "x", ["block_size", "engine"], registry=reg)
    info.labels("16", "0").set(1)
    s = parse_scrape(generate_latest(reg).decode(), 1.0)
    steps = s.histograms["vllm:iteration_tokens_total"]
    assert steps.count == 2 and steps.buckets == [(8.0, 1.0), (16.0, 2.0), (math.inf, 2.0)]
    assert s.counters["vllm:num_preemptions"] == 3
    assert s.gauges["vllm:kv_cache_usage_perc"] == 0.4
    assert s.cache_info == {"block_size": "16"}
    with pytest.raises(WarmctlError, match="not Prometheus text"):
        parse_scrape("a b c\n", 1.0, "h")


def test_delta_refuses_a_restart_or_new_buckets() -> None:
    a = hist(STEP_BOUNDS, [4, 4, 600])
    b = hist(STEP_BOUNDS, [4, 4, 600, 12])
    d = delta(b, a, "steps", "h")
    assert d.count == 1 and d.total == 12
    with pytest.raises(WarmctlError, match=r"went down.*restarted"):
        delta(a, b, "steps", "h")
    with pytest.raises(WarmctlError, match="changed its buckets"):
        delta(hist((1, 2), [1]), a, "steps", "h")


def test_no_traffic_keeps_everything() -> None:
    p = propose(obs([], [], []), Knobs(sleeps=True))
    assert all(c.keep for c in p.choices)
    assert {c.why for c in p.choices} == {"no traffic between the scrapes: keep"}
    assert instance_changes(p) == {}


def test_one_shape() -> None:
    # every request: a 113-token prompt, 8 tokens, 4 at a time
    o = obs([113] * 400, [8] * 400, [113] * 400 + [4] * 2800, running=[4, 4, 4, 4], kv=[0.01] * 4)
    p = propose(o, Knobs(sleeps=True))
    # 4 lies in vLLM's (1, 8] bucket: 2, 4 and 8 cover it
    assert p.choice(CAPTURE).value == [2, 4, 8, 80, 96, 112, 128]
    assert p.choice(MAX_NUM_SEQS).keep and p.choice(MAX_BATCHED).keep
    # one bucket (100-200]: the interpolated percentiles spread inside it
    assert p.choice(WARMUP_PROMPTS).value == [110, 150, 190]
    assert p.choice(WARMUP_RAMP).value == [1, 4]
    # 1.5 x the larger of 1 % x 160,000 tokens and 4 x (p99 prompt + p99 generation), but at
    # least one max_model_len request (40960 / 16 = 2560 blocks): vLLM refuses less (seen on
    # the H200: 2344 blocks for a 40960 context failed the start)
    kv = p.choice(KV_BLOCKS)
    assert math.ceil(1.5 * max(1600, 4 * (199.0 + 9.96)) / 16) < 2560
    assert kv.value == 2560 and "vLLM refuses less" in kv.why
    o.max_model_len = 1024  # a short context: the traffic decides
    kv_small = propose(o, Knobs(sleeps=True)).choice(KV_BLOCKS)
    assert kv_small.value == math.ceil(1.5 * max(1600, 4 * (199.0 + 9.96)) / 16)
    o.max_model_len = None
    assert propose(o, Knobs(sleeps=True)).choice(KV_BLOCKS).keep
    changes = instance_changes(p, {"extra_args": ["--seed", "1", "--num-gpu-blocks-override=9"]})
    assert changes["extra_args"] == ["--seed", "1", "--num-gpu-blocks-override", str(kv.value)]
    assert changes["warmup_args"] == ["--prompt-tokens", "110,150,190", "--batch-sizes", "1,4"]


def test_huge_prompts_are_too_coarse() -> None:
    # prompts above the last bound (20,000) of the 1-2-5 series: only a lower bound is known
    o = obs([30000] * 50, [10] * 50, [8192] * 200 + [4] * 400, running=[2, 3])
    p = propose(o, Knobs(sleeps=True))
    assert p.choice(MAX_BATCHED).keep
    assert "too coarse" in p.choice(MAX_BATCHED).why
    assert p.choice(WARMUP_PROMPTS).keep and "too coarse" in p.choice(WARMUP_PROMPTS).why
    assert p.choice(KV_BLOCKS).keep
    # the steps are bounded; those above --max-capture are said to run without a graph
    cap = p.choice(CAPTURE)
    assert cap.value == [2, 4, 8] and "200 steps (33.3%) above 2048 run without a graph" in cap.why
    only_big = propose(obs([30000] * 5, [10] * 5, [8192] * 5), Knobs()).choice(CAPTURE)
    assert only_big.keep and "every step is above 2048" in only_big.why


def test_steps_above_the_last_bound_are_too_coarse() -> None:
    p = propose(obs([900] * 10, [9] * 10, [20000] * 10), Knobs())
    assert p.choice(CAPTURE).keep and "too coarse" in p.choice(CAPTURE).why


def test_long_prompts_raise_max_num_batched_tokens() -> None:
    o = obs([15000] * 100, [50] * 100, [8192] * 300, running=[3, 3], max_num_batched_tokens=2048)
    c = propose(o, Knobs()).choice(MAX_BATCHED)
    assert c.value == 512 * math.ceil((o.prompt.quantile(0.99) + 3) / 512)
    assert "chunked prefill" in c.why


def test_queueing_with_room_raises_max_num_seqs() -> None:
    o = obs(
        [500] * 100,
        [100] * 100,
        [32] * 1000,
        running=[32, 32, 32],
        kv=[0.3],
        queue=[0.5] * 100,
        max_num_seqs=32,
    )
    o.samples[0].waiting = 20
    c = propose(o, Knobs()).choice(MAX_NUM_SEQS)
    assert c.value == 64 and "queued" in c.why
    o.preemptions = 5
    c = propose(o, Knobs()).choice(MAX_NUM_SEQS)
    assert c.keep and "preemptions" in c.why


def test_cpu_server_gets_no_capture_sizes_and_awake_instances_no_kv() -> None:
    p = propose(obs([100] * 10, [8] * 10, [100] * 10, device="cpu"), Knobs(sleeps=False))
    assert p.choice(CAPTURE).keep and "CPU" in p.choice(CAPTURE).why
    assert p.choice(KV_BLOCKS).keep and "never sleeps" in p.choice(KV_BLOCKS).why
    p = propose(obs([100] * 10, [8] * 10, [100] * 10), Knobs(sleeps=False))
    assert p.choice(KV_BLOCKS).keep and "does not sleep" in p.choice(KV_BLOCKS).why
    # no /server_info (no dev mode): the server cannot sleep, whatever the inventory says
    p = propose(obs([100] * 10, [8] * 10, [100] * 10, sleep_mode=None), Knobs(sleeps=True))
    assert not p.sleeps and p.choice(KV_BLOCKS).keep


def test_snippet_merges_into_the_inventory_instances() -> None:
    o = obs([600] * 100, [50] * 100, [600] * 100 + [8] * 5000, running=[8, 8])
    o.target = "gpu-1/chat"
    p = propose(o, Knobs(sleeps=False))
    instances = [
        {"name": "chat", "model": "/m", "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
        {"name": "code", "model": "/c"},
    ]
    text = snippet([p], {"gpu-1/chat": ("gpu-1", "chat", instances, False)}, "# head\n")
    assert text.startswith("# head\n")
    data = yaml.safe_load(text)
    chat, code = data["all"]["hosts"]["gpu-1"]["vllm_service_instances"]
    assert code == {"name": "code", "model": "/c"}
    assert chat["model"] == "/m"
    assert chat["compilation_config"]["cudagraph_mode"] == "PIECEWISE"
    assert chat["compilation_config"]["cudagraph_capture_sizes"] == p.choice(CAPTURE).value
    # p10/p50/p90 interpolated inside vLLM's (500, 1000] bucket
    assert chat["warmup_args"] == ["--prompt-tokens", "550,750,950", "--batch-sizes", "1,8"]
    assert instances[0] == {
        "name": "chat",
        "model": "/m",
        "compilation_config": {"cudagraph_mode": "PIECEWISE"},
    }


def test_more_graphs_than_now_says_what_a_restart_pays() -> None:
    steps = [4, 12, 24] * 1000 + [300, 600, 900] * 20
    prompts, gens = [600.0] * 50, [32.0] * 50
    more = propose(obs(prompts, gens, steps, capture_sizes=[1, 2, 4, 8]), Knobs())
    assert len(more.choice(CAPTURE).value) == 14
    assert "10 more graphs than now" in more.choice(CAPTURE).why
    fewer = propose(obs(prompts, gens, steps, capture_sizes=list(range(1, 60))), Knobs())
    assert "more graphs than now" not in fewer.choice(CAPTURE).why
