#!/usr/bin/env python3
"""Issue 14's GPU measurement: the project's default unit against the unit `warmctl tune`
proposes from that unit's own /metrics, under a traffic mix that is not vLLM's default shape.

The mix: 85 % of the prompts 300-900 tokens, 15 % 30-120 tokens, 32 generated tokens each
(ignore_eos), sent by closed-loop clients at concurrency 4, 8, 16 and 24 in turn.

Plan (both configurations share one cache dir and HOME, like one host redeployed):
  1. D cold     the default unit (roles' defaults); the mix runs inside a tune window, and
                `warmctl.tune` proposes capture sizes, limits, warmup and KV cache from it
  2. T first    the unit with tune's proposals merged in (first start after the redeploy:
                the compile cache misses, since the capture sizes are in its hash)
  3. D restart  4. T restart: the comparable restarts
Every start: ready and warm (the unit's ExecStartPost warmup done) times, vLLM's own graph
capture time from its log, first vs steady single request (c=1), first vs steady burst of 16,
and the mix (TTFT p50/p90, output tokens/s). Prints a table, writes OUT/tune_bench.json (rewritten
after every start). Figures are compared within one run, as ratios.

    PYTHONPATH=toolkit python3 tools/experiments/tune_bench.py --model
/root/models/qwen3-0.6b-random \
        --python "$(command -v python3)" --out /root/tune --budget 440 \
        --env VLLM_USE_FLASHINFER_SAMPLER=0
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warmctl.bench import configs, gpumem, measure, shims
from warmctl.bench.api import Api
from warmctl.bench.configs import Config, Site
from warmctl.bench.logphases import parse_startup
from warmctl.bench.process import ServerProcess
from warmctl.errors import WarmctlError
from warmctl.warmth.prompts import sized_prompts

CONCURRENCY: tuple[int, ...] = (4, 8, 16, 24)
PER_CLIENT = 6  # requests each client sends in a phase
MIX_TOKENS = 32
# --quick (a CPU smoke run of this script): a small mix and fewer measurements
QUICK = {"CONCURRENCY": (2, 4), "PER_CLIENT": 2, "MIX_TOKENS": 4}
LONG_SHARE = 0.85
KEY = "U"  # both configurations: one host, one cache dir


def echo(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def mix_prompts(seed: int, n: int, tokens_per_word: float) -> list[tuple[str, int]]:
    """(prompt, intended tokens): unique first words, so no prefix-cache hit flatters TTFT."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tokens = rng.randint(300, 900) if rng.random() < LONG_SHARE else rng.randint(30, 120)
        (body,) = sized_prompts([tokens], tokens_per_word=tokens_per_word)
        out.append((f"Ticket {seed}-{i}-{rng.randrange(10**6)}. {body}", tokens))
    return out


def run_phase(
    api: Api, c: int, prompts: list[tuple[str, int]]
) -> tuple[list[float], int, list[int]]:
    """`c` closed-loop clients share `prompts`: (TTFTs in ms, output tokens, prompt tokens)."""
    lock = threading.Lock()
    ttfts: list[float] = []
    prompt_tokens: list[int] = []
    tokens = [0]

    def client(k: int) -> None:
        for text, _ in prompts[k::c]:
            s = api.complete(text, MIX_TOKENS, ignore_eos=True)
            with lock:
                ttfts.append(s.ttft_s * 1000)
                tokens[0] += s.completion_tokens
                if s.prompt_tokens:
                    prompt_tokens.append(s.prompt_tokens)

    with ThreadPoolExecutor(c) as pool:
        list(pool.map(client, range(c)))
    return ttfts, tokens[0], prompt_tokens


def run_mix(api: Api, seed: int) -> dict[str, Any]:
    """The mix, phase by phase; TTFTs in ms and output tokens/s over the whole mix. Prompt
    lengths are sized with the server's own tokenizer (/tokenize)."""
    from warmctl.warmth.warmup import tokens_per_word

    tpw = tokens_per_word(api.client, api.model) or 1.25
    ttfts: list[float] = []
    tokens = 0
    prompt_tokens: list[int] = []
    phases = []
    t0 = time.monotonic()
    for c in CONCURRENCY:
        p0 = time.monotonic()
        phase_ttfts, phase_tokens, phase_prompts = run_phase(
            api, c, mix_prompts(seed * 100 + c, c * PER_CLIENT, tpw)
        )
        wall = time.monotonic() - p0
        phases.append(
            {
                "concurrency": c,
                "requests": len(phase_ttfts),
                "wall_s": round(wall, 3),
                "ttft_p50_ms": round(statistics.median(phase_ttfts), 2),
                "requests_per_s": round(len(phase_ttfts) / wall, 2),
                "output_tokens_per_s": round(phase_tokens / wall, 1),
            }
        )
        ttfts += phase_ttfts
        tokens += phase_tokens
        prompt_tokens += phase_prompts
    wall = time.monotonic() - t0
    q = statistics.quantiles(ttfts, n=10)
    return {
        "requests": len(ttfts),
        "wall_s": round(wall, 3),
        "ttft_p50_ms": round(statistics.median(ttfts), 2),
        "ttft_p90_ms": round(q[-1], 2),
        "ttft_mean_ms": round(statistics.fmean(ttfts), 2),
        "output_tokens_per_s": round(tokens / wall, 1),
        "tokens_per_word": round(tpw, 3),
        "prompt_tokens_p50": statistics.median(prompt_tokens) if prompt_tokens else None,
        "prompt_tokens_p10_p90": statistics.quantiles(prompt_tokens, n=10)[::8]
        if len(prompt_tokens) > 1
        else None,
        "phases": phases,
        "ttfts_ms": [round(x, 2) for x in ttfts],
    }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.out = Path(args.out).absolute()
        work = self.out / "work"
        if work.exists() and any(work.iterdir()):
            raise WarmctlError(f"{work} is not empty: a cold start needs empty cache dirs")
        extra_env = dict(e.split("=", 1) for e in args.env)
        self.site = Site(
            device="gpu" if gpumem.available() else "cpu",
            venv=shims.vllm_venv(Path(args.python), work / "vllm-venv"),
            model=args.model,
            served_name="m",
            port=args.port,
            workdir=work,
            warmctl_venv=shims.warmctl_venv(work / "warmctl-venv"),
            extra_args=tuple(args.arg),
            extra_env=extra_env,
        )
        self.doc: dict[str, Any] = {
            "meta": {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "device_name": gpumem.gpu_name(),
                "model": args.model,
                "mix": {
                    "concurrency": list(CONCURRENCY),
                    "per_client": PER_CLIENT,
                    "max_tokens": MIX_TOKENS,
                    "long_share": LONG_SHARE,
                    "long_tokens": [300, 900],
                    "short_tokens": [30, 120],
                },
                "default_capture_sizes": list(configs.C_CAPTURE_SIZES),
            },
            "starts": [],
        }

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "tune_bench.json"
        path.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def start(self, cfg: Config, name: str, tune: bool = False) -> dict[str, Any]:
        rec: dict[str, Any] = {"name": name, "title": cfg.title}
        s0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
        try:
            launch = cfg.launch(self.site, tmp)
            rec["argv"], rec["warmup_argv"] = launch.spec.argv, launch.warmup_argv
            api = Api(launch.spec.base_url, self.site.served_name)
            server = ServerProcess(launch.spec, self.out / f"{name}.log")
            try:
                server.start()
                rec["ready_s"] = round(server.wait_ready(api.ready, min(420.0, self.left())), 3)
                echo(f"[tune-bench] {name}: ready after {rec['ready_s']:.1f} s")
                if not self.doc["meta"].get("vllm_version"):
                    self.doc["meta"]["vllm_version"] = api.client.version()
                w0 = time.monotonic()
                proc = subprocess.run(
                    launch.warmup_argv or ["true"],
                    env=launch.spec.env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
                rec["warmup_s"] = round(time.monotonic() - w0, 3)
                if proc.returncode != 0:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                    raise WarmctlError(f"the unit's warmup exited {proc.returncode}: {tail}")
                rec["warm_s"] = round(server.elapsed(), 3)
                counter = measure.Counter()
                quick = self.args.quick
                single = measure.single(api, counter, 3 if quick else 11)
                rec["single"] = dataclasses.asdict(single) | {"ratio": single.ratio}
                bursts = measure.bursts(api, counter, 4 if quick else 16, 2 if quick else 5)
                rec["bursts"] = dataclasses.asdict(bursts) | {"ratio": bursts.ratio}
                if tune:
                    rec["mix"], rec["tune"] = self.mix_with_tune(api)
                else:
                    rec["mix"] = run_mix(api, seed=1)
            except WarmctlError as err:
                rec["error"] = str(err)
                echo(f"[tune-bench] {name}: FAILED: {err}")
            finally:
                rec["stop_s"] = server.stop()
                startup = parse_startup(server.lines(), rec.get("ready_s"))
                rec["graph_capture_s"] = startup.reported.get("graph_capture_s")
                rec["compile_cache"] = startup.compile_cache
                rec["capture_sizes"] = startup.capture_sizes
                rec["startup"] = dataclasses.asdict(startup)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            rec["wall_s"] = round(time.monotonic() - s0, 1)  # start, measurements and stop
        return rec

    def mix_with_tune(self, api: Api) -> tuple[dict[str, Any], dict[str, Any]]:
        """The mix inside a tune window (gauges sampled every 0.25 s); tune's proposal."""
        from warmctl.tune import Knobs, observe, propose

        finished = threading.Event()
        got: dict[str, Any] = {}

        def watch() -> None:
            try:
                got["obs"], _ = observe(
                    api.client, start=None, window_s=600, every_s=0.25, done=finished.is_set
                )
            except WarmctlError as err:
                got["error"] = err

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(1.0)  # the window's first scrape
        try:
            mix = run_mix(api, seed=1)
        finally:
            finished.set()
            watcher.join()
        if "error" in got:
            raise got["error"]
        proposal = propose(got["obs"], Knobs(sleeps=self.site.device == "gpu"))
        self.proposal = proposal
        return mix, proposal.to_dict()

    def run(self) -> None:
        default = Config(KEY, "default unit (roles' defaults)", True)
        plan = [(default, "1-D-cold", True)]
        rec = self.start(*plan[0])
        self.doc["starts"].append(rec)
        self.write()
        echo(f"[tune-bench] 1-D-cold: {one_line(rec)}")
        if "error" in rec:
            return
        from warmctl.tune import instance_changes

        base = default.instance(self.site)
        base.pop("extra_args", None)  # the site's own flags: Config.instance adds them again
        changes = instance_changes(self.proposal, base)
        self.doc["meta"]["tuned_instance_changes"] = changes
        echo(f"[tune-bench] tune proposes: {json.dumps(changes)}")
        tuned = Config(
            KEY,
            "default unit + warmctl tune's proposals",
            True,
            changes.get("compilation_config"),
            {k: v for k, v in changes.items() if k != "compilation_config"},
        )
        later = [(tuned, "2-T-first"), (default, "3-D-restart"), (tuned, "4-T-restart")]
        if self.args.skip_default_restart:  # the tuned unit's restart is what needs measuring
            later = [later[0], (tuned, "3-T-restart")]
        for cfg, name in later:
            # what an earlier start took here, whole (start, measurements, stop), plus a margin:
            # a first start is estimated by the slowest, a restart by the fastest
            done = [s["wall_s"] + 15 for s in self.doc["starts"] if s.get("ready_s")]
            need = max(done) if name.endswith("first") else min(done)
            if self.left() < need:
                self.doc["starts"].append({"name": name, "skipped": f"{self.left():.0f} s left"})
                echo(f"[tune-bench] {name}: skipped ({self.left():.0f} s of the budget left)")
                continue
            rec = self.start(cfg, name)
            self.doc["starts"].append(rec)
            self.write()
            echo(f"[tune-bench] {name}: {one_line(rec)}")
        self.doc["meta"]["total_s"] = round(time.monotonic() - self.t0, 1)
        self.write()


def one_line(rec: dict[str, Any]) -> str:
    if "error" in rec:
        return f"error: {rec['error']}"
    m = rec.get("mix", {})
    return (
        f"ready {rec.get('ready_s', 0):.1f} s, warm {rec.get('warm_s', 0):.1f} s, capture "
        f"{rec.get('graph_capture_s')} s; mix TTFT p50 {m.get('ttft_p50_ms')} ms, "
        f"{m.get('output_tokens_per_s')} tok/s"
    )


def print_table(doc: dict[str, Any]) -> None:
    from warmctl.terminal.output import console, table

    def f(v: Any, digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    rows = []
    for r in doc["starts"]:
        if "skipped" in r or "error" in r:
            rows.append([r["name"], r.get("skipped") or r.get("error", "")] + [""] * 11)
            continue
        s, b, m = r["single"], r["bursts"], r["mix"]
        rows.append(
            [
                r["name"],
                f(r.get("ready_s")),
                f(r.get("warm_s")),
                f(r.get("graph_capture_s"), 2),
                str(r.get("capture_sizes") or "-"),
                f(s["first_ms"]),
                f(s["steady_ms"]),
                f(s["ratio"], 2),
                f(b["first_mean_ms"]),
                f(b["steady_mean_ms"]),
                f(b["ratio"], 2),
                f"{m['ttft_p50_ms']:.1f} / {m['ttft_p90_ms']:.1f}",
                f(m["output_tokens_per_s"], 0),
            ]
        )
    cols = [
        "start",
        "ready s",
        "warm s",
        "capture s",
        "graphs",
        "1st ms",
        "steady ms",
        "x",
        "1st burst",
        "steady burst",
        "x",
        "mix TTFT p50/p90",
        "mix tok/s",
    ]
    console().print(table("warmctl tune: default unit (D) vs tuned (T)", cols, rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--budget", type=float, default=440.0, help="seconds for the whole plan")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every start")
    ap.add_argument("--arg", action="append", default=[], help="a vLLM flag for every start")
    ap.add_argument("--quick", action="store_true", help="a small mix (CPU smoke run)")
    ap.add_argument(
        "--skip-default-restart",
        action="store_true",
        help="after the tuned first start, restart the tuned unit (not the default one)",
    )
    ap.add_argument("--report", action="store_true", help="re-print OUT/tune_bench.json")
    args = ap.parse_args()
    if args.quick:
        globals().update(QUICK)
    if args.report:
        print_table(json.loads((Path(args.out) / "tune_bench.json").read_text()))
        return 0
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.write()
        print_table(bench.doc)
        echo(f"[tune-bench] raw results: {bench.out / 'tune_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
