"""Assemble a benchmark run from the command's options: the machine (`Site`), the plan, the
metadata that makes the JSON reproducible; run it; print the tables."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

from warmctl.bench import bytecode, configs, gpumem, shims
from warmctl.bench.options import BenchOptions, Server
from warmctl.bench.report import print_report
from warmctl.bench.runner import Runner, echo_stderr, parse_plan
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


def run(options: BenchOptions) -> dict[str, Any]:
    """Run the plan of `options`, write OUT/bench.json, print the tables; the document."""
    device = _device(options.server.device)
    _check(options)
    out = options.out.absolute()
    work = out / "work"
    if work.exists() and any(work.iterdir()):
        raise WarmctlError(
            f"{work} is not empty: a cold start needs empty cache dirs "
            "(choose another --out or remove it)",
            kind="input",
        )
    site = _site(options.server, device, work)
    table = configs.standard(
        options.levers.c_capture_sizes,
        options.levers.c_gpu_memory_utilization,
        options.levers.w_warmup_args,
    )
    steps = parse_plan(options.plan, table)
    meta = _meta(options, site, table)
    doc = Runner(site, steps, out, options.knobs, options.budget_s, echo_stderr, meta).run()
    print_report(doc)
    echo_stderr(f"[bench] raw results: {out / 'bench.json'}")
    return doc


def _device(asked: str) -> str:
    if asked == "auto":
        return "gpu" if gpumem.available() else "cpu"
    return asked


def _check(options: BenchOptions) -> None:
    """Bad input, one line, before anything is started."""
    if options.server.tensor_parallel_size < 1:
        raise WarmctlError(
            f"--tensor-parallel-size {options.server.tensor_parallel_size}: expected 1 or more",
            kind="input",
        )
    k = options.knobs
    if k.single_n < 2 or k.bursts_n < 2 or k.burst_width < 1:
        raise WarmctlError(
            "--requests and --bursts need at least 2 (a first and a steady one)", kind="input"
        )


def _site(server: Server, device: str, work: Path) -> configs.Site:
    """This machine, as every configuration's server sees it."""
    return configs.Site(
        device=device,
        venv=shims.vllm_venv(server.python, work / "vllm-venv"),
        model=_model_ref(server.model),
        served_name=server.served_name,
        port=server.port,
        workdir=work,
        warmctl_venv=shims.warmctl_venv(work / "warmctl-venv"),
        extra_args=server.extra_args,
        extra_env=server.extra_env,
        tensor_parallel_size=server.tensor_parallel_size,
    )


def _model_ref(model: str) -> str:
    """A local folder as an absolute path, else the model id as given."""
    path = Path(model).expanduser()
    return str(path.absolute()) if path.exists() else model


def _meta(
    options: BenchOptions, site: configs.Site, table: dict[str, configs.Config]
) -> dict[str, Any]:
    """What makes the JSON reproducible: the command, the machine, the model, the plan."""
    k = options.knobs
    return {
        "command": options.command_line,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": site.device,
        "device_name": gpumem.gpu_name() or _cpu_name(),
        "model": site.model,
        "model_config": _model_config(Path(options.server.model).expanduser()),
        # what a host runs: the unit's environment, a venv with bytecode (bench/bytecode.py)
        "bytecode": bytecode.prepare(site.venv / "bin" / "python", options.compile_bytecode),
        "plan": options.plan,
        "tensor_parallel_size": options.server.tensor_parallel_size,
        "configs": {
            key: {
                "title": c.title,
                "compilation_config": c.compilation_config,
                "instance_extra": c.instance_extra,
            }
            for key, c in table.items()
        },
        "knobs": {
            "requests": k.single_n,
            "bursts": k.bursts_n,
            "burst_width": k.burst_width,
            "decode_tokens": k.decode_tokens,
            "idle_gap_s": k.idle_gap_s,
        },
    }


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
