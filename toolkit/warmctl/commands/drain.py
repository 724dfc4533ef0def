"""`warmctl drain HOST --gate FILE`: a thin command over
`warmctl.sleepwake.actions.drain_out_of_rotation`."""

from __future__ import annotations

from functools import partial
from typing import Any

import click

from warmctl.commands.options import (
    drain_timeout_option,
    guard,
    host_options,
    one_instance,
    per_host,
    resolve_targets,
)
from warmctl.server.target import Target


@click.command(name="drain")
@host_options()
@click.option(
    "--gate",
    "gate_path",
    metavar="FILE",
    required=True,
    help="The instance's draining flag (one HOST), e.g. /run/vllm-gate/NAME.draining: while it "
    'exists the proxy answers new requests 503 + Retry-After and /health 503 "draining", so '
    "a load balancer moves on. It is left in place: remove it once the instance is back "
    "(a deploy does, after warmctl verify passed).",
)
@drain_timeout_option("exit 1 (the gate stays closed: a restart now cuts what is still running).")
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    gate_path: str,
    drain_timeout: float,
) -> None:
    """Take an instance out of rotation before a restart: close its proxy gate as draining,
    then wait until vllm:num_requests_running and vllm:num_requests_waiting are 0, and so is
    the API server's count of requests in flight (/load: vLLM's --enable-server-load-tracking,
    which the unit always passes; a server without /load is drained on the gauges alone).

    HOST is the vLLM server itself (behind the proxy: 127.0.0.1:PORT+offset on the host). A
    server that does not answer (stopped, starting, engine dead) has nothing in flight: the gate
    is closed and nothing is waited for.

    Exit status: 0 drained (or not serving), 1 requests still in flight after --drain-timeout,
    2 on any error.
    """

    guard(partial(_drain, hosts, api_key, timeout, as_json, gate_path, drain_timeout))


def _drain(hosts: tuple[str, ...], api_key: str | None, timeout: float, as_json: bool,
           gate_path: str, drain_timeout: float) -> int:  # fmt: skip
    from warmctl.sleepwake.actions import DrainReport, drain_lines
    from warmctl.sleepwake.gate import Gate
    from warmctl.terminal.output import report_hosts

    targets = resolve_targets(hosts)
    one_instance("--gate", gate_path, targets)
    gate = Gate(gate_path)
    results = per_host(targets, partial(_one, gate, api_key, timeout, drain_timeout))
    labels = [t.label for t in targets]
    late = any(isinstance(r, DrainReport) and not r.drained for r in results)
    lines = partial(drain_lines, drain_timeout=drain_timeout)
    return report_hosts(
        "drain", labels, results, DrainReport, lines, as_json=as_json, ok_code=int(late)
    )


def _one(gate: Any, api_key: str | None, timeout: float, drain_timeout: float, t: Target) -> Any:
    from warmctl.server.client import Client
    from warmctl.sleepwake.actions import drain_out_of_rotation

    return drain_out_of_rotation(Client(t, api_key, timeout), gate, drain_timeout)
