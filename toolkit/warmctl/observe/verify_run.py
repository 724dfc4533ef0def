"""`warmctl verify` run: which targets are measured where, with which limits, and the report.

The command (commands/verify.py) only reads its options; here: the targets (HOST arguments
measured from here, inventory hosts measured on themselves unless `--from controller`), each
target's limits (the command line wins, then the inventory's vllm_verify_*), the measurement
(`warmctl.observe.fleet` for the hosts that measure themselves, `warmctl.observe.verify` from here,
several
targets at once), and the report (exit status, textfiles, journald lines, the table or JSON).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmctl.observe.verify import Thresholds
from warmctl.server.target import Target

Inventory = list[tuple[str, dict[str, Any], list[Target]]]


@dataclass(frozen=True)
class Settings:
    """The measurement's options as given (`given`: those not left at their default)."""

    max_first_ttft: float
    max_ratio: float
    max_steady_ttft: float | None
    max_decode_ms: float | None
    steady: int
    max_tokens: int
    decode_tokens: int
    ready_timeout: float
    timeout: float
    model: str | None
    attempts: int
    attempt_pause: float
    wait_ready: bool
    given: frozenset[str] = field(default_factory=frozenset)

    def limits_for(self, t: Target) -> Thresholds:
        """The command line wins, then the inventory's vllm_verify_* of the host."""
        first = t.settings.get("max_first_ttft", self.max_first_ttft)
        ratio = t.settings.get("max_ratio", self.max_ratio)
        return Thresholds(
            self.max_first_ttft if "max_first_ttft" in self.given else first,
            self.max_ratio if "max_ratio" in self.given else ratio,
            self.max_steady_ttft,
            self.max_decode_ms,
        )

    def attempts_for(self, t: Target) -> int:
        if "attempts" in self.given:
            return self.attempts
        return int(t.settings.get("attempts", self.attempts))

    def host_options(self, t: Target) -> dict[str, Any]:
        """The options of a host's own verify (`fleet.verify_argv`): the same measurement,
        the host's limits."""
        limits = self.limits_for(t)
        return {
            "max_first_ttft": float(limits.max_first_ttft_s),
            "max_ratio": float(limits.max_ratio),
            "attempts": self.attempts_for(t),
            "attempt_pause": float(self.attempt_pause),
            "steady": self.steady,
            "max_tokens": self.max_tokens,
            "decode_tokens": self.decode_tokens,
            "ready_timeout": float(self.ready_timeout),
            "timeout": float(self.timeout),
            "model": self.model,
            "max_steady_ttft": self.max_steady_ttft,
            "max_decode_ms": self.max_decode_ms,
        }


def split_targets(
    hosts: Sequence[str], inventory_path: str | None, limit: str | None, measure_from: str
) -> tuple[list[Target], Inventory, list[Target]]:
    """(every target in report order, the inventory hosts that measure themselves, the targets
    measured from here). HOST arguments are measured from here."""
    from warmctl.commands.options import resolve_targets

    inventory: Inventory = []
    if inventory_path is not None and measure_from == "host":
        from warmctl.plan.inventory import inventory_hosts

        targets = resolve_targets(hosts) if hosts else []
        inventory = inventory_hosts(str(inventory_path), limit)
        seen = {t.base_url for t in targets}
        for _, _, host_targets in inventory:
            targets += [t for t in host_targets if t.base_url not in seen]
    else:
        targets = resolve_targets(hosts, inventory_path, limit)
    here = [t for t in targets if not any(t in ts for _, _, ts in inventory)]
    return targets, inventory, here


def measure_on_hosts(
    inventory_path: str,
    inventory: Inventory,
    targets: Sequence[Target],
    settings: Settings,
    *,
    api_key: str | None,
    parallel: int | None,
) -> dict[str, dict[str, Any]]:
    """Each inventory host measures itself (`warmctl.observe.fleet`): base URL -> result. Every
    host at
    once unless told otherwise: --parallel, or the inventory's vllm_verify_throttle (hosts
    that share cores, like a test bed)."""
    from warmctl.observe.fleet import plan, verify_on_hosts

    plans = plan(inventory, settings.host_options, wait_ready=settings.wait_ready)
    throttle = [int(t.settings["parallel"]) for t in targets if t.settings.get("parallel")]
    forks = parallel or (min(throttle) if throttle else len(plans))
    fleet = verify_on_hosts(inventory_path, plans, api_key=api_key, forks=forks)
    flat = [t for p in plans for t in p.targets]
    return {t.base_url: r for t, r in zip(flat, fleet, strict=True)}


def measure_here(
    here: Sequence[Target],
    all_targets: Sequence[Target],
    settings: Settings,
    *,
    api_key: str | None,
    parallel: int | None,
    show: bool,
) -> dict[str, dict[str, Any]]:
    """The targets measured from this machine, --parallel at a time (a line each on a
    terminal): base URL -> result."""
    from warmctl.commands.options import inventory_parallel, per_host
    from warmctl.observe.verify import VerifyReport, verify_attempts
    from warmctl.server.client import Client
    from warmctl.sleepwake.gate import VERIFY_HEADER
    from warmctl.terminal.waits import board, say_of

    if not here:
        return {}

    def one(t: Target, track: Any) -> VerifyReport:
        return verify_attempts(
            Client(t, api_key, settings.timeout, headers={VERIFY_HEADER: "1"}),
            attempts=settings.attempts_for(t),
            pause_s=settings.attempt_pause,
            steady=settings.steady,
            max_tokens=settings.max_tokens,
            decode_tokens=settings.decode_tokens,
            thresholds=settings.limits_for(t),
            ready_timeout=settings.ready_timeout,
            model=settings.model,
            wait_start=settings.wait_ready,
            on_wait=say_of(track(t.label)),
        )

    with board(show) as track:
        reports = per_host(
            here,
            lambda t: one(t, track),
            workers=parallel or inventory_parallel(here or all_targets),
        )
    out = {}
    for t, r in zip(here, reports, strict=True):
        report = r if isinstance(r, VerifyReport) else VerifyReport(t.label, error=str(r))
        out[t.base_url] = report.to_dict()
    return out


def report(
    done: Sequence[Mapping[str, Any]],
    targets: Sequence[Target],
    *,
    as_json: bool,
    asleep_ok: bool,
    textfile_dir: str | None,
    instance_name: str | None,
) -> int:
    """Textfiles, one line per failure on stderr (a warning in the journal for a FAIL), then
    the JSON or the table; the exit status."""
    from warmctl.observe.textfile import write_metrics
    from warmctl.observe.verify import exit_code
    from warmctl.observe.verify_table import results_table, why
    from warmctl.terminal.output import (
        console,
        emit_json,
        error_line,
        journal_attached,
        status_style,
        warning_line,
    )

    code = exit_code(done, asleep_ok=asleep_ok)
    code = max(code, write_metrics(textfile_dir, instance_name, "verify", targets, done))
    in_journal = journal_attached(sys.stderr)
    for d in done:
        if d.get("error"):
            error_line(d["error"])
        elif d["status"] != "PASS" and in_journal:  # `journalctl -p warning` finds it
            warning_line(f"{d['target']}: {d['status']}: {why(d)}")
    if as_json:
        emit_json("verify", list(done), code)
        return code
    if all(d["status"] == "ERROR" for d in done):
        return code  # nothing measured: the one line per host on stderr says it all
    console().print(results_table(done, status_style))
    return code
