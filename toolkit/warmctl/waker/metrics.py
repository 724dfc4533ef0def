"""The waker's metrics: prometheus_client's own Counter/Gauge/Histogram in a registry of its own,
written to `DIR/warmctl_NAME.waker.prom` (node_exporter's textfile collector reads every *.prom).

A file of its own, not the instance's shared `warmctl_NAME.prom`: the waker runs for weeks and
its counters live in its memory, while the commands' file is rewritten by each command under a
lock (warmctl.observe.textfile); two writers of one file would have to merge on every request held.
The
labels are the same as the commands' (vllm_instance, model, host: the model is read back from the
instance's shared file, which the unit's warmup fills). Written at most once a second, and at
exit, with `write_to_textfile` (a temporary file renamed over the old one).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile
from prometheus_client.metrics_core import Metric

from warmctl.errors import WarmctlError
from warmctl.observe.textfile import file_name, read_samples

# what a held request's hold ended with (the 204 answers "awake" are not held: not counted)
OUTCOMES = ("woke", "failed", "timeout", "refused", "gone")
# ... of a request held across a restart or relaunch (the holding flag): served by the new server,
# 503 because no server answered once it ended, 503 past the hold bound
RELAUNCH_OUTCOMES = ("relaunched", "relaunch-failed", "relaunch-timeout")
# why a wake the waker asked for failed
FAILURES = ("failed", "timeout", "ask")
# what the door's bound did to a connection past it (warmctl.waker.connections.Storm)
PAST_BOUND = ("idle", "refused", "descriptors")
# a GPU wake is under a second to seconds, a CPU one a start + warmup (minutes)
HOLD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# every series the waker writes (docs/MONITORING.md lists the same; a test compares them)
METRICS: dict[str, str] = {
    "warmctl_waker_held_requests_total": "Requests that reached the instance asleep and were "
    "held, by outcome (woke: served after the wake; failed, timeout, refused: answered 503; "
    "gone: nginx gave up on it).",
    "warmctl_waker_hold_seconds": "How long requests were held, by outcome.",
    "warmctl_waker_holding_requests": "Requests held now.",
    "warmctl_waker_wakes_asked_total": "Wakes the waker asked for (a request reached the "
    "instance asleep).",
    "warmctl_waker_failed_wakes_total": "Wakes the waker asked for that failed, by reason "
    "(failed: the wake ended with the instance still asleep; timeout: not awake within the "
    "hold; ask: the request file could not be written).",
    "warmctl_waker_idle_sleeps_asked_total": "Idle sleeps the waker asked for.",
    "warmctl_waker_last_activity_timestamp_seconds": "When the proxy last told the waker of a "
    "request vLLM answered (Unix time; 0: none since the waker started).",
    "warmctl_waker_past_bound_connections_total": "Connections past the door's bound of "
    "connections (a storm), by what the bound did (idle: an idle connection closed to make "
    "room; refused: every connection held a request, nginx answered 503; descriptors: accept() "
    "found no free descriptor).",
}


def waker_file(directory: str | os.PathLike[str], instance: str) -> Path:
    """`DIR/warmctl_NAME.waker.prom`: an instance name has no dot, so it names no other file."""
    return Path(directory) / (file_name(instance).removesuffix(".prom") + ".waker.prom")


class _Labelled:
    """The registry's families with the instance's labels added to every sample (and without
    prometheus_client's `_created` series: a restart of the waker already shows as a reset)."""

    def __init__(self, inner: CollectorRegistry, labels: dict[str, str]) -> None:
        self.inner, self.labels = inner, labels

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                out.add_sample(s.name, {**self.labels, **s.labels}, s.value, s.timestamp)
            yield out


class WakerMetrics:
    def __init__(self, instance: str, textfile_dir: str | None, interval: float = 1.0) -> None:
        self.instance, self.textfile_dir, self.interval = instance, textfile_dir, interval
        self.registry = CollectorRegistry(auto_describe=True)
        r, doc = self.registry, METRICS.__getitem__
        self.held = Counter(
            "warmctl_waker_held_requests",
            doc("warmctl_waker_held_requests_total"),
            ["outcome"],
            registry=r,
        )
        self.hold_seconds = Histogram(
            "warmctl_waker_hold_seconds",
            doc("warmctl_waker_hold_seconds"),
            ["outcome"],
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.holding = Gauge(
            "warmctl_waker_holding_requests", doc("warmctl_waker_holding_requests"), registry=r
        )
        self.wakes_asked = Counter(
            "warmctl_waker_wakes_asked", doc("warmctl_waker_wakes_asked_total"), registry=r
        )
        self.failed_wakes = Counter(
            "warmctl_waker_failed_wakes",
            doc("warmctl_waker_failed_wakes_total"),
            ["reason"],
            registry=r,
        )
        self.idle_sleeps_asked = Counter(
            "warmctl_waker_idle_sleeps_asked",
            doc("warmctl_waker_idle_sleeps_asked_total"),
            registry=r,
        )
        self.last_activity = Gauge(
            "warmctl_waker_last_activity_timestamp_seconds",
            doc("warmctl_waker_last_activity_timestamp_seconds"),
            registry=r,
        )
        self.past_bound = Counter(
            "warmctl_waker_past_bound_connections",
            doc("warmctl_waker_past_bound_connections_total"),
            ["what"],
            registry=r,
        )
        # every series from the start: rate() and alerts see 0, not none
        for outcome in OUTCOMES + RELAUNCH_OUTCOMES:
            self.held.labels(outcome)
            self.hold_seconds.labels(outcome)
        for reason in FAILURES:
            self.failed_wakes.labels(reason)
        for what in PAST_BOUND:
            self.past_bound.labels(what)
        self._dirty = asyncio.Event()
        self._model = ""
        self.write_error: str | None = None

    # -- what happened --------------------------------------------------------------------
    def held_one(self, outcome: str, seconds: float) -> None:
        self.held.labels(outcome).inc()
        self.hold_seconds.labels(outcome).observe(seconds)
        self.changed()

    def connection_past_bound(self, what: str) -> None:
        self.past_bound.labels(what).inc()
        self.changed()

    def activity(self) -> None:
        self.last_activity.set(time.time())
        self.changed()

    def changed(self) -> None:
        self._dirty.set()

    # -- the file -------------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        return waker_file(self.textfile_dir, self.instance) if self.textfile_dir else None

    def _labels(self) -> dict[str, str]:
        if not self._model and self.textfile_dir:  # the unit's warmup tells the model
            shared = Path(self.textfile_dir) / file_name(self.instance)
            self._model = next((dict(k[1]).get("model", "") for k in read_samples(shared)), "")
        return {"vllm_instance": self.instance, "model": self._model, "host": socket.gethostname()}

    def write(self) -> None:
        """Write the file now (nothing without a textfile folder); raises WarmctlError."""
        path = self.path
        if path is None:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Labelled(self.registry, self._labels()))  # type: ignore[arg-type]
        old_mask = os.umask(0o022)  # readable by node_exporter's user whatever the unit's UMask
        try:
            write_to_textfile(str(path), registry)
        except OSError as err:
            raise WarmctlError(
                f"cannot write metrics to {str(path)!r}: {err.strerror or err}", kind="input"
            ) from None
        finally:
            os.umask(old_mask)

    async def writer(self) -> None:
        """Write the file whenever something changed, at most once every `interval` s; one
        line when writing starts failing (not one per change), one when it works again."""
        from warmctl.terminal.output import info_line, warning_line

        self._dirty.set()
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self.write()
            except WarmctlError as err:
                if self.write_error is None:
                    warning_line(f"{self.instance}: {err.message} (retrying)")
                self.write_error = err.message
            else:
                if self.write_error is not None:
                    info_line(f"{self.instance}: metrics written again to {self.path}")
                self.write_error = None
            await asyncio.sleep(self.interval)
