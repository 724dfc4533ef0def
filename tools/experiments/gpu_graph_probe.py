#!/usr/bin/env python3
"""Probe: is the first prefill that lands in a CUDA-graph size the warmup never used slower than
the next ones of the same size? (Question behind the 1.04-1.22x first-request residual.)

Starts vLLM like the project's GPU unit (caches pinned, sleep mode, C's capture sizes), runs
`warmctl warmup` as the unit's ExecStartPost does, then sends single streamed completions whose
prompts are exact token counts (token-id prompts with a distinct first token, so no prefix-cache
hit shortens them): for each length, REPEAT requests in a row. Then restarts the server with the
primed caches and does it again. With --idle, also the TTFT of a 131-token request after
idle gaps from 0 to 4 s (the GPU's SM clock sampled meanwhile by nvidia-smi).
Prints a table, writes JSON.

Usage (GPU machine, vLLM importable by python3):
  python3 tools/experiments/gpu_graph_probe.py --model /root/models/qwen3-0.6b-random --out
/root/out
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

CAPTURE = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
LENGTHS = [12, 20, 40, 60, 100, 131, 180, 250, 300, 450, 500]
REPEAT = 6
GAPS = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 2.0, 4.0]
IDLE_REPEAT = 8
ROOT = Path(__file__).resolve().parents[2]


def wait_ready(base: str, proc: subprocess.Popen[bytes], limit: float = 400.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            if requests.get(base + "/v1/models", timeout=2).ok:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(0.2)
    sys.exit("server not ready")


def ttft(base: str, ids: list[int]) -> float:
    body = {"model": "m", "prompt": ids, "max_tokens": 2, "temperature": 0, "stream": True}
    t0 = time.monotonic()
    with requests.post(base + "/v1/completions", json=body, stream=True, timeout=60) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                obj = json.loads(line[6:])
                if obj.get("choices"):
                    return (time.monotonic() - t0) * 1000.0
    raise RuntimeError("no token")


def token_ids(first: int, length: int, vocab: int) -> list[int]:
    """A prompt of exactly `length` token ids starting with `first` (distinct first tokens:
    no prefix-cache hit between requests)."""
    return [first] + [(first + 7 * k) % (vocab - 1000) + 500 for k in range(1, length)]


def series(base: str, vocab: int, length: int, count: int, gap: float, seed: int) -> list[float]:
    """TTFTs (ms) of `count` requests of `length` tokens, each after `gap` seconds of idleness."""
    out = []
    for n in range(seed, seed + count):
        time.sleep(gap)
        out.append(ttft(base, token_ids(1000 + (n * 389) % (vocab - 2000), length, vocab)))
    return out


def probe(base: str, vocab: int, salt: int) -> list[dict[str, object]]:
    rows = []
    for i, length in enumerate(LENGTHS):
        samples = series(base, vocab, length, REPEAT, 0.0, (salt * len(LENGTHS) + i) * REPEAT)
        rows.append(
            {
                "tokens": length,
                "graph": next((c for c in CAPTURE if c >= length), None),
                "first_ms": samples[0],
                "rest_median_ms": statistics.median(samples[1:]),
                "samples_ms": samples,
            }
        )
    return rows


def idle_probe(base: str, vocab: int) -> list[dict[str, object]]:
    """TTFT of a 131-token request after an idle gap of G seconds, G from 0 to 4 s."""
    rows = []
    for i, gap in enumerate(GAPS):
        samples = series(base, vocab, 131, IDLE_REPEAT, gap, 100_000 + i * IDLE_REPEAT)
        rows.append({"gap_s": gap, "median_ms": statistics.median(samples), "samples_ms": samples})
    return rows


def start(args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    cache = Path(args.out) / "cache"
    env = dict(os.environ)
    env.update(
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        TRITON_CACHE_DIR=str(cache / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        CUDA_CACHE_PATH=str(cache / "nv"),
        XDG_CACHE_HOME=str(cache / "xdg"),
        VLLM_SERVER_DEV_MODE="1",
    )
    argv = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.model,
        "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8000",
        "--enable-sleep-mode", "--gpu-memory-utilization", "0.2",
        "--compilation-config", json.dumps({"cudagraph_capture_sizes": CAPTURE}),
    ]  # fmt: skip
    return subprocess.Popen(
        argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--starts", type=int, default=2)
    ap.add_argument("--idle", action="store_true", help="also: TTFT against idle gaps")
    ap.add_argument("--warmup-args", default="", help="extra `warmctl warmup` arguments")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = "http://127.0.0.1:8000"
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    runs = []
    for i in range(args.starts):
        proc = start(args, out / f"probe-server-{i}.log")
        try:
            ready = wait_ready(base, proc)
            t0 = time.monotonic()
            subprocess.run(
                [sys.executable, "-c", "from warmctl.cli import main; main()", "warmup", base,
                 *args.warmup_args.split()],
                check=True, env={**os.environ, "PYTHONPATH": f"{ROOT}/toolkit:" +
                                 os.environ.get("PYTHONPATH", "")},
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            warm = time.monotonic() - t0
            time.sleep(1.0)
            rows = probe(base, vocab, i)
            idle = idle_probe(base, vocab) if args.idle else []
        finally:
            stop(proc)
        runs.append({"start": i, "ready_s": ready, "warmup_s": warm, "rows": rows, "idle": idle})
        print(f"start {i}: ready {ready:.1f} s, warmup {warm:.1f} s")
        print(f"{'tokens':>6} {'graph':>5} {'first ms':>9} {'rest ms':>8} {'x':>5}")
        for r in rows:
            x = r["first_ms"] / r["rest_median_ms"]  # type: ignore[operator]
            print(
                f"{r['tokens']:>6} {r['graph']!s:>5} {r['first_ms']:>9.1f} "
                f"{r['rest_median_ms']:>8.1f} {x:>5.2f}"
            )
        for r in idle:
            ms = ", ".join(f"{v:.1f}" for v in r["samples_ms"])  # type: ignore[attr-defined]
            print(f"idle {r['gap_s']:>5} s: median {r['median_ms']:.1f} ms  [{ms}]")
    (out / "graph_probe.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
