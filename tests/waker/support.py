"""`warmctl waker` as a real process on real sockets and files, and systemd's part played by the
test: the path units that run `warmctl wake` / `warmctl sleep` when the waker asks, as the
lead's units do (their service removes the request file when it ends, whatever the result)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.double import wait_until

WARMCTL = str(Path(sys.executable).parent / "warmctl")


@dataclass(frozen=True)
class GateFiles:
    """An instance's files in a gate folder (the names warmctl.plan.instance gives them)."""

    dir: Path
    name: str = "tiny"

    def path(self, suffix: str) -> Path:
        return self.dir / f"{self.name}.{suffix}"

    @property
    def wakeable(self) -> Path:
        return self.path("wakeable")

    @property
    def closed(self) -> Path:
        return self.path("closed")

    @property
    def warming(self) -> Path:
        return self.path("warming")

    @property
    def draining(self) -> Path:
        return self.path("draining")

    @property
    def holding(self) -> Path:
        return self.path("holding")

    @property
    def wake_request(self) -> Path:
        return self.path("wake-request")

    @property
    def sleep_request(self) -> Path:
        return self.path("sleep-request")

    @property
    def socket(self) -> Path:
        return self.path("waker.sock")

    @property
    def activity(self) -> Path:
        return self.path("activity.sock")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def waker_config(files: GateFiles, target: str, **options: Any) -> dict[str, Any]:
    """The waker's configuration (the JSON file `warmctl waker --config` reads) of `files`."""
    config: dict[str, Any] = {
        "name": files.name,
        "target": target,
        "socket": str(files.socket),
        "flags": {
            "wakeable": str(files.wakeable),
            "closed": str(files.closed),
            "warming": str(files.warming),
            "draining": str(files.draining),
            "wake_request": str(files.wake_request),
        },
    }
    if options.get("idle_after"):  # the idle sleep's trigger (warmctl.sleepwake.triggers)
        config["activity_socket"] = str(files.activity)
        config["triggers"] = [{"cause": "idle", "request_file": str(files.sleep_request),
                               "settings": {"after": options["idle_after"]}}]  # fmt: skip
    if options.get("wake_here"):
        config["wake_here"] = True
    if options.get("holding"):
        config["flags"]["holding"] = str(files.holding)
    for key in ("hold", "failed_backoff", "textfile_dir", "output_check", "socket_group",
                "max_connections"):  # fmt: skip
        if options.get(key) is not None:
            value = options[key]
            config[key] = str(value) if isinstance(value, Path) else value
    return config


def write_config(config: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(config))
    return path


def waker_argv(files: GateFiles, target: str, **options: Any) -> list[str]:
    """`warmctl waker --config FILE`, its file written beside the gate folder."""
    path = files.dir.parent / f"{files.name}.waker.json"
    write_config(waker_config(files, target, **options), path)
    return [WARMCTL, "waker", "--config", str(path)]


class Waker:
    """A running `warmctl waker`; its output is kept in `log_path`. `nofile`: its descriptor
    limit (soft and hard, as a unit's LimitNOFILE=N sets them)."""

    def __init__(
        self,
        files: GateFiles,
        target: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        nofile: int | None = None,
        **options: Any,
    ) -> None:
        self.files, self.log_path, self.env, self.nofile = files, log_path, env, nofile
        self.argv = waker_argv(files, target, **options)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Waker:
        env = {**os.environ, **(self.env or {})}
        argv = self.argv
        if self.nofile is not None:  # util-linux's prlimit: no preexec_fn among threads
            argv = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *argv]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.state()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the waker exited: {self.log()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the waker did not listen: {self.log()}") from None
                time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
        conn = UnixHTTPConnection(self.files.socket, timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def state(self) -> dict[str, Any]:
        status, _, body = self.get("/state", timeout=5)
        assert status == 200, status
        return json.loads(body)

    def hold(self) -> tuple[int, str, float]:
        """(status, X-Warmctl-Wake, X-Warmctl-Held) of one /hold, as nginx asks it."""
        status, headers, _ = self.get("/hold")
        return status, headers.get("x-warmctl-wake", ""), float(headers.get("x-warmctl-held", -1))

    def wait_holding(self, n: int) -> None:
        wait_until(lambda: self.state()["holding"] == n, f"the waker holding {n} requests")


@dataclass
class Held:
    """Requests sent one by one (each held before the next goes), answered in threads."""

    send: Callable[[], Any]
    answers: list[Any] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, n: int, held: Callable[[int], None]) -> Held:
        for i in range(n):
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self.threads.append(t)
            held(i + 1)  # the event: it is held (or answered)
        return self

    def _one(self) -> None:
        answer = self.send()
        with self.lock:
            self.answers.append(answer)

    def join(self, timeout: float = 60.0) -> list[Any]:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a held request never got an answer"
        return list(self.answers)


class PathUnits:
    """systemd's part: when the waker creates a request file, run what the lead's path unit's
    service runs (GPU: `warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request`;
    `warmctl sleep TARGET --gate WAKEABLE --cause idle`), then remove the request file, as its
    ExecStopPost does whatever the result. `wake_argv`/`sleep_argv` None: leave that request
    alone (the test acts itself)."""

    def __init__(
        self,
        files: GateFiles,
        target: str,
        *,
        wake: bool = True,
        sleep: bool = True,
        textfile_dir: Path | None = None,
    ) -> None:
        self.files, self.target = files, target
        extra = (
            ["--textfile-dir", str(textfile_dir), "--instance", files.name] if textfile_dir else []
        )
        self.wake_argv = (
            [WARMCTL, "wake", target, "--gate", str(files.closed), "--gate",
             str(files.wakeable), "--cause", "request", "--no-warmup", *extra]
            if wake else None
        )  # fmt: skip
        self.sleep_argv = (
            [WARMCTL, "sleep", target, "--gate", str(files.wakeable), "--cause", "idle",
             "--drain-timeout", "30", *extra]
            if sleep else None
        )  # fmt: skip
        self.runs: list[tuple[str, int]] = []  # (action, exit status), in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> PathUnits:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for action, request, argv in (
                ("wake", self.files.wake_request, self.wake_argv),
                ("sleep", self.files.sleep_request, self.sleep_argv),
            ):
                if argv is not None and request.exists():
                    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
                    self.runs.append((action, proc.returncode))
                    request.unlink(missing_ok=True)
            self._stop.wait(0.02)


def send_datagram(path: Path, text: bytes = b"<190>warmctl: activity") -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(text, str(path))
