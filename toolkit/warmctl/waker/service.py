"""`warmctl waker`'s run: the options checked (nothing bound or written before), the two sockets
bound in the gate folder, the hold, the idle watch and the metrics writer run until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.output import info_line
from warmctl.waker.flags import Flags
from warmctl.waker.hold import Hold
from warmctl.waker.http import HEAD_LIMIT, handler
from warmctl.waker.idle import Activity, IdleWatch
from warmctl.waker.metrics import WakerMetrics

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
LOAD_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class WakerConfig:
    name: str  # the instance (log lines, metrics)
    socket: Path  # the hold's HTTP socket (nginx's auth_request)
    activity_socket: Path | None  # nginx's access-log datagrams (None: no idle sleep)
    flags: Flags
    target: str  # HOST:PORT of vLLM on this host (its /load)
    idle_after: float  # 0: no idle sleep
    hold: float
    failed_backoff: float
    textfile_dir: str | None
    wake_argv: list[str] | None = None  # `warmctl` argv of the waker's own wake (GPU), else None


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


def check(cfg: WakerConfig) -> None:
    """Every problem of the options, before anything is bound or written (one line)."""
    problems: list[str] = []
    if cfg.idle_after > 0 and (cfg.activity_socket is None or cfg.flags.sleep_request is None):
        problems.append("--idle-after needs --activity-socket and --sleep-request")
    sockets = [(cfg.socket, socket.SOCK_STREAM, "--socket")]
    if cfg.activity_socket is not None:
        sockets.append((cfg.activity_socket, socket.SOCK_DGRAM, "--activity-socket"))
    files = cfg.flags.paths() + [s for s, _, _ in sockets]
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
        problems.append(f"--textfile-dir {cfg.textfile_dir}: not writable")
    if problems:
        raise WarmctlError("waker: " + "; ".join(problems), kind="input")


def _bind(path: Path, kind: int) -> socket.socket:
    """A unix socket at `path` (a stale one replaced), mode 0666: nginx's workers run as
    another user, and a unix socket's write permission is what connecting needs."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, kind)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666)
        if kind == socket.SOCK_STREAM:
            sock.listen(1024)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        raise WarmctlError(
            f"waker: cannot bind {path}: {err.strerror or err}", kind="input"
        ) from None
    return sock


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
    from warmctl.client import Client
    from warmctl.target import parse_target

    client = Client(parse_target(target), timeout=LOAD_TIMEOUT_S)
    return client.server_load


def _serving_probe(target: str) -> Any:
    """After a restart or relaunch the requests were held for: does vLLM answer /health?"""
    from warmctl.client import Client
    from warmctl.errors import WarmctlError
    from warmctl.target import parse_target

    client = Client(parse_target(target), timeout=LOAD_TIMEOUT_S)

    def serving() -> bool:
        try:
            client.health()
        except WarmctlError:
            return False
        return True

    return serving


async def serve(cfg: WakerConfig, stop: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    metrics = WakerMetrics(cfg.name, cfg.textfile_dir)
    local = None
    if cfg.wake_argv is not None:
        from warmctl.waker.wakehere import LocalWake

        local = LocalWake(cfg.name, cfg.wake_argv, cfg.flags.wake_request)
    hold = Hold(cfg.name, cfg.flags, cfg.hold, cfg.failed_backoff, metrics,
                on_asked=local.start if local is not None else None,
                serving=_serving_probe(cfg.target) if cfg.flags.holding else None)  # fmt: skip
    idle: IdleWatch | None = None
    if cfg.idle_after > 0:
        idle = IdleWatch(cfg.name, cfg.flags, cfg.idle_after, _load_reader(cfg.target), metrics)
    started = time.time()

    def state() -> dict[str, Any]:
        out: dict[str, Any] = {"instance": cfg.name, "started": started, **hold.state()}
        out["awake"] = cfg.flags.awake()
        if idle is not None:
            out["idle_s"] = round(time.monotonic() - idle.last, 3)
            out["idle_after"] = cfg.idle_after
            out["activities"] = idle.activities
        return out

    tasks: list[asyncio.Task[None]] = []
    activity: Activity | None = None
    server = await asyncio.start_unix_server(
        handler(hold, state), sock=_bind(cfg.socket, socket.SOCK_STREAM), limit=HEAD_LIMIT
    )
    try:
        if idle is not None and cfg.activity_socket is not None:
            dgram = _bind(cfg.activity_socket, socket.SOCK_DGRAM)
            activity = Activity(dgram, idle.activity, idle.pause)
            tasks.append(asyncio.create_task(idle.run()))
        tasks.append(asyncio.create_task(metrics.writer()))
        idle_text = f"idle sleep after {cfg.idle_after:g} s" if idle else "no idle sleep"
        info_line(
            f"{cfg.name}: waker listening on {cfg.socket} (hold up to {cfg.hold:g} s, "
            f"{idle_text}; vLLM at {cfg.target})"
        )
        _notify_ready()
        await stop.wait()
    finally:
        hold.shutdown()
        server.close()
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
        info_line(f"{cfg.name}: waker stopped")


def run(cfg: WakerConfig) -> int:
    check(cfg)
    asyncio.run(serve(cfg))
    return 0
