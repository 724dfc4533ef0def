"""`warmctl status HOST...`"""

from __future__ import annotations

import click

from warmctl.options import guard, host_options, per_host, resolve_targets


@click.command(name="status")
@host_options(inventory=True)
@click.option(
    "--gate-dir",
    metavar="DIR",
    envvar="WARMCTL_GATE_DIR",
    show_envvar=True,
    type=click.Path(file_okay=False, exists=True),
    help="On the instance's host: its proxy gate folder (vllm_proxy_gate_dir, /run/vllm-gate). "
    "The SLEEP column then says since when it sleeps and why (window, idle, request, manual), "
    "and whether a request wakes it; needs --instance (one HOST).",
)
@click.option(
    "--instance",
    "instance_name",
    metavar="NAME",
    envvar="WARMCTL_INSTANCE",
    show_envvar=True,
    help="The instance whose flags --gate-dir holds.",
)
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    inventory_path: str | None,
    limit: str | None,
    gate_dir: str | None,
    instance_name: str | None,
) -> None:
    """Health, served model(s) and max_model_len, vLLM version, sleep state and load.

    The sleep state needs the server's dev-mode routes (VLLM_SERVER_DEV_MODE=1); without them
    it reads "unknown (dev mode off)". Running/waiting requests come from /metrics. Behind the
    proxy, an instance asleep that a request wakes (idle sleep) says so on /health: status
    then asks it nothing that would wake it. On its host, --gate-dir and --instance add since
    when it sleeps and why, from the gate's flag (an instance asleep the CPU way, its unit
    stopped, is then no error).

    Exit status: 0 when every server answered (or sleeps, as its flag says), 2 when any did
    not.
    """

    def body() -> int:
        from rich.text import Text

        from warmctl.client import Client
        from warmctl.errors import WarmctlError
        from warmctl.output import console, emit_json, error_line, num, styled, table
        from warmctl.status import StatusReport, gate_state, status

        targets = resolve_targets(hosts, inventory_path, limit)
        gate = None
        if gate_dir:
            if not instance_name or len(targets) != 1:
                raise WarmctlError("--gate-dir needs --instance NAME and one HOST", kind="input")
            gate = gate_state(gate_dir, instance_name)
        results = per_host(targets, lambda t: status(Client(t, api_key, timeout), gate))
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
            return code
        rows = []
        for r in reports:
            models = ", ".join(m["id"] for m in r.models) or "-"
            lens = ", ".join(num(m.get("max_model_len")) for m in r.models) or "-"
            health: str | Text = (
                "ok" if r.healthy and not r.error else styled("[red]unreachable[/]")
            )
            if not r.healthy and not r.error and r.sleeping:
                health = "asleep (stopped)"  # its flag says asleep: the CPU way
            if r.healthy and r.error:
                health = styled("[red]error[/]")
            rows.append(
                [
                    r.target,
                    health,
                    models,
                    lens,
                    r.version or "-",
                    r.sleep_text if not r.error else "-",
                    num(r.running),
                    num(r.waiting),
                ]
            )
        out = console()
        out.print(
            table(
                None,
                ["HOST", "HEALTH", "MODEL", "MAX LEN", "VERSION", "SLEEP", "RUNNING", "WAITING"],
                rows,
            )
        )
        return code

    guard(body)
