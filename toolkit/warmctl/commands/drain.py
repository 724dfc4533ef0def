"""`warmctl drain HOST --gate FILE`"""

from __future__ import annotations

import click

from warmctl.options import (
    drain_timeout_option,
    guard,
    host_options,
    per_host,
    resolve_targets,
)
from warmctl.target import Target


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

    def body() -> int:
        from warmctl.client import Client
        from warmctl.gate import DrainReport, drain_out_of_rotation, gate_for
        from warmctl.output import report_hosts

        targets = resolve_targets(hosts)
        gate = gate_for(gate_path, targets)
        assert gate is not None

        def one(t: Target) -> DrainReport:
            return drain_out_of_rotation(Client(t, api_key, timeout), gate, drain_timeout)

        results = per_host(targets, one)

        def lines(r: DrainReport) -> list[str]:
            if not r.serving:
                return [f"{r.target}: not serving, nothing to drain; gate {r.gate} closed"]
            d = r.drain
            assert d is not None
            if d.drained:
                return [f"{r.target}: drained in {d.seconds:.2f} s; gate {r.gate} closed"]
            return [
                f"{r.target}: NOT drained after --drain-timeout {drain_timeout:g} s: still "
                f"{d.still()}; gate {r.gate} closed"
            ]

        labels = [t.label for t in targets]
        late = any(isinstance(r, DrainReport) and not r.drained for r in results)
        return report_hosts(
            "drain", labels, results, DrainReport, lines, as_json=as_json, ok_code=int(late)
        )

    guard(body)
