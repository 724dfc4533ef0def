"""Startup phases from vLLM log lines (0.26 on CUDA and 0.32 on CPU wordings)."""

from warmctl.bench.logphases import parse_startup, serve_jit_events
from warmctl.bench.process import StampedLine

GPU_LOG = [
    (18.2, "(APIServer pid=1) INFO 11-30 10:00:18 [api_utils.py:273] non-default args: {...}"),
    (
        40.5,
        "(EngineCore pid=2) INFO 11-30 10:00:40 [core.py:117] Initializing a V1 LLM engine "
        "(v0.26.0) with config: compilation_config={'cudagraph_capture_sizes': [1, 2, 4, 8], "
        "'max_cudagraph_capture_size': 8}",
    ),
    (44.0, "(EngineCore pid=2) INFO [default_loader.py:431] Loading weights took 0.61 seconds"),
    (
        44.9,
        "(EngineCore pid=2) INFO [gpu_model_runner.py:5348] Model loading took 1.13 GiB memory "
        "and 1.900000 seconds",
    ),
    (47.0, "(EngineCore pid=2) INFO [backends.py:1156] Dynamo bytecode transform time: 2.10 s"),
    (50.0, "(EngineCore pid=2) INFO [decorators.py:311] Directly load AOT compilation from path x"),
    (51.2, "(EngineCore pid=2) INFO [monitor.py:20] torch.compile took 5.31 s in total"),
    (52.0, "(EngineCore pid=2) INFO [kv_cache_utils.py:2177] GPU KV cache size: 1,100,000 tokens"),
    (
        55.1,
        "(EngineCore pid=2) INFO [gpu_model_runner.py:6845] Graph capturing finished in 3 secs, "
        "took 0.50 GiB",
    ),
    (56.0, "(EngineCore pid=2) INFO [jit_monitor.py:80] Kernel JIT monitor activated; ..."),
    (
        56.2,
        "(EngineCore pid=2) INFO [core.py:348] init engine (profile, create kv cache, warmup "
        "model) took 11.30 s",
    ),
    (57.9, "(APIServer pid=1) INFO [api_server.py:677] Starting vLLM server on http://x:8000"),
    (
        70.0,
        "(EngineCore pid=2) WARNING [jit_monitor.py:135] Triton kernel JIT compilation during "
        "inference: _topk_kernel (grid 1). This causes a latency spike; consider extending "
        "warmup to cover this shape/config.",
    ),
]


def lines(raw):
    return [StampedLine(t, text) for t, text in raw]


def test_gpu_phases_in_order_and_closed_by_readiness():
    s = parse_startup(lines(GPU_LOG), ready_s=58.4)
    names = [p.name for p in s.phases]
    assert names[0] == "API process start + imports"
    assert names[-1] == "until /health 200"
    assert "CUDA graph capture" in names and "kernel warmup (Triton JIT)" in names
    # contiguous: each phase starts where the previous ended, from 0 to readiness
    assert s.phases[0].start_s == 0.0
    assert all(a.end_s == b.start_s for a, b in zip(s.phases, s.phases[1:], strict=False))
    assert s.phases[-1].end_s == 58.4
    capture = next(p for p in s.phases if p.name == "CUDA graph capture")
    assert round(capture.seconds, 1) == 3.1
    assert s.reported["torch_compile_s"] == 5.31
    assert s.reported["graph_capture_s"] == 3.0
    assert s.reported["model_load_s"] == 1.9
    assert s.reported["init_engine_s"] == 11.3
    assert s.compile_cache == "hit"
    assert s.capture_sizes == 4


def test_fresh_compile_and_missing_milestones():
    raw = [
        (10.0, "INFO [api_utils.py:286] non-default args: {'host': '127.0.0.1'}"),
        (30.0, "INFO [backends.py:394] Compiling a graph for compile range (1, 512) takes 9 s"),
        (31.0, "INFO [monitor.py:20] torch.compile took 12.00 s in total"),
    ]
    s = parse_startup(lines(raw), ready_s=40.0)
    assert [p.name for p in s.phases] == [
        "API process start + imports",
        "torch.compile (dynamo + inductor)",
        "until /health 200",
    ]
    assert s.compile_cache == "miss"
    assert s.capture_sizes is None


def test_milestones_after_readiness_are_not_phases():
    s = parse_startup(lines(GPU_LOG), ready_s=50.0)
    assert s.phases[-1].name == "until /health 200"
    assert all(p.end_s <= 50.0 for p in s.phases)


def test_serve_jit_events_counted_per_window():
    raw = lines(GPU_LOG)
    assert serve_jit_events(raw, 60.0, 80.0) == 1
    assert serve_jit_events(raw, 0.0, 60.0) == 0
