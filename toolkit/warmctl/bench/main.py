"""Assemble a benchmark run from the command's options: the machine (`Site`), the plan, the
metadata that makes the JSON reproducible; run it; print the tables."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

from warmctl.bench import bytecode, configs, gpumem, shims
from warmctl.bench.report import print_report
from warmctl.bench.runner import Knobs, Runner, echo_stderr, parse_plan
from warmctl.errors import WarmctlError

MODEL_KEYS = (
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "torch_dtype",
    "dtype",
)


def run(
    *,
    model: str,
    python: Path,
    plan: str,
    device: str,
    out: Path,
    port: int,
    served_name: str,
    extra_args: tuple[str, ...],
    extra_env: dict[str, str],
    tensor_parallel_size: int,
    c_capture_sizes: tuple[int, ...] | None,
    c_gpu_memory_utilization: float | None,
    idle_gap: float,
    budget: float | None,
    single_n: int,
    bursts_n: int,
    burst_width: int,
    decode_tokens: int,
    start_timeout: float,
    command_line: str,
    compile_bytecode: bool = True,
    w_warmup_args: tuple[str, ...] = configs.W_WARMUP_ARGS,
) -> dict[str, Any]:
    if device == "auto":
        device = "gpu" if gpumem.available() else "cpu"
    if tensor_parallel_size < 1:
        raise WarmctlError(
            f"--tensor-parallel-size {tensor_parallel_size}: expected 1 or more", kind="input"
        )
    if single_n < 2 or bursts_n < 2 or burst_width < 1:
        raise WarmctlError(
            "--requests and --bursts need at least 2 (a first and a steady one)", kind="input"
        )
    out = out.absolute()
    work = out / "work"
    if work.exists() and any(work.iterdir()):
        raise WarmctlError(
            f"{work} is not empty: a cold start needs empty cache dirs "
            "(choose another --out or remove it)",
            kind="input",
        )
    model_path = Path(model).expanduser()
    model_ref = str(model_path.absolute()) if model_path.exists() else model
    site = configs.Site(
        device=device,
        venv=shims.vllm_venv(python, work / "vllm-venv"),
        model=model_ref,
        served_name=served_name,
        port=port,
        workdir=work,
        warmctl_venv=shims.warmctl_venv(work / "warmctl-venv"),
        extra_args=extra_args,
        extra_env=extra_env,
        tensor_parallel_size=tensor_parallel_size,
    )
    table = configs.standard(
        c_capture_sizes or configs.C_CAPTURE_SIZES, c_gpu_memory_utilization, w_warmup_args
    )
    steps = parse_plan(plan, table)
    meta: dict[str, Any] = {
        "command": command_line,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": device,
        "device_name": gpumem.gpu_name() or _cpu_name(),
        "model": model_ref,
        "model_config": _model_config(model_path),
        # what a host runs: the unit's environment, a venv with bytecode (bench/bytecode.py)
        "bytecode": bytecode.prepare(site.venv / "bin" / "python", compile_bytecode),
        "plan": plan,
        "tensor_parallel_size": tensor_parallel_size,
        "configs": {
            k: {
                "title": c.title,
                "compilation_config": c.compilation_config,
                "instance_extra": c.instance_extra,
            }
            for k, c in table.items()
        },
        "knobs": {
            "requests": single_n,
            "bursts": bursts_n,
            "burst_width": burst_width,
            "decode_tokens": decode_tokens,
            "idle_gap_s": idle_gap,
        },
    }
    knobs = Knobs(
        single_n=single_n,
        bursts_n=bursts_n,
        burst_width=burst_width,
        decode_tokens=decode_tokens,
        start_timeout_s=start_timeout,
        idle_gap_s=idle_gap,
    )
    doc = Runner(site, steps, out, knobs, budget, echo_stderr, meta).run()
    print_report(doc)
    echo_stderr(f"[bench] raw results: {out / 'bench.json'}")
    return doc


def report_only(path: Path, plot_file: Path | None = None, strict: bool = True) -> None:
    """Print the tables of a saved document; draw it to `plot_file` (when matplotlib is missing:
    an error if `strict`, else one note on stderr)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WarmctlError(f"cannot read {path}: {exc}", kind="input") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise WarmctlError(f"{path}: not a warmctl bench.json (no steps)", kind="input")
    print_report(doc)
    if plot_file is not None:
        from warmctl.bench.plot import draw

        try:
            draw(doc, plot_file)
        except WarmctlError as err:
            if strict or err.kind != "missing_dependency":
                raise
            echo_stderr(f"[bench] no picture: {err}")
            return
        echo_stderr(f"[bench] startup picture: {plot_file}")


def _model_config(path: Path) -> dict[str, Any] | None:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: cfg[k] for k in MODEL_KEYS if k in cfg}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU: " + (platform.processor() or platform.machine())
