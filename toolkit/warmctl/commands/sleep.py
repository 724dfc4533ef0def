"""`warmctl sleep HOST...`"""

from __future__ import annotations

import click

from warmctl.options import guard, host_options, per_host, resolve_targets


@click.command(name="sleep")
@host_options()
@click.option(
    "--level",
    type=click.IntRange(1, 2),
    default=1,
    show_default=True,
    help="1: weights to CPU memory, KV cache dropped. 2: weights and KV cache dropped "
    "(wake reloads the weights from disk).",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Seconds to wait for in-flight requests to finish; past it, the server is NOT put "
    "to sleep.",
)
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    level: int,
    drain_timeout: float,
) -> None:
    """Drain in-flight requests, then put a server to sleep.

    Waits until vllm:num_requests_running and vllm:num_requests_waiting are 0 (vLLM crashes or
    hangs when sleep races live requests), then POST /sleep?level=N and confirms with
    /is_sleeping. Already asleep: nothing to do. Needs a server started with
    VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode.

    Exit status: 0 asleep, 2 on any error (a drain that timed out included).
    """

    def body() -> int:
        from warmctl.client import Client
        from warmctl.output import console, emit_json, error_line
        from warmctl.sleepwake import DEFAULT_OP_TIMEOUT, SleepReport, sleep

        targets = resolve_targets(hosts)
        results = per_host(
            targets,
            lambda t: sleep(
                Client(t, api_key, timeout),
                level=level,
                drain_timeout=drain_timeout,
                op_timeout=max(timeout, DEFAULT_OP_TIMEOUT),
            ),
        )
        code = 0
        out = console()
        dicts = []
        for t, r in zip(targets, results, strict=True):
            if not isinstance(r, SleepReport):
                code = 2
                error_line(str(r))
                dicts.append({"target": t.label, "error": str(r), "error_kind": r.kind})
                continue
            dicts.append(r.to_dict())
            if as_json:
                continue
            if r.already_asleep:
                out.print(f"{r.target}: already asleep, nothing to do")
            else:
                steps = ", ".join(f"{s.name} {s.seconds:.2f} s" for s in r.steps)
                out.print(f"{r.target}: asleep at level {r.level} ({steps})")
        if as_json:
            emit_json("sleep", dicts, code)
        return code

    guard(body)
