"""A quick look at a server: health, models, version, sleep state, load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warmctl.client import Client
from warmctl.errors import WarmctlError

DEV_MODE_OFF = "unknown (dev mode off)"


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

    @property
    def sleep_text(self) -> str:
        if self.sleeping is None:
            return self.sleep_note or "unknown"
        if self.sleeping:
            return f"asleep (level {self.sleep_level})" if self.sleep_level else "asleep"
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
            "running": self.running,
            "waiting": self.waiting,
            "error": self.error,
            "error_kind": self.error_kind,
        }


def status(client: Client) -> StatusReport:
    """Never raises `WarmctlError`: a failure is kept in `error` (the first one met)."""
    report = StatusReport(target=client.target.label)
    try:
        client.health()
        report.healthy = True
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
        report.error, report.error_kind = err.message, err.kind
    return report
