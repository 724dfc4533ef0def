"""A quick look at a server: health, models, version, sleep state, load; on its host, the proxy
gate's flags too (since when it sleeps, and why)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmctl.client import PROXY_ASLEEP_WAKEABLE, Client
from warmctl.errors import WarmctlError
from warmctl.gate import FlagInfo, read_flag

DEV_MODE_OFF = "unknown (dev mode off)"
# the gate's flags of an instance (warmctl.facts: gate, wakeable, warming, draining), strongest
# first: what the proxy answers is the first one that exists
GATE_FLAGS = (("asleep", "closed"), ("asleep", "wakeable"), ("warming", "warming"),
              ("draining", "draining"))  # fmt: skip


@dataclass
class GateState:
    """What the instance's flags in the gate folder say (on its host: `--gate-dir`)."""

    state: str  # open, asleep, warming, draining
    flag: FlagInfo | None = None
    wakes_on_request: bool = False

    @property
    def text(self) -> str:
        if self.flag is None:
            return self.state
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.flag.since))
        why = [self.flag.cause] if self.flag.cause else []
        if self.state == "asleep":
            why.append("a request wakes it" if self.wakes_on_request else "requests refused")
        return f"{self.state} since {since}" + (f" ({'; '.join(why)})" if why else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.flag.since if self.flag else None,
            "cause": self.flag.cause if self.flag else None,
            "wakes_on_request": self.wakes_on_request,
            "flag": str(self.flag.path) if self.flag else None,
        }


def gate_state(gate_dir: str | Path, instance: str) -> GateState:
    for state, suffix in GATE_FLAGS:
        flag = read_flag(Path(gate_dir) / f"{instance}.{suffix}")
        if flag is not None:
            return GateState(state, flag, wakes_on_request=suffix == "wakeable")
    return GateState("open")


@dataclass
class StatusReport:
    target: str
    healthy: bool = False
    models: list[dict[str, Any]] = field(default_factory=list)  # id, max_model_len
    version: str | None = None
    sleeping: bool | None = None
    sleep_level: int | None = None
    sleep_note: str = ""
    running: float | None = None
    waiting: float | None = None
    error: str | None = None
    error_kind: str | None = None
    wakes_on_request: bool = False  # the proxy holds requests and wakes it
    gate: GateState | None = None

    @property
    def sleep_text(self) -> str:
        asleep_flag = self.gate is not None and self.gate.state == "asleep"
        if asleep_flag and self.sleeping is not False:
            assert self.gate is not None
            level = f" (level {self.sleep_level})" if self.sleep_level else ""
            return self.gate.text.replace("asleep", f"asleep{level}", 1)
        if self.sleeping is None:
            return self.sleep_note or "unknown"
        if self.sleeping:
            text = f"asleep (level {self.sleep_level})" if self.sleep_level else "asleep"
            return text + (" (a request wakes it)" if self.wakes_on_request else "")
        return "awake"

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "healthy": self.healthy,
            "models": self.models,
            "version": self.version,
            "sleeping": self.sleeping,
            "sleep_level": self.sleep_level,
            "sleep": self.sleep_text,
            "wakes_on_request": self.wakes_on_request,
            "gate": self.gate.to_dict() if self.gate else None,
            "running": self.running,
            "waiting": self.waiting,
            "error": self.error,
            "error_kind": self.error_kind,
        }


def status(client: Client, gate: GateState | None = None) -> StatusReport:
    """Never raises `WarmctlError`: a failure is kept in `error` (the first one met). `gate`:
    the instance's flags, read on its host. An instance asleep behind its proxy that a request
    would wake is not asked anything that would (/v1/*)."""
    report = StatusReport(target=client.target.label, gate=gate)
    if gate is not None and gate.state == "asleep":
        report.wakes_on_request = gate.wakes_on_request
    try:
        said = client.health()
        report.healthy = True
        if said == PROXY_ASLEEP_WAKEABLE:
            report.sleeping = report.wakes_on_request = True
            metrics = client.metrics()  # vLLM's own, through the proxy: no wake
            report.running, report.waiting = metrics.running, metrics.waiting
            report.sleep_level = metrics.sleep_level if metrics.sleep_level in (1, 2) else None
            return report
        report.models = [
            {"id": m["id"], "max_model_len": m.get("max_model_len")} for m in client.models()
        ]
        report.version = client.version()
        metrics = client.metrics()
        report.running, report.waiting = metrics.running, metrics.waiting
        try:
            report.sleeping = client.is_sleeping()
        except WarmctlError as err:
            if err.kind != "dev_route":
                raise
            report.sleep_note = DEV_MODE_OFF
        if report.sleeping and metrics.sleep_level in (1, 2):
            report.sleep_level = metrics.sleep_level
    except WarmctlError as err:
        if gate is not None and gate.state == "asleep" and err.kind in ("refused", "asleep"):
            report.sleeping = True  # asleep the CPU way (stopped), or the proxy refuses: no error
            return report
        report.error, report.error_kind = err.message, err.kind
    return report
