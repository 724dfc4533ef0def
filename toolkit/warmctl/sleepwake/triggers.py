"""Sleep triggers: the causes that sleep or wake an instance on their own, beside its windows
and a person (the idle sleep), each defined once as data in `KINDS`.

A kind says everything the rest of warmctl derives from it: the instance key that turns it on
(its setting, a mapping, in roles/vllm_service/meta/argument_specs.yml), its cause (the
commands' `--cause`, a flag's text, the metrics: warmctl.sleepwake.gate.CAUSES), its action,
its request file in the gate folder (its detector creates it, a path unit starts its service,
the service removes it), whether it needs the proxy and the proxy's activity log, how its
settings are read (which are durations; a sleep's level), the texts its units print, and its
detector in the waker, by name (`module:Class`: the plan never imports the waker).

The generic code iterates over the kinds: the plan (warmctl.plan.instance: a trigger of the
instance with its path and service units; warmctl.plan.units: its service, the proxy's activity
log, the waker's configuration), validation (warmctl.plan.validate), the gate model and the
waker (warmctl.waker.config, warmctl.waker.service). A new trigger: its setting in the argument
spec, a row of `KINDS`, its detector module under warmctl/waker/ (warmctl.waker.detector says
what a detector is given and does).

The wake on request (a request that reaches an instance asleep-and-wakeable) is not a kind: it is
the waker's own job (its hold, warmctl.waker.hold), shared by every trigger whose sleep a request
may end and by the windows with `on_request: wake`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmctl.plan.roles import integer

SLEEP_LEVEL = 1  # vLLM's sleep level of a window or a trigger unless it names one
_DURATION = re.compile(r"^\s*(\d+)\s*(s|sec|m|min|h)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


@dataclass(frozen=True)
class TriggerKind:
    key: str  # the instance's key: a mapping of its settings (the role's argument spec)
    cause: str  # --cause, a flag's text, the metrics (gate.CAUSES)
    action: str  # "sleep" or "wake": what its service does
    request: str  # its request file in the gate folder: NAME.<request>
    detector: str  # its detector in the waker: "module:Class" (warmctl.waker.detector)
    purpose: str  # what its path unit starts its service for ("idle sleep")
    asked: str  # why its service runs, with its settings ("idle for {after} s")
    watch: str  # what the waker does for it, with its settings (the waker unit's comment)
    durations: tuple[str, ...] = ()  # its settings that are durations (seconds in the plan)
    watched: tuple[str, ...] = ()  # the settings its detector reads (the waker's configuration)
    needs_proxy: bool = True  # it sees the requests at the proxy: off (refused) without it
    activity: bool = False  # the proxy's access log of /v1/ goes to the waker (its idle clock)
    wakeable: bool = True  # its sleep leaves the instance asleep-and-wakeable: a request wakes it

    def settings(self, value: Any, name: str) -> dict[str, Any] | None:
        """Its settings from the instance's value (a mapping; anything else, or an empty one:
        off, None): each duration in seconds, and a sleep's level."""
        if not isinstance(value, Mapping) or not value:
            return None
        out: dict[str, Any] = {
            d: duration_seconds(value.get(d), f"{name}: {self.key}.{d}") for d in self.durations
        }
        if self.action == "sleep":
            out["level"] = integer(value.get("level", SLEEP_LEVEL), f"instance {name}: "
                                   f"{self.key}.level")  # fmt: skip
        return out


KINDS: tuple[TriggerKind, ...] = (
    # no /v1/ request finished at the proxy for `after` and none in flight (vLLM /load)
    TriggerKind(
        key="idle_sleep",
        cause="idle",
        action="sleep",
        request="sleep-request",
        detector="warmctl.waker.idle:IdleWatch",
        purpose="idle sleep",
        asked="idle for {after} s",
        watch="after {after} s without one and nothing in flight (vLLM /load) it asks for the "
        "idle sleep; ",
        durations=("after",),
        watched=("after",),
        activity=True,
    ),
)
BY_CAUSE: dict[str, TriggerKind] = {kind.cause: kind for kind in KINDS}


def kind_of(trigger: Mapping[str, Any]) -> TriggerKind | None:
    """The kind of one of the plan's triggers (None: the request wake, the waker's own)."""
    return BY_CAUSE.get(str(trigger.get("cause")))


def duration_seconds(value: Any, what: str) -> int:
    """Seconds of a duration: an integer (seconds) or "90s", "15m"/"15min", "2h"."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        match = _DURATION.match(str(value)) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"{what} must be seconds or a duration such as 15m, got {value!r}")
        seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{what} must be more than 0 seconds, got {value!r}")
    return seconds
