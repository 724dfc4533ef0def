"""`warmctl status HOST...`"""

from __future__ import annotations

import click

from warmctl.options import guard, host_options, per_host, resolve_targets


@click.command(name="status")
@host_options(inventory=True)
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    inventory_path: str | None,
    limit: str | None,
) -> None:
    """Health, served model(s) and max_model_len, vLLM version, sleep state and load.

    The sleep state needs the server's dev-mode routes (VLLM_SERVER_DEV_MODE=1); without them
    it reads "unknown (dev mode off)". Running/waiting requests come from /metrics.

    Exit status: 0 when every server answered, 2 when any did not.
    """

    def body() -> int:
        from warmctl.client import Client
        from warmctl.output import console, emit_json, error_line, num, table
        from warmctl.status import StatusReport, status

        targets = resolve_targets(hosts, inventory_path, limit)
        results = per_host(targets, lambda t: status(Client(t, api_key, timeout)))
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
            health = "ok" if r.healthy and not r.error else "[red]unreachable[/]"
            if r.healthy and r.error:
                health = "[red]error[/]"
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
