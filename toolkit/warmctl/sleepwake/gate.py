"""The traffic gate of one proxied instance: the one model of its flag files, their precedence,
the state they put the instance in and what the reverse proxy answers in each state.

The flags live in the gate folder (`/run/vllm-gate`), one file per state, `NAME.SUFFIX`
(`GateFiles`: the paths of an instance from its name and the folder). Strongest first (`FLAGS`:
the proxy, `warmctl status` and the waker all take the first one that exists):

- `NAME.closed`, asleep: a sleeping vLLM holds requests forever or crashes on them
  (vllm-project/vllm#15483, #45268). `warmctl sleep --gate FILE` closes it BEFORE draining, so
  requests already streaming finish while new ones are refused; `warmctl wake --gate FILE`
  opens it once the server is awake and warm. A failed sleep puts the gate back the way it was.
- `NAME.wakeable`, asleep, and a request wakes it (idle sleep, or a window whose `on_request` is
  wake): the proxy holds a request while `warmctl waker` asks for a wake (docs/IDLE-SLEEP.md).
  The sleep closes it (`warmctl sleep --gate NAME.wakeable --cause idle`), the wake opens it.
- `NAME.holding`, a restart or relaunch of a single host runs: the waker holds requests until
  it is gone (docs/LAUNCHER.md).
- `NAME.warming`, the unit's warmup is running (created and removed by the unit itself).
- `NAME.draining`, out of rotation for a restart: `warmctl drain --gate FILE` closes it and
  waits for the requests in flight; it outlives the restart and the warmup, and the deploy
  removes it only once `warmctl verify` passed (verify's requests carry `VERIFY_HEADER`, which
  the proxy lets past this flag and a load balancer strips).

What the proxy answers in each state, on /v1/* and on /health, is data here (`proxy_answers`):
the nginx template prints it (the collection's filter `vllm_gate_answers`) and
`warmctl.server.client`
reads the proxy's answers back with the same model (`proxy_state`).

A flag's text says why and when it was closed (`sleep cause=idle level=1 at
2026-12-04T14:02:11+0000`); `warmctl status --gate-dir` reads it back (`read_flag`, `read_state`).

One sleep or wake of an instance at a time: `warmctl sleep/wake --gate` hold `.NAME.lock` in the
gate folder (`instance_lock`) from before the gate closes to after it opens. A request that
reaches an instance while its idle sleep still drains asks for a wake at once (the waker); that
wake then waits for the sleep to end, finds the server asleep and wakes it, instead of finding
it awake, opening the gate and letting requests reach the engine the sleep then puts to sleep.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from warmctl.errors import WarmctlError
from warmctl.host import safefs
from warmctl.sleepwake.triggers import KINDS

T = TypeVar("T")

# verify's requests carry it: the proxy lets them past the draining flag (never past the asleep
# one), so a deploy measures a restarted instance before it rejoins the load balancer
VERIFY_HEADER = "X-Warmctl-Verify"

# -- the flags and their precedence ------------------------------------------------------------
# why a sleep or a wake happened: its window's timer, a sleep trigger's detector in the waker
# (warmctl.sleepwake.triggers), a request that reached the instance asleep, or a person; the
# commands' --cause, the flag's text, the metrics
CAUSES = ("window", *(kind.cause for kind in KINDS), "request", "manual")
CLOSED, WAKEABLE, HOLDING = "closed", "wakeable", "holding"
WARMING, DRAINING = "warming", "draining"
# the waker's asks to systemd (path units), beside the flags: a wake on request, and each
# trigger's own (its kind's `request`)
WAKE_REQUEST = "wake-request"
# the waker's sockets beside them: its HTTP door (nginx's auth_request), nginx's access log
WAKER_SOCKET, ACTIVITY_SOCKET = "waker.sock", "activity.sock"


@dataclass(frozen=True)
class FlagKind:
    suffix: str  # NAME.<suffix> in the gate folder
    state: str  # the proxy's state while it is the strongest flag (nginx's $vllm_gate)
    meaning: str


# strongest first: an instance is in the state of the first of its flags that exists
FLAGS: tuple[FlagKind, ...] = (
    FlagKind(CLOSED, "asleep", "asleep, requests refused"),
    FlagKind(WAKEABLE, "wakeable", "asleep, a request wakes it"),
    FlagKind(HOLDING, "holding", "a restart or relaunch runs, requests are held"),
    FlagKind(WARMING, "warming", "the unit's warmup runs"),
    FlagKind(DRAINING, "draining", "out of rotation for a restart"),
)


@dataclass(frozen=True)
class GateFiles:
    """Every file of one instance in the gate folder, from its name: `GATE_DIR/NAME.SUFFIX`
    (warmctl.plan.instance gives the templates the same paths)."""

    gate_dir: Path
    name: str

    def path(self, suffix: str) -> Path:
        return Path(self.gate_dir) / f"{self.name}.{suffix}"

    @property
    def lock(self) -> Path:
        return Path(self.gate_dir) / f".{self.name}.lock"

    def flags(self, holding: bool = True, asks: bool = True) -> Flags:
        """The flags, with every sleep trigger's request file (`asks`) and the holding flag."""
        sleeps = [kind.request for kind in KINDS if kind.action == "sleep"] if asks else []
        return Flags(
            wakeable=self.path(WAKEABLE),
            closed=self.path(CLOSED),
            warming=self.path(WARMING),
            draining=self.path(DRAINING),
            wake_request=self.path(WAKE_REQUEST),
            asks=tuple(self.path(suffix) for suffix in sleeps),
            holding=self.path(HOLDING) if holding else None,
        )


@dataclass(frozen=True)
class Flags:
    """An instance's flags and request files as paths (the waker's, `warmctl status`'s view)."""

    wakeable: Path
    closed: Path
    warming: Path
    draining: Path
    wake_request: Path  # the waker asks systemd for a wake (vllm-NAME-wake-request.path)
    # the sleep triggers' request files: a sleep asked for (vllm-NAME-sleep-CAUSE.path)
    asks: tuple[Path, ...] = ()
    # None: restarts are not held (behind a load balancer, or the waker has no --holding)
    holding: Path | None = None

    def flag(self, suffix: str) -> Path | None:
        return {CLOSED: self.closed, WAKEABLE: self.wakeable, HOLDING: self.holding,
                WARMING: self.warming, DRAINING: self.draining}[suffix]  # fmt: skip

    def paths(self) -> list[Path]:
        every = (self.wakeable, self.closed, self.warming, self.draining, self.wake_request)
        return [*every, *self.asks, *([self.holding] if self.holding is not None else [])]

    def strongest(self, hold_max_age: float | None = None) -> FlagKind | None:
        """The first of the flags that exists, in `FLAGS`' order (a holding flag older than
        `hold_max_age` seconds does not count: a restart whose end never removed it)."""
        for kind in FLAGS:
            path = self.flag(kind.suffix)
            if path is None:
                continue
            if kind.suffix == HOLDING:
                if self.is_holding(hold_max_age):
                    return kind
            elif path.exists():
                return kind
        return None

    def state(self, hold_max_age: float | None = None) -> str:
        """The proxy's state: asleep, wakeable, holding, warming, draining, or awake."""
        kind = self.strongest(hold_max_age)
        return kind.state if kind else "awake"

    def is_holding(self, max_age: float | None = None) -> bool:
        """The holding flag exists (and, with `max_age`, was created less than that many
        seconds ago: a restart or relaunch whose end never removed it, e.g. a hand's
        `systemctl reload` that failed, stops holding requests after the hold's bound)."""
        if self.holding is None:
            return False
        try:
            mtime = self.holding.stat().st_mtime
        except OSError:
            return False
        return max_age is None or time.time() - mtime < max_age

    def awake(self) -> bool:
        """Serving, and nothing is about to change that: no flag, no sleep asked for."""
        return self.strongest() is None and not any(p.exists() for p in self.asks)


# -- reading a flag ----------------------------------------------------------------------------
_CAUSE = re.compile(r"\bcause=([a-z]+)")
_LEVEL = re.compile(r"\blevel=([12])\b")
WINDOW_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a window's name in a flag's text
_WINDOW = re.compile(r"\bwindow=([A-Za-z0-9_.-]+)")
# what read_flag reads of a flag at most (its text is one line)
FLAG_TEXT_MAX = 4096


def sleep_reason(cause: str, level: int | None = None, window: str | None = None) -> str:
    """The text a sleep writes into its flag: `sleep cause=window window=night level=1`."""
    return (
        f"sleep cause={cause}"
        + (f" window={window}" if window else "")
        + (f" level={level}" if level else "")
    )


@dataclass(frozen=True)
class FlagInfo:
    """A flag that exists: since when (its file's time) and why (its text's cause, if any)."""

    path: Path
    since: float  # Unix time
    text: str
    cause: str | None
    level: int | None = None
    window: str | None = None

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
    text = data.decode(errors="replace")[:500].strip()
    cause, level, window = (m.group(1) if (m := r.search(text)) else None
                            for r in (_CAUSE, _LEVEL, _WINDOW))  # fmt: skip
    return FlagInfo(p, st.st_mtime, text, cause, int(level) if level else None, window)


# -- the state of an instance, as `warmctl status` tells it --------------------------------------
@dataclass
class GateState:
    """What the instance's flags say: awake (none), asleep, waking (asleep, a wake asked),
    holding, warming, draining; `closed` is said by status when the server itself is awake."""

    state: str
    flag: FlagInfo | None = None
    wakes_on_request: bool = False

    @property
    def text(self) -> str:
        if self.flag is None:
            return self.state
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.flag.since))
        why = [self.flag.cause] if self.flag.cause else []
        if self.flag.window:
            why[-1:] = [f"{self.flag.cause or 'window'} {self.flag.window}"]
        if self.state in ("asleep", "waking"):
            why.append("a request wakes it" if self.wakes_on_request else "requests refused")
        return f"{self.state} since {since}" + (f" ({'; '.join(why)})" if why else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.flag.since if self.flag else None,
            "cause": self.flag.cause if self.flag else None,
            "window": self.flag.window if self.flag else None,
            "level": self.flag.level if self.flag else None,
            "wakes_on_request": self.wakes_on_request,
            "flag": str(self.flag.path) if self.flag else None,
        }


def read_state(files: GateFiles) -> GateState:
    """The instance's state from its flags, read in `FLAGS`' order (link-safe, `read_flag`)."""
    for kind in FLAGS:
        flag = read_flag(files.path(kind.suffix))
        if flag is None:
            continue
        if kind.suffix in (CLOSED, WAKEABLE):
            wakeable = kind.suffix == WAKEABLE
            waking = wakeable and read_flag(files.path(WAKE_REQUEST)) is not None
            return GateState("waking" if waking else "asleep", flag, wakes_on_request=wakeable)
        return GateState(kind.state, flag)
    return GateState("awake")


# -- what the proxy answers in each state ------------------------------------------------------
@dataclass(frozen=True)
class ProxyAnswer:
    code: int
    body: Mapping[str, Any] | None = None  # None: no body (418: the request goes to the waker)

    @property
    def nginx(self) -> str:
        """The arguments of nginx's `return` (the body is JSON without a single quote)."""
        if self.body is None:
            return str(self.code)
        return f"{self.code} '{json.dumps(self.body)}\\n'"


def refusal(message: str, state: str, **more: Any) -> ProxyAnswer:
    """503 with vLLM's error shape, and the gate's state (client.proxy_state reads it)."""
    error = {"message": message, "type": "ServiceUnavailable", "code": 503}
    return ProxyAnswer(503, {"error": error, "state": state, **more})


# the state of /health's 200 while asleep and a request wakes it (warmctl.server.client.health)
WAKEABLE_HEALTH = "asleep"
TO_WAKER = ProxyAnswer(418)  # nginx's error_page 418 = @wake: the waker holds the request


def proxy_answers(name: str, wake_hold: object) -> dict[str, tuple[ProxyAnswer, ProxyAnswer]]:
    """(on /v1/*, on /health) per proxy state, in `FLAGS`' order."""
    asleep = refusal(f"{name} is asleep; retry later", "asleep")
    woken = f"{name} is asleep; a request wakes it (held up to {wake_hold} s)"
    wakeable = {"state": WAKEABLE_HEALTH, "wakes_on_request": True, "message": woken}
    holding = refusal(f"{name} is restarting; requests are held until it serves", "holding",
                      holds_requests=True)  # fmt: skip
    warming = refusal(f"{name} is warming up; retry later", "warming")
    draining = refusal(f"{name} is draining (out of rotation); retry later", "draining")
    return {
        "asleep": (asleep, asleep),
        "wakeable": (TO_WAKER, ProxyAnswer(200, wakeable)),
        "holding": (TO_WAKER, holding),
        "warming": (warming, warming),
        "draining": (draining, draining),
    }


# the instance's facts (warmctl.plan.instance) that hold each flag's path; the proxy tests the ones
# it has: wakeable with wake on request, holding with a single host's restart hold
FACT_OF_FLAG = {CLOSED: "gate", WAKEABLE: "wakeable", HOLDING: "holding", WARMING: "warming",
                DRAINING: "draining"}  # fmt: skip
_FACT_ON = {WAKEABLE: "wake_on_request", HOLDING: "restart_hold"}
# nginx's value of $vllm_gate for a flag, when it is not the state itself
_NGINX_VALUE = {WAKEABLE: "$vllm_wakeable", DRAINING: "draining$vllm_proxy_verify"}
_NGINX_NOTE = {
    HOLDING: "a restart or relaunch runs: held (the waker) until it ends, warming included",
    DRAINING: "out of rotation (warmctl verify's requests pass it: draining-verify)",
}


def waker_refusals(name: str, wake_hold: object) -> dict[str, ProxyAnswer]:
    """What the proxy answers a request the waker refused (its 403's X-Warmctl-Wake: the hold's
    outcome), in the template's order; "" is any other (its failure, or no answer)."""
    return {
        "relaunch-failed": refusal(
            f"{name} was restarting and no server answers since; retry later", "relaunch-failed"
        ),
        "relaunch-timeout": refusal(
            f"{name} is still restarting after {wake_hold} s; retry later", "relaunch-timeout"
        ),
        "timeout": refusal(
            f"{name} did not wake within {wake_hold} s; retry later", "wake-timeout"
        ),
        "refused": proxy_answers(name, wake_hold)["asleep"][0],
        "": refusal(f"{name} could not be woken; retry later", "waking-failed"),
    }


def stopped(name: str) -> ProxyAnswer:
    """The instance is stopped or (re)starting: nothing answers behind the proxy."""
    return refusal(f"{name} is not running; retry later", "stopped")


def nginx_gate(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The gate of one instance as the nginx template prints it (the collection's filter
    `vllm_gate_answers`). `flags`, strongest first: per flag its path, nginx's `$vllm_gate`
    value, a note, and the `return` of /v1/* and of /health in that state; `refused`: the
    `return` per outcome of the waker's hold that refuses (`failed`: any other); `stopped`."""
    name, hold = str(facts["name"]), facts["wake_hold"]
    relaunch = ("relaunch-failed", "relaunch-timeout") if facts["restart_hold"] else ()
    refused = waker_refusals(name, hold)
    return {
        "flags": _nginx_flags(facts),
        "refused": [
            {"outcome": k, "answer": a.nginx}
            for k, a in refused.items()
            if k and (k in relaunch or not k.startswith("relaunch"))
        ],
        "failed": refused[""].nginx,
        "stopped": stopped(name).nginx,
    }


def _nginx_flags(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    answers = proxy_answers(str(facts["name"]), facts["wake_hold"])
    out = []
    for kind in FLAGS:
        if kind.suffix in _FACT_ON and not facts[_FACT_ON[kind.suffix]]:
            continue
        v1, health = answers[kind.state]
        out.append({
            "state": kind.state,
            "flag": str(facts[FACT_OF_FLAG[kind.suffix]]),
            "value": _NGINX_VALUE.get(kind.suffix, kind.state),
            "note": _NGINX_NOTE.get(kind.suffix, ""),
            "v1": v1.nginx,
            "health": health.nginx,
        })  # fmt: skip
    return out


# the states a proxy's 503 names: asleep (the sleep gate), or out of a load balancer's rotation
ASLEEP_STATES = ("asleep",)
OUT_OF_ROTATION_STATES = ("draining", "warming", "holding")


def proxy_state(body: Any) -> str | None:
    """The gate's state a proxy's answer names (its JSON's `state`), None for vLLM's own."""
    state = body.get("state") if isinstance(body, dict) else None
    known = {k.state for k in FLAGS} | {"stopped"}
    known |= {a.body["state"] for a in waker_refusals("", 0).values() if a.body}
    return state if isinstance(state, str) and state in known else None


# -- one flag file -----------------------------------------------------------------------------
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
            raise self.error("read", exc) from None

    def close(self, reason: str = "closed") -> bool:
        """Create the flag (atomically, never through a link: warmctl runs as root in a folder
        the service user owns, see warmctl.host.safefs); True if the gate was open before."""
        text = f"{reason} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
        try:
            with safefs.folder(self.path.parent) as folder:
                was_open = not safefs.lexists(folder, self.path.name)
                # 0644: the proxy's workers only test that it exists
                safefs.replace(folder, self.path.name, text.encode(), 0o644)
        except OSError as exc:
            raise self.error("close", exc) from None
        return was_open

    def open(self) -> bool:
        """Remove the flag (a link: the link itself); True if the gate was closed before."""
        try:
            with safefs.folder(self.path.parent) as folder:
                return safefs.remove(folder, self.path.name)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self.error("open", exc) from None

    def error(self, action: str, exc: OSError) -> WarmctlError:
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


def lock_path(gate: Gate, instance: str | None = None) -> Path:
    """`.NAME.lock` in the gate's folder: one per instance. `--gate FILE` alone names no
    instance: a flag is `NAME.SUFFIX` (`GateFiles`), so its name up to the first dot is it."""
    name = instance or gate.path.name.split(".", 1)[0]
    return GateFiles(gate.path.parent, name).lock


@contextlib.contextmanager
def instance_lock(
    gates: Sequence[Gate],
    on_wait: Callable[[str], None] | None = None,
    instance: str | None = None,
) -> Iterator[None]:
    """Hold the instance's sleep/wake lock (nothing without a gate). Another sleep or wake of it
    running: `on_wait` is told, then this waits for it (a unit's start timeout bounds it)."""
    if not gates:
        yield
        return
    path = lock_path(gates[0], instance)
    try:
        # read-only is enough for flock: a lock file another user created (root's units, the
        # vllm user's) still locks; never through a link, never a FIFO (warmctl.host.safefs)
        with safefs.folder(path.parent) as folder:
            fd = safefs.open_lock(folder, path.name, 0o644)
    except OSError as exc:
        raise gates[0].error("lock", exc) from None
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


def ask(path: Path, what: str) -> bool:
    """Create the request file `path` unless it exists; True when this call created it.

    Atomic both ways: the text is written to a temporary file first and linked to `path`
    (`link` fails when `path` exists), so a path unit never sees half a file and two asks never
    replace each other (a replaced file would not start the unit again). OSError propagates."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(f"{what} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        tmp.chmod(0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)
