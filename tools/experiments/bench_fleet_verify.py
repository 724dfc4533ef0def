#!/usr/bin/env python3
"""How long `warmctl verify --inventory` takes for a fleet, and how true its figures stay:
measured on each host (`--from host`) vs from this machine (`--from controller`).

The fleet is N local-connection inventory hosts, each in front of a loopback vLLM stand-in
(tests/double) whose first token comes after FIRST s and later ones after STEADY s, so every
figure has a known true value. Each host's own warmctl is this checkout's.

python tools/experiments/bench_fleet_verify.py --hosts 1,8 --out fleet-verify.json
Prints a table and writes the raw results as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.double import VllmDouble  # noqa: E402


def inventory(path: Path, doubles: list[VllmDouble]) -> Path:
    import yaml

    venv = Path(sys.executable).parent.parent
    hosts = {
        f"standin-{i}": {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "ansible_host": "127.0.0.1",  # --from controller reaches the stand-in here
            "vllm_install_warmctl_venv": str(venv),
            "warmctl_port": d.port,
        }
        for i, d in enumerate(doubles)
    }
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def run(inv: Path, where: str, doubles: list[VllmDouble], steady: int) -> dict:
    for d in doubles:
        d.first_pending = True  # each stand-in's next request is a first one again
    warmctl = Path(sys.executable).parent / "warmctl"
    argv = [str(warmctl), "verify", "-i", str(inv), "--from", where, "--json"]
    argv += ["--steady", str(steady), "--decode-tokens", "0", "--max-ratio", "100"]
    if where == "controller":
        argv += ["--parallel", str(len(doubles))]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    results = json.loads(proc.stdout)["results"]
    firsts = [r["first_ttft_s"] for r in results if r.get("first_ttft_s") is not None]
    steadies = [r["steady_median_ttft_s"] for r in results if r.get("steady_median_ttft_s")]
    return {
        "from": where,
        "hosts": len(doubles),
        "exit_code": proc.returncode,
        "seconds": seconds,
        "first_ttft_median_s": statistics.median(firsts) if firsts else None,
        "first_ttft_max_s": max(firsts) if firsts else None,
        "steady_ttft_median_s": statistics.median(steadies) if steadies else None,
        "results": results,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,8", help="fleet sizes, comma-separated")
    ap.add_argument("--first", type=float, default=0.05, help="stand-ins' first TTFT (s)")
    ap.add_argument("--steady-ttft", type=float, default=0.03, help="their later TTFT (s)")
    ap.add_argument("--steady", type=int, default=5, help="steady requests per verify")
    ap.add_argument("--out", type=Path, default=Path("fleet-verify.json"))
    args = ap.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    rows = []
    doubles = [
        VllmDouble(first_ttft=args.first, ttft=args.steady_ttft).start() for _ in range(max(sizes))
    ]
    try:
        with TemporaryDirectory() as tmp:
            for n in sizes:
                inv = inventory(Path(tmp) / f"fleet-{n}.yml", doubles[:n])
                for where in ("host", "controller"):
                    rows.append(run(inv, where, doubles[:n], args.steady))
    finally:
        for d in doubles:
            d.stop()
    one = {r["from"]: r["seconds"] for r in rows if r["hosts"] == min(sizes)}
    print(f"true first TTFT {args.first * 1000:.0f} ms, steady {args.steady_ttft * 1000:.0f} ms")
    print(
        f"{'FROM':<11}{'HOSTS':>6}{'EXIT':>5}{'TIME s':>9}{'x ONE':>7}"
        f"{'FIRST p50 ms':>14}{'FIRST max ms':>14}{'STEADY p50 ms':>15}"
    )
    for r in rows:

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.1f}"

        print(
            f"{r['from']:<11}{r['hosts']:>6}{r['exit_code']:>5}{r['seconds']:>9.1f}"
            f"{r['seconds'] / one[r['from']]:>7.1f}{ms(r['first_ttft_median_s']):>14}"
            f"{ms(r['first_ttft_max_s']):>14}{ms(r['steady_ttft_median_s']):>15}"
        )
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": rows}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
