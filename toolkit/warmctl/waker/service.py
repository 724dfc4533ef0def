"""`warmctl waker`'s run: the options checked (nothing bound or written before), the two sockets
bound in the gate folder (reachable by nginx's group and the service user only), the
descriptors sized to the door's bound, the hold, the sleep triggers' detectors and the metrics
writer run until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import resource
import signal
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.sleepwake.gate import Flags
from warmctl.terminal.output import info_line
from warmctl.waker.connections import Connections, Door, Storm
from warmctl.waker.detector import Activity, Detector, Trigger, Watch, detector_class
from warmctl.waker.hold import Hold
from warmctl.waker.http import handler
from warmctl.waker.metrics import WakerMetrics
from warmctl.waker.wakehere import WakeHere

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
LOAD_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 1024  # the door's bound by default (nginx holds one per held request)
BACKLOG = 1024  # the listen backlog: connections the kernel queues for accept (a burst)
# descriptors beyond the bound: connections closed for room and not yet released (the door
# waits past Door.CLOSING_MAX), and the process's own (sockets, files, the wake's pipes, its
# HTTP connection to vLLM)
FD_RESERVE = Door.CLOSING_MAX + 128


@dataclass(frozen=True)
class WakerConfig:
    name: str  # the instance (log lines, metrics)
    socket: Path  # the hold's HTTP socket (nginx's auth_request)
    activity_socket: Path | None  # nginx's access-log datagrams (None: no trigger reads them)
    flags: Flags
    target: str  # HOST:PORT of vLLM on this host (its /load)
    triggers: tuple[Trigger, ...]  # the sleep triggers its detectors watch (none: ())
    hold: float
    failed_backoff: float
    textfile_dir: str | None
    wake: WakeHere | None = None  # the waker's own wake (GPU), else None
    socket_group: str | None = None  # nginx's group (name or number): sockets 0660; None: 0600
    max_connections: int = MAX_CONNECTIONS


def _socket_problem(path: Path, kind: int) -> str | None:
    """Why `path` cannot be bound: None when it is free or a stale socket (nobody listens)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(mode):
        return "exists and is not a socket"
    with socket.socket(socket.AF_UNIX, kind) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return None  # stale: left by a waker that died
    return "another process listens on it (is a waker for this instance running already?)"


def group_id(group: str) -> int | None:
    """The gid of a group name or number (None: no such group)."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return int(group) if group.isdigit() else None


def _group_problem(group: str) -> str | None:
    gid = group_id(group)
    if gid is None:
        return f"socket_group {group}: no such group"
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        return (
            f"socket_group {group}: this process is not in that group, so it cannot give "
            "it its sockets (its unit's SupplementaryGroups=)"
        )
    return None


def check(cfg: WakerConfig) -> None:
    """Every problem of the configuration, before anything is bound or written (one line)."""
    problems: list[str] = []
    if cfg.socket_group is not None and (why := _group_problem(cfg.socket_group)):
        problems.append(why)
    for trigger in cfg.triggers:
        if trigger.kind.activity and cfg.activity_socket is None:
            problems.append(f"the {trigger.kind.cause} trigger needs activity_socket")
    sockets = [(cfg.socket, socket.SOCK_STREAM, "socket")]
    if cfg.activity_socket is not None:
        sockets.append((cfg.activity_socket, socket.SOCK_DGRAM, "activity_socket"))
    wakes = [t.request for t in cfg.triggers if t.request not in cfg.flags.asks]
    files = cfg.flags.paths() + wakes + [s for s, _, _ in sockets]
    if len({p.resolve() for p in files}) != len(files):
        problems.append("the flag, request and socket paths must all differ")
    missing = sorted({str(p.parent) for p in files if not p.parent.is_dir()})
    problems += [f"folder {folder} does not exist" for folder in missing]
    for path in files:
        if not path.name or path.name in (".", ".."):
            problems.append(f"{path}: not a file name")
        elif path.is_dir():
            problems.append(f"{path}: is a folder")
    for path, kind, option in sockets:
        if len(os.fsencode(str(path))) > SOCKET_PATH_MAX:
            problems.append(f"{option} {path}: longer than {SOCKET_PATH_MAX} bytes")
        elif path.parent.is_dir() and (why := _socket_problem(path, kind)):
            problems.append(f"{option} {path}: {why}")
    if cfg.textfile_dir and not os.access(cfg.textfile_dir, os.W_OK):
        problems.append(f"textfile_dir {cfg.textfile_dir}: not writable")
    if problems:
        raise WarmctlError("waker: " + "; ".join(problems), kind="input")


def _bind(path: Path, kind: int, gid: int | None) -> socket.socket:
    """A unix socket at `path` (a stale one replaced) that only nginx's workers and this user
    reach: connecting needs write permission on it, and it is made 0600 (the umask during the
    bind), given nginx's group, then made 0660; without a group it stays 0600. The gate folder
    is this user's: nobody else can swap the file between those steps."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, kind)
    try:
        umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(umask)
        if gid is not None:
            os.chown(path, -1, gid, follow_symlinks=False)
            os.chmod(path, 0o660)
        if kind == socket.SOCK_STREAM:
            sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        raise WarmctlError(
            f"waker: cannot bind {path}: {err.strerror or err}", kind="input"
        ) from None
    return sock


def fit_descriptors(name: str, bound: int) -> int:
    """The door's bound that the descriptor limit holds (FD_RESERVE beside it): the soft limit
    raised towards the hard one if need be (the unit's LimitNOFILE fits the default bound;
    its system call filter refuses a raise), else the bound lowered, with a line."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = bound + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        top = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(soft - FD_RESERVE, 1)
        info_line(
            f"{name}: waker: {soft} descriptors (LimitNOFILE) hold {fitted} connections, not "
            f"the {bound} asked for"
        )
        return fitted
    return bound


def _notify_ready() -> None:
    """sd_notify READY=1 (a unit of Type=notify starts nginx's users only once we listen)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.sendall(b"READY=1")


def _load_reader(target: str) -> Any:
    from warmctl.server.client import Client
    from warmctl.server.target import parse_target

    client = Client(parse_target(target), timeout=LOAD_TIMEOUT_S)
    return client.server_load


def _serving_probe(target: str) -> Any:
    """After a restart or relaunch the requests were held for: does vLLM answer /health?"""
    from warmctl.errors import WarmctlError
    from warmctl.server.client import Client
    from warmctl.server.target import parse_target

    client = Client(parse_target(target), timeout=LOAD_TIMEOUT_S)

    def serving() -> bool:
        try:
            client.health()
        except WarmctlError:
            return False
        return True

    return serving


def _detectors(cfg: WakerConfig, metrics: WakerMetrics) -> list[tuple[Trigger, Detector]]:
    """Each sleep trigger with its detector (warmctl.waker.detector), built from its kind."""
    if not cfg.triggers:
        return []
    load = _load_reader(cfg.target)
    watches = [Watch(cfg.name, cfg.flags, t.request, t.settings, load, metrics)
               for t in cfg.triggers]  # fmt: skip
    return [(t, detector_class(t.kind)(w)) for t, w in zip(cfg.triggers, watches, strict=True)]


def _activity(cfg: WakerConfig, readers: list[Detector], gid: int | None) -> Activity | None:
    """The activity socket bound, its datagrams noted by the detectors that read them."""
    if not readers or cfg.activity_socket is None:
        return None

    def noted(count: int) -> None:
        for reader in readers:
            reader.activity(count)

    dgram = _bind(cfg.activity_socket, socket.SOCK_DGRAM, gid)
    return Activity(dgram, noted, min(reader.pause for reader in readers))


async def serve(cfg: WakerConfig, stop: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    metrics = WakerMetrics(cfg.name, cfg.textfile_dir)
    local = None
    if cfg.wake is not None:
        from warmctl.waker.wakehere import LocalWake

        local = LocalWake(cfg.name, cfg.wake, cfg.flags.wake_request)
    hold = Hold(cfg.name, cfg.flags, cfg.hold, cfg.failed_backoff, metrics,
                on_asked=local.start if local is not None else None,
                serving=_serving_probe(cfg.target) if cfg.flags.holding else None)  # fmt: skip
    detectors = _detectors(cfg, metrics)
    started = time.time()

    def state() -> dict[str, Any]:
        out: dict[str, Any] = {"instance": cfg.name, "started": started, **hold.state()}
        out["awake"] = cfg.flags.awake()
        for _, detector in detectors:
            out.update(detector.state())
        return out

    gid = group_id(cfg.socket_group) if cfg.socket_group is not None else None
    bound = fit_descriptors(cfg.name, cfg.max_connections)
    storm = Storm(cfg.name, bound, count=metrics.connection_past_bound)
    connections = Connections(bound, storm)

    def door_state() -> dict[str, Any]:
        return {**state(), "connections": len(connections), "max_connections": bound,
                "storms": storm.storms}  # fmt: skip

    tasks: list[asyncio.Task[None]] = []
    activity: Activity | None = None
    door = Door(_bind(cfg.socket, socket.SOCK_STREAM, gid), connections,
                handler(hold, door_state, connections))  # fmt: skip
    door.start()
    try:
        activity = _activity(cfg, [d for t, d in detectors if t.kind.activity], gid)
        tasks += [asyncio.create_task(detector.run()) for _, detector in detectors]
        tasks.append(asyncio.create_task(metrics.writer()))
        watching = ", ".join(detector.summary() for _, detector in detectors)
        info_line(
            f"{cfg.name}: waker listening on {cfg.socket} (hold up to {cfg.hold:g} s, at most "
            f"{bound} connections, {watching or 'no sleep trigger'}; vLLM at {cfg.target})"
        )
        _notify_ready()
        await stop.wait()
    finally:
        hold.shutdown()
        door.close()
        if activity is not None:
            activity.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.2)  # the refused holders' answers go out
        for path in (cfg.socket, cfg.activity_socket):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()
        with contextlib.suppress(WarmctlError):
            metrics.write()
        storm.close()
        info_line(f"{cfg.name}: waker stopped")


def run(cfg: WakerConfig) -> int:
    check(cfg)
    asyncio.run(serve(cfg))
    return 0
