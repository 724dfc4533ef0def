"""vLLM as two small modules for the launcher's tests, and what the tests read back: an import
that is logged (and reads one variable at import, as vLLM's logging reads VLLM_LOGGING_LEVEL,
besides scanning the whole environment, as tqdm does at import; THREAD: leaves a thread running,
BREAK_IMPORT: fails while that file exists), and a server that forks a child
of its own, as vLLM's API process starts its EngineCore, and logs its arguments and VLLM_*
variables."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

HEAVY = """
import os, threading
if os.environ.get("BREAK_IMPORT") and os.path.exists(os.environ["BREAK_IMPORT"]):
    raise ImportError("heavy is broken")
if os.environ.get("SLOW_IMPORT"):  # an import that takes long (a cold page cache, NFS)
    with open(os.environ["LOG"], "a") as f:
        f.write(f"importing {os.getpid()}\\n")
    import time
    time.sleep(float(os.environ["SLOW_IMPORT"]))
if os.environ.get("THREAD"):  # a thread the import leaves running (NVML's, jemalloc's on a GPU)
    threading.Thread(target=threading.Event().wait, name=os.environ["THREAD"], daemon=True).start()
AT_IMPORT = os.environ.get("VLLM_AT_IMPORT", "")  # a module-level read: fixed by the import
_ = dict(os.environ)  # a scan of every variable: no particular one is read
_ = [k for k, v in os.environ.items() if k.startswith("TQDM_")]
with open(os.environ["LOG"], "a") as f:
    f.write(f"imported {os.getpid()}\\n")
"""

SERVER = """
import os, signal, sys, time
import heavy  # preloaded by the launcher: imported once for every generation


def write(line):
    with open(os.environ["LOG"], "a") as f:
        f.write(line + "\\n")


def main():
    engine = os.fork()
    if engine == 0:  # the "EngineCore": outlives the server by a moment on SIGTERM
        def engine_stop(*_):
            time.sleep(0.3)
            write(f"engine-stopped {os.getpid()}")
            os._exit(0)

        signal.signal(signal.SIGTERM, engine_stop)
        while True:
            time.sleep(0.1)

    def stop(*_):
        os.kill(engine, signal.SIGTERM)
        os.waitpid(engine, 0)
        write(f"stopped {os.getpid()}")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    vllm = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("VLLM_"))
    write(f"env {os.getpid()} {' '.join(vllm)}".rstrip())
    write(f"run {os.getpid()} engine {engine} args {' '.join(sys.argv[1:])} main {__name__}")
    if os.environ.get("EXIT_WITH"):
        sys.exit(int(os.environ["EXIT_WITH"]))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":  # as vLLM's entry modules: importing it runs nothing
    main()
"""

FAKE_TORCH = """
class cuda:
    @staticmethod
    def is_initialized():
        return True
"""


class Launched:
    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc, self.log = proc, log

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wait_for(self, prefix: str, count: int, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [ln for ln in self.lines() if ln.startswith(prefix)]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {count} x {prefix!r} in {self.lines()}: {self.stderr()}")

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read() if self.proc.stderr else ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return stat[0] != "Z"


def write_launch(path: Path, argv: list[str], env: dict[str, str] | None = None) -> Path:
    """A launch file as the template writes it: comment lines, then the JSON object."""
    doc = json.dumps({"argv": argv, "env": env or {}}, indent=2)
    path.write_text(f"# Ansible managed\n# warmctl instance: t\n{doc}\n")
    return path


def wait_state(path: Path, signals: int, timeout: float = 30.0) -> dict[str, Any]:
    """The launcher's state once it has handled `signals` SIGHUPs (and started: signals=0)."""
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):  # not written yet, or being replaced
            doc = {}
        if doc.get("signals", -1) >= signals and doc.get("last"):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"{path}: no state after {signals} SIGHUP(s): {doc}")
