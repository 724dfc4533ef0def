"""Pre-imported vLLM: import vLLM once, then fork the server from the imported interpreter.

    PYTHON vllm_launch.py [--preload MODULE]... [--stop-timeout S] -- -m MODULE ARGS...

runs `PYTHON -m MODULE ARGS...` (e.g. `-m vllm.entrypoints.cli.main serve MODEL ...`) in a
child forked after MODULE, vLLM's OpenAI API server and its engine core have been imported.
SIGHUP relaunches: the running server gets SIGTERM and stops what it started, what is left of
its group is killed once it has exited (everything after --stop-timeout), and a new child is
forked from the same imported interpreter, so a relaunch skips the Python imports (13-16 s of
every vLLM start on an H200 host). The launcher stays the unit's main process: systemd
supervises it, its sandbox and cgroup hold every child, SIGTERM stops the server and then the
launcher, and a server that exits on its own takes the launcher with it (exit status passed
on), so `Restart=` still applies.

Fork safety: the launcher never initialises CUDA (checked before each fork: a relaunch that
finds CUDA initialised refuses), the same state vLLM's API process is in when it forks its
engine core. Threads: the child of a fork has only the forking thread, and a lock another thread
held stays locked in it. Right after each fork the launcher lists the threads still alive, the
way Python 3.12's fork warning counts them (/proc/self/task; a pool that a pthread_atfork handler
stops before the fork, as OpenBLAS's does, is not alive then): none, nothing is said; threads
shown safe (SAFE_THREADS, with the reason), one line saying so instead of Python's bare
DeprecationWarning; any other thread, one line naming them and Python's warning as before.
Standard library only: this runs with vLLM's interpreter, not warmctl's.
"""

import atexit
import contextlib
import importlib
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings

# Python put this script's folder first on sys.path; nothing there is for the server
if (
    sys.path
    and sys.path[0]
    and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__))
):
    del sys.path[0]

PREFIX = "vllm-launch:"
# what the server imports on every start, beyond the module it runs
DEFAULT_PRELOAD = ("vllm.entrypoints.openai.api_server", "vllm.v1.engine.core")
# Python's warning (3.12+) when a process with more than one thread forks
FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks"
# Threads shown safe to fork with, by name (a Python thread's name; a native one's comm): why.
# None is needed with vLLM's CPU build (its only other threads, OpenBLAS's pools, are stopped by
# OpenBLAS's own pthread_atfork handler before each fork); add an entry only with its proof.
SAFE_THREADS: dict[str, str] = {}
HANDLED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class UsageError(Exception):
    pass


def say(text: str) -> None:
    print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


def parse(argv: list[str]) -> tuple[list[str], float, str, list[str]]:
    """(preload modules, stop timeout, module to run, its arguments)."""
    preload: list[str] = []
    stop_timeout = 90.0
    i = 0
    while i < len(argv) and argv[i] != "--":
        opt = argv[i]
        if opt in ("--preload", "--stop-timeout") and i + 1 < len(argv):
            if opt == "--preload":
                preload.append(argv[i + 1])
            else:
                try:
                    stop_timeout = float(argv[i + 1])
                except ValueError:
                    raise UsageError(f"--stop-timeout: not a number: {argv[i + 1]!r}") from None
            i += 2
            continue
        raise UsageError(f"unknown option {opt!r}")
    rest = argv[i + 1 :]
    if len(rest) < 2 or rest[0] != "-m" or not rest[1]:
        raise UsageError("expected: [--preload MODULE]... -- -m MODULE ARGS...")
    return preload or list(DEFAULT_PRELOAD), stop_timeout, rest[1], rest[2:]


def preload(module: str, extra: list[str]) -> float:
    """Import the module the server runs (its failure is the server's: fatal) and what it
    will import (a missing one only costs the server the import: said, not fatal)."""
    t = time.monotonic()
    importlib.import_module(module)
    for name in extra:
        try:
            importlib.import_module(name)
        except Exception as exc:
            say(f"not preloaded: {name} ({exc.__class__.__name__}: {exc})")
    return time.monotonic() - t


def cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


def _die_with_launcher() -> None:
    """SIGKILL the server if the launcher itself is killed (systemd kills the whole cgroup on
    stop anyway; this covers a launcher run outside systemd, e.g. by the benchmark)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _child(module: str, args: list[str]) -> None:
    """In the forked child: become the server. Never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own group: a relaunch waits for all of it
        _die_with_launcher()
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def other_threads() -> list[str]:
    """The threads of this process but the calling one, as Python's fork warning counts them
    (/proc/self/task): a Python thread by its name, a native one by its comm."""
    me = threading.get_native_id()
    named = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    try:
        tids = sorted(int(tid) for tid in os.listdir("/proc/self/task"))
    except OSError:  # no /proc: the threads Python knows
        return [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    found = []
    for tid in tids:
        if tid == me:
            continue
        if tid in named:
            found.append(named[tid])
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                found.append(f.read().strip())
        except OSError:  # it ended meanwhile
            pass
    return found


def report_threads(alive: list[str]) -> None:
    """After a fork (in the launcher): the threads that were alive, one line; Python's own
    warning only when one of them is not shown safe."""
    if not alive:
        return
    names = ", ".join(alive)
    unknown = [name for name in alive if name not in SAFE_THREADS]
    if unknown:
        say(
            f"forked the server with {len(alive)} other thread(s) alive ({names}): "
            f"not shown fork-safe: {', '.join(unknown)}"
        )
        warnings.warn(
            f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may lead to "
            "deadlocks in the child.",
            DeprecationWarning,
            stacklevel=3,
        )
        return
    why = "; ".join(sorted({f"{name}: {SAFE_THREADS[name]}" for name in alive}))
    say(f"forked the server with {len(alive)} other thread(s) alive ({names}): safe because {why}")


def start(module: str, args: list[str]) -> int:
    if cuda_initialised():
        raise RuntimeError("CUDA is initialised in the launcher: forking the server is unsafe")
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # said by report_threads, with the threads' names
        warnings.filterwarnings("ignore", message=FORK_WARNING, category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _child(module, args)
    report_threads(other_threads())  # what Python's warning counts: alive after the fork
    return pid


def status_code(status: int) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return 1


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_others() -> None:
    """Reap orphans the launcher adopted as subreaper (the old server's engine core)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop(pid: int, timeout: float) -> tuple[int, float]:
    """SIGTERM the server alone (as the unit's KillMode=mixed does for the main process): vLLM's
    API server then stops its own engine core and workers in order. Signalled together, the
    engine core could die before the API server knew it was shutting down, and vLLM logged
    "AsyncLLM output_handler failed ... EngineDeadError" as an ERROR. Once the server has
    exited, what is left of its group is killed (SIGKILL, as systemd's final kill does), and
    the whole group too when the server is still there `timeout` s after the SIGTERM."""
    t = time.monotonic()
    status = None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = t + timeout
    killed = False
    while True:
        if status is None:
            try:
                done, st = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, st = pid, 0
            if done == pid:
                status = st
                if group_alive(pid):  # the server's leftovers: it has stopped what it meant to
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
        reap_others()
        if status is not None and not group_alive(pid):
            break
        if time.monotonic() > deadline and not killed:
            say(f"server group {pid} still running {timeout:.0f} s after SIGTERM: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    return status_code(status), time.monotonic() - t


def supervise(module: str, args: list[str], stop_timeout: float) -> int:
    generation = 1
    pid = start(module, args)
    say(f"server started (pid {pid}, generation {generation})")
    while True:
        info = signal.sigwaitinfo(HANDLED)
        sig = info.si_signo
        if sig == signal.SIGCHLD:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            reap_others()
            if done == pid:  # the server ended by itself: so does the launcher
                code = status_code(status)
                if group_alive(pid):
                    stop(pid, stop_timeout)
                say(f"server exited with status {code}")
                return code
            continue
        if sig == signal.SIGHUP:
            if cuda_initialised():
                say("relaunch refused: CUDA is initialised in the launcher")
                continue
            code, took = stop(pid, stop_timeout)
            generation += 1
            pid = start(module, args)
            say(
                f"relaunch: old server stopped in {took:.2f} s (status {code}); "
                f"server started (pid {pid}, generation {generation})"
            )
            continue
        # SIGTERM / SIGINT: stop the server, then the launcher
        code, took = stop(pid, stop_timeout)
        say(f"stopped the server in {took:.2f} s (status {code})")
        return 0


def main(argv: list[str]) -> int:
    try:
        modules, stop_timeout, module, args = parse(argv)
    except UsageError as exc:
        say(str(exc))
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass
    extra = [m for m in modules if m != module]
    try:
        took = preload(module, extra)
    except Exception as exc:  # the server itself would fail the same way: say it once
        say(f"cannot import {module}: {exc.__class__.__name__}: {exc}")
        return 1
    say(f"imported {', '.join([module, *extra])} in {took:.2f} s ({len(sys.modules)} modules)")
    try:
        return supervise(module, args, stop_timeout)
    except RuntimeError as exc:
        say(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
