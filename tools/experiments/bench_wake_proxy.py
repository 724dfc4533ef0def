#!/usr/bin/env python3
"""What wake on request and idle sleep add to an AWAKE instance's proxy: TTFT p50 and throughput
through nginx with wake_on_request off vs on, in one run, against one vLLM stand-in.

Proxies rendered from templates/ (real nginx, the same host variables) in front of the same
loopback vLLM double (tests/double, in a process of its own): "off" an instance without idle
sleep (today's file), "off-again" the same file on another port (the control: what two equal
proxies differ by on this machine), "on" the instance with `idle_sleep` and an `awake_port`,
its `warmctl waker` running (idle clock far off), "on-no-idle" wake on request without idle
sleep (a window whose on_request is wake). On an awake instance wake on request costs one more
flag test per request (the wakeable file), idle sleep one syslog datagram to the waker per
finished /v1/ request (and the waker's handling of it); nothing passes through the waker.

- TTFT: `warmctl.server.stream.stream_completion` (the timing verify uses), one request to each
proxy
  in turn (the order rotating), so a drift of the machine hits all alike; p50 per proxy.
- throughput: C client processes streaming completions for S seconds, one proxy after the other,
  the order rotating each round; completed requests per second, median over the rounds; against
  "off": the median of each round's ratio and its 95 % interval (bootstrap over the rounds).
- the proxy's CPU per request during the TTFT phase: its nginx worker's user + system time, and
  its waker's, from /proc (clock ticks: 10 ms each): what the machine's other load blurs least.

python tools/experiments/bench_wake_proxy.py --rounds 10 --out wake-proxy.json
python tools/experiments/bench_wake_proxy.py --pin ...   the proxy's side alone on one CPU
Prints a table and writes the raw results as JSON. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.hardening.proxy_support import Nginx, ensure_nginx, free_port, render_proxy  # noqa: E402
from tests.waker.support import GateFiles, Waker  # noqa: E402

MODEL = "double-model"


MODES = ("off", "off-again", "on", "on-no-idle")


def start_double(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.launcher.double_main", "--port", str(port),
         "--enable-server-load-tracking"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'toolkit'}"},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("the vLLM double did not start")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def workers(master: int) -> list[int]:
    """nginx's worker processes (children of its master)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            found.append(int(stat.parent.name))
    return found


def proxies(
    upstream: int, root: Path, nginx: str
) -> tuple[dict[str, int], list[Any], dict[str, list[int]]]:
    """{mode: port}, what to stop, {mode: the proxy's processes (nginx's workers, the waker)}."""
    ports, stop, pids = {}, [], {}
    for mode in MODES:
        port = free_port()
        gate = GateFiles(root / mode / "gate")
        gate.dir.mkdir(parents=True)
        instance: dict[str, Any] = {"name": "tiny", "model": "/m", "port": port}
        if mode == "on":
            instance |= {"idle_sleep": {"after": "1h"}, "awake_port": free_port()}
        if mode == "on-no-idle":  # a window that wakes on request: no activity log
            window = {"name": "n", "sleep": "0 20 * * *", "wake": "0 7 * * *"}
            instance |= {"windows": [{**window, "on_request": "wake"}]}
        pids[mode] = []
        if mode.startswith("on"):
            target, log = f"127.0.0.1:{upstream}", root / f"{mode}.log"
            idle = 3600 if mode == "on" else 0
            waker = Waker(gate, target, log, idle_after=idle).start()
            stop.append(waker)
            assert waker.proc is not None
            pids[f"{mode} waker"] = [waker.proc.pid]
        host = {
            "vllm_proxy_enabled": True,
            "vllm_proxy_gate_dir": str(gate.dir),
            "vllm_proxy_upstream_port_offset": upstream - port,
            "vllm_proxy_access_log": str(root / mode / "nginx" / "access.log"),
        }
        files = render_proxy(instance, host)
        proxy = Nginx(nginx, root / mode / "nginx", files).start(port)
        stop.append(proxy)
        assert proxy.proc is not None
        pids[mode] += workers(proxy.proc.pid)
        ports[mode] = port
    return ports, stop, pids


def _client(port: int) -> Any:
    from warmctl.server.client import Client
    from warmctl.server.target import parse_target

    return Client(parse_target(f"127.0.0.1:{port}"), timeout=30)


def ttfts(ports: dict[str, int], n: int, max_tokens: int) -> dict[str, list[float]]:
    """n requests to each proxy, one to each in turn (the order rotating)."""
    from warmctl.server.stream import stream_completion

    clients = {mode: _client(port) for mode, port in ports.items()}
    out: dict[str, list[float]] = {mode: [] for mode in ports}
    modes = list(ports)
    for i in range(n):
        for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
            r = stream_completion(clients[mode], MODEL, f"bench {i}", max_tokens=max_tokens)
            assert r.ttft_s is not None and r.tokens == max_tokens, r
            out[mode].append(r.ttft_s)
    return out


def _load(port: int, seconds: float, max_tokens: int) -> int:
    """One client process: streamed completions for `seconds`; how many completed."""
    from warmctl.server.stream import stream_completion

    client, done = _client(port), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = stream_completion(client, MODEL, "load", max_tokens=max_tokens)
        assert r.tokens == max_tokens, r
        done += 1
    return done


def throughput(pool: ProcessPoolExecutor, port: int, clients: int, seconds: float,
               max_tokens: int) -> float:  # fmt: skip
    t0 = time.monotonic()
    counts = list(pool.map(_load, [port] * clients, [seconds] * clients, [max_tokens] * clients))
    return sum(counts) / (time.monotonic() - t0)


def bootstrap_median_ci(values: list[float], draws: int = 5000, seed: int = 1) -> list[float]:
    """The 95 % interval of the median of `values` (percentile bootstrap)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return [medians[int(draws * 0.025)], medians[int(draws * 0.975) - 1]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="throughput rounds (each proxy once)")
    ap.add_argument("--requests", type=int, default=1000, help="TTFT requests to each proxy")
    ap.add_argument("--clients", type=int, default=8, help="throughput client processes")
    ap.add_argument("--seconds", type=float, default=3.0, help="a throughput phase")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--pin", action="store_true",
                    help="the proxies, their wakers and the double on the last CPU, the clients "
                    "on the others: the proxy's side is what limits throughput")  # fmt: skip
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    nginx = ensure_nginx()
    if not nginx:
        sys.exit("nginx is not installed")
    rps: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    if args.pin:
        os.sched_setaffinity(0, client_cpus)
    upstream = free_port()
    double = start_double(upstream)
    pool_args: dict[str, Any] = (
        {"initializer": os.sched_setaffinity, "initargs": (0, client_cpus)} if args.pin else {}
    )
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            ProcessPoolExecutor(args.clients, **pool_args) as pool,
        ):
            ports, stop, pids = proxies(upstream, Path(tmp), nginx)
            if args.pin:
                for pid in [double.pid, *(p for group in pids.values() for p in group),
                            *(s.proc.pid for s in stop if s.proc is not None)]:  # fmt: skip
                    os.sched_setaffinity(pid, server_cpus)
            try:
                ttfts(ports, 20, args.max_tokens)  # warm: connections, nginx's workers
                before = {key: cpu_seconds(p) for key, p in pids.items()}
                ttft = ttfts(ports, args.requests, args.max_tokens)
                # the proxy's own CPU per request (nginx's worker, and the waker): what the
                # machine's other load does not blur
                cpu_us = {
                    key: (cpu_seconds(p) - before[key]) / args.requests * 1e6
                    for key, p in pids.items()
                }
                for rnd in range(args.rounds):
                    order = MODES[rnd % len(MODES) :] + MODES[: rnd % len(MODES)]
                    for mode in order:
                        rps[mode].append(throughput(pool, ports[mode], args.clients,
                                                    args.seconds, args.max_tokens))  # fmt: skip
                    print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
            finally:
                for s in stop:
                    s.stop()
    finally:
        double.terminate()
        double.wait(10)
    summary = {
        mode: {
            "ttft_p50_ms": statistics.median(ttft[mode]) * 1000,
            "ttft_p90_ms": statistics.quantiles(ttft[mode], n=10)[-1] * 1000,
            "requests": len(ttft[mode]),
            "rps_median": statistics.median(rps[mode]),
            "rps_rounds": rps[mode],
            "nginx_cpu_us_per_request": cpu_us[mode],
            "waker_cpu_us_per_request": cpu_us.get(f"{mode} waker"),
        }
        for mode in MODES
    }

    def versus(mode: str) -> dict[str, Any]:
        a, b = summary["off"], summary[mode]
        # each request i to `mode` went out next to request i to "off": the median of their
        # differences is blind to the machine's drift
        paired = statistics.median(y - x for x, y in zip(ttft["off"], ttft[mode], strict=True))
        return {
            "ttft_p50_pct": (b["ttft_p50_ms"] / a["ttft_p50_ms"] - 1) * 100,
            "ttft_p50_us": (b["ttft_p50_ms"] - a["ttft_p50_ms"]) * 1000,
            "ttft_paired_median_us": paired * 1e6,
            "rps_pct": (b["rps_median"] / a["rps_median"] - 1) * 100,
            # each round's phases ran one after the other: the median of their ratios, and
            # its 95 % interval (bootstrap over the rounds)
            "rps_paired_median_pct": statistics.median(ratios[mode]),
            "rps_paired_median_ci95_pct": bootstrap_median_ci(ratios[mode]),
        }

    ratios = {
        mode: [(y / x - 1) * 100 for x, y in zip(rps["off"], rps[mode], strict=True)]
        for mode in MODES[1:]
    }

    delta = {mode: versus(mode) for mode in MODES[1:]}
    print(f"{'proxy':<12} {'TTFT p50':>10} {'TTFT p90':>10} {'req/s':>8} {'nginx CPU':>10} "
          f"{'waker CPU':>10}   vs off: TTFT p50, req/s (paired median, 95 % CI)")  # fmt: skip
    for mode in MODES:
        s, d = summary[mode], delta.get(mode)
        vs = (
            f"{d['ttft_p50_pct']:+6.2f} % ({d['ttft_p50_us']:+.0f} us), "
            f"{d['rps_paired_median_pct']:+6.2f} % [{d['rps_paired_median_ci95_pct'][0]:+.2f}, "
            f"{d['rps_paired_median_ci95_pct'][1]:+.2f}]"
            if d
            else ""
        )
        waker = s["waker_cpu_us_per_request"]
        waker_text = f"{waker:>7.1f} us" if waker is not None else f"{'-':>10}"
        print(f"{mode:<12} {s['ttft_p50_ms']:>7.3f} ms {s['ttft_p90_ms']:>7.3f} ms "
              f"{s['rps_median']:>8.1f} {s['nginx_cpu_us_per_request']:>7.1f} us "
              f"{waker_text}   {vs}")  # fmt: skip
    if args.out:
        raw = {
            "what": "nginx -> vLLM double, wake_on_request off vs on (awake instance), "
            "off-again: the same file as off (the machine's noise)",
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
            },
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpus": {"server": sorted(server_cpus), "clients": sorted(client_cpus)}
            if args.pin
            else None,
            "summary": summary,
            "delta_vs_off": delta,
            "ttft_us": {mode: [round(s * 1e6) for s in samples] for mode, samples in ttft.items()},
        }
        args.out.write_text(json.dumps(raw) + "\n")  # one line: 4 x N samples
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
