"""The traffic gate of one proxied instance: a flag file the reverse proxy checks.

While `/run/vllm-gate/NAME.closed` exists, nginx answers every request for that instance with
`503` + `Retry-After` instead of passing it to vLLM: a sleeping vLLM holds requests forever or
crashes on them (vllm-project/vllm#15483, #45268). `warmctl sleep --gate FILE` closes the gate
BEFORE draining, so requests already streaming finish while new ones are refused; `warmctl wake
--gate FILE` opens it once the server is awake and warm. A failed sleep puts the gate back the
way it was, so a server that stays awake keeps serving.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from warmctl.client import Client
from warmctl.errors import WarmctlError
from warmctl.sleepwake import SleepReport, Step, drain

T = TypeVar("T")


class Gate:
    """open / close / is_closed on one flag file (closing twice or opening twice is a no-op)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.name or self.path.name in (".", ".."):
            raise WarmctlError(f"gate {str(path)!r}: not a file name", kind="input")

    def __repr__(self) -> str:
        return f"Gate({str(self.path)!r})"

    def is_closed(self) -> bool:
        return self.path.exists()

    def close(self, reason: str = "closed") -> bool:
        """Create the flag (atomically); True if the gate was open before."""
        was_open = not self.is_closed()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(f"{reason} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
            tmp.chmod(0o644)  # the proxy's workers only test that it exists
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._error("close", exc) from None
        return was_open

    def open(self) -> bool:
        """Remove the flag; True if the gate was closed before."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("open", exc) from None
        return True

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


def open_after(gate: Gate | None, action: Callable[[], T]) -> T:
    """Run `action` (wake + warmup); open the gate (if any) only if it succeeded."""
    result = action()
    if gate is not None:
        gate.open()
    return result


def gate_for(path: str | None, targets: Sequence[object]) -> Gate | None:
    """The `--gate FILE` of a command: one gate belongs to one instance, so one HOST."""
    if path is None:
        return None
    if len(targets) != 1:
        raise WarmctlError(
            f"--gate belongs to one instance: give exactly one HOST, not {len(targets)}",
            kind="input",
        )
    return Gate(path)


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
    report.drain = drain(client, drain_timeout, poll_interval, on_wait=on_wait)
    report.steps.append(Step("drain", report.drain.seconds))
    if not report.drain.drained:
        d = report.drain
        raise WarmctlError(
            f"{client.target.label}: not drained: still {d.running:g} running and "
            f"{d.waiting:g} waiting requests after --drain-timeout {drain_timeout:g} s",
            kind="drain_timeout",
        )
    report.total_s = time.monotonic() - t0
    return report
