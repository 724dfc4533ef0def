"""The units' policy of one instance: their sandbox (the hardening table, written once), the
window, trigger, waker and boot-time services' commands, the gate flags each action sets and
clears, and the waker's configuration. `unit_plan()` computes it from the instance's facts
(warmctl.plan.instance calls it: the `units` field of InstanceFacts); the templates only print it.

    units["instance"]["hardening"]   the server unit's sandbox lines
    units["services"][SERVICE]       one sleep or wake service (a window's, a sleep trigger's,
                                     the request wake's): its argv, flags, conditions, sandbox
    units["waker"]                   the waker unit: argv, limits, sandbox, and `config` (the
                                     JSON file `warmctl waker --config` reads; its text is
                                     one of the plan's documents)
    units["reconcile"]               the boot-time window check: its After= and sandbox

The hardening table: every line of every unit's sandbox, in the order the units print them,
each with the unit kinds that have it; a line that only some kinds have says why beside it.
`{paths}` and `{devices}` are each unit's own lines (what it may write, which devices it sees).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from warmctl.plan.roles import truthy
from warmctl.sleepwake.triggers import kind_of

if TYPE_CHECKING:
    from warmctl.plan.instance import InstanceFacts

# The variables the units' policy depends on (unset: the roles' defaults).
KINDS = ("instance", "window", "waker", "reconcile")
ALL = frozenset(KINDS)
NOT_SERVER = ALL - {"instance"}
# the door's bound on the waker's connections (nginx holds one per held request); its
# descriptors hold it with room to spare (the bound + 256: connections closed for room, its files)
WAKER_MAX_CONNECTIONS = 1024

# (line, the unit kinds that have it); a line some kinds lack says why.
HARDENING: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "# Sandbox: an unprivileged user in a read-only system, writing only its caches and home",
        frozenset({"instance"}),
    ),
    ("# (systemd-analyze security: exposure <= 4.0).", frozenset({"instance"})),
    ("NoNewPrivileges=yes", ALL),
    ("ProtectSystem=strict", ALL),
    ("{paths}", ALL),
    ("PrivateTmp=yes", ALL),
    # the server's own /dev/shm (vLLM's MessageQueue ring buffers, NCCL's segments): no other
    # local user fills the tmpfs they need (a SIGBUS mid-request) or reads them, and they go
    # with the unit, a crash's leftovers too (RemoveIPC= waits for the user's last unit, and the
    # waker runs as the same user); the other units use no shared memory
    ("TemporaryFileSystem=/dev/shm:mode=1777,nosuid", frozenset({"instance"})),
    ("ProtectHome=yes", ALL),
    # a GPU host's server sees its GPUs (DevicePolicy=closed + DeviceAllow), every other unit
    # (and a CPU host's server) no device at all
    ("{devices}", ALL),
    ("ProtectKernelTunables=yes", ALL),
    ("ProtectKernelModules=yes", ALL),
    ("ProtectKernelLogs=yes", ALL),
    ("ProtectControlGroups=yes", ALL),
    ("ProtectClock=yes", ALL),
    ("ProtectHostname=yes", ALL),
    ("ProtectProc=invisible", ALL),
    # the server's distributed setup (torch's gloo, NCCL) lists the host's interfaces over
    # netlink (getifaddrs); no other unit needs it
    ("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", frozenset({"instance"})),
    ("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", NOT_SERVER),
    ("RestrictNamespaces=yes", ALL),
    ("RestrictRealtime=yes", ALL),
    ("RestrictSUIDSGID=yes", ALL),
    ("LockPersonality=yes", ALL),
    # the server's System V / POSIX IPC (its workers' shared memory) goes with it; the other
    # units of the same user must not remove it (systemd removes the user's IPC when the last
    # unit with RemoveIPC= of that user stops)
    ("RemoveIPC=yes", frozenset({"instance"})),
    ("PrivateMounts=yes", ALL),
    # torch, Triton, inductor and CUDA compile code at run time (memory written, then
    # executed): the server cannot have W^X; warmctl and systemctl can
    ("MemoryDenyWriteExecute=yes", NOT_SERVER),
    ("SystemCallArchitectures=native", ALL),
    ("SystemCallFilter=@system-service", ALL),
    # the server: what @system-service still allows and a server never calls; it keeps
    # @resources (thread and NUMA binding: sched_setaffinity, mbind, setrlimit)
    (
        "SystemCallFilter=~@mount @swap @reboot @raw-io @obsolete @cpu-emulation @debug @module "
        "@clock @privileged",
        frozenset({"instance"}),
    ),
    # the waker: a unix-socket server and a warmctl wake, nothing privileged nor resource
    # setting; windows and the boot-time check run systemctl as root, which sets its own
    # limits (@resources): no deny list beyond @system-service
    ("SystemCallFilter=~@privileged @resources", frozenset({"waker"})),
    (
        "# chown back (@privileged has it): without a capability it can only give its sockets "
        "one of its",
        frozenset({"waker"}),
    ),
    ("# own groups, nginx's", frozenset({"waker"})),
    ("SystemCallFilter=@chown", frozenset({"waker"})),
    ("SystemCallErrorNumber=EPERM", ALL),
    # the server and the waker run unprivileged and need no capability; a window's service and
    # the boot-time check run systemctl as root (a CPU host's window also writes the gate as
    # root in the service user's folder): they keep root's capabilities
    ("CapabilityBoundingSet=", frozenset({"instance", "waker"})),
    ("AmbientCapabilities=", frozenset({"instance", "waker"})),
    # the server's caches and home: not for other users; the other units' files are read by
    # others (the gate's flags by nginx, metrics by node_exporter) and set their own modes
    ("UMask=0027", frozenset({"instance"})),
)


def _list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def hardening(kind: str, paths: list[str], devices: list[str]) -> list[str]:
    """The sandbox lines of a unit of `kind` (the table's, with its own paths and devices)."""
    lines: list[str] = []
    for line, kinds in HARDENING:
        if kind not in kinds:
            continue
        lines += paths if line == "{paths}" else devices if line == "{devices}" else [line]
    return lines


def _gpu_devices(instance: Mapping[str, Any]) -> list[str]:
    gpus = instance.get("gpus")
    lines = ["DevicePolicy=closed"]
    if isinstance(gpus, (list, tuple)):
        lines += [f"DeviceAllow=/dev/nvidia{gpu} rw" for gpu in gpus]
    else:
        lines.append("DeviceAllow=char-nvidia-frontend rw")
    return [
        *lines,
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
        "DeviceAllow=/dev/nvidia-uvm-tools rw",
        "DeviceAllow=char-nvidia-caps r",
    ]


def _instance(f: InstanceFacts, instance: Mapping[str, Any], s: Mapping[str, Any]) -> list[str]:
    paths = [f"ReadWritePaths={s['vllm_install_cache_dir']} {s['vllm_install_home']}"]
    if s["vllm_service_textfile_dir"]:
        paths += ["# the warmup's metrics (Prometheus textfile)",
                  f"ReadWritePaths=-{s['vllm_service_textfile_dir']}"]  # fmt: skip
    devices = _gpu_devices(instance) if f.gpu else ["PrivateDevices=yes"]
    return hardening("instance", paths, devices)


def gate_flags(f: InstanceFacts, window: Mapping[str, Any], action: str) -> list[str]:
    """The gate flags a sleep sets (one) or a wake clears: a sleep closes NAME.wakeable when a
    request may wake the instance (the proxy holds it and the waker asks for a wake), else
    NAME.closed (503 "asleep"); a wake opens both. None without the proxy."""
    if not f.proxied:
        return []
    if action == "sleep":
        wakes = f.wake_on_request and window.get("on_request") == "wake"
        return [f.wakeable if wakes else f.gate]
    return [f.gate, f.wakeable] if f.wake_on_request else [f.gate]


def _sleeps(f: InstanceFacts) -> list[str]:
    """Every sleep service of the instance (a wake asked while one runs waits for it)."""
    windows = [w["units"]["sleep"]["service"] for w in f.windows]
    return windows + [t["units"]["sleep"]["service"] for t in f.triggers if t["action"] == "sleep"]


def _service_argv(
    f: InstanceFacts, w: Mapping[str, Any], action: str, s: Mapping[str, Any]
) -> dict[str, list[str]]:
    """The commands of one sleep or wake service: its condition, its ExecStart (vLLM sleep mode)
    or its drain (ExecStartPre, proxied without sleep mode) and systemctl's stop or start."""
    gate = [arg for flag in gate_flags(f, w, action) for arg in ("--gate", flag)]
    cause = ["--cause", str(w.get("cause", "window"))]
    if action == "sleep" and w.get("cause", "window") == "window":
        # the flag's text names the window (`warmctl status` says which one put it to sleep)
        cause += ["--window", str(w.get("name"))]
    check = ["--output-check", f.outputs] if f.output_check else []
    metrics = list(f.textfile_args)
    if action == "sleep" and metrics and w.get("wake") is not None:
        # the window's wake time: an alert tells a wake that did not come
        metrics = [*metrics, "--next-wake", str(w["wake"])]
    out: dict[str, list[str]] = {"condition": [], "start": [], "drain": [], "systemctl": []}
    if f.sleep or action == "sleep":
        out["condition"] = [f.warmctl, "window-check", f.unit, "--action", action, "--window",
                            str(w.get("name")), "--systemctl", str(s["vllm_schedule_systemctl"]),
                            *f.textfile_args]  # fmt: skip
    if f.sleep and action == "sleep":
        out["start"] = [f.warmctl, "sleep", f.target, "--level", str(w["level"]), *gate, *cause,
                        *check, *metrics, *_list(s["vllm_schedule_sleep_args"])]  # fmt: skip
    elif f.sleep:
        out["start"] = [f.warmctl, "wake", f.target, *gate, *cause, *check,
                        *f.textfile_args, *_list(s["vllm_schedule_wake_args"])]  # fmt: skip
    else:
        if f.proxied and action == "sleep":
            out["drain"] = [f.warmctl, "sleep", f.target, "--drain-only", *gate, *cause, *metrics]
        verb = "stop" if action == "sleep" else "start"
        out["systemctl"] = [str(s["vllm_schedule_systemctl"]), verb, f.unit]
    return out


def _service(
    f: InstanceFacts, w: Mapping[str, Any], action: str, s: Mapping[str, Any]
) -> dict[str, Any]:
    """One sleep or wake service: a window's (its timer starts it) or a trigger's (its path
    unit starts it when the waker creates `file`)."""
    trigger = w.get("file") is not None
    argv = _service_argv(f, w, action, s)
    checked = bool(argv["start"]) and f.output_check
    paths = [f"ReadWritePaths=-{f.gate_dir}"] if f.proxied else []
    writes_metrics = f.sleep or (f.proxied and action == "sleep")
    if s["vllm_service_textfile_dir"] and writes_metrics:
        paths.append(f"ReadWritePaths=-{s['vllm_service_textfile_dir']}")
    cause = str(w.get("cause", "window"))
    kind = kind_of(w)  # a sleep trigger's (None: a window's or the request wake's)
    asked = kind.asked.format(**w["settings"]) if kind else "a request came while asleep"
    return {
        "action": action,
        "trigger": trigger,
        # the Description= of the service, and what its path unit starts it for (a trigger's)
        "description": f"{action} ({asked}; asked by the waker)"
        if trigger
        else f"{action} ({w.get('name')} window)",
        "purpose": (kind.purpose if kind else "wake on request") if trigger else "",
        "cause": cause,
        "gate_flags": gate_flags(f, w, action),
        "after": _sleeps(f) if trigger and action == "wake" else [],
        **argv,
        "sleep_mode": f.sleep,
        "state_directory": checked,  # the recorded answers (sleep writes, wake reads)
        # a start that failed leaves the instance stopped, not retried behind the waker's back
        "stop_failed_start": trigger and action == "wake" and not f.sleep,
        "remove_file": str(w["file"]) if trigger else "",  # the waker's ask is answered
        "hardening": hardening("window", paths, ["PrivateDevices=yes"]) if _on(s) else [],
    }


def _on(s: Mapping[str, Any]) -> bool:
    return truthy(s["vllm_service_hardening"])


def _detected(f: InstanceFacts) -> list[dict[str, Any]]:
    """The instance's sleep triggers, which the waker's detectors watch."""
    return [t for t in f.triggers if kind_of(t) is not None]


def _watched(trigger: Mapping[str, Any]) -> dict[str, Any]:
    """A trigger in the waker's configuration: its cause, request file and the settings its
    detector reads."""
    kind = kind_of(trigger)
    assert kind is not None
    settings = {key: trigger["settings"][key] for key in kind.watched}
    return {"cause": kind.cause, "request_file": trigger["file"], "settings": settings}


def waker_config(f: InstanceFacts, s: Mapping[str, Any]) -> dict[str, Any]:
    """What `warmctl waker --config FILE` reads (warmctl.waker.config.load_config)."""
    check = f.sleep and f.output_check
    return {
        "name": f.name,
        "target": f.target,
        "socket": f.waker_socket,
        "activity_socket": f.activity_socket,
        "socket_group": str(s["vllm_proxy_nginx_group"]),
        "max_connections": WAKER_MAX_CONNECTIONS,
        "flags": {
            "wakeable": f.wakeable,
            "closed": f.gate,
            "warming": f.warming,
            "draining": f.draining,
            "wake_request": f.wake_request,
            "holding": f.holding if f.restart_hold else None,
        },
        "triggers": [_watched(t) for t in _detected(f)],
        "hold": f.wake_hold,
        "failed_backoff": f.wake_failed_backoff,
        # vLLM sleep mode: the waker wakes it itself, as the wake service would (~0.2 s, no
        # process to start inside the first request's hold); a CPU host's wake is systemd's start
        "wake_here": f.sleep,
        "output_check": f.outputs if check else None,
        "textfile_dir": str(s["vllm_service_textfile_dir"]) or None,
    }


def activity_log(f: InstanceFacts, s: Mapping[str, Any]) -> list[str]:
    """The proxy's access-log lines of /v1/ for a sleep trigger that reads it (the idle sleep):
    every request vLLM answered (not the gate's own answers: no upstream) is one syslog datagram
    to the waker, its idle clock; the host's access log stays. [] without such a trigger."""
    if not any(kind.activity for t in f.triggers if (kind := kind_of(t))):
        return []
    host_log = str(s["vllm_proxy_access_log"])
    lines = [f"        access_log {host_log};"] if host_log != "off" else []
    return [*lines, f"        access_log syslog:server=unix:{f.activity_socket},nohostname,"
                    "tag=warmctl combined if=$upstream_addr;"]  # fmt: skip


def _waker_comment(f: InstanceFacts, s: Mapping[str, Any]) -> list[str]:
    """The waker unit's opening comment: what it watches and how it wakes the instance."""
    watches = "".join(kind.watch.format(**t["settings"]) for t in _detected(f)
                      if (kind := kind_of(t)))  # fmt: skip
    wake = "wakes it itself, as the wake service would" if f.sleep else "asks systemd for one start"
    return [
        f'The waker of vLLM instance "{f.name}" (warmctl waker): the proxy\'s requests end in its',
        f"access log ({PurePath(f.activity_socket).name}); {watches}while",
        "the instance sleeps wakable, the proxy holds each request on it "
        f"({PurePath(f.waker_socket).name}, nginx",
        f"auth_request) and {wake} (up to {f.wake_hold} s, then 503). It asks",
        "systemd through files its path units watch; it needs no privilege and listens on unix "
        "sockets only,",
        f"mode 0660 with nginx's group ({s['vllm_proxy_nginx_group']}): nginx's workers and "
        f"{s['vllm_install_user']} connect, no other user.",
    ]


def _waker(f: InstanceFacts, s: Mapping[str, Any], config_path: str) -> dict[str, Any]:
    paths = [f"ReadWritePaths={f.gate_dir}"]
    if s["vllm_service_textfile_dir"]:
        paths.append(f"ReadWritePaths=-{s['vllm_service_textfile_dir']}")
    config = waker_config(f, s)
    return {
        "comment": _waker_comment(f, s),
        "argv": [f.warmctl, "waker", "--config", config_path],
        "config_path": config_path,
        "config": config,  # its file's text: the plan's documents (warmctl.plan.instance)
        "limit_nofile": WAKER_MAX_CONNECTIONS * 2,
        "hardening": hardening("waker", paths, ["PrivateDevices=yes"]) if _on(s) else [],
    }


def unit_plan(
    f: InstanceFacts, instance: Mapping[str, Any], s: Mapping[str, Any]
) -> dict[str, Any]:
    """The units' part of an instance's plan (see the module's docstring); `s`: the plan's
    settings (warmctl.plan.instance.SETTINGS, over the roles' defaults)."""
    services = {}
    for w in [*f.windows, *f.triggers]:
        for action, names in w["units"].items():
            services[names["service"]] = _service(f, w, action, s)
    after = [f.unit, "time-sync.target"]
    for w in f.windows:
        after += [w["units"]["sleep"]["service"], w["units"]["wake"]["service"]]
    return {
        "instance": {"hardening": _instance(f, instance, s) if _on(s) else []},
        "services": services,
        "waker": _waker(f, s, f.waker_config) if f.waker_unit else {},
        "proxy": {"activity_log": activity_log(f, s)},
        "reconcile": {
            "after": after if f.windows else [],
            # outside every window: awake, by a wake service (any window's wakes it; the first's)
            "awake_service": f.windows[0]["units"]["wake"]["service"] if f.windows else "",
            "hardening": hardening("reconcile", [], ["PrivateDevices=yes"]) if _on(s) else [],
        },
    }
