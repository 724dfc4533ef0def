"""A quick look at a server: health, models, version, sleep state, load. Behind its proxy, the
gate's state (warmctl.sleepwake.gate): what the proxy answers, and on the instance's host its flags
(since
when, and why) and vLLM itself on loopback (its version and sleep state, which the proxy does
not pass on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.sleepwake.gate import FLAGS, WAKEABLE_HEALTH, GateState

DEV_MODE_OFF = "unknown (dev mode off)"
GATE_STATES = {k.state for k in FLAGS}  # the proxy answers for the instance (not "stopped")
# what the proxy's own answer (no flag read) says of each gate state
PROXY_TEXT = {
    "asleep": "the proxy's gate: requests refused",
    "holding": "a restart or relaunch runs: requests held",
    "warming": "the unit's warmup runs",
    "draining": "out of rotation for a restart",
}


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
    gate: GateState | None = None  # the flags, read on the instance's host
    proxy: str | None = None  # the gate state the proxy answered with (warmctl.sleepwake.gate)

    @property
    def state(self) -> str:
        """The instance's state: the flags' first (`FLAGS`' precedence), else the proxy's
        answer, else the server's own sleep state."""
        g = self.gate
        if g is not None and g.state != "awake":
            if g.state in ("asleep", "waking") and self.sleeping is False:
                return g.text.replace(g.state, "closed (the server is awake)", 1)
            level = f" (level {self.sleep_level})" if self.sleep_level else ""
            return g.text.replace(g.state, f"{g.state}{level}", 1)
        if self.proxy == "asleep" and self.sleeping is False:
            return "closed (the proxy's gate; the server is awake)"
        if self.proxy in PROXY_TEXT:
            level = f"level {self.sleep_level}; " if self.sleep_level else ""
            return f"{self.proxy} ({level}{PROXY_TEXT[self.proxy]})"
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
            "sleep": self.state,
            "wakes_on_request": self.wakes_on_request,
            "gate": self.gate.to_dict() if self.gate else None,
            "proxy": self.proxy,
            "running": self.running,
            "waiting": self.waiting,
            "error": self.error,
            "error_kind": self.error_kind,
        }


def status(
    client: Client, gate: GateState | None = None, upstream: Client | None = None
) -> StatusReport:
    """Never raises `WarmctlError`: a failure is kept in `error` (the first one met). `gate`:
    the instance's flags, read on its host; `upstream`: vLLM itself behind the proxy (on its
    host), asked for its version and sleep state. An instance asleep behind its proxy that a
    request would wake is not asked anything that would (/v1/*)."""
    report = StatusReport(target=client.target.label, gate=gate)
    if gate is not None and gate.state in ("asleep", "waking"):
        report.wakes_on_request = gate.wakes_on_request
    try:
        _door(client, report)
    except WarmctlError as err:
        if err.gate in GATE_STATES and err.status == 503:
            report.proxy = err.gate  # the proxy answers for the instance: a state, no error
            report.sleeping = True if err.gate == "asleep" else None
            _behind_gate(client, report)
        elif gate is not None and gate.state in ("asleep", "waking") and err.kind == "refused":
            report.sleeping = True  # asleep the CPU way (its unit stopped): no error
        else:
            report.error, report.error_kind = err.message, err.kind
    if upstream is not None:
        _upstream(upstream, report)
    return report


def _door(client: Client, report: StatusReport) -> None:
    said = client.health()
    report.healthy = True
    metrics = None
    if said == WAKEABLE_HEALTH:
        report.sleeping = report.wakes_on_request = True
        metrics = client.metrics()  # vLLM's own, through the proxy: no wake
    else:
        report.models = [
            {"id": m["id"], "max_model_len": m.get("max_model_len")} for m in client.models()
        ]
        report.version = client.version()
        metrics = client.metrics()
        try:
            report.sleeping = client.is_sleeping()
        except WarmctlError as err:
            if err.kind != "dev_route":
                raise
            # behind the proxy (its dev routes are 404): vLLM's own gauge, if it has one
            state = metrics.sleep_state
            report.sleeping = None if state is None else state != "awake"
            report.sleep_note = DEV_MODE_OFF
    report.running, report.waiting = metrics.running, metrics.waiting
    if report.sleeping and metrics.sleep_level in (1, 2):
        report.sleep_level = metrics.sleep_level


def _behind_gate(client: Client, report: StatusReport) -> None:
    """The proxy answers for the instance (its gate is shut): vLLM's own /metrics still pass
    it (no wake), for its load and sleep level; a stopped server has none."""
    try:
        metrics = client.metrics()
    except WarmctlError:
        return
    report.running, report.waiting = metrics.running, metrics.waiting
    if metrics.sleep_state is not None:
        report.sleeping = metrics.sleep_state != "awake"
        report.sleep_level = metrics.sleep_level if report.sleeping else None


def _upstream(upstream: Client, report: StatusReport) -> None:
    """vLLM on loopback behind the proxy: its version, sleep state and level (dev mode)."""
    try:
        report.version = upstream.version() or report.version
        if not report.models:
            report.models = [{"id": m["id"], "max_model_len": m.get("max_model_len")}
                             for m in upstream.models()]  # fmt: skip
        metrics = upstream.metrics()
        report.sleeping = upstream.is_sleeping()
    except WarmctlError as err:
        if report.error is None and not (report.sleeping and err.kind == "refused"):
            report.error, report.error_kind = err.message, err.kind
        return
    if report.running is None:
        report.running, report.waiting = metrics.running, metrics.waiting
    report.sleep_level = metrics.sleep_level if report.sleeping else None
