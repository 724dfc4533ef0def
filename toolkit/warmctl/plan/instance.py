"""An instance's plan: everything derived of it, computed once for the templates, the roles'
tasks, the preflight checks, `warmctl render` and the inventory reader (the Ansible side calls it
through the collection's `warmctl.vllm.vllm_instance_facts` filter, once per host in
vllm_preflight, whose `vllm_preflight_instances` every other role and template reads). Its
fields are one dataclass, InstanceFacts; what the server runs (argv, environment, the unit's exec
argv, the launch and env files' content, KV sizing, warmup and relaunch argvs, the launcher's
path) is warmctl.plan.server's part of it. Every variable it reads is in SETTINGS.

    proxied   the instance sits behind the host's nginx (vllm_proxy_enabled true, or auto and
              vLLM dev mode is on); dev mode's routes have no authentication
    sleep     vLLM sleep mode (and so dev mode) on: asked for (`sleep`, else any window) on a
              GPU host
    launcher  the pre-imported launcher runs the server (the instance's `launcher`, else
              vllm_service_launcher; its `auto`: on GPU hosts, where it saves 13-16 s of imports
              per restart, off on CPU hosts)
    launch_file   what the launcher runs at every (re)launch: vLLM's arguments and the
              variables it may change ("" without the launcher; warmctl.plan.launchfile)
    runtime_dir, launch_state   the unit's RuntimeDirectory (under /run) and the launcher's
              state file in it (what it runs now: `warmctl relaunch` checks a relaunch with it)
    port      the clients' port (the instance's `port`, else vllm_service_port)
    upstream  where vLLM listens: port + vllm_proxy_upstream_port_offset when proxied, else port
    bind      vLLM's bind address: 127.0.0.1 when proxied or in dev mode, else `bind`, else
              vllm_service_bind
    target    HOST:PORT that reaches vLLM from the host itself (warmup, sleep, wake, drain)
    listens   every TCP port the instance's processes listen on, each with the key that sets it:
              the clients' port, vLLM's behind the proxy, the awake-only door (validate: each is
              a port and one process's on the host)
    warmctl   the host's warmctl (vllm_install_warmctl_venv/bin/warmctl)
    python    vLLM's interpreter (vllm_install_vllm_python, else vllm_install_venv/bin/python)
    unit, gate, draining, warming   the unit's name and the proxy gate's flag files
    load_balanced   the instance sits behind a load balancer (vllm_proxy_load_balanced; its
              `auto`: when it has an awake-only door, which only a load balancer uses)
    restart_hold   a restart or relaunch of it holds new requests instead of refusing them:
              proxied and not load balanced (a single host; behind a load balancer the drain
              takes it out of rotation instead)
    holding   the gate's flag of that hold: while it exists the proxy sends /v1/* to the
              waker, which holds them until the flag is gone (docs/LAUNCHER.md)
    windows   the sleep windows, each with its level (default SLEEP_LEVEL), what a request that
              comes while it sleeps does (`on_request`: refuse, the default, or wake) and unit names
    wake_on_request   the proxy holds a request that reaches the instance asleep and wakes it
              (a sleep trigger such as idle sleep, or a window with on_request: wake); the waker
              unit runs beside it
              (also with restart_hold: the waker holds requests across a restart)
    wake_hold  how long the proxy holds such a request before a 503 (seconds)
    wake_failed_backoff  after a failed wake, how long requests get 503 at once (seconds)
    awake_port  the awake-only door (0: none): a load balancer's primary, refused while asleep
    wakeable, wake_request, waker_socket, activity_socket   the wake-on-request files in the
              gate folder: asleep-and-wakeable flag, the waker's ask to systemd for a wake (a path
              unit), its HTTP socket (nginx's auth_request) and the access-log socket
    outputs   the answers a GPU sleep records and its wake replays (the output check)
    triggers  the sleep triggers that are on (warmctl.sleepwake.triggers.KINDS: the idle sleep)
              with their settings and request files, and the request wake, shaped like windows
              (one action each), with their path and service units
    files     every file the roles render for the instance: path, template, role, window, action
    waker     the waker unit runs: wake on request, or the hold across a restart (restart_hold)
    output_check  a GPU sleep records answers its wake replays (vllm_schedule_output_check)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from warmctl.plan.roles import integer, role_defaults, truthy
from warmctl.plan.server import Core, server_plan
from warmctl.plan.units import unit_plan
from warmctl.sleepwake.gate import (
    ACTIVITY_SOCKET,
    CLOSED,
    DRAINING,
    HOLDING,
    WAKE_REQUEST,
    WAKEABLE,
    WAKER_SOCKET,
    WARMING,
    GateFiles,
)
from warmctl.sleepwake.triggers import KINDS, SLEEP_LEVEL, TriggerKind

# The variables the facts depend on (unset: the roles' defaults); the one list of them.
SETTINGS = (
    "vllm_preflight_device_kind",
    "vllm_proxy_enabled",
    "vllm_proxy_upstream_port_offset",
    "vllm_proxy_gate_dir",
    "vllm_proxy_load_balanced",
    "vllm_proxy_conf_dir",
    "vllm_service_port",
    "vllm_service_bind",
    "vllm_service_launcher",
    "vllm_service_config_dir",
    "vllm_service_unit_dir",
    "vllm_install_warmctl_venv",
    "vllm_install_venv",
    "vllm_install_vllm_python",
    "vllm_schedule_wake_hold_sec",
    "vllm_schedule_wake_failed_backoff_sec",
    "vllm_schedule_output_check",
    # the server's plan (warmctl.plan.server)
    "vllm_service_extra_args",
    "vllm_service_env",
    "vllm_service_gpu_compilation_config",
    "vllm_service_compilation_config",
    "vllm_service_sleep_kv_cache_tokens",
    "vllm_service_shutdown_timeout",
    "vllm_service_timeout_start_sec",
    "vllm_service_timeout_stop_sec",
    "vllm_service_textfile_dir",
    "vllm_service_warmup_args",
    "vllm_service_gpu_warmup_args",
    "vllm_service_cuda_cache_maxsize",
    "vllm_install_cache_dir",
    "vllm_install_user",
    "vllm_install_group",
    # the units' plan (warmctl.plan.units)
    "vllm_service_hardening",
    "vllm_install_home",
    "vllm_schedule_systemctl",
    "vllm_schedule_sleep_args",
    "vllm_schedule_wake_args",
    "vllm_proxy_nginx_group",
    "vllm_proxy_access_log",
)
ON_REQUEST = ("refuse", "wake")  # what a request does to a sleeping instance (window default first)
# how long the proxy holds a request while the instance wakes, unless vllm_schedule_wake_hold_sec
# says: a GPU wake is a /wake_up (under a second, seconds at level 2), a CPU one a start + warmup
WAKE_HOLD = {"gpu": 120, "cpu": 600}
ACTIONS = ("sleep", "wake")  # a window's two timers and services
LAUNCHER_PATHS = ("launch_file", "runtime_dir", "launch_state")  # launcher_paths()
# the template of a file whose whole text the plan computes (its `documents`): it prints it
DOCUMENT = "vllm-document.j2"
_LOOPBACK_BINDS = ("0.0.0.0", "::", "127.0.0.1", "localhost")


class Listen(NamedTuple):
    """A TCP port one of the instance's processes listens on."""

    key: str  # the instance's key that sets it (where a problem with it is said)
    number: int
    who: str  # who listens there, for a problem's line ("": the clients' door itself)


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    gpu: bool
    sleep_requested: bool
    sleep: bool
    proxied: bool
    launcher: bool
    launch_file: str  # "" without the launcher
    runtime_dir: str  # the unit's RuntimeDirectory= ("" without the launcher)
    launch_state: str  # the launcher's state file ("" without the launcher)
    port: int
    upstream: int
    bind: str
    target: str
    listens: tuple[Listen, ...]
    warmctl: str  # the host's warmctl (the warmup, the windows, the drain)
    python: str  # vLLM's interpreter: vllm_install_vllm_python, else the role's venv's
    unit: str
    config_dir: str  # vllm_service_config_dir: the env, launch and waker files
    gate_dir: str
    gate: str  # flag files of the proxy's gate (warmctl.sleepwake.gate): asleep
    draining: str  # out of rotation for a restart
    warming: str  # starting, warmup not finished
    load_balanced: bool  # behind a load balancer: a restart drains it out of rotation
    restart_hold: bool  # a single proxied host: a restart holds requests (the waker)
    holding: str  # the flag of that hold: requests are held while it exists
    env_file: str
    unit_file: str
    proxy_conf: str  # the nginx server of the instance (rendered when proxied)
    window_unit: str  # the boot-time window check ("" without windows)
    window_script: str  # what it runs ("" without windows)
    windows: tuple[dict[str, Any], ...]
    wake_on_request: bool
    wake_hold: int
    wake_failed_backoff: int  # after a failed wake, requests are refused at once this long
    awake_port: int
    wakeable: str  # asleep, and a request wakes it (the proxy holds it meanwhile)
    wake_request: str  # the waker asks systemd for a wake (vllm-NAME-wake-request.path)
    waker_socket: str
    activity_socket: str
    outputs: str
    waker_unit: str  # "" without wake on request and restarts that hold requests
    waker_config: str  # what the waker reads (`warmctl waker --config`; "" without a waker)
    triggers: tuple[dict[str, Any], ...]
    files: tuple[dict[str, Any], ...]
    waker: bool  # the waker runs: wake on request, or the hold across a restart
    output_check: bool  # a GPU sleep records answers its wake replays (vllm_schedule_output_check)
    # the server's plan (warmctl.plan.server): what runs, with what environment, how it starts
    server_argv: tuple[str, ...]
    exec_argv: tuple[str, ...]  # the unit's ExecStart
    launch_args: tuple[str, ...]  # the launch file's argv (() without the launcher)
    launch_env: dict[str, str]  # the launch file's variables ({} without the launcher)
    # the text of each file whose whole content the plan computes, by path ({"text", "comment":
    # the file's comment mark, "" for none}): the launch file, the waker's configuration
    documents: dict[str, dict[str, str]]
    env: tuple[tuple[str, str], ...]  # the server's environment, in order (a later pair wins)
    env_lines: tuple[tuple[str, str], ...]  # the env file's: env less the launch file's
    env_notes: tuple[str, ...]  # the env file's comment lines after its heading
    kv_cache_tokens: int  # the KV cache in tokens (0: vLLM's own sizing)
    warmup_argv: tuple[str, ...]  # ExecStartPost
    relaunch_argv: tuple[str, ...]  # ExecReload (with --main-pid)
    relaunch_check_argv: tuple[str, ...]  # ExecReload's check, first
    restart_argv: tuple[str, ...]  # the deploy's restart (--reload: a reload where it applies)
    launcher_script: str  # "" without the launcher
    as_service_user: tuple[str, ...]  # the prefix of a `+` line's command run as the service user
    textfile_dir: str  # the Prometheus textfile folder ("": off)
    textfile_args: tuple[str, ...]  # its options of warmctl's commands
    cache_dir: str  # the compile and model caches (vllm_install_cache_dir)
    summary: str  # the unit's one-line comment: what it serves, where, how
    # the units' sandbox, commands and gate flags, the waker's configuration (warmctl.plan.units)
    units: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _launcher(instance: Mapping[str, Any], setting: Any, gpu: bool) -> bool:
    """The instance's `launcher`, else vllm_service_launcher: true, false or auto (GPU hosts)."""
    value = instance.get("launcher", setting)
    if str(value).strip().lower() == "auto":
        return gpu
    return truthy(value)


def _listens(port: int, upstream: int, proxied: bool, awake_port: int) -> tuple[Listen, ...]:
    doors = [Listen("port", port, "")]
    if proxied:  # nginx on the clients' port, vLLM on its own
        doors.append(Listen("port", upstream, "vLLM behind the proxy"))
    if awake_port:
        doors.append(Listen("awake_port", awake_port, "the awake-only door"))
    return tuple(doors)


def _load_balanced(setting: Any, awake_port: int) -> bool:
    """vllm_proxy_load_balanced: true, false or auto (an awake-only door: a load balancer's)."""
    if str(setting).strip().lower() == "auto":
        return awake_port > 0
    return truthy(setting)


def launcher_paths(config_dir: str, name: str) -> dict[str, str]:
    """The launcher's files of instance `name` (LAUNCHER_PATHS): its launch file, the unit's
    RuntimeDirectory (under /run) and the launcher's state file in it. `warmctl restart` reads
    them here too: the files root expects that instance's running launcher to name."""
    runtime_dir = f"vllm-{name}"
    return {
        "launch_file": f"{config_dir}/{name}.launch",
        "runtime_dir": runtime_dir,
        "launch_state": f"/run/{runtime_dir}/launcher.json",
    }


def local_address(bind: str) -> str:
    """The address that reaches a server bound to `bind` from the host itself."""
    return "127.0.0.1" if bind in _LOOPBACK_BINDS else bind


def warmctl_path(variables: Mapping[str, Any]) -> str:
    """The host's warmctl: vllm_install_warmctl_venv (else the roles' default)/bin/warmctl."""
    return f"{settings_from(variables)['vllm_install_warmctl_venv']}/bin/warmctl"


def settings_from(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The variables the facts depend on: `variables` over the roles' defaults."""
    defaults = role_defaults()
    out = {key: variables.get(key) for key in SETTINGS}
    for key, value in out.items():
        if value is None:  # unset here: the roles' default (one source)
            out[key] = defaults.get(key)
    if out["vllm_preflight_device_kind"] is None:
        out["vllm_preflight_device_kind"] = "gpu"
    return out


def _window(name: str, window: Mapping[str, Any]) -> dict[str, Any]:
    """One sleep window with its level and the names of its services and timers."""
    units = {
        action: {
            "service": f"vllm-{name}-{action}-{window.get('name')}.service",
            "timer": f"vllm-{name}-{action}-{window.get('name')}.timer",
        }
        for action in ACTIONS
    }
    return {
        **window,
        "level": window.get("level", SLEEP_LEVEL),
        "on_request": window.get("on_request", ON_REQUEST[0]),
        "units": units,
    }


def _trigger(name: str, cause: str, action: str, level: int, file: str) -> dict[str, Any]:
    """A sleep trigger or the request wake: a window with one action, started by a path unit
    when the waker creates `file` (the service removes it when it ends, done or failed)."""
    base = f"vllm-{name}-{action}-{cause}"
    unit = {"service": f"{base}.service", "path": f"{base}.path"}
    return {"name": cause, "cause": cause, "action": action, "level": level, "file": file,
            "on_request": "wake", "units": {action: unit}}  # fmt: skip


def _entry(
    path: str, template: str, role: str, name: str, window: Any = None, action: str = ""
) -> dict:
    return {
        "path": path,
        "template": template,
        "role": role,
        "instance": name,
        "window": window,
        "action": action,
    }


def _files(
    name: str,
    paths: Mapping[str, str],
    unit_dir: str,
    windows: list[dict[str, Any]],
    triggers: list[dict[str, Any]],
) -> tuple[dict[str, Any], ...]:
    """Every file the roles render for the instance, in the order `warmctl render` lists them."""
    files = [
        _entry(paths["unit_file"], "vllm-instance.service.j2", "vllm_service", name),
        _entry(paths["env_file"], "vllm-instance.env.j2", "vllm_service", name),
    ]
    if paths["launch_file"]:
        files.append(_entry(paths["launch_file"], DOCUMENT, "vllm_service", name))
    for w in windows:
        for action in ACTIONS:
            units = w["units"][action]
            files.append(_entry(f"{unit_dir}/{units['service']}", "vllm-window.service.j2",
                                "vllm_schedule", name, w, action))  # fmt: skip
            files.append(_entry(f"{unit_dir}/{units['timer']}", "vllm-window.timer.j2",
                                "vllm_schedule", name, w, action))  # fmt: skip
    for t in triggers:
        units = t["units"][t["action"]]
        files.append(_entry(f"{unit_dir}/{units['service']}", "vllm-window.service.j2",
                            "vllm_schedule", name, t, t["action"]))  # fmt: skip
        files.append(_entry(f"{unit_dir}/{units['path']}", "vllm-trigger.path.j2",
                            "vllm_schedule", name, t, t["action"]))  # fmt: skip
    if paths["waker_unit"]:
        files.append(_entry(f"{unit_dir}/{paths['waker_unit']}", "vllm-waker.service.j2",
                            "vllm_schedule", name))  # fmt: skip
        files.append(_entry(paths["waker_config"], DOCUMENT, "vllm_schedule", name))
    if windows:
        files.append(_entry(paths["window_script"], "vllm-reconcile.sh.j2", "vllm_schedule", name))
        files.append(_entry(f"{unit_dir}/{paths['window_unit']}", "vllm-reconcile.service.j2",
                            "vllm_schedule", name))  # fmt: skip
    return tuple(files)


def _wake_settings(s: Mapping[str, Any], sleep: bool) -> tuple[int, int]:
    """How long the proxy holds a request while the instance wakes; the backoff after a failed
    wake."""
    hold = s["vllm_schedule_wake_hold_sec"]
    wake_hold = integer(WAKE_HOLD["gpu" if sleep else "cpu"] if hold in (None, "auto") else hold,
                     "vllm_schedule_wake_hold_sec")  # fmt: skip
    backoff = integer(s["vllm_schedule_wake_failed_backoff_sec"],
                   "vllm_schedule_wake_failed_backoff_sec")  # fmt: skip
    if backoff < 0:
        raise ValueError(f"vllm_schedule_wake_failed_backoff_sec must be >= 0, got {backoff}")
    return wake_hold, backoff


def _gate_files(gate_dir: str, name: str) -> dict[str, str]:
    """The instance's files in the gate folder (the gate model's names) and its output check's
    answers."""
    files = GateFiles(Path(gate_dir), name)
    named = {"gate": CLOSED, "draining": DRAINING, "warming": WARMING, "holding": HOLDING,
             "wakeable": WAKEABLE, "wake_request": WAKE_REQUEST, "waker_socket": WAKER_SOCKET,
             "activity_socket": ACTIVITY_SOCKET}  # fmt: skip
    return {
        **{field: str(files.path(suffix)) for field, suffix in named.items()},
        # the greedy answers a sleep records and a wake replays (vllm_schedule_output_check)
        "outputs": f"/var/lib/warmctl/{name}.outputs.json",
    }


def _kinds_on(instance: Mapping[str, Any], name: str) -> list[tuple[TriggerKind, dict]]:
    """The sleep triggers the instance turns on, each with its settings (their kinds' order)."""
    on = [(kind, kind.settings(instance.get(kind.key), name)) for kind in KINDS]
    return [(kind, settings) for kind, settings in on if settings is not None]


def _triggers(
    name: str, gate_dir: str, on: list[tuple[TriggerKind, dict]], wakes: bool, sleep: bool
) -> list[dict[str, Any]]:
    """The sleep triggers that are `on`, with their settings and request files, then the
    request wake."""
    files = GateFiles(Path(gate_dir), name)
    triggers = []
    for kind, settings in on:
        level = settings.get("level", SLEEP_LEVEL)
        trigger = _trigger(name, kind.cause, kind.action, level, str(files.path(kind.request)))
        triggers.append({**trigger, "on_request": ON_REQUEST[kind.wakeable],
                         "settings": settings})  # fmt: skip
    if wakes and not sleep:
        # a start (CPU hosts, sleep off) is systemd's to do; a vLLM sleep mode's wake the waker
        # does itself, as `warmctl wake` would (no process to start: the wake is ~0.2 s); it
        # wakes from the first sleep trigger's level
        level = triggers[0]["level"] if triggers else SLEEP_LEVEL
        file = str(files.path(WAKE_REQUEST))
        triggers.append(_trigger(name, "request", "wake", level, file))
    return triggers


def _server(instance: Mapping[str, Any], s: Mapping[str, Any], f: Mapping[str, Any]) -> dict:
    core = Core(
        name=f["name"],
        gpu=f["gpu"],
        sleep=f["sleep"],
        launcher=f["launcher"],
        bind=f["bind"],
        upstream=f["upstream"],
        target=f["target"],
        python=f["python"],
        warmctl=f["warmctl"],
        venv=str(s["vllm_install_warmctl_venv"]),
        launch_file=f["launch_file"],
        launch_state=f["launch_state"],
        unit=f["unit"],
        config_dir=f["config_dir"],
    )
    return server_plan(instance, s, core)


def instance_facts(instance: Mapping[str, Any], variables: Mapping[str, Any]) -> InstanceFacts:
    """The derived facts of one item of vllm_service_instances on a host with `variables`."""
    if not isinstance(instance, Mapping):
        raise ValueError(f"an instance must be a mapping, got {type(instance).__name__}")
    s = settings_from(variables)
    name = str(instance.get("name", ""))
    gpu = s["vllm_preflight_device_kind"] == "gpu"
    windows = instance.get("windows") or []
    kinds_on = _kinds_on(instance, name)
    asked = instance.get("sleep")
    sleeps = any(kind.action == "sleep" for kind, _ in kinds_on)
    sleep_requested = bool(windows or sleeps) if asked is None else truthy(asked)
    sleep = sleep_requested and gpu
    mode = str(s["vllm_proxy_enabled"]).strip().lower()
    # a trigger that sees the requests needs the door every request passes: the proxy
    needs_proxy = any(kind.needs_proxy for kind, _ in kinds_on)
    proxied = truthy(mode) or (mode == "auto" and (sleep or needs_proxy))
    launcher = _launcher(instance, s["vllm_service_launcher"], gpu)
    port = integer(instance.get("port", s["vllm_service_port"]), f"instance {name}: port")
    offset = integer(s["vllm_proxy_upstream_port_offset"], "vllm_proxy_upstream_port_offset")
    upstream = port + offset if proxied else port
    bind = "127.0.0.1" if (proxied or sleep) else str(instance.get("bind", s["vllm_service_bind"]))
    gate_dir = str(s["vllm_proxy_gate_dir"])
    window_facts = [_window(name, w) for w in windows if isinstance(w, Mapping)]
    kinds_on = [(k, settings) for k, settings in kinds_on if proxied or not k.needs_proxy]
    wake_on_request = proxied and (
        any(k.wakeable for k, _ in kinds_on) or any(w["on_request"] == "wake" for w in window_facts)
    )
    wake_hold, backoff = _wake_settings(s, sleep)
    gate_files = _gate_files(gate_dir, name)
    triggers = _triggers(name, gate_dir, kinds_on, wake_on_request, sleep)
    awake_port = integer(instance.get("awake_port", 0), f"instance {name}: awake_port")
    load_balanced = _load_balanced(s["vllm_proxy_load_balanced"], awake_port)
    restart_hold = proxied and not load_balanced
    unit_dir, config_dir = s["vllm_service_unit_dir"], s["vllm_service_config_dir"]
    own = launcher_paths(config_dir, name) if launcher else dict.fromkeys(LAUNCHER_PATHS, "")
    paths = {
        "env_file": f"{config_dir}/{name}.env",
        "launch_file": own["launch_file"],
        "unit_file": f"{unit_dir}/vllm-{name}.service",
        "proxy_conf": f"{s['vllm_proxy_conf_dir']}/vllm-{name}.conf",
        "window_unit": f"vllm-{name}-window.service" if window_facts else "",
        "window_script": f"{config_dir}/{name}-window.sh" if window_facts else "",
        "waker_unit": f"vllm-{name}-waker.service" if wake_on_request or restart_hold else "",
    }
    paths["waker_config"] = f"{config_dir}/{name}.waker.json" if paths["waker_unit"] else ""
    facts: dict[str, Any] = {
        "name": name,
        "gpu": gpu,
        "sleep_requested": sleep_requested,
        "sleep": sleep,
        "proxied": proxied,
        "launcher": launcher,
        "runtime_dir": own["runtime_dir"],
        "launch_state": own["launch_state"],
        "config_dir": config_dir,
        "port": port,
        "upstream": upstream,
        "bind": bind,
        "target": f"{local_address(bind)}:{upstream}",
        "listens": _listens(port, upstream, proxied, awake_port),
        "warmctl": warmctl_path(s),
        "python": str(s["vllm_install_vllm_python"] or f"{s['vllm_install_venv']}/bin/python"),
        "unit": f"vllm-{name}.service",
        "gate_dir": gate_dir,
        "load_balanced": load_balanced,
        "restart_hold": restart_hold,
        **paths,
        **gate_files,
        "windows": tuple(window_facts),
        "wake_on_request": wake_on_request,
        "wake_hold": wake_hold,
        "wake_failed_backoff": backoff,
        "awake_port": awake_port,
        "triggers": tuple(triggers),
        "files": _files(name, paths, unit_dir, window_facts, triggers),
        "waker": wake_on_request or restart_hold,
        "output_check": truthy(s["vllm_schedule_output_check"]),
    }
    plan = InstanceFacts(**facts, **_server(instance, s, facts))
    units = unit_plan(plan, instance, s)
    waker = units.get("waker") or {}
    documents = dict(plan.documents)
    if waker.get("config_path"):
        text = json.dumps(waker["config"], indent=2)
        documents[waker["config_path"]] = {"comment": "", "text": text}
    return replace(plan, units=units, documents=documents)


def inventory_facts(instance: Mapping[str, Any], variables: Mapping[str, Any]) -> InstanceFacts:
    """The facts of an instance read from an inventory, before preflight probed the host: its kind
    is vllm_preflight_device_kind when set, else vllm_preflight_device forced to cpu, else gpu
    (auto: a GPU host is assumed)."""
    kind = variables.get("vllm_preflight_device_kind")
    if kind not in ("gpu", "cpu"):
        kind = "cpu" if str(variables.get("vllm_preflight_device", "")).lower() == "cpu" else "gpu"
    return instance_facts(instance, {**variables, "vllm_preflight_device_kind": kind})
