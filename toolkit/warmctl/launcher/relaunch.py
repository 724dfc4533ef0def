"""Relaunch a server run by the pre-imported launcher (`warmctl/launcher/vllm_launch.py`):
SIGHUP to the launcher (systemd's $MAINPID), wait until the old server is gone and a new one
was forked, then the caller warms it. The launcher stays; the unit never leaves `active`.

A launcher started with a launch file (the unit's `--launch-file`) reads it again at the
relaunch. Before the signal, `check` reads that file and the launcher's state file (its
`--state-file`) and says whether a relaunch can apply it: a file that is not a launch file is an
error (exit 2, nothing signalled); a change only a restart applies (a variable vLLM read when the
launcher imported it, or a launcher script changed on disk since it started: warmctl upgraded)
exits RESTART_NEEDED, so a deploy restarts the unit instead. After the signal the state file
proves the new configuration took effect: the launcher handled this SIGHUP, its new server is
the process that runs now, and it was launched from the launch file as it is on disk.

`vet` asks the launcher for vLLM's own verdict on the launch file (SIGUSR1; a launcher that
answers says so in its state file, "checks"): its standby, which has imported vLLM, parses the
file's arguments with vLLM's parser and builds vLLM's configuration from them
(launcher/vllm_args.py), and the launcher writes the answer to its state file. What vLLM
rejects is an error (exit 2), and the server keeps running: the launcher itself refuses such a
file at the SIGHUP too, before it stops the old server.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.host import safefs
from warmctl.launcher import vllm_launch

RESTART_NEEDED = 3  # exit status: the launcher cannot apply the change, a restart can
# the most read of the launcher's state file and of its script (a bigger script: a restart)
STATE_MAX_BYTES = 1 << 20
SCRIPT_MAX_BYTES = 16 << 20
LAUNCH_MAX_BYTES = 1 << 20  # a launch file: vLLM's arguments and a few variables


@dataclass(frozen=True)
class Relaunched:
    pid: int  # the launcher
    old: tuple[int, ...]  # its server process(es) before
    new: tuple[int, ...]  # after
    seconds: float  # SIGHUP -> the new server forked
    generation: int = 0  # the launcher's count of servers (0: it keeps no state file)
    argv: str = ""  # what the new server runs (secrets masked), from the state file


@dataclass(frozen=True)
class LauncherFiles:
    """What the launcher's command line names (None: not given)."""

    script: str | None
    launch_file: str | None
    state_file: str | None


def own_files(config_dir: str, name: str) -> LauncherFiles:
    """The launch and state files the plan gives instance `name` (warmctl.plan.instance.
    launcher_paths): what root expects that instance's running launcher to name."""
    from warmctl.plan.instance import launcher_paths

    paths = launcher_paths(config_dir, name)
    return LauncherFiles(None, paths["launch_file"], paths["launch_state"])


@dataclass(frozen=True)
class Checked:
    """A launcher that can apply its launch file by a relaunch."""

    files: LauncherFiles
    state: dict[str, Any] | None  # None: no state file (a launcher without --state-file)
    launch: vllm_launch.Launch | None  # None: no launch file (it relaunches the same argv)

    @property
    def current(self) -> bool | None:
        """Its server runs the launch file as it is on disk (None: no file or no state)."""
        if self.state is None or self.launch is None:
            return None
        return self.state.get("launch_sha256") == self.launch.digest

    def report(self, label: str, pid: int, vllm_checked: bool) -> dict[str, Any]:
        """What `warmctl relaunch --check --json` says of it (the restart role reads it)."""
        state = self.state or {}
        return {"target": label, "launcher_pid": pid, "can_relaunch": True,
                "launch_file": self.files.launch_file,
                "generation": state.get("generation"), "argv": state.get("argv"),
                "runs_launch_file": self.current, "vllm_checked": vllm_checked}  # fmt: skip

    def line(self, label: str, pid: int, vllm_checked: bool) -> str:
        """... and without --json, in one line."""
        generation = (self.state or {}).get("generation", "?")
        what = self.files.launch_file or "the same arguments"
        said = " (vLLM accepts it)" if vllm_checked else ""
        return f"{label}: launcher {pid} (generation {generation}) can relaunch with {what}{said}"


def children(
    pid: int, proc: Path = Path("/proc"), state: dict[str, Any] | None = None
) -> tuple[int, ...]:
    """The launcher's server: its child processes from /proc (Linux), but its standby (the next
    server, importing or waiting). With the launcher's `state`: the server it names, if it is
    one of them; else the children but the standby it names and any named vllm-standby."""
    found = _child_pids(pid, proc)
    server = (state or {}).get("server_pid")
    if server in found:
        return (server,)
    standby = (state or {}).get("standby_pid")
    return tuple(sorted(p for p in found if p != standby and not _is_standby(p, proc)))


def _child_pids(pid: int, proc: Path) -> set[int]:
    found: set[int] = set()
    task_dir = proc / str(pid) / "task"
    try:
        tasks = list(task_dir.iterdir())
    except FileNotFoundError:
        raise WarmctlError(f"process {pid} is not running", kind="input") from None
    except OSError as exc:
        raise WarmctlError(f"cannot read {task_dir}: {exc.strerror}", kind="input") from None
    for task in tasks:
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def _is_standby(pid: int, proc: Path) -> bool:
    try:
        return (proc / str(pid) / "comm").read_bytes().strip() == vllm_launch.STANDBY_COMM
    except OSError:  # ended meanwhile
        return False


def _cmdline(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def is_launcher(pid: int, proc: Path = Path("/proc")) -> bool:
    return any(arg.endswith("vllm_launch.py") for arg in _cmdline(pid, proc)[:3])


def launcher_files(pid: int, proc: Path = Path("/proc")) -> LauncherFiles:
    """The script, launch file and state file of launcher `pid`, from its command line (read by
    the launcher's own parser; a line it would refuse names no file)."""
    argv = _cmdline(pid, proc)
    script = next((a for a in argv[:3] if a.endswith("vllm_launch.py")), None)
    if script is None:
        return LauncherFiles(None, None, None)
    try:
        options = vllm_launch.parse(argv[argv.index(script) + 1 :])
    except vllm_launch.UsageError:
        return LauncherFiles(script, None, None)
    return LauncherFiles(script, options.launch_file, options.state_file)


def read_state(path: str) -> dict[str, Any]:
    """The launcher's state file (vllm_launch.Supervisor.write_state)."""
    try:
        # root reads it (the deploy's relaunch --check) in the unit's runtime folder, the
        # service user's: no link, FIFO or device, bounded (warmctl.host.safefs)
        doc = json.loads(safefs.read_file(path, STATE_MAX_BYTES))
    except FileNotFoundError:
        raise WarmctlError(f"{path}: no launcher state (is the unit running?)") from None
    except OSError as exc:
        raise WarmctlError(f"{path}: cannot read the launcher's state: {exc.strerror}") from None
    except ValueError:
        raise WarmctlError(f"{path}: the launcher's state is not JSON") from None
    if not isinstance(doc, dict):
        raise WarmctlError(f"{path}: the launcher's state is not a JSON object")
    return doc


def _digest(path: str) -> str:
    try:
        return vllm_launch.sha256(safefs.read_file(path, SCRIPT_MAX_BYTES))
    except OSError:
        return ""


def read_launch(path: str) -> vllm_launch.Launch:
    """The launch file at `path`, read as root may read a path the launcher's command line (the
    service user's process) names: a regular file reached without a link, at most
    LAUNCH_MAX_BYTES (warmctl.host.safefs), then parsed as the launcher parses it."""
    try:
        data = safefs.read_file(path, LAUNCH_MAX_BYTES)
    except OSError as exc:
        raise vllm_launch.LaunchFileError(f"cannot read it: {exc.strerror or exc}") from None
    return vllm_launch.parse_launch(data)


def _expected(files: LauncherFiles, expect: LauncherFiles | None, pid: int) -> None:
    """Root's callers name the instance's own files (its facts): a launcher whose command line
    names others (a process of the service user's can show any command line) is refused before
    anything is read."""
    if expect is None:
        return
    for what, want, got in (
        ("launch file", expect.launch_file, files.launch_file),
        ("state file", expect.state_file, files.state_file),
    ):
        if want is not None and want != got:
            raise WarmctlError(
                f"process {pid} names {got or 'no ' + what} as its {what}, not this instance's "
                f"{want}: not this instance's launcher",
                kind="input",
            )


def check(pid: int, proc: Path = Path("/proc"), expect: LauncherFiles | None = None) -> Checked:
    """Can launcher `pid` apply its launch file by a relaunch? Raises WarmctlError: exit 2 for
    what is not a launcher or a launch file (or, with `expect`, names other files than the
    instance's), RESTART_NEEDED for what only a restart applies."""
    if pid <= 1:
        raise WarmctlError(f"--pid {pid}: not a launcher process", kind="input")
    if not is_launcher(pid, proc):
        raise WarmctlError(
            f"process {pid} is not the pre-imported launcher (vllm_launch.py): a unit without "
            "vllm_service_launcher restarts instead",
            kind="input",
        )
    files = launcher_files(pid, proc)
    _expected(files, expect, pid)
    if not files.launch_file:
        return Checked(files, read_state(files.state_file) if files.state_file else None, None)
    try:
        launch = read_launch(files.launch_file)
    except vllm_launch.LaunchFileError as exc:
        raise WarmctlError(f"{files.launch_file}: {exc}", kind="input") from None
    if not files.state_file:
        return Checked(files, None, launch)
    state = read_state(files.state_file)
    if state.get("launcher_pid") != pid:
        raise WarmctlError(f"{files.state_file}: the state of process {state.get('launcher_pid')}")
    if files.script and _digest(files.script) != state.get("script_sha256"):
        raise WarmctlError(
            f"launcher {pid}: {files.script} changed since it started (warmctl upgraded): "
            "only a restart runs the new launcher",
            RESTART_NEEDED,
            kind="restart",
        )
    why = vllm_launch.refusal(state, launch.env)
    if why:
        raise WarmctlError(f"{files.launch_file}: {why}", RESTART_NEEDED, kind="restart")
    return Checked(files, state, launch)


def vet(
    pid: int, checked: Checked, timeout: float, *, interval: float = 0.05
) -> dict[str, Any] | None:
    """vLLM's verdict on the launch file from launcher `pid`'s standby (the state's "check":
    {"ok", "reason", "checked", "launch_sha256"}); None when this launcher cannot be asked (no
    state file, or a launcher that does not answer checks: never signalled then). Raises
    WarmctlError (exit 2) when vLLM rejects the file or no answer came in `timeout` s."""
    state, state_file = checked.state, checked.files.state_file
    if state is None or state_file is None or "checks" not in state:
        return None
    before = int(state.get("checks", 0))
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        raise WarmctlError(f"process {pid} is not running", kind="input") from None
    except PermissionError:
        raise WarmctlError(f"not allowed to signal process {pid}", kind="input") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = read_state(state_file)
        except WarmctlError:  # being replaced this instant
            state = {}
        if int(state.get("checks", 0)) > before:
            break
        if time.monotonic() > deadline:
            raise WarmctlError(
                f"launcher {pid}: no answer to the check {timeout:.0f} s after asking (its "
                f"standby still importing vLLM?)"
            )
        time.sleep(interval)
    answer = dict(state.get("check") or {})
    if not answer.get("ok"):
        raise WarmctlError(str(answer.get("reason") or "the launcher could not check the file"))
    return answer


def _handled(checked: Checked, before: int) -> dict[str, Any] | None:
    """The launcher's state once it has handled our SIGHUP, else None."""
    if not checked.files.state_file:
        return None
    try:
        state = read_state(checked.files.state_file)
    except WarmctlError:  # being replaced this instant
        return None
    return state if int(state.get("signals", 0)) > before else None


def relaunch(
    pid: int,
    timeout: float,
    *,
    proc: Path = Path("/proc"),
    on_wait: Callable[[str], None] | None = None,
    interval: float = 0.05,
    expect: LauncherFiles | None = None,
) -> Relaunched:
    """SIGHUP the launcher `pid`; return once its old server is gone and a new one runs (with
    a state file: the one the launcher forked from the launch file as it is on disk)."""
    checked = check(pid, proc, expect)
    before = int((checked.state or {}).get("signals", 0))
    old = children(pid, proc, checked.state)
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise WarmctlError(f"process {pid} is not running", kind="input") from None
    except PermissionError:
        raise WarmctlError(f"not allowed to signal process {pid}", kind="input") from None
    deadline = t0 + timeout
    said = 0.0
    while True:
        state = _handled(checked, before)
        now = children(pid, proc, state)
        if state is not None and state.get("last") == "refused":
            raise WarmctlError(
                f"launcher {pid} refused the relaunch: {state.get('reason')} "
                f"(server {', '.join(map(str, old))} keeps running)"
            )
        # one new server (a standby forked this instant may not have its name yet: look again)
        fresh = len(now) == 1 and not set(now) & set(old)
        if fresh and checked.state is None:
            return Relaunched(pid, old, now, time.monotonic() - t0)
        if fresh and state is not None and state.get("server_pid") in now:
            return _confirmed(checked, pid, old, now, time.monotonic() - t0, state)
        if time.monotonic() > deadline:
            raise WarmctlError(
                f"launcher {pid}: no new server {timeout:.0f} s after SIGHUP "
                f"(server processes {', '.join(map(str, now)) or 'none'})"
            )
        if on_wait and time.monotonic() - said > 5:
            said = time.monotonic()
            on_wait(f"waiting for the launcher: its standby's imports, then the old server "
                    f"({', '.join(map(str, old))}) to stop")  # fmt: skip
        time.sleep(interval)


def _confirmed(
    checked: Checked,
    pid: int,
    old: tuple[int, ...],
    now: tuple[int, ...],
    seconds: float,
    state: dict[str, Any],
) -> Relaunched:
    """The new server runs the launch file as it is on disk now, or a one-line error."""
    path = checked.files.launch_file
    if path and state.get("launch_sha256") != _digest(path):
        raise WarmctlError(
            f"launcher {pid}: the new server (pid {state.get('server_pid')}) runs another "
            f"version of {path} than the one there now (changed during the relaunch?): reload again"
        )
    generation = int(state.get("generation", 0))
    return Relaunched(pid, old, now, seconds, generation, str(state.get("argv", "")))
