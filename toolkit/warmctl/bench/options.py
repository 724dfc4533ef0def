"""What one `warmctl bench` run was asked for: built once from the command's options, then read
by the run (bench/main.py) and handed in parts to the runner (its `Knobs`, the budget)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warmctl.bench import configs
from warmctl.bench.runner import Knobs


@dataclass(frozen=True)
class Server:
    """What every configuration's server gets on this machine."""

    model: str  # a folder (absolute) or a model id
    python: Path  # the interpreter that has vLLM installed
    device: str  # auto, gpu or cpu
    port: int
    served_name: str
    extra_args: tuple[str, ...]  # vLLM arguments every configuration gets
    extra_env: dict[str, str]  # variables every configuration gets
    tensor_parallel_size: int


@dataclass(frozen=True)
class Levers:
    """The settings of the configurations that differ from B (C's and W's)."""

    c_capture_sizes: tuple[int, ...] = configs.C_CAPTURE_SIZES
    c_gpu_memory_utilization: float | None = None
    w_warmup_args: tuple[str, ...] = configs.W_WARMUP_ARGS


@dataclass(frozen=True)
class BenchOptions:
    """One run: the machine's server, the plan and its levers, the traffic, where it goes."""

    server: Server
    out: Path
    plan: str  # e.g. A,B,B+sleep,C,C (runner.parse_plan)
    levers: Levers
    knobs: Knobs
    budget_s: float | None  # seconds the whole plan may take (None: no limit)
    compile_bytecode: bool  # compile the vLLM interpreter's site-packages first
    command_line: str  # the options as one reproducible command line (for the JSON)
