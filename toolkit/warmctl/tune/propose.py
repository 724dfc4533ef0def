"""What the observed traffic says each setting should be: capture sizes, scheduler limits,
warmup and KV cache, each a `Choice` with what was observed and why."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from warmctl.plan.roles import gpu_capture_sizes
from warmctl.server.metrics import CACHE_INFO, Histogram
from warmctl.tune.observe import Observation

# the project's GPU default (roles/vllm_service/defaults/main.yml): what "keep" means
DEFAULT_CAPTURE_SIZES = gpu_capture_sizes()
DEFAULT_MAX_PADDING = 0.25
# a step bucket holding fewer than this share of the window's steps is "not reached"
MIN_STEP_SHARE = 0.001
DEFAULT_MAX_CAPTURE = 2048
DEFAULT_KV_HEADROOM = 1.5


@dataclass
class Choice:
    """One proposed setting: `value` None means keep what the instance has."""

    key: str  # the roles' name (compilation_config.cudagraph_capture_sizes, max_num_seqs, ...)
    value: Any
    now: Any
    observed: str
    why: str

    @property
    def keep(self) -> bool:
        return self.value is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "now": self.now,
            "keep": self.keep,
            "observed": self.observed,
            "why": self.why,
        }


@dataclass
class Knobs:
    max_padding: float = DEFAULT_MAX_PADDING
    max_capture: int = DEFAULT_MAX_CAPTURE
    kv_headroom: float = DEFAULT_KV_HEADROOM
    sleeps: bool | None = None  # from the inventory (False: never); None: the server says
    graphs: bool = True  # False: the inventory says the instance captures none (CPU, eager)


@dataclass
class Proposal:
    target: str
    observation: Observation
    choices: list[Choice]
    sleeps: bool

    def choice(self, key: str) -> Choice:
        return next(c for c in self.choices if c.key == key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "sleeps": self.sleeps,
            "observed": self.observation.to_dict(),
            "choices": [c.to_dict() for c in self.choices],
        }


CAPTURE = "compilation_config.cudagraph_capture_sizes"
MAX_NUM_SEQS = "max_num_seqs"
MAX_BATCHED = "max_num_batched_tokens"
WARMUP_PROMPTS = "warmup prompt tokens"
WARMUP_RAMP = "warmup concurrency ramp"
KV_BLOCKS = "num_gpu_blocks_override"


def size_grid(limit: int, max_padding: float) -> list[int]:
    """Every capture size worth having up to `limit`: 1, 2, 4, 8, then each octave [a, 2a]
    cut into steps of max(8, a * max_padding) rounded down to a multiple of 8. A step of n
    tokens is then padded to at most max(n * (1 + max_padding), n + 7) tokens."""
    grid = [s for s in (1, 2, 4, 8) if s <= limit]
    a = 8
    while a < limit:
        step = max(8, 8 * int(a * max_padding // 8))
        g = a + step
        while g < 2 * a:
            grid.append(g)
            g += step
        grid.append(2 * a)
        a *= 2
    return [g for g in grid if g <= limit] or [1]


def capture_sizes(
    steps: Histogram, max_padding: float, limit: int
) -> tuple[list[int], list[tuple[float, float, float]], str]:
    """(sizes, reached buckets (lo, hi, count), note). Sizes cover the buckets of tokens per step
    that traffic reached (at least MIN_STEP_SHARE of the steps), each filled with `size_grid`;
    nothing in a bucket no step fell in."""
    reached: list[tuple[float, float, float]] = []
    prev = 0.0
    prev_cum = 0.0
    floor = max(1.0, MIN_STEP_SHARE * steps.count)
    for le, cum in steps.buckets:
        count = cum - prev_cum
        if count >= floor:
            reached.append((prev, le, count))
        prev, prev_cum = le, cum
    if not reached:
        return [], [], ""
    top = reached[-1][1]
    note = ""
    if math.isinf(top):
        note = f"steps above {prev_inf(steps):g} tokens (the histogram's last bound)"
    cap = int(min(limit, top if not math.isinf(top) else limit))
    grid = size_grid(cap, max_padding)
    sizes = []
    lower = 0
    for g in grid:
        if any(lo < g and hi > lower for lo, hi, _ in reached):
            sizes.append(g)
        lower = g
    return sizes, reached, note


def prev_inf(h: Histogram) -> float:
    finite = [le for le, _ in h.buckets if not math.isinf(le)]
    return finite[-1] if finite else 0.0


def _pct(h: Histogram, q: float) -> float | None:
    return h.quantile(q)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.0f}{unit}" if value >= 10 else f"{value:.2g}{unit}"


def _dist(h: Histogram, unit: str = "") -> str:
    """p50/p90/p99 as vLLM's buckets give them, with the top bucket that was reached."""
    if h.count <= 0:
        return "no observation"
    parts = [f"p{int(q * 100)} {_fmt(_pct(h, q), unit)}" for q in (0.5, 0.9, 0.99)]
    top = _top_bucket(h)
    return ", ".join(parts) + f" (n={h.count:.0f}; top bucket {top})"


def _top_bucket(h: Histogram) -> str:
    prev, prev_cum = 0.0, 0.0
    top = "-"
    for le, cum in h.buckets:
        if cum > prev_cum:
            top = f"{prev:g}-{le:g}" if not math.isinf(le) else f">{prev:g}"
        prev, prev_cum = le, cum
    return top


def _in_inf(h: Histogram, q: float) -> bool:
    """Whether quantile q of h lies in the +Inf bucket (only a lower bound is known)."""
    if h.count <= 0 or not h.buckets:
        return False
    finite = [(le, c) for le, c in h.buckets if not math.isinf(le)]
    return bool(finite) and finite[-1][1] < q * h.count


def propose(obs: Observation, knobs: Knobs) -> Proposal:
    # sleeping needs the dev-mode routes, so the server's /server_info tells; the inventory can
    # only say no (sleep: false, or a CPU host)
    sleeps = obs.sleep_mode is True and knobs.sleeps is not False
    no_traffic = obs.steps.count <= 0 or obs.prompt.count <= 0
    choices = [
        _capture_choice(obs, knobs, no_traffic),
        _max_num_seqs_choice(obs, no_traffic),
        _batched_choice(obs, no_traffic),
        *_warmup_choices(obs, no_traffic),
        _kv_choice(obs, knobs, sleeps, no_traffic),
    ]
    return Proposal(obs.target, obs, choices, sleeps)


NO_TRAFFIC = "no traffic between the scrapes: keep"


def _capture_choice(obs: Observation, knobs: Knobs, no_traffic: bool) -> Choice:
    now = obs.capture_sizes
    observed = _dist(obs.steps, " tok")
    if no_traffic:
        return Choice(CAPTURE, None, now, observed, NO_TRAFFIC)
    if obs.device == "cpu" or not knobs.graphs:
        return Choice(
            CAPTURE, None, now, observed, "CPU host or enforce_eager: it captures no CUDA graphs"
        )
    limit = knobs.max_capture
    if obs.max_num_batched_tokens:
        limit = min(limit, obs.max_num_batched_tokens)
    sizes, reached, note = capture_sizes(obs.steps, knobs.max_padding, limit)
    if note and len(reached) == 1:
        return Choice(
            CAPTURE,
            None,
            now,
            observed,
            f"too coarse: every step is among the {note}; keep",
        )
    above = sum(c for lo, _, c in reached if lo >= limit)
    if not sizes:
        return Choice(
            CAPTURE,
            None,
            now,
            observed,
            f"every step is above {limit} tokens (--max-capture / max_num_batched_tokens): "
            "no graph would serve them: keep",
        )
    bound = f"padding at most +{knobs.max_padding:.0%} or +7 tokens"
    why = (
        f"{len(sizes)} sizes up to {max(sizes)} over the step buckets traffic reached "
        f"({', '.join(f'{lo:g}-{hi:g}' for lo, hi, _ in reached)}); {bound}; "
        f"none where no step fell (bucket holding < {MIN_STEP_SHARE:.1%} of steps)"
    )
    if above:
        why += (
            f"; {above:.0f} steps ({above / obs.steps.count:.1%}) above {limit} run without a graph"
        )
    if note:
        why += f"; {note}: they run without a graph"
    if now and len(sizes) > len(now):
        # H200, Qwen3-0.6B shape: 27 sizes instead of 15 cost 1.7 s more capture and 1.5 s more
        # compile-cache load on every restart (docs/BENCHMARKS.md, tune run 4)
        why += (
            f"; {len(sizes) - len(now)} more graphs than now: each start captures (and loads) "
            "them, about 3 s more per restart on an H200 for 12 more"
        )
    return Choice(CAPTURE, sizes, now, observed, why)


def _max_num_seqs_choice(obs: Observation, no_traffic: bool) -> Choice:
    now = obs.max_num_seqs
    peak_run, peak_wait = obs.peak("running"), obs.peak("waiting")
    mean = obs.mean_running
    queue_p90 = _pct(obs.queue, 0.9)
    observed = (
        f"running peak {_fmt(peak_run)}, mean {_fmt(mean)}; waiting peak {_fmt(peak_wait)}; "
        f"queue p90 {_fmt(queue_p90 * 1000 if queue_p90 is not None else None, ' ms')}; "
        f"preemptions {obs.preemptions:.0f}"
    )
    if no_traffic:
        return Choice(MAX_NUM_SEQS, None, now, observed, NO_TRAFFIC)
    if now is None:
        return Choice(
            MAX_NUM_SEQS, None, now, observed, "the server does not tell its value (dev mode): keep"
        )
    kv_peak = obs.peak("kv_usage")
    if (
        peak_run is not None
        and peak_run >= now
        and (peak_wait or 0) > 0
        and queue_p90 is not None
        and queue_p90 > 0.05
        and obs.preemptions == 0
        and (kv_peak is None or kv_peak < 0.8)
    ):
        want = 1 << math.ceil(math.log2(peak_run + (peak_wait or 0)))
        return Choice(
            MAX_NUM_SEQS,
            want,
            now,
            observed,
            f"all {now} slots were busy while requests queued (p90 {queue_p90 * 1000:.0f} ms) "
            f"and the KV cache had room (peak {_fmt((kv_peak or 0) * 100)} %)",
        )
    if obs.preemptions > 0:
        return Choice(
            MAX_NUM_SEQS,
            None,
            now,
            observed,
            f"{obs.preemptions:.0f} preemptions: the KV cache is too small for this concurrency; "
            "give it more memory (gpu_memory_utilization) rather than more slots: keep",
        )
    return Choice(MAX_NUM_SEQS, None, now, observed, "no request waited for a slot: keep")


def _batched_choice(obs: Observation, no_traffic: bool) -> Choice:
    now = obs.max_num_batched_tokens
    observed = "prompt " + _dist(obs.prompt, " tok")
    if no_traffic:
        return Choice(MAX_BATCHED, None, now, observed, NO_TRAFFIC)
    if now is None:
        return Choice(
            MAX_BATCHED, None, now, observed, "the server does not tell its value (dev mode): keep"
        )
    if _in_inf(obs.prompt, 0.99):
        return Choice(
            MAX_BATCHED,
            None,
            now,
            observed,
            f"too coarse: p99 prompt is above {prev_inf(obs.prompt):g} tokens, the histogram's "
            "last bound: keep",
        )
    p99 = _pct(obs.prompt, 0.99) or 0.0
    if p99 <= now:
        return Choice(
            MAX_BATCHED, None, now, observed, f"p99 prompt ({p99:.0f}) prefills in one step: keep"
        )
    cap = obs.max_model_len or math.inf
    want = int(min(cap, 512 * math.ceil((p99 + (obs.peak("running") or 0)) / 512)))
    return Choice(
        MAX_BATCHED,
        want,
        now,
        observed,
        f"p99 prompt {p99:.0f} > {now}: such prompts take several steps (chunked prefill)",
    )


def _warmup_choices(obs: Observation, no_traffic: bool) -> list[Choice]:
    observed = _dist(obs.prompt, " tok")
    if no_traffic:
        return [
            Choice(WARMUP_PROMPTS, None, None, observed, NO_TRAFFIC),
            Choice(WARMUP_RAMP, None, None, "-", NO_TRAFFIC),
        ]
    out: list[Choice] = []
    if _in_inf(obs.prompt, 0.5):
        out.append(
            Choice(
                WARMUP_PROMPTS,
                None,
                None,
                observed,
                f"too coarse: most prompts are above {prev_inf(obs.prompt):g} tokens, "
                "the histogram's last bound: keep the default prompts",
            )
        )
    else:
        cap = (obs.max_model_len or math.inf) - 64
        lengths = []
        for q in (0.1, 0.5, 0.9):
            v = _pct(obs.prompt, q)
            if v is not None and v >= 1:
                n = int(max(1, min(cap, round(v / 10) * 10 or round(v))))
                if n not in lengths:
                    lengths.append(n)
        note = ""
        if _in_inf(obs.prompt, 0.9):
            note = f"; p90 is above {prev_inf(obs.prompt):g} tokens (last bound): capped there"
        out.append(
            Choice(
                WARMUP_PROMPTS,
                lengths,
                None,
                observed,
                "one prompt at each of p10, p50, p90 of the observed prompt lengths" + note,
            )
        )
    out.append(_ramp_choice(obs))
    return out


def _ramp_choice(obs: Observation) -> Choice:
    have = [s.running for s in obs.samples if s.running is not None] if obs.windowed else []
    sampled = [s for s in have if s > 0]
    cap = obs.max_num_seqs or 1024
    if sampled:
        points = [1.0] + [obs.sampled("running", q) or 1.0 for q in (0.5, 0.9, 1.0)]
        observed = (
            f"running p50 {_fmt(obs.sampled('running', 0.5))}, "
            f"p90 {_fmt(obs.sampled('running', 0.9))}, max {_fmt(max(have))} "
            f"({len(have)} samples)"
        )
        why = "1, then the sampled p50, p90 and peak of running requests"
    else:
        mean = obs.mean_in_system
        if mean is None or mean <= 0:
            return Choice(
                WARMUP_RAMP, None, None, "no running request sampled", "nothing to size it: keep"
            )
        points = [1.0, mean, 2 * mean]
        observed = f"mean in flight {_fmt(mean)} (end-to-end time / window; no samples)"
        why = "1, the mean and twice the mean of requests in flight (not sampled: --since)"
    ramp = sorted({int(max(1, min(cap, math.ceil(p)))) for p in points})
    return Choice(WARMUP_RAMP, ramp, None, observed, why)


def _kv_choice(obs: Observation, knobs: Knobs, sleeps: bool, no_traffic: bool) -> Choice:
    capacity = obs.kv_capacity_tokens
    block = int(obs.cache_info.get("block_size") or 0) or None
    now = int(obs.cache_info["num_gpu_blocks"]) if capacity and block else None
    kv_peak = obs.peak("kv_usage")
    run_peak = obs.peak("running") or (2 * obs.mean_running if obs.mean_running else None)
    p99_tokens = None
    if obs.prompt.count > 0 and obs.generation.count > 0:
        p99_tokens = (_pct(obs.prompt, 0.99) or 0) + (_pct(obs.generation, 0.99) or 0)
    observed = (
        f"KV usage peak {_fmt(kv_peak * 100 if kv_peak is not None else None, ' %')} of "
        f"{_fmt(capacity)} tokens; running peak {_fmt(run_peak)}; "
        f"p99 prompt+generation {_fmt(p99_tokens, ' tok')}"
    )
    if obs.device == "cpu":
        return Choice(KV_BLOCKS, None, now, observed, "CPU server: it never sleeps: keep")
    if not sleeps:
        return Choice(KV_BLOCKS, None, now, observed, "the instance does not sleep: keep")
    if no_traffic:
        return Choice(KV_BLOCKS, None, now, observed, NO_TRAFFIC)
    if not capacity or not block or now is None:
        return Choice(
            KV_BLOCKS, None, now, observed, f"/metrics has no {CACHE_INFO} with num_gpu_blocks"
        )
    if obs.preemptions > 0:
        return Choice(
            KV_BLOCKS, None, now, observed, "preemptions seen: the KV cache is not too big: keep"
        )
    needs = []
    if kv_peak is not None:
        needs.append(kv_peak * capacity)
    if run_peak and p99_tokens and not _in_inf(obs.prompt, 0.99):
        needs.append(run_peak * p99_tokens)
    if not needs:
        return Choice(KV_BLOCKS, None, now, observed, "nothing sampled to size it: keep")
    if not obs.max_model_len:
        return Choice(KV_BLOCKS, None, now, observed, "max_model_len unknown (vLLM's floor): keep")
    want_tokens = max(needs) * knobs.kv_headroom
    # vLLM refuses to start when the KV cache cannot hold one request of max_model_len
    floor = math.ceil(obs.max_model_len / block)
    want = max(floor, math.ceil(want_tokens / block))
    if want >= 0.8 * now:
        return Choice(KV_BLOCKS, None, now, observed, "the traffic uses most of it: keep")
    why = (
        f"{knobs.kv_headroom:g}x the larger of peak usage and peak running x p99 tokens"
        + (
            f", raised to one max_model_len request ({floor} blocks; vLLM refuses less)"
            if want == floor
            else ""
        )
        + f": {want / now:.1%} of today's blocks, so a wake re-maps that much KV memory"
    )
    return Choice(KV_BLOCKS, want, now, observed, why)
