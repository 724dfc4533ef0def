"""One vLLM server process under the benchmark: started with an exact argv + environment, its
output read line by line and stamped with the monotonic time since the process was started
(vLLM's own log timestamps have one-second resolution), readiness polled, stopped as a group."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from warmctl.errors import WarmctlError
from warmctl.host.procs import die_with_parent, session_pids


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the argv and the COMPLETE environment of the server process."""

    argv: list[str]
    env: dict[str, str]
    base_url: str


@dataclass(frozen=True)
class StampedLine:
    t: float  # seconds since the process was started
    text: str


@dataclass
class ServerProcess:
    """Start with `start()`, then `wait_ready()`; always `stop()` (or use it as a context)."""

    spec: LaunchSpec
    log_path: Path
    _proc: subprocess.Popen[bytes] | None = None
    _t0: float = 0.0
    _lines: list[StampedLine] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reader: threading.Thread | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.spec.argv,
                env=self.spec.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends EngineCore too
                preexec_fn=die_with_parent,  # only a prctl: safe between fork and exec
            )
        except OSError as exc:
            raise WarmctlError(f"cannot start {self.spec.argv[0]}: {exc.strerror}") from exc
        atexit.register(self.stop)
        self._reader = threading.Thread(target=self._read, name="vllm-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with self.log_path.open("w", encoding="utf-8") as log:
            for raw in self._proc.stdout:
                t = time.monotonic() - self._t0
                text = raw.decode("utf-8", "replace").rstrip("\n")
                with self._lock:
                    self._lines.append(StampedLine(t, text))
                log.write(f"[{t:9.3f}] {text}\n")
                log.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def signal(self, sig: signal.Signals) -> None:
        """Signal the process itself (not its group): e.g. SIGHUP to the launcher."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, sig)

    def lines(self) -> list[StampedLine]:
        with self._lock:
            return list(self._lines)

    def tail(self, n: int = 1) -> str:
        lines = [ln.text for ln in self.lines() if ln.text.strip()]
        return " | ".join(lines[-n:]) or "(no output)"

    def wait_ready(self, probe: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
        """Poll `probe` (True = ready) until it holds; returns seconds since start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                raise WarmctlError(
                    f"vLLM exited with code {code} before it was ready "
                    f"(log {self.log_path}): {self.tail(1)[:300]}"
                )
            if probe():
                return self.elapsed()
            time.sleep(interval)
        raise WarmctlError(
            f"vLLM was not ready {timeout:.0f} s after start (log {self.log_path}): "
            f"{self.tail(1)[:300]}"
        )

    def stop(self, timeout: float = 60.0) -> float | None:
        """SIGTERM the process group, SIGKILL after `timeout`; returns the seconds it took."""
        if self._proc is None:
            return None
        atexit.unregister(self.stop)
        t = time.monotonic()
        pgid = self._proc.pid  # start_new_session: the server leads its own group
        _signal_group(pgid, signal.SIGTERM)
        deadline = t + timeout
        # the group may outlive its leader (EngineCore children): wait for all of it
        while (self._proc.poll() is None or session_pids(pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        while session_pids(pgid) and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        if self._reader is not None:
            self._reader.join(timeout=10)
        took = time.monotonic() - t
        self._proc = None
        return took


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
