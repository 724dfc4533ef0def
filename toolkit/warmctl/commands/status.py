"""`warmctl status HOST...`"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import click

from warmctl.commands.options import guard, host_options, per_host, resolve_targets


@click.command(name="status")
@host_options(inventory=True)
@click.option(
    "--gate-dir",
    metavar="DIR",
    envvar="WARMCTL_GATE_DIR",
    show_envvar=True,
    type=click.Path(file_okay=False, exists=True),
    help="On the instance's host: its proxy gate folder (vllm_proxy_gate_dir, /run/vllm-gate). "
    "The STATE column then says the gate's state from its flags (asleep, waking, holding, "
    "warming, draining; closed: the gate shut on a server that is awake), since when and why "
    "(window, idle, request, manual; the level), and whether a request wakes it; needs "
    "--instance (one HOST).",
)
@click.option(
    "--instance",
    "instance_name",
    metavar="NAME",
    envvar="WARMCTL_INSTANCE",
    show_envvar=True,
    help="The instance whose flags --gate-dir holds.",
)
@click.option(
    "--upstream",
    metavar="HOST:PORT",
    envvar="WARMCTL_UPSTREAM",
    show_envvar=True,
    help="On the instance's host: vLLM itself behind the proxy (127.0.0.1:PORT+offset, the "
    "instance's target), asked for its version, served models and sleep state (dev-mode "
    "routes on loopback), which the proxy does not pass on. One HOST.",
)
def command(**params: Any) -> None:
    """Health, served model(s) and max_model_len, vLLM version, state and load.

    The sleep state needs the server's dev-mode routes (VLLM_SERVER_DEV_MODE=1), else
    vllm:engine_sleep_state from /metrics; without either it reads "unknown (dev mode off)".
    Running/waiting requests come from /metrics. Behind the proxy, the gate's state is what
    the proxy answers (asleep, draining, warming, holding: no error), and an instance asleep that
    a request wakes (idle sleep) says so on /health: status then asks it nothing that would
    wake it. On its host, --gate-dir and --instance add the gate's flags (since when and why;
    an instance asleep the CPU way, its unit stopped, is then no error), and --upstream vLLM's
    own version and sleep state.

    Exit status: 0 when every server answered (its proxy included, or it sleeps as its flag
    says), 2 when any did not.
    """
    guard(partial(_status, **params))


def _status(hosts: tuple[str, ...], api_key: str | None, timeout: float, as_json: bool,
            inventory_path: str | None, limit: str | None, gate_dir: str | None,
            instance_name: str | None, upstream: str | None) -> int:  # fmt: skip
    from warmctl.errors import WarmctlError
    from warmctl.observe.status import StatusReport, status
    from warmctl.server.client import Client
    from warmctl.server.target import parse_target
    from warmctl.sleepwake.gate import GateFiles, read_state
    from warmctl.terminal.output import emit_json, error_line

    targets = resolve_targets(hosts, inventory_path, limit)
    gate = upstream_client = None
    if gate_dir:
        if not instance_name or len(targets) != 1:
            raise WarmctlError("--gate-dir needs --instance NAME and one HOST", kind="input")
        gate = read_state(GateFiles(Path(gate_dir), instance_name))
    if upstream:
        if len(targets) != 1:
            raise WarmctlError("--upstream belongs to one HOST", kind="input")
        upstream_client = Client(parse_target(upstream), api_key, timeout)
    results = per_host(
        targets, lambda t: status(Client(t, api_key, timeout), gate, upstream_client)
    )
    reports = [
        r if isinstance(r, StatusReport) else StatusReport(t.label, error=str(r))
        for t, r in zip(targets, results, strict=True)
    ]
    code = 2 if any(r.error for r in reports) else 0
    for r in reports:
        if r.error:
            error_line(r.error)
    if as_json:
        emit_json("status", [r.to_dict() for r in reports], code)
    else:
        _table(reports)
    return code


def _table(reports: list[Any]) -> None:
    from rich.text import Text

    from warmctl.terminal.output import console, num, styled, table

    rows = []
    for r in reports:
        models = ", ".join(m["id"] for m in r.models) or "-"
        lens = ", ".join(num(m.get("max_model_len")) for m in r.models) or "-"
        health: str | Text = "ok" if r.healthy and not r.error else styled("[red]unreachable[/]")
        if r.proxy and not r.error:
            health = f"{r.proxy} (the proxy)"  # the proxy answers for it: the gate's state
        elif not r.healthy and not r.error and r.sleeping:
            health = "asleep (stopped)"  # its flag says asleep: the CPU way
        if r.healthy and r.error:
            health = styled("[red]error[/]")
        state = r.state if not r.error else "-"
        rows.append([r.target, health, models, lens, r.version or "-", state, num(r.running),
                     num(r.waiting)])  # fmt: skip
    headers = ["HOST", "HEALTH", "MODEL", "MAX LEN", "VERSION", "STATE", "RUNNING", "WAITING"]
    console().print(table(None, headers, rows))
