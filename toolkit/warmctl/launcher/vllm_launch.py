"""Pre-imported vLLM: the next server's interpreter has imported vLLM before it is needed.

    PYTHON vllm_launch.py [--preload MODULE]... [--stop-timeout S]
        [--launch-file PATH] [--state-file PATH] [--prepare LEVEL] [--standby-delay S|ready]
    -- -m MODULE [ARGS...]

runs `PYTHON -m MODULE ARGS...` (e.g. `-m vllm.entrypoints.cli.main serve MODEL ...`) in a
standby: a process the launcher forks before it imports anything (the launcher itself imports
nothing but the standard library, so it has no thread but its own when it forks), which imports
MODULE, vLLM's OpenAI API server and its engine core, then waits; told to go, it becomes the
server, in the interpreter that did the imports (nothing is forked after them). Right after a
server starts the launcher forks the next standby, which imports while the server serves.
SIGHUP relaunches: once the standby has imported (the old server serves meanwhile), the running
server gets SIGTERM and stops what it started, what is left of its group is killed once it has
exited (everything after --stop-timeout), and the standby becomes the new server, so a relaunch
skips the Python imports (13-16 s of every vLLM start on an H200 host). The launcher stays the
unit's main process: systemd supervises it, its sandbox and cgroup hold every child, SIGTERM
stops the server (and the standby) and then the launcher, and a server that exits on its own
takes the launcher with it (exit status passed on), so `Restart=` still applies.

A configuration change is a relaunch (--launch-file): the server's ARGS and the vLLM variables
it may change come from the launch file, read again at every (re)launch; the command line then
names only MODULE, what is imported once. The file: comment lines (`#`), then one JSON object,
`{"argv": [ARG, ...], "env": {"VLLM_NAME": "value", ...}}`. What may change by relaunch, and why
(the line a deploy draws between a reload and a restart):
  - the arguments: vLLM parses them in the server, after the fork;
  - variables named VLLM_*: vLLM reads its own variables through `vllm.envs`, whose module
    `__getattr__` reads os.environ at each access (its cache, `enable_envs_cache()`, is switched
    on by the EngineCore, after the fork), so the server sees a new value; except a variable
    that vLLM read while the launcher imported it (a module-level read: vLLM's logging, the dev
    mode's routes, ...): the launcher records every os.environ lookup its imports make (a scan
    of the whole environment, as tqdm's for its own prefix, is no lookup) and refuses a
    relaunch that would change one of those (ENV_IMPORTED in the state file);
  - nothing else: other variables are read by Python libraries at import (huggingface_hub,
    transformers, torch's inductor settings) or by native code at load (CUDA, OpenMP), where
    the launcher cannot see or redo the read. They belong to the unit's environment file, and
    their change restarts the unit, as does a change of MODULE, the interpreter or the unit.
A launch file that cannot be read, is not that shape or names another variable is refused with
one line and the old server keeps running (at the first start it is fatal: exit 2). The first
start sets the file's variables in the launcher's own environment before the imports, so the
imports see what a plain start would.

The next server prepared before the old one stops (--prepare LEVEL, default config): once the
standby has imported and a SIGHUP asks, the launcher sends it the launch file's arguments and
variables; it parses them with vLLM's own parser and builds vLLM's configuration from them
(vllm_args.py beside this script, loaded by the standby: vLLM's API process does the same before
its EngineCore starts, through NVML, without a CUDA context), and answers on its pipe. What vLLM
rejects is refused like a file that cannot be read (one line, the old server keeps running);
only then is the old server asked to stop. At "reuse" the standby also loads the tokenizer,
imports the model's class and keeps the configuration for the server. SIGUSR1 asks the same of
the standby without a relaunch (`warmctl relaunch --check`): the answer goes to the state file
("checks", "check"). --standby-delay S forks the next standby S s after a server's start instead
of at once (at once when a relaunch or a check asks meanwhile); --standby-delay ready forks it
once the server answers its own /health (200; the host and port of its arguments, polled with
the standard library's http.client every READY_POLL s; at the latest READY_WAIT_MAX s after its
start; at once with --uds), so no standby imports beside a starting server. The last
--standby-delay given wins.

--state-file: after each start and each SIGHUP the launcher writes what it runs there (JSON: its
pid and script digest, the generation, the server's pid, its argv with vLLM's secret arguments
masked, the launch file's digest, digests of the applied variables, the VLLM_* names its imports
read, the SIGHUPs handled and the last one's outcome); `warmctl relaunch` checks the new server
against it. Secrets: no value is written or logged but the argv, whose --api-key, --hf-token and
--watermark-config values are masked as vLLM masks them in its own log.

Fork safety: every fork happens in the launcher, before any import of vLLM, torch or anything
that starts a thread (NVML's, started by vLLM's platform probe at the import of
vllm.platforms.cuda; Arrow's jemalloc background thread; OpenMP and BLAS pools) or initialises
CUDA: the child of a fork has only the forking thread, and a lock another thread held would stay
locked in it. The launcher checks this at each fork (/proc/self/task, as Python 3.12's fork
warning counts threads) and says so in one line if a thread is ever alive. A standby's imports
run in the process that becomes the server, as a plain `python -m vllm...` start runs them.
Standard library only: this runs with vLLM's interpreter, not warmctl's.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import os
import re
import runpy
import select
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import NamedTuple

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
HANDLED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
# a standby's name (/proc/PID/comm) while it waits: `warmctl relaunch` tells it from the server
STANDBY_COMM = b"vllm-standby"
# the variables a launch file may set: vLLM's own, read through vllm.envs at each access
RELAUNCH_ENV = re.compile(r"^VLLM_[A-Za-z0-9_]+$")
# vLLM's arguments whose value it masks in its own log (_SENSITIVE_ARG_FIELDS): masked here too
SECRET_ARGS = ("--api-key", "--hf-token", "--watermark-config")
LAUNCH_KEYS = ("argv", "env")
# what the standby prepares of the next server with the launch file before the old server is
# stopped (vllm_args.py, beside this script): "parse" vLLM's parser only, "config" and vLLM's
# configuration (the default), "reuse" and the tokenizer, the configuration kept for the server
PREPARE_LEVELS = ("parse", "config", "reuse")
ARGS_SCRIPT = "vllm_args.py"
# seconds a standby may take to answer a prepare (vLLM reads the model's config from disk)
PREPARE_TIMEOUT = 300.0
# --standby-delay ready: how often the server's /health is asked, how long one answer may take,
# and when the next standby is forked anyway (a server that never says it is ready)
READY_POLL = 0.5
HEALTH_TIMEOUT = 2.0
READY_WAIT_MAX = 600.0
RETRY = "\0retry"  # Supervisor.vet: the standby is gone, another one asks again
# A standby's pipes. The launcher writes JSON lines on "go" (a prepare request, then the go);
# the standby answers on "ready": NAMED, its report (one JSON line), an answer (one JSON line)
# per prepare request, then BECAME_SERVER. The end of a pipe: the other side is gone.
NAMED = b"n"  # it has its name (STANDBY_COMM) and its own process group: the launcher goes on
BECAME_SERVER = b"g"  # told to go, it took the launcher's name back and runs the server


class UsageError(Exception):
    pass


class LaunchFileError(Exception):
    """A launch file that cannot be applied: str() is one line."""


class Options(NamedTuple):
    preload: list[str]
    stop_timeout: float
    module: str
    args: list[str]
    launch_file: str | None = None
    state_file: str | None = None
    prepare: str = "config"
    standby_delay: float = 0.0  # s after a server's start before the next standby is forked
    standby_ready: bool = False  # the next standby is forked once the server is ready (/health)


class Launch(NamedTuple):
    """What one (re)launch runs: the server's arguments and the variables the launcher sets.
    (No dataclasses here: a test loads this script as a module without registering it.)"""

    args: list[str]
    env: dict[str, str]
    digest: str = ""  # sha256 of the launch file's bytes ("" without a file)


def say(text: str) -> None:
    sys.stderr.write(f"{PREFIX} {text}\n")  # one write: a server's line cannot split it
    sys.stderr.flush()


_VALUED = ("--preload", "--stop-timeout", "--launch-file", "--state-file", "--prepare",
           "--standby-delay")  # fmt: skip


def parse(argv: list[str]) -> Options:
    """The command line: options, then `-- -m MODULE [ARGS...]` (no ARGS with --launch-file)."""
    preload: list[str] = []
    values: dict[str, str] = {}
    stop_timeout = 90.0
    i = 0
    while i < len(argv) and argv[i] != "--":
        opt = argv[i]
        if opt in _VALUED and i + 1 < len(argv):
            if opt == "--preload":
                preload.append(argv[i + 1])
            elif opt == "--stop-timeout":
                try:
                    stop_timeout = float(argv[i + 1])
                except ValueError:
                    raise UsageError(f"--stop-timeout: not a number: {argv[i + 1]!r}") from None
            elif opt == "--standby-delay" and argv[i + 1] == "ready":
                values[opt] = "ready"
            elif opt == "--standby-delay":
                try:
                    values[opt] = str(max(0.0, float(argv[i + 1])))
                except ValueError:
                    why = f"not a number or 'ready': {argv[i + 1]!r}"
                    raise UsageError(f"--standby-delay: {why}") from None
            elif opt == "--prepare" and argv[i + 1] not in PREPARE_LEVELS:
                raise UsageError(f"--prepare: one of {', '.join(PREPARE_LEVELS)}")
            else:
                values[opt] = argv[i + 1]
            i += 2
            continue
        raise UsageError(f"unknown option {opt!r}")
    rest = argv[i + 1 :]
    if len(rest) < 2 or rest[0] != "-m" or not rest[1]:
        raise UsageError("expected: [--preload MODULE]... -- -m MODULE ARGS...")
    launch_file = values.get("--launch-file")
    delay = values.get("--standby-delay", "0")
    if launch_file and rest[2:]:
        raise UsageError("with --launch-file the server's arguments come from the file alone")
    return Options(
        preload or list(DEFAULT_PRELOAD),
        stop_timeout,
        rest[1],
        rest[2:],
        launch_file,
        values.get("--state-file"),
        values.get("--prepare", "config"),
        0.0 if delay == "ready" else float(delay),
        delay == "ready",
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_launch(data: bytes) -> Launch:
    """A launch file's bytes: comment lines (`#`), then `{"argv": [...], "env": {...}}`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LaunchFileError("not UTF-8 text") from None
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise LaunchFileError(f"not JSON after its comment lines: {exc}") from None
    if not isinstance(doc, dict) or "argv" not in doc:
        raise LaunchFileError('expected one object {"argv": [...], "env": {...}}')
    unknown = sorted(set(doc) - set(LAUNCH_KEYS))
    if unknown:
        raise LaunchFileError(f"unknown key(s) {', '.join(map(repr, unknown))}")
    args, env = doc["argv"], doc.get("env", {})
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise LaunchFileError("argv must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise LaunchFileError("env must map names to strings")
    for name in env:
        if not RELAUNCH_ENV.match(name):
            raise LaunchFileError(
                f"env {name!r}: a launch file sets vLLM's own variables (VLLM_*) only; "
                "other variables belong to the unit's environment file"
            )
        if "\0" in env[name]:
            raise LaunchFileError(f"env {name}: a NUL character")
    return Launch(list(args), dict(env), sha256(data))


def read_launch(path: str) -> Launch:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise LaunchFileError(f"cannot read it: {exc.strerror or exc}") from None
    return parse_launch(data)


def health_target(args: list[str]) -> tuple[str, int, bool] | None:
    """Where the server of `args` answers /health: (host, port, TLS), from its --host, --port
    (vLLM's default 8000) and --ssl-keyfile, the last of each as vLLM's parser takes it; None
    when it listens on a Unix socket (--uds)."""

    def value(flag: str) -> str | None:
        found = None
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(flag + "="):
                found = arg.split("=", 1)[1]
        return found

    if value("--uds") is not None:
        return None
    try:
        port = int(value("--port") or 8000)
    except ValueError:
        port = 8000
    host = (value("--host") or "").strip("[]")
    if host in ("", "0.0.0.0"):  # every address: the loopback one
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return host, port, value("--ssl-keyfile") is not None


def healthy(host: str, port: int, tls: bool) -> bool:
    """Whether the server answers GET /health with 200 (vLLM: its engine is up). The standard
    library's http.client: no proxy variables, no thread, nothing of vLLM's imported."""
    import http.client

    conn: http.client.HTTPConnection
    try:
        if tls:  # the server's own certificate, on its own address: not what is checked here
            import ssl

            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(host, port, timeout=HEALTH_TIMEOUT, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=HEALTH_TIMEOUT)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return False


def env_digests(env: dict[str, str]) -> dict[str, str]:
    """Digests of the variables' values: what the state file says instead of the values."""
    return {name: sha256(value.encode()) for name, value in sorted(env.items())}


def refusal(state: dict, env: dict[str, str]) -> str | None:
    """Why the launcher that wrote `state` cannot apply `env` by a relaunch, or None: a changed
    (set, unset, new value) variable that vLLM read while the launcher imported it."""
    before = state.get("env_sha256") or {}
    after = env_digests(env)
    changed = {n for n in set(before) | set(after) if before.get(n) != after.get(n)}
    hit = sorted(changed & set(state.get("env_imported") or ()))
    if not hit:
        return None
    return (
        f"{', '.join(hit)} changed, and vLLM read {'it' if len(hit) == 1 else 'them'} when the "
        "launcher imported vLLM: only a restart applies that"
    )


def shown(module: str, args: list[str]) -> str:
    """The server's command line for the log and the state file, secrets masked."""
    out: list[str] = []
    mask = False
    for arg in args:
        if mask:
            out.append("***")
            mask = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_ARGS:
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(arg)
                mask = True
            continue
        out.append(arg)
    return shlex.join(["-m", module, *out])


class EnvReads:
    """While active: the names looked up in os.environ (`os.environ[...]`, `.get`, `in`,
    os.getenv), not the names a scan of the whole environment touches: an iteration (tqdm's
    search for its own prefix at import) or a copy (`dict(os.environ)`, `.copy()`: Python lists
    the keys, then reads each in that order) reads no particular variable."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._scans = 0
        self._sweep: list[str] = []  # the keys a finished iteration listed, still to be read

    def __enter__(self) -> EnvReads:
        cls = type(os.environ)
        self._getitem, self._iter = cls.__getitem__, cls.__iter__
        reads = self

        def getitem(env: os._Environ[str], key: str) -> str:
            name = key.decode() if isinstance(key, bytes) else str(key)
            if reads._sweep and reads._sweep[0] == name:
                reads._sweep.pop(0)  # a copy reading what it listed
            elif not reads._scans:
                reads._sweep = []
                reads.names.add(name)
            return reads._getitem(env, key)

        def scan(env: os._Environ[str]) -> Iterator[str]:
            reads._scans += 1
            listed: list[str] = []
            try:
                for name in reads._iter(env):
                    listed.append(name)
                    yield name
            finally:
                reads._scans -= 1
            reads._sweep = listed  # listed to the end: a copy reads them next

        cls.__getitem__, cls.__iter__ = getitem, scan  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        cls = type(os.environ)
        cls.__getitem__, cls.__iter__ = self._getitem, self._iter  # type: ignore[method-assign]


def preload(module: str, extra: list[str]) -> tuple[float, set[str], list[str]]:
    """Import the module the server runs (its failure is the server's: fatal) and what it
    will import (a missing one only costs the server the import: said, not fatal); with the
    variables the imports looked up and what was not preloaded."""
    t = time.monotonic()
    skipped: list[str] = []
    with EnvReads() as reads:
        importlib.import_module(module)
        for name in extra:
            try:
                importlib.import_module(name)
            except Exception as exc:
                skipped.append(f"{name} ({exc.__class__.__name__}: {exc})")
    return time.monotonic() - t, reads.names, skipped


def cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


def _prctl(option: int, arg: int | bytes) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, arg)
    except (OSError, AttributeError):
        pass


def _die_with_launcher() -> None:
    """SIGKILL the standby / server if the launcher itself is killed (systemd kills the whole
    cgroup on stop anyway; this covers a launcher run outside systemd, e.g. by the benchmark)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _read_line(fd: int) -> bytes:
    """Read up to a newline or the end of the pipe (blocking)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf


def _become_server(module: str, args: list[str], env: dict[str, str | None]) -> None:
    """In a standby told to go: become the server (`env`: variables to set, None: to unset).
    Never returns."""
    code = 1
    try:  # its signals are a plain start's since before its imports (_standby_main)
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
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


def _standby_main(
    module: str, extra: list[str], ready_w: int, go_r: int, comm: bytes, launcher: int
) -> None:
    """In the forked standby: name itself (NAMED on `ready_w` once done), import, report on
    `ready_w` (one JSON line), wait for the go on `go_r` (one JSON line; the end of the pipe:
    not needed, exit 0), take the launcher's name back, say so (BECAME_SERVER) and become the
    server. Never returns."""
    try:
        _prctl(_PR_SET_NAME, STANDBY_COMM)
        with contextlib.suppress(OSError):  # the launcher may have set it already
            os.setpgid(0, 0)  # its own group: a relaunch waits for all of it
        _die_with_launcher()
        if os.getppid() != launcher:  # the launcher died before PDEATHSIG was set
            os._exit(1)
        # the threads the imports start inherit this mask: none of the launcher's blocking
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        _write_all(ready_w, NAMED)
        try:
            took, names, skipped = preload(module, extra)
        except BaseException as exc:
            report: dict = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        else:
            report = {"ok": True, "seconds": took, "modules": len(sys.modules),
                      "env_read": sorted(names), "skipped": skipped,
                      "cuda_initialised": cuda_initialised()}  # fmt: skip
        _write_all(ready_w, (json.dumps(report) + "\n").encode())
        if not report["ok"]:
            os._exit(1)
        while True:  # prepare requests (answered on ready_w), then the go
            line = _read_line(go_r)
            if not line.endswith(b"\n"):
                os._exit(0)  # discarded
            go = json.loads(line)
            if "prepare" not in go:
                break
            answer = _prepare(module, go["prepare"])
            _write_all(ready_w, (json.dumps(answer) + "\n").encode())
        os.close(go_r)
        _prctl(_PR_SET_NAME, comm)
        _write_all(ready_w, BECAME_SERVER)
        os.close(ready_w)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    _become_server(module, go["args"], go["env"])


def _load_args_script() -> object | None:
    """vllm_args.py from beside this script (in the standby, once vLLM is imported); None when
    it is not there (a launcher installed without it)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), ARGS_SCRIPT)
    if not os.path.exists(path):
        return None
    name = "_warmctl_vllm_args"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _output_kept() -> Iterator[int]:
    """The process's stdout and stderr (fds 1, 2: vLLM's log lines while it builds its
    configuration) into a temporary file while inside: its fd, read by the caller."""
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield tmp.fileno()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _prepare(module: str, request: dict) -> dict:
    """In the standby: vLLM's verdict on the next server's arguments, and at level "reuse" what
    the server takes over (vllm_args.prepare). vLLM's own lines are kept out of the journal
    unless it rejects the arguments (then they say why, before the launcher's line)."""
    t = time.monotonic()
    answer: dict
    with _output_kept() as fd:
        try:
            helper = _load_args_script()
            if helper is None:
                answer = {"ok": True, "checked": False, "error": f"no {ARGS_SCRIPT} beside "
                          "the launcher", "steps": []}  # fmt: skip
            else:
                answer = helper.prepare(  # type: ignore[attr-defined]
                    module, list(request["args"]), request.get("level", "config"),
                    request.get("env") or {},
                )  # fmt: skip
        except BaseException as exc:  # its own failure: said, not vLLM's verdict
            why = " ".join(f"{exc.__class__.__name__}: {exc}".split())[:400]
            answer = {"ok": False, "checked": True, "steps": [], "error": why}
        os.lseek(fd, 0, os.SEEK_SET)
        said = b"".join(iter(lambda: os.read(fd, 65536), b""))
    if not answer.get("ok") and said.strip():
        sys.stderr.write(said.decode(errors="replace"))
        sys.stderr.flush()
    answer["seconds"] = time.monotonic() - t
    answer["cuda_initialised"] = cuda_initialised()
    return answer


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


def _own_comm() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().strip()[:15]
    except OSError:
        return b"python3"


class Standby:
    """A process forked from the launcher before any import, which imports the server's modules
    and waits to be told to become the server."""

    def __init__(self, module: str, extra: list[str], children: Children) -> None:
        alive = other_threads()
        if alive:  # never expected: the launcher imports only the standard library
            say(f"forking a standby with {len(alive)} other thread(s) alive: {', '.join(alive)}")
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        comm, launcher = _own_comm(), os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            _standby_main(module, extra, ready_w, go_r, comm, launcher)
        children.watch(pid)
        self._children = children
        with contextlib.suppress(OSError):  # its own group from the start (it sets it too)
            os.setpgid(pid, pid)
        os.close(ready_w)
        os.close(go_r)
        self.pid, self._ready_fd, self._go_fd = pid, ready_r, go_w
        self.report: dict | None = None  # its report once it has imported (or failed)
        self.busy = False  # preparing a server (vet), its answer not read yet
        os.read(ready_r, 1)  # NAMED (vllm-standby) before the launcher goes on: or it ended

    def poll(self) -> bool:
        """Whether its report is in (read now if it is there)."""
        if self.report is not None:
            return True
        if not select.select([self._ready_fd], [], [], 0)[0]:
            return False
        line = _read_line(self._ready_fd)
        try:
            self.report = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            self.report = None
        if not isinstance(self.report, dict):
            self.report = {"ok": False, "error": "it ended before it said it had imported"}
        return True

    @property
    def ready(self) -> bool:
        return bool(self.report and self.report.get("ok"))

    def alive(self) -> bool:
        return self._children.exited(self.pid) is None

    def vet(self, args: list[str], env: dict[str, str | None], level: str) -> dict:
        """Its answer to a prepare request: {"ok", "checked", "error", "seconds", "steps"},
        "gone": True when it ended or did not answer (it cannot become the server). Raises
        Stopped when a SIGTERM / SIGINT comes meanwhile."""
        request = {"prepare": {"args": args, "env": env, "level": level}}
        try:
            _write_all(self._go_fd, (json.dumps(request) + "\n").encode())
        except OSError:  # BrokenPipeError: it died after its report
            return {"ok": False, "gone": True, "error": "the standby ended before it checked"}
        self.busy = True  # until its answer is read: a discard meanwhile kills it
        deadline = time.monotonic() + PREPARE_TIMEOUT
        while not select.select([self._ready_fd], [], [], 0.1)[0]:
            if _stop_asked():
                raise Stopped()
            if time.monotonic() > deadline:
                why = f"the standby did not answer in {PREPARE_TIMEOUT:.0f} s"
                return {"ok": False, "gone": True, "error": why}
        line = _read_line(self._ready_fd)
        self.busy = False
        try:
            answer = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return {"ok": False, "gone": True, "error": "the standby ended while it checked"}
        return answer

    def go(self, args: list[str], env: dict[str, str | None]) -> bool:
        """Make it the server; True once it has taken the launcher's name back and runs the
        server's module, False if it is gone."""
        try:
            _write_all(self._go_fd, (json.dumps({"args": args, "env": env}) + "\n").encode())
            return os.read(self._ready_fd, 1) == BECAME_SERVER
        except OSError:  # BrokenPipeError: it died after its report
            return False
        finally:
            self._close()

    def _close(self) -> None:
        for fd in (self._ready_fd, self._go_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ready_fd = self._go_fd = -1

    def discard(self, wait: float = 0.0) -> None:
        """Not needed: it exits (the end of its pipe, or SIGKILL while it still imports);
        waited for up to `wait` s (a stop leaves nothing for systemd to kill)."""
        if self.report is None or not self.ready or self.busy:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self._close()
        deadline = time.monotonic() + wait
        children = self._children
        while wait and children.exited(self.pid) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if children.exited(self.pid) is not None:
            children.forget(self.pid)


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


class Children:
    """The exit statuses of the watched children (the server, the standby), reaped by reap()
    with everything else (orphans the launcher adopted as subreaper: the old server's engine
    core)."""

    def __init__(self) -> None:
        self._watched: set[int] = set()
        self._exited: dict[int, int] = {}

    def watch(self, pid: int) -> None:
        self._watched.add(pid)

    def reap(self) -> None:
        """Reap every child that has exited; keep the status of a watched one."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self._watched:
                self._exited[pid] = status

    def exited(self, pid: int) -> int | None:
        """The wait status of watched child `pid` once it has exited, else None."""
        self.reap()
        return self._exited.get(pid)

    def forget(self, pid: int) -> None:
        self._watched.discard(pid)
        self._exited.pop(pid, None)

    def stop(self, pid: int, timeout: float) -> tuple[int, float]:
        """SIGTERM the server alone (as the unit's KillMode=mixed does for the main process):
        vLLM's API server then stops its own engine core and workers in order. Signalled
        together, the engine core could die before the API server knew it was shutting down,
        and vLLM logged "AsyncLLM output_handler failed ... EngineDeadError" as an ERROR. Once
        the server has exited, what is left of its group is killed (SIGKILL, as systemd's final
        kill does), and the whole group too when the server is still there `timeout` s after
        the SIGTERM."""
        t = time.monotonic()
        if pid not in self._watched:  # stopped (and reaped) already
            return 0, 0.0
        status = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = t + timeout
        killed = False
        while True:
            if status is None:
                status = self.exited(pid)
                if status is not None and group_alive(
                    pid
                ):  # leftovers: it stopped what it meant to
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
            self.reap()
            if status is not None and not group_alive(pid):
                break
            if time.monotonic() > deadline and not killed:
                say(f"server group {pid} still running {timeout:.0f} s after SIGTERM: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        self.forget(pid)
        return status_code(status), time.monotonic() - t


class Stopped(Exception):
    """SIGTERM / SIGINT while the launcher waited for a standby: stop, nothing more."""


# after this many standbys in a row that died once they had imported (out of memory?), a
# relaunch is refused instead of forking another one
STANDBY_DEATHS = 3


class Supervisor:
    """The server of each generation, the standby that becomes the next, what each was launched
    with, and the state file."""

    def __init__(self, opts: Options, first: Launch) -> None:
        self.opts = opts
        self.extra = [m for m in opts.preload if m != opts.module]
        self.base = dict(first.env)  # in the launcher's own environment since its start
        self.launch = first
        self.state: dict = {
            "launcher_pid": os.getpid(),
            "script": os.path.realpath(__file__),
            "script_sha256": _file_digest(__file__),
            "launch_file": opts.launch_file,
            "env_imported": [],
            "signals": 0,
            "standby_pid": 0,
            "standby": "none",
            "prepare": opts.prepare,
            "checks": 0,  # check requests (SIGUSR1: `warmctl relaunch --check`) answered
            "check": {},  # the last one's answer
        }
        self.checks_asked = 0  # SIGUSR1s received, not yet answered
        # when the next standby is forked (--standby-delay after a server's start; inf: only
        # when a relaunch or a check asks, after a fork that failed)
        self.standby_due = 0.0
        # --standby-delay ready: where the server answers /health while the launcher waits for
        # it to be ready (None: not waiting), when it is asked next, since when it is waited for
        self.ready_wait: tuple[str, int, bool] | None = None
        self.next_poll = 0.0
        self.ready_from = 0.0
        self.generation = 0
        self.pid = 0
        self.standby: Standby | None = None
        self.pending: Launch | None = None  # a relaunch asked for, waiting for the standby
        self.unanswered = 0  # SIGHUPs received, not yet answered (counted in the state then)
        self.deaths = 0  # standbys in a row that died after their imports
        self.fork_error = ""  # why the last standby could not be forked
        self.children = Children()  # the server and the standby, reaped with any orphan

    def prepare(self) -> Standby | None:
        """The standby, forked now if there is none (None: it cannot be forked, said)."""
        if self.standby is None:
            self.ready_wait = None  # forked now: not waiting for the server any more
            try:
                self.standby = Standby(self.opts.module, self.extra, self.children)
            except OSError as exc:  # EAGAIN: the unit's TasksMax, the pids cgroup, memory
                self.fork_error = f"cannot fork a standby: {exc.strerror or exc}"
                say(f"{self.fork_error}; the next relaunch tries again")
                self.standby_due = float("inf")
                return None
            self.state.update(standby_pid=self.standby.pid, standby="importing")
        return self.standby

    def prepare_later(self) -> None:
        """The next standby: now, --standby-delay s from now, or once the server is ready (its
        imports then leave the new server's start to itself; a relaunch or a check asked for
        before forks it at once)."""
        now = time.monotonic()
        target = health_target(self.launch.args) if self.opts.standby_ready else None
        if target is not None:
            self.ready_wait, self.next_poll, self.ready_from = target, now, now
            self.standby_due = now + READY_WAIT_MAX
        elif self.opts.standby_delay <= 0 or self.opts.standby_ready:  # ready on --uds: now
            self.prepare()
        else:
            self.standby_due = now + self.opts.standby_delay

    def standby_wanted(self) -> bool:
        """Whether the next standby is due now: its delay is over, or (--standby-delay ready)
        the server answers /health, asked at most every READY_POLL s."""
        now = time.monotonic()
        took = now - self.ready_from
        if now >= self.standby_due:
            if self.ready_wait is not None and took >= READY_WAIT_MAX:
                say(f"server not ready {took:.0f} s after its start: the next standby imports now")
            return True
        if self.ready_wait is None or now < self.next_poll:
            return False
        self.next_poll = now + READY_POLL
        if not healthy(*self.ready_wait):
            return False
        say(f"server ready {took:.1f} s after its start: the next standby imports now")
        return True

    def standby_wake(self) -> float:
        """When the main loop looks again at a standby not yet forked (monotonic)."""
        if self.ready_wait is None:
            return self.standby_due
        return min(self.standby_due, self.next_poll)

    def check_standby(self) -> bool:
        """Whether the standby's report is in (read, said and in the state the first time)."""
        standby = self.standby
        if standby is None:
            return False
        if standby.report is not None:
            return True
        if not standby.poll():
            return False
        self.imported(standby)
        return True

    def wait_standby(self) -> Standby | None:
        """Wait for the standby's report; signals meanwhile: SIGTERM / SIGINT raise Stopped,
        SIGHUP is counted and kept for later (the launch file is read when it is handled),
        SIGCHLD reaps. None: no standby could be forked."""
        standby = self.prepare()
        while standby is not None and not self.check_standby():
            info = signal.sigtimedwait(HANDLED, 0.1)
            if info is None:
                continue
            if info.si_signo in (signal.SIGTERM, signal.SIGINT):
                raise Stopped()
            if info.si_signo == signal.SIGHUP:
                self.unanswered += 1
                self.pending = self.pending or self.launch  # read again when it is handled
            if info.si_signo == signal.SIGUSR1:
                self.checks_asked += 1  # answered once a server runs
            self.children.reap()
        return standby

    def imported(self, standby: Standby) -> None:
        """Its report is in: say it (the first standby's is the start's own line)."""
        report = standby.report or {}
        if not report.get("ok"):
            self.state.update(standby="failed")
            who = "" if self.generation == 0 else f"standby {standby.pid}: "
            say(f"{who}cannot import {self.opts.module}: {report.get('error')}")
            return
        names = {n for n in report.get("env_read", ()) if RELAUNCH_ENV.match(n)}
        self.state.update(standby="ready", env_imported=sorted(names))
        took, count = float(report.get("seconds", 0.0)), report.get("modules", 0)
        if self.generation == 0:
            for skipped in report.get("skipped", ()):
                say(f"not preloaded: {skipped}")
            modules = ", ".join([self.opts.module, *self.extra])
            say(f"imported {modules} in {took:.2f} s ({count} modules)")
        else:
            say(f"standby {standby.pid} ready for the next relaunch (imported in {took:.2f} s)")
        if report.get("cuda_initialised"):
            say(f"standby {standby.pid}: its imports initialised CUDA (it holds a CUDA context on "
                "the GPU while it waits)")  # fmt: skip
        if self.generation:
            self.save()

    def run(self, launch: Launch) -> bool:
        """Make the (ready) standby the next generation's server with `launch` (the old one is
        stopped); False if the standby is gone."""
        standby = self.standby
        assert standby is not None and standby.ready
        env = self.env_for(launch)
        self.standby = None
        self.state.update(standby_pid=0, standby="none")
        if not standby.go(launch.args, env):
            standby.discard()
            return False
        self.pid = standby.pid
        self.generation += 1
        self.deaths = 0
        self.launch = launch
        self.state.update(
            generation=self.generation,
            server_pid=self.pid,
            argv=shown(self.opts.module, launch.args),
            launch_sha256=launch.digest,
            env_sha256=env_digests(launch.env),
        )
        return True

    def env_for(self, launch: Launch) -> dict[str, str | None]:
        """The variables the server of `launch` sets (None: unsets) in the launcher's
        environment."""
        env: dict[str, str | None] = {n: None for n in self.base if n not in launch.env}
        env.update({n: v for n, v in launch.env.items() if self.base.get(n) != v})
        return env

    def vet(self, launch: Launch, level: str) -> str:
        """The ready standby prepares the server of `launch` (vLLM's parser, its configuration,
        ...: vllm_args.py) while the old server serves: "" when vLLM accepts it, else why not
        (one line); RETRY when the standby ended or did not answer: another one is importing,
        ask it once it is ready."""
        standby = self.standby
        assert standby is not None and standby.ready
        answer = standby.vet(launch.args, self.env_for(launch), level)
        what = self.opts.launch_file or "the server's arguments"
        self.state["prepared"] = {
            "launch_sha256": launch.digest, "ok": bool(answer.get("ok")),
            "checked": bool(answer.get("checked", True)), "level": level,
            "steps": answer.get("steps", []), "seconds": round(answer.get("seconds", 0.0), 3),
        }  # fmt: skip
        if answer.get("gone"):  # another standby asks again (RETRY), up to STANDBY_DEATHS
            say(f"standby {standby.pid}: {answer.get('error')}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(standby.pid, signal.SIGKILL)  # it may be stuck in vLLM's code
            return RETRY if self.replace_dead_standby(standby) else f"{what}: {self.fork_error}"
        # type: ignore[union-attr]
        if answer.get("cuda_initialised") and not standby.report.get("cuda_initialised"):
            say(f"standby {standby.pid}: preparing the server initialised CUDA")
        if not answer.get("ok"):
            return f"{what}: vLLM rejects it: {answer.get('error')}"
        return ""

    def answer_checks(self) -> None:
        """The check requests received (SIGUSR1, `warmctl relaunch --check`): vLLM's verdict on
        the launch file as it is now, from the standby, in the state file ("checks", "check")."""
        launch, why = self.next_launch()
        checked = False
        standby = self.standby
        if launch is not None and not why:
            if standby is None:
                why = self.fork_error or "no standby to check the launch file with"
            elif not standby.ready:
                why = f"the standby could not import {self.opts.module}: "
                why += str((standby.report or {}).get("error"))
            else:
                level = "parse" if self.opts.prepare == "parse" else "config"
                why = self.vet(launch, level)
                if why == RETRY:
                    return  # answered once the next standby has imported
                checked = bool(self.state["prepared"]["checked"])
        self.state["checks"] += self.checks_asked
        self.checks_asked = 0
        self.state["check"] = {
            "launch_sha256": launch.digest if launch else "", "ok": not why, "reason": why,
            "checked": checked,
        }  # fmt: skip
        if why:
            say(f"check: {why}")
        self.save()

    def start_next(self, launch: Launch) -> bool:
        """The server of `launch` from the standby, waiting for it to import; a standby that
        died after its report is replaced once. False: no server (said)."""
        for _ in range(2):
            standby = self.wait_standby()
            if standby is None:
                return False
            if not standby.ready:
                self.discard_standby()
                return False
            if self.run(launch):
                return True
            say(f"standby {standby.pid} ended before it became the server: another one")
        return False

    def next_launch(self) -> tuple[Launch | None, str]:
        """What a SIGHUP relaunches with, or None and why it cannot."""
        if not self.opts.launch_file:
            return self.launch, ""
        try:
            launch = read_launch(self.opts.launch_file)
        except LaunchFileError as exc:
            return None, f"{self.opts.launch_file}: {exc}"
        why = refusal(self.state, launch.env)
        return (None, why) if why else (launch, "")

    def answered(self) -> None:
        """The SIGHUPs received so far are answered by the next state written."""
        self.state["signals"] += self.unanswered
        self.unanswered = 0

    def refuse(self, why: str) -> None:
        self.pending = None
        self.answered()
        say(
            f"relaunch refused: {why}; the server (pid {self.pid}, generation "
            f"{self.generation}) keeps running"
        )
        self.write_state("refused", why)

    def write_state(self, outcome: str, reason: str = "") -> None:
        self.state.update(last=outcome, reason=reason)
        self.save()

    def save(self) -> None:
        """The state as it is (the last outcome kept)."""
        if not self.opts.state_file:
            return
        path = self.opts.state_file
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.state, f, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except OSError as exc:
            say(f"cannot write the state file {path}: {exc.strerror or exc}")
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def started(self) -> str:
        argv = self.state["argv"]
        return f"server started (pid {self.pid}, generation {self.generation}): {argv}"

    def replace_dead_standby(self, standby: Standby) -> bool:
        """`standby` ended after its imports: another one (False, said: too many in a row, or
        none could be forked)."""
        self.discard_standby()
        self.deaths += 1
        if self.deaths >= STANDBY_DEATHS:
            self.fork_error = (
                f"{self.deaths} standbys in a row ended after their imports (out of memory?)"
            )
            say(f"{self.fork_error}: none until the next relaunch asks")
            self.standby_due = float("inf")
            return False
        say(f"standby {standby.pid} ended after it had imported: another one")
        return self.prepare() is not None

    def discard_standby(self, wait: float = 0.0) -> None:
        if self.standby is not None:
            self.standby.discard(wait)
            self.standby = None
            self.state.update(standby_pid=0, standby="none")

    # -- what the main loop (supervise) asks of it -------------------------------------------
    @property
    def standby_delayed(self) -> bool:
        """Whether a standby is to be forked later by itself (not only when a relaunch or a
        check asks: after a fork that failed)."""
        return self.standby_due != float("inf")

    def sighup_again(self) -> None:
        """A SIGHUP that came during the first start: sent again, handled as any later one."""
        if self.pending is not None:
            self.pending = None
            os.kill(os.getpid(), signal.SIGHUP)
            self.unanswered -= 1

    def relaunch_asked(self) -> None:
        """A SIGHUP: the launch file read now (the latest file wins over one still waiting);
        the relaunch waits for the standby, forked now if there is none or it failed."""
        self.unanswered += 1
        launch, why = self.next_launch()
        if launch is None:
            self.refuse(why)
            return
        self.pending = launch
        if self.standby is None or (self.standby.report and not self.standby.ready):
            self.discard_standby()  # a failed one is tried again for this relaunch
            self.deaths = 0
            self.prepare()

    def check_asked(self) -> None:
        """A SIGUSR1 (`warmctl relaunch --check`): answered once the standby can say."""
        self.checks_asked += 1

    def standby_for_check(self) -> bool:
        """A check waits and the next standby is only delayed: it is due now (True)."""
        if self.checks_asked and self.standby is None and self.standby_delayed:
            self.standby_due = 0.0
            return True
        return False

    def wait_signal(self) -> signal.struct_siginfo | None:
        """The next signal, or None when the loop should look again first: soon while the
        standby imports, when a delayed one is due, else only at a signal."""
        if self.standby is not None and self.standby.report is None:  # importing
            return signal.sigtimedwait(HANDLED, 0.1)
        if self.standby is None and self.standby_delayed:
            return signal.sigtimedwait(HANDLED, max(0.0, self.standby_wake() - time.monotonic()))
        return signal.sigwaitinfo(HANDLED)

    def relaunch(self) -> None:
        """The relaunch asked for, now that the standby has imported: stop the old server, the
        standby becomes the new one (or the relaunch is refused: the standby could not
        import, or vLLM rejects the launch file)."""
        launch, standby = self.pending, self.standby
        assert launch is not None and standby is not None and standby.report is not None
        if not standby.ready:
            self.discard_standby()
            error = standby.report.get("error")
            self.refuse(f"the standby could not import {self.opts.module}: {error}")
            return
        if not standby.alive():  # ended after its report: another one, the old server serves on
            if not self.replace_dead_standby(standby):
                self.refuse(self.fork_error)
            return
        # the next server prepared, vLLM's verdict on it in, before the old one is asked to stop
        why = self.vet(launch, self.opts.prepare)
        if why == RETRY:  # kept pending: the next standby prepares it once it has imported
            return
        if why:
            self.refuse(why)
            return
        prepared = self.state["prepared"]
        if prepared["checked"]:  # what the old server's last seconds were spent on
            say(f"standby {standby.pid} prepared the next server in {prepared['seconds']:.2f} s "
                f"({', '.join(prepared['steps'])}); stopping the old one")  # fmt: skip
        self.pending = None
        code, took = self.children.stop(self.pid, self.opts.stop_timeout)
        if _stop_asked():  # a stop came while the old server stopped: no new one
            self.pid = 0
            raise Stopped()
        if not self.start_next(launch):
            raise RuntimeError(f"relaunch: old server stopped in {took:.2f} s; no new server")
        say(f"relaunch: old server stopped in {took:.2f} s (status {code}); {self.started()}")
        self.prepare_later()  # the next relaunch's standby imports while this server serves
        self.answered()
        self.write_state("relaunched")

    def child_exited(self) -> int | None:
        """A SIGCHLD: the server's exit code when it has ended by itself (its group stopped,
        the standby discarded, said), else None (a standby that ended after its imports is
        replaced)."""
        status = self.children.exited(self.pid)
        if status is None:
            standby = self.standby
            if standby is not None and standby.ready and not standby.alive():
                self.replace_dead_standby(standby)
            return None
        code = status_code(status)
        if group_alive(self.pid):
            self.children.stop(self.pid, self.opts.stop_timeout)
        self.children.forget(self.pid)
        self.discard_standby(wait=5)
        say(f"server exited with status {code}")
        return code

    def stop_server(self) -> None:
        """SIGTERM / SIGINT: the server stopped (if one runs), said."""
        if self.pid and self.children.exited(self.pid) is None:
            code, took = self.children.stop(self.pid, self.opts.stop_timeout)
            say(f"stopped the server in {took:.2f} s (status {code})")
        else:
            say("stopped before a server ran")


def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return sha256(f.read())
    except OSError:
        return ""


def _stop_asked() -> bool:
    """A SIGTERM / SIGINT is waiting (blocked, not yet taken)."""
    return bool({signal.SIGTERM, signal.SIGINT} & signal.sigpending())


def supervise(sup: Supervisor) -> int:
    say(sup.started())
    sup.prepare_later()  # the first relaunch's standby
    sup.write_state("started")
    sup.sighup_again()
    while True:
        if sup.standby is None and sup.standby_wanted():
            sup.prepare()  # (a delayed one: due now, or its server is ready)
        sup.check_standby()
        if sup.pending is not None and sup.check_standby():
            sup.relaunch()
            continue
        if sup.standby_for_check():  # a delayed standby: forked now for the check
            continue
        if sup.checks_asked and (sup.standby is None or sup.check_standby()):
            sup.answer_checks()
            continue
        if sup.pending is not None and sup.standby is None:  # none could be forked
            sup.refuse(sup.fork_error or "no standby")
            continue
        info = sup.wait_signal()
        if info is None:
            continue
        sig = info.si_signo
        if sig == signal.SIGCHLD:
            code = sup.child_exited()
            if code is not None:  # the server ended by itself: so does the launcher
                return code
            continue
        if sig == signal.SIGUSR1:
            sup.check_asked()
            continue
        if sig == signal.SIGHUP:
            sup.relaunch_asked()
            continue
        raise Stopped()  # SIGTERM / SIGINT


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
    except UsageError as exc:
        say(str(exc))
        return 2
    first = Launch(opts.args, {})
    if opts.launch_file:
        try:
            first = read_launch(opts.launch_file)
        except LaunchFileError as exc:
            say(f"{opts.launch_file}: {exc}")
            return 2
        os.environ.update(first.env)  # the imports see what a plain start would
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    sup = Supervisor(opts, first)
    try:
        standby = sup.wait_standby()
        if standby is None or not standby.ready:  # the server would fail the same way: said
            sup.discard_standby()
            return 1
        if not sup.start_next(first):
            return 1
        return supervise(sup)
    except Stopped:
        sup.stop_server()
        sup.discard_standby(wait=5)
        return 0
    except RuntimeError as exc:
        say(str(exc))
        sup.discard_standby()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
