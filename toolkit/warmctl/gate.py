"""The traffic gate of one proxied instance: flag files the reverse proxy checks.

Three flags in the gate folder (`/run/vllm-gate`), each a state the proxy's `/health` reports
with a 503 (so a load balancer moves on) and `/v1/*` answers with 503 + `Retry-After`:

- `NAME.closed`, asleep: a sleeping vLLM holds requests forever or crashes on them
  (vllm-project/vllm#15483, #45268). `warmctl sleep --gate FILE` closes it BEFORE draining, so
  requests already streaming finish while new ones are refused; `warmctl wake --gate FILE`
  opens it once the server is awake and warm. A failed sleep puts the gate back the way it was.
- `NAME.draining`, out of rotation for a restart: `warmctl drain --gate FILE` closes it and
  waits for the requests in flight; it outlives the restart and the warmup, and the deploy
  removes it only once `warmctl verify` passed (verify's requests carry `VERIFY_HEADER`, which
  the proxy lets past this flag and a load balancer strips).
- `NAME.warming`, the unit's warmup is running (created and removed by the unit itself).
- `NAME.wakeable`, asleep, and a request wakes it (idle sleep, or a window whose `on_request` is
  wake): the proxy holds a request while `warmctl waker` asks for a wake (docs/IDLE-SLEEP.md).
  The sleep closes it (`warmctl sleep --gate NAME.wakeable --cause idle`), the wake opens it.

A flag's text says why and when it was closed (`sleep cause=idle at 2026-12-04T14:02:11+0000`);
`warmctl status --gate-dir` reads it back (`read_flag`).

One sleep or wake of an instance at a time: `warmctl sleep/wake --gate` hold `.NAME.lock` in the
gate folder (`instance_lock`) from before the gate closes to after it opens. A request that
reaches an instance while its idle sleep still drains asks for a wake at once (the waker); that
wake then waits for the sleep to end, finds the server asleep and wakes it, instead of finding
it awake, opening the gate and letting requests reach the engine the sleep then puts to sleep.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from warmctl import safefs
from warmctl.client import Client
from warmctl.errors import WarmctlError
from warmctl.sleepwake import DrainResult, SleepReport, drain, drain_step

T = TypeVar("T")

# verify's requests carry it: the proxy lets them past the draining flag (never past the asleep
# one), so a deploy measures a restarted instance before it rejoins the load balancer
VERIFY_HEADER = "X-Warmctl-Verify"
# connection refused, engine dead or still loading: nothing in flight to wait for
NOT_SERVING_KINDS = ("refused", "server", "asleep", "timeout")


class Gate:
    """open / close / is_closed on one flag file (closing twice or opening twice is a no-op)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.name or self.path.name in (".", ".."):
            raise WarmctlError(f"gate {str(path)!r}: not a file name", kind="input")

    def __repr__(self) -> str:
        return f"Gate({str(self.path)!r})"

    def is_closed(self) -> bool:
        """Something has the flag's name (a link too: only `close` writes it, never through it)."""
        try:
            with safefs.folder(self.path.parent) as folder:
                return safefs.lexists(folder, self.path.name)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("read", exc) from None

    def close(self, reason: str = "closed") -> bool:
        """Create the flag (atomically, never through a link: warmctl runs as root in a folder
        the service user owns, see warmctl.safefs); True if the gate was open before."""
        text = f"{reason} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
        try:
            with safefs.folder(self.path.parent) as folder:
                was_open = not safefs.lexists(folder, self.path.name)
                # 0644: the proxy's workers only test that it exists
                safefs.replace(folder, self.path.name, text.encode(), 0o644)
        except OSError as exc:
            raise self._error("close", exc) from None
        return was_open

    def open(self) -> bool:
        """Remove the flag (a link: the link itself); True if the gate was closed before."""
        try:
            with safefs.folder(self.path.parent) as folder:
                return safefs.remove(folder, self.path.name)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("open", exc) from None

    def _error(self, action: str, exc: OSError) -> WarmctlError:
        why = exc.strerror or exc.__class__.__name__
        return WarmctlError(
            f"cannot {action} the gate {self.path}: {why} (the folder must exist and be "
            "writable by this user)",
            kind="input",
        )


def behind_closed_gate(gate: Gate, action: Callable[[], T], reason: str = "sleep") -> T:
    """Close the gate, then run `action` (drain + sleep). If it fails, the gate goes back to
    the state it had (a server left awake serves again) and the error propagates."""
    was_open = gate.close(reason)
    try:
        return action()
    except BaseException:
        if was_open:
            gate.open()
        raise


def open_after(gates: Gate | Sequence[Gate] | None, action: Callable[[], T]) -> T:
    """Run `action` (wake + warmup); open the gates (if any) only if it succeeded."""
    result = action()
    for gate in [gates] if isinstance(gates, Gate) else gates or ():
        gate.open()
    return result


def gate_for(path: str | None, targets: Sequence[object]) -> Gate | None:
    """The `--gate FILE` of a command: one gate belongs to one instance, so one HOST."""
    if path is None:
        return None
    return gates_for((path,), targets)[0]


def gates_for(paths: Sequence[str], targets: Sequence[object]) -> list[Gate]:
    """The `--gate FILE...` of `warmctl wake` (the asleep flag and the wakeable one): all of
    one instance, so one HOST."""
    if paths and len(targets) != 1:
        raise WarmctlError(
            f"--gate belongs to one instance: give exactly one HOST, not {len(targets)}",
            kind="input",
        )
    return [Gate(p) for p in paths]


def lock_path(gate: Gate) -> Path:
    """`.NAME.lock` beside the gate's flag `NAME.<state>`: one per instance."""
    return gate.path.with_name(f".{gate.path.name.split('.', 1)[0]}.lock")


@contextlib.contextmanager
def instance_lock(
    gates: Sequence[Gate], on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the instance's sleep/wake lock (nothing without a gate). Another sleep or wake of it
    running: `on_wait` is told, then this waits for it (a unit's start timeout bounds it)."""
    if not gates:
        yield
        return
    path = lock_path(gates[0])
    try:
        # read-only is enough for flock: a lock file another user created (root's units, the
        # vllm user's) still locks; never through a link, never a FIFO (warmctl.safefs)
        with safefs.folder(path.parent) as folder:
            fd = safefs.open_lock(folder, path.name, 0o644)
    except OSError as exc:
        raise gates[0]._error("lock", exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(f"waiting for another sleep or wake of this instance to end ({path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def sleep_reason(cause: str, level: int | None = None) -> str:
    """The text a sleep writes into its flag: `sleep cause=idle level=1` (`read_flag`)."""
    return f"sleep cause={cause}" + (f" level={level}" if level else "")


_CAUSE = re.compile(r"\bcause=([a-z]+)")
# what read_flag reads of a flag at most (its text is one line)
FLAG_TEXT_MAX = 4096


@dataclass(frozen=True)
class FlagInfo:
    """A flag that exists: since when (its file's time) and why (its text's cause, if any)."""

    path: Path
    since: float  # Unix time
    text: str
    cause: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "since": self.since, "cause": self.cause}


def read_flag(path: str | os.PathLike[str]) -> FlagInfo | None:
    """The flag at `path`, or None when it does not exist (or cannot be read)."""
    p = Path(path)
    try:
        with safefs.folder(p.parent) as folder:
            if not safefs.lexists(folder, p.name):
                return None
            try:
                data, st = safefs.read_regular(folder, p.name, FLAG_TEXT_MAX)
            except safefs.UnsafeFileError:
                # a link, a FIFO...: the name is there (the gate is closed), its text unread
                st = os.stat(p.name, dir_fd=folder, follow_symlinks=False)
                data = b""
    except OSError:
        return None
    since = st.st_mtime
    text = data.decode(errors="replace")[:500].strip()
    match = _CAUSE.search(text)
    return FlagInfo(p, since, text, match.group(1) if match else None)


def drain_only_report(
    client: Client,
    drain_timeout: float,
    poll_interval: float = 0.2,
    on_wait: Callable[[str], None] | None = None,
) -> SleepReport:
    """For servers that cannot sleep (CPU): drain without POST /sleep; the caller then stops
    the unit. A drain that times out raises (kind `drain_timeout`)."""
    t0 = time.monotonic()
    report = SleepReport(target=client.target.label, level=0)
    client.health()
    drain_step(client, report, drain_timeout, poll_interval, on_wait, "not drained")
    report.total_s = time.monotonic() - t0
    return report


@dataclass
class DrainReport:
    """`warmctl drain`: the gate closed as draining, then the wait for the requests in flight.
    `serving` False: the server was not answering (stopped, starting, dead), nothing to wait for."""

    target: str
    gate: str
    serving: bool
    drain: DrainResult | None
    total_s: float

    @property
    def drained(self) -> bool:
        return self.drain is None or self.drain.drained

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "gate": self.gate,
            "serving": self.serving,
            "drained": self.drained,
            "drain": self.drain.to_dict() if self.drain else None,
            "total_s": self.total_s,
        }


def drain_out_of_rotation(
    client: Client, gate: Gate, drain_timeout: float, poll_interval: float = 0.2
) -> DrainReport:
    """Close `gate` (the draining flag), then wait up to `drain_timeout` for the requests in
    flight (the same wait as a sleep's). The gate stays closed either way: the caller restarts,
    verifies, then opens it. A server that does not answer is not waited for."""
    t0 = time.monotonic()
    gate.close("draining")
    try:
        client.health()
    except WarmctlError as err:
        if err.kind not in NOT_SERVING_KINDS:
            raise
        return DrainReport(client.target.label, str(gate.path), False, None, time.monotonic() - t0)
    result = drain(client, drain_timeout, poll_interval)
    return DrainReport(client.target.label, str(gate.path), True, result, time.monotonic() - t0)
