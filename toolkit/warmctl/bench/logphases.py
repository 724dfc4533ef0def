"""Startup phases of a vLLM server from its log lines, each stamped with the seconds since the
process was started (see `process.StampedLine`), plus the durations vLLM reports itself.

Milestones are matched on vLLM's own messages (0.26 on CUDA, 0.3x on CPU); a milestone a
backend does not log is simply absent, and the phase before the next one found absorbs it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmctl.bench.process import StampedLine

# (key, phase that ENDS at this milestone, pattern); in startup order
MILESTONES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("api_args", "API process start + imports", re.compile(r"non-default args")),
    ("engine_init", "EngineCore start + imports", re.compile(r"Initializing a V1 LLM engine")),
    ("model_loaded", "model load", re.compile(r"Model loading took")),
    ("compiled", "torch.compile (dynamo + inductor)", re.compile(r"torch\.compile took")),
    ("kv_cache", "memory profile + KV cache", re.compile(r"KV cache size")),
    ("captured", "CUDA graph capture", re.compile(r"Graph capturing finished")),
    ("kernels_warm", "kernel warmup (Triton JIT)", re.compile(r"Kernel JIT monitor activated")),
    ("engine_ready", "engine init done", re.compile(r"init engine \(profile")),
    ("listening", "API server start", re.compile(r"Starting vLLM server")),
    ("app_ready", "app startup", re.compile(r"Application startup complete")),
)

# durations vLLM reports itself: key -> pattern with one group (seconds)
REPORTED: dict[str, re.Pattern[str]] = {
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s"),
    "weights_load_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took .*? and ([\d.]+) seconds"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile.*?took ([\d.]+) s"),
}

COMPILE_LOADED = re.compile(r"Directly load (the compiled graph|AOT compilation)")
COMPILE_FRESH = re.compile(r"Compiling a graph for compile range")
# vLLM's JIT monitor, active after its own warmup: one line per kernel compiled while serving
SERVE_JIT = re.compile(r"during inference: .*latency spike")
CAPTURE_SIZES = re.compile(r"cudagraph_capture_sizes['\"]?: ?\[([\d, ]*)\]")


@dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Startup:
    milestones: dict[str, float]  # key -> seconds since process start (first occurrence)
    phases: list[Phase]
    reported: dict[str, float]
    compile_cache: str  # "hit", "miss", "partial" or "unknown"
    capture_sizes: int | None  # how many CUDA graph sizes vLLM was configured to capture


def parse_startup(lines: list[StampedLine], ready_s: float | None = None) -> Startup:
    """Milestones and phases up to readiness; `ready_s` (the /health 200) closes the last one."""
    found: dict[str, float] = {}
    for key, _, pattern in MILESTONES:
        for ln in lines:
            if pattern.search(ln.text):
                found[key] = ln.t
                break
    names = {key: name for key, name, _ in MILESTONES}
    phases: list[Phase] = []
    prev = 0.0
    for key, t in sorted(found.items(), key=lambda kv: kv[1]):
        if ready_s is not None and t > ready_s:
            break
        phases.append(Phase(names[key], prev, t))
        prev = t
    if ready_s is not None:
        phases.append(Phase("until /health 200", prev, ready_s))

    reported: dict[str, float] = {}
    for key, pattern in REPORTED.items():
        for ln in lines:
            m = pattern.search(ln.text)
            if m:
                reported[key] = float(m.group(1))
                break

    loaded = any(COMPILE_LOADED.search(ln.text) for ln in lines)
    fresh = any(COMPILE_FRESH.search(ln.text) for ln in lines)
    cache = {(True, False): "hit", (False, True): "miss", (True, True): "partial"}.get(
        (loaded, fresh), "unknown"
    )
    return Startup(found, phases, reported, cache, _capture_sizes(lines))


def _capture_sizes(lines: list[StampedLine]) -> int | None:
    for ln in lines:
        m = CAPTURE_SIZES.search(ln.text)
        if m:
            return len([s for s in m.group(1).split(",") if s.strip()])
    return None


def serve_jit_events(lines: list[StampedLine], start_s: float, end_s: float) -> int:
    """How many kernels vLLM reports JIT-compiled while serving, between two instants."""
    return sum(1 for ln in lines if start_s <= ln.t < end_s and SERVE_JIT.search(ln.text))


# vLLM's error lines (its own logger's ERROR level, and Python tracebacks)
SERVER_ERROR = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|EngineDeadError")


def server_errors(lines: list[StampedLine], start_s: float, end_s: float) -> list[str]:
    """The server's error lines between two instants (at most 40, each cut to 300 chars)."""
    found = [
        ln.text[:300] for ln in lines if start_s <= ln.t < end_s and SERVER_ERROR.search(ln.text)
    ]
    return found[:40]
