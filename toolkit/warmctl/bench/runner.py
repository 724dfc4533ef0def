"""Runs a plan of server starts (e.g. `A,B,B+sleep,C,C`) one after the other and records each:
start -> ready, start -> warm (the unit's ExecStartPost done), startup phases from the log,
request-side figures, GPU memory, sleep/wake cycles, and what each start wrote to disk.

A configuration's first start in the plan is cold (its cache dir and HOME are new); each later
one is a restart with everything the first one left on disk. The JSON is rewritten after every
step, so a run cut short still leaves every finished step behind."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.bench import gpumem, loadsleep, measure
from warmctl.bench.api import Api
from warmctl.bench.configs import Config, Launch, Site
from warmctl.bench.inventory import cache_bytes
from warmctl.bench.logphases import parse_startup, serve_jit_events, server_errors
from warmctl.bench.process import ServerProcess, StampedLine, session_pids
from warmctl.bench.sleepcycle import cycle
from warmctl.errors import WarmctlError


@dataclass(frozen=True)
class Step:
    config: Config
    sleep: bool  # run the sleep / wake cycles after the request measurements
    load: bool = False  # then sleep and wake under streaming load (loadsleep)
    relaunch: bool = False  # first: relaunch under the launcher (SIGHUP) and measure it again

    @property
    def label(self) -> str:
        flags = [
            f
            for f, on in (("relaunch", self.relaunch), ("sleep", self.sleep), ("load", self.load))
            if on
        ]
        return "+".join([self.config.key, *flags])


@dataclass(frozen=True)
class Knobs:
    """How much traffic each start gets."""

    single_n: int = 11  # c = 1 requests: the first + 10 steady
    burst_width: int = 16
    bursts_n: int = 9  # the first burst + 8 steady (bursts are noisy: arrivals split steps)
    decode_tokens: int = 128
    decode_n: int = 3
    idle_gap_s: float = 2.0  # c=1: one more request after this long idle
    start_timeout_s: float = 420.0
    warmup_timeout_s: float = 300.0


def parse_plan(text: str, configs: dict[str, Config]) -> list[Step]:
    steps = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        key, *flags = item.split("+")
        if (
            key not in configs
            or not set(flags) <= {"sleep", "load", "relaunch"}
            or len(set(flags)) < len(flags)
            or ("relaunch" in flags and not configs[key].launcher)
        ):
            raise WarmctlError(
                f"bad plan item {item!r}: expected one of {', '.join(configs)} "
                "optionally followed by +sleep, +load, and +relaunch for a launcher "
                "configuration (e.g. A,B,B+sleep+load,L+relaunch)",
                kind="input",
            )
        steps.append(Step(configs[key], "sleep" in flags, "load" in flags, "relaunch" in flags))
    if not steps:
        raise WarmctlError("the plan is empty", kind="input")
    return steps


Echo = Callable[[str], None]


class Runner:
    def __init__(
        self,
        site: Site,
        steps: list[Step],
        out: Path,
        knobs: Knobs,
        budget_s: float | None,
        echo: Echo,
        meta: dict[str, Any],
    ) -> None:
        self.site, self.steps, self.out, self.knobs = site, steps, out, knobs
        self.budget_s, self.echo = budget_s, echo
        self.t0 = time.monotonic()
        self.doc: dict[str, Any] = {"meta": meta, "steps": []}
        self.starts: dict[str, int] = {}

    # -- plan ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        for i, step in enumerate(self.steps):
            n = self.starts.get(step.config.cache_key, 0)
            state = "cold" if n == 0 else "restart"
            name = f"{i + 1}-{step.config.key}-{state}"
            skip = self._over_budget(state)
            if not skip:  # a skipped start leaves nothing on disk: the next one is still cold
                self.starts[step.config.cache_key] = n + 1
            if skip:
                self.echo(f"[bench] {name}: skipped ({skip})")
                self._record(
                    {"name": name, "config": step.config.key, "state": state, "skipped": skip}
                )
                continue
            self.echo(f"[bench] {name}: {step.config.title}")
            t = time.monotonic()
            rec = self._start(step, name, state)
            rec["wall_s"] = round(time.monotonic() - t, 3)
            self._record(rec)
            self.echo(f"[bench] {name}: " + _one_line(rec))
        self.doc["meta"]["total_s"] = round(time.monotonic() - self.t0, 1)
        self._write()
        return self.doc

    def _over_budget(self, state: str) -> str | None:
        if self.budget_s is None:
            return None
        left = self.budget_s - (time.monotonic() - self.t0)
        done = [s for s in self.doc["steps"] if "wall_s" in s]
        same = [s["wall_s"] for s in done if s["state"] == state]
        cold = [s["wall_s"] for s in done if s["state"] == "cold"]
        estimate = max(same) if same else (0.6 * max(cold) if cold else 0.0)
        if left < 30 or left < estimate:
            return f"{left:.0f} s of the budget left, a {state} start took {estimate:.0f} s"
        return None

    def _record(self, rec: dict[str, Any]) -> None:
        self.doc["steps"].append(rec)
        self._write()

    def _write(self) -> None:
        path = self.out / "bench.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=_jsonable) + "\n")
        tmp.replace(path)

    # -- one start -------------------------------------------------------------------------
    def _start(self, step: Step, name: str, state: str) -> dict[str, Any]:
        cfg = step.config
        rec: dict[str, Any] = {
            "name": name,
            "config": cfg.key,
            "state": state,
            "sleep_planned": step.sleep,
            "load_planned": step.load,
        }
        # vLLM puts its ZMQ IPC sockets in TMPDIR (a socket path has at most 107 bytes)
        base = tempfile.gettempdir()
        tmp = Path(tempfile.mkdtemp(prefix=f"wb{cfg.key}-", dir=base if len(base) < 40 else "/tmp"))
        try:
            return self._run_start(step, name, rec, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # like PrivateTmp / a reboot

    def _run_start(self, step: Step, name: str, rec: dict[str, Any], tmp: Path) -> dict[str, Any]:
        cfg, site, k = step.config, self.site, self.knobs
        try:
            launch = cfg.launch(site, tmp)
        except WarmctlError as err:
            rec["error"] = str(err)
            return rec
        rec["argv"] = launch.spec.argv
        rec["env"] = {k2: v for k2, v in sorted(launch.spec.env.items()) if _shown(k2)}
        rec["warmup_argv"] = launch.warmup_argv
        idle = gpumem.read()
        rec["gpu_idle_mib"] = idle.used_mib if idle else None
        api = Api(
            launch.spec.base_url, site.served_name, check_path=self.out / f"{name}.outputs.json"
        )
        rec["base_url"] = launch.spec.base_url
        counter = measure.Counter()
        server = ServerProcess(launch.spec, self.out / f"{name}.log")
        marks: dict[str, float] = {}
        try:
            server.start()
            left = self._left()
            ready = server.wait_ready(api.ready, min(k.start_timeout_s, left))
            marks["ready"] = rec["ready_s"] = round(ready, 3)
            self.echo(f"[bench] {name}: ready after {ready:.1f} s")
            if not self.doc["meta"].get("vllm_version"):
                self.doc["meta"]["vllm_version"] = api.client.version()
            rec["warmup"] = self._warmup(launch, server)
            # without a warmup, the server is as warm as it gets when it is ready
            warm = server.elapsed() if launch.warmup_argv else ready
            marks["warm"] = rec["warm_s"] = round(warm, 3)
            single = measure.single(api, counter, k.single_n, idle_gap_s=k.idle_gap_s)
            marks["single"] = server.elapsed()
            rec["single"] = dataclasses.asdict(single) | {"ratio": single.ratio}
            bursts = measure.bursts(api, counter, k.burst_width, k.bursts_n)
            marks["bursts"] = server.elapsed()
            rec["bursts"] = dataclasses.asdict(bursts) | {"ratio": bursts.ratio}
            rec["decode"] = dataclasses.asdict(
                measure.decode(api, counter, k.decode_tokens, k.decode_n)
            )
            marks["decode"] = server.elapsed()
            pids = session_pids(server.pid)
            serving = gpumem.read(pids)
            rec["gpu_serving"] = dataclasses.asdict(serving) if serving else None
            if step.relaunch:
                rec["relaunch"] = self._relaunch(launch, api, counter, server, name)
            if step.sleep:
                rec["sleep"] = self._sleep_cycles(launch, api, counter, server, rec)
            if step.load:
                rec["sleep_under_load"] = self._under_load(launch, api, server, name)
        except WarmctlError as err:
            rec["error"] = str(err)
            self.echo(f"[bench] {name}: FAILED: {err}")
        finally:
            rec["stop_s"] = server.stop()
            lines = server.lines()
            startup = parse_startup(lines, rec.get("ready_s"))
            rec["startup"] = dataclasses.asdict(startup)
            rec["jit_while_serving"] = _jit_windows(lines, marks)
            rec["disk"] = {role: cache_bytes(path) for role, path in launch.dirs.items()}
            rec["log"] = server.log_path.name
        return rec

    def _left(self) -> float:
        if self.budget_s is None:
            return float("inf")
        return max(30.0, self.budget_s - (time.monotonic() - self.t0))

    def _warmup(self, launch: Launch, server: ServerProcess) -> dict[str, Any] | None:
        """The unit's ExecStartPost, exactly as rendered: the unit is active when it exits 0."""
        if not launch.warmup_argv:
            return None
        t = time.monotonic()
        try:
            proc = subprocess.run(
                launch.warmup_argv,
                env=launch.spec.env,
                capture_output=True,
                text=True,
                timeout=self.knobs.warmup_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WarmctlError(f"the unit's warmup did not finish: {exc}") from exc
        took = time.monotonic() - t
        (server.log_path.with_suffix(".warmup.txt")).write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["?"]
            raise WarmctlError(f"the unit's warmup exited {proc.returncode}: {last[0][:300]}")
        return {"seconds": round(took, 3), "output": proc.stdout.strip().splitlines()[-20:]}

    def _relaunch(
        self,
        launch: Launch,
        api: Api,
        counter: measure.Counter,
        server: ServerProcess,
        name: str,
    ) -> dict[str, Any]:
        """SIGHUP the launcher: the server is replaced by one forked from the already imported
        interpreter. Measured like a start, from the signal: ready, warm (the unit's warmup
        again, as a reload would run it), phases, first request and burst."""
        k = self.knobs
        mark = server.elapsed()
        generation = _launcher_generation(server.lines())
        server.signal(signal.SIGHUP)
        deadline = time.monotonic() + min(k.start_timeout_s, self._left())
        while _launcher_generation(server.lines()) <= generation:
            if time.monotonic() > deadline or not server.running():
                raise WarmctlError(f"the launcher did not relaunch: {server.tail(1)[:300]}")
            time.sleep(0.02)
        stopped = server.elapsed() - mark
        ready = server.wait_ready(api.ready, max(30.0, deadline - time.monotonic())) - mark
        self.echo(f"[bench] {name}: relaunch ready after {ready:.1f} s")
        out: dict[str, Any] = {
            "old_server_stopped_s": round(stopped, 3),
            "ready_s": round(ready, 3),
        }
        if launch.relaunch_warmup_argv:  # the configuration's own warmup after a relaunch
            launch = dataclasses.replace(launch, warmup_argv=launch.relaunch_warmup_argv)
        out["warmup"] = self._warmup(launch, server)
        out["warm_s"] = round((server.elapsed() - mark) if launch.warmup_argv else ready, 3)
        single = measure.single(api, counter, k.single_n, idle_gap_s=k.idle_gap_s)
        out["single"] = dataclasses.asdict(single) | {"ratio": single.ratio}
        bursts = measure.bursts(api, counter, k.burst_width, k.bursts_n)
        out["bursts"] = dataclasses.asdict(bursts) | {"ratio": bursts.ratio}
        after = [StampedLine(ln.t - mark, ln.text) for ln in server.lines() if ln.t >= mark]
        out["startup"] = dataclasses.asdict(parse_startup(after, ready))
        out["launcher_lines"] = [ln.text for ln in after if ln.text.startswith(LAUNCHER_PREFIX)]
        self.echo(
            f"[bench] {name}: relaunch warm after {out['warm_s']:.1f} s, first "
            f"{single.first_ms:.1f} ms vs steady {single.steady_ms:.1f} ms"
        )
        return out

    def _under_load(
        self, launch: Launch, api: Api, server: ServerProcess, name: str
    ) -> list[dict[str, Any]]:
        if not launch.sleep:
            return [{"skipped": "sleep mode is off in this configuration's unit"}]
        out: list[dict[str, Any]] = []
        for level in (1, 2):
            t = server.elapsed()
            try:
                res = loadsleep.run(
                    api,
                    self.out / f"{name}.gate",
                    self.out / f"{name}.load-outputs.json",
                    level=level,
                )
            except WarmctlError as err:
                self.echo(f"[bench]   sleep L{level} under load FAILED: {err}")
                out.append({"level": level, "error": str(err)})
                continue
            rec = dataclasses.asdict(res)
            rec["server_log_errors"] = server_errors(server.lines(), t, server.elapsed() + 1)
            out.append(rec)
            self.echo("[bench]   sleep under load: " + loadsleep.summary(res))
        return out

    def _sleep_cycles(
        self,
        launch: Launch,
        api: Api,
        counter: measure.Counter,
        server: ServerProcess,
        rec: dict[str, Any],
    ) -> list[dict[str, Any]]:
        if not launch.sleep:
            return [{"skipped": "sleep mode is off in this configuration's unit"}]
        out = []
        for level, how in ((1, "route"), (1, "warmctl"), (2, "warmctl"), (2, "route")):
            t = server.elapsed()
            try:
                res = cycle(
                    api,
                    counter,
                    level,
                    how,
                    lambda: session_pids(server.pid),
                    rec.get("gpu_idle_mib"),
                )
            except WarmctlError as err:
                out.append({"level": level, "how": how, "error": str(err)})
                self.echo(f"[bench]   sleep L{level} ({how}) FAILED: {err}")
                continue
            lines = server.lines()
            jit = serve_jit_events(lines, t, server.elapsed() + 1)
            res = dataclasses.replace(res, jit_events=jit)
            out.append(
                dataclasses.asdict(res)
                | {
                    "freed_fraction": res.freed_fraction,
                    "output_same": res.output_same,
                    "server_log_errors": server_errors(lines, t, server.elapsed() + 1),
                }
            )
            self.echo(
                f"[bench]   sleep L{level} ({how}): sleep {res.sleep_s:.2f} s, wake "
                f"{res.wake_s:.2f} s, wake->first token {res.wake_to_first_token_s:.3f} s, "
                f"output {'same' if res.output_same else 'DIFFERS'} after the wake"
            )
        return out


LAUNCHER_PREFIX = "vllm-launch:"
_GENERATION = re.compile(r"^vllm-launch: .*generation (\d+)\)")


def _launcher_generation(lines: list[StampedLine]) -> int:
    """The launcher's last reported server generation (0: none started yet)."""
    for ln in reversed(lines):
        m = _GENERATION.search(ln.text)
        if m:
            return int(m.group(1))
    return 0


def _jit_windows(lines: list[Any], marks: dict[str, float]) -> dict[str, int]:
    order = ["ready", "warm", "single", "bursts", "decode"]
    names = {"warm": "warmup", "single": "c1 requests", "bursts": "bursts", "decode": "decode"}
    out: dict[str, int] = {}
    for a, b in itertools.pairwise(order):
        if a in marks and b in marks:
            out[names[b]] = serve_jit_events(lines, marks[a], marks[b])
    return out


def _shown(key: str) -> bool:
    """Environment variables worth recording (no secrets, no noise)."""
    prefixes = (
        "VLLM_",
        "TRITON_",
        "TORCH",
        "CUDA_",
        "NCCL_",
        "NVSHMEM_",
        "HF_",
        "TRANSFORMERS_",
        "XDG_CACHE",
        "HOME",
        "TMPDIR",
        "PYTHONPATH",
    )
    return key.startswith(prefixes) and "KEY" not in key and "TOKEN" not in key


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _one_line(rec: dict[str, Any]) -> str:
    if "error" in rec:
        return f"error: {rec['error']}"
    s, b = rec.get("single", {}), rec.get("bursts", {})
    return (
        f"ready {rec.get('ready_s', 0):.1f} s, warm {rec.get('warm_s', 0):.1f} s, "
        f"first {s.get('first_ms', 0):.1f} ms vs steady {s.get('steady_ms', 0):.1f} ms, "
        f"burst {b.get('first_mean_ms', 0):.1f} vs {b.get('steady_mean_ms', 0):.1f} ms"
    )


def echo_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
