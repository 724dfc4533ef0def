"""Options every subcommand shares, target resolution, per-host parallelism and the error guard
that turns `WarmctlError` into one line on stderr and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import click

from warmctl.errors import WarmctlError
from warmctl.server.target import Target, parse_target
from warmctl.sleepwake.gate import CAUSES

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def host_options(*, inventory: bool = False) -> Callable[[F], F]:
    """HOST... plus --api-key/--timeout/--json (and --inventory/--limit)."""

    def deco(fn: F) -> F:
        opts = [
            click.argument("hosts", nargs=-1, metavar="HOST..."),
            click.option(
                "--api-key",
                envvar="VLLM_API_KEY",
                show_envvar=True,
                help="Bearer key of servers started with --api-key.",
            ),
            click.option(
                "--timeout",
                type=click.FloatRange(min=0.1),
                default=30.0,
                show_default=True,
                help="Seconds each HTTP answer may take, whole (a streamed one: 10 times this, "
                "and this between two chunks).",
            ),
            click.option("--json", "as_json", is_flag=True, help="Machine output (raw samples)."),
        ]
        if inventory:
            opts += [
                click.option(
                    "--inventory",
                    "-i",
                    "inventory_path",
                    metavar="FILE",
                    help="Also check every host of this Ansible inventory "
                    "(ansible_host; a port per vllm_service_instances item, or warmctl_port).",
                ),
                click.option(
                    "--limit", "-l", metavar="PATTERN", help="Ansible host pattern for --inventory."
                ),
            ]
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return deco


def drain_timeout_option(past_it: str) -> Callable[[F], F]:
    """--drain-timeout of the commands that drain (sleep, drain); `past_it`: what happens then."""
    return click.option(
        "--drain-timeout",
        type=click.FloatRange(min=0),
        default=60.0,
        show_default=True,
        metavar="S",
        help=f"Seconds to wait for in-flight requests to finish; past it, {past_it}",
    )


def cause_option(action: str) -> Callable[[F], F]:
    """--cause of sleep and wake: what made it happen, in the metrics and the gate's flag."""
    return click.option(
        "--cause",
        type=click.Choice(CAUSES),
        default="manual",
        show_default=True,
        help=f"Why this {action} happens (its window's timer, the waker's idle sleep or a request "
        "that reached the instance asleep, a person): the metrics' cause label "
        f"(warmctl_{action}s_total) and the gate flag's text (`warmctl status --gate-dir`).",
    )


def output_check_option(help_text: str) -> Callable[[F], F]:
    """--output-check FILE of sleep and wake (the greedy answers recorded, then replayed)."""
    return click.option(
        "--output-check",
        "check_file",
        metavar="FILE",
        envvar="WARMCTL_OUTPUT_CHECK",
        show_envvar=True,
        help=help_text,
    )


def one_instance(option: str, given: object, targets: Sequence[Target]) -> None:
    """An option that belongs to one instance (its gate, its recorded answers): one HOST."""
    if given and len(targets) != 1:
        raise WarmctlError(
            f"{option} belongs to one instance: give exactly one HOST, not {len(targets)}",
            kind="input",
        )


def textfile_options(fn: F) -> F:
    """--textfile-dir and --instance: the Prometheus textfile of each instance."""
    opts = [
        click.option(
            "--textfile-dir",
            metavar="DIR",
            envvar="WARMCTL_TEXTFILE_DIR",
            show_envvar=True,
            type=click.Path(file_okay=False, exists=True, writable=True),
            help="Also write the results as Prometheus metrics, one file per instance "
            "(warmctl_INSTANCE.prom), for node_exporter's textfile collector; metrics an "
            "earlier command wrote there are kept. See docs/MONITORING.md.",
        ),
        click.option(
            "--instance",
            "instance_name",
            metavar="NAME",
            envvar="WARMCTL_INSTANCE",
            show_envvar=True,
            help="Instance name the metrics are labelled with (one HOST only; default: the "
            "inventory name, else HOST:PORT).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def check_instance_name(instance_name: str | None, targets: Sequence[Target]) -> None:
    if instance_name and len(targets) > 1:
        raise WarmctlError("--instance names one instance: give one HOST", kind="input")


def resolve_targets(
    hosts: Sequence[str], inventory_path: str | None = None, limit: str | None = None
) -> list[Target]:
    if limit and not inventory_path:
        raise WarmctlError("--limit needs --inventory", kind="input")
    targets = [parse_target(h) for h in hosts]
    if inventory_path:
        from warmctl.plan.inventory import hosts_from_inventory

        targets += hosts_from_inventory(inventory_path, limit)
    if not targets:
        raise WarmctlError(
            "no host given: pass HOST[:PORT] or a URL"
            + (" (or --inventory)" if inventory_path is not None else ""),
            kind="input",
        )
    seen: set[str] = set()
    unique = []
    for t in targets:
        if t.base_url not in seen:
            seen.add(t.base_url)
            unique.append(t)
    return unique


DEFAULT_WORKERS = 16


def inventory_parallel(targets: Sequence[Target]) -> int:
    """Hosts to measure at once: the smallest `vllm_verify_throttle` the inventory gives the
    targets (Target.settings "parallel"), else `DEFAULT_WORKERS`."""
    given = [int(t.settings["parallel"]) for t in targets if t.settings.get("parallel")]
    return max(1, min(given)) if given else DEFAULT_WORKERS


def per_host(
    targets: Sequence[Target], fn: Callable[[Target], T], workers: int = DEFAULT_WORKERS
) -> list[T | WarmctlError]:
    """Run `fn` for each target in parallel; a `WarmctlError` is returned in its slot."""

    def one(t: Target) -> T | WarmctlError:
        try:
            return fn(t)
        except WarmctlError as err:
            return err

    if len(targets) == 1:
        return [one(targets[0])]
    with ThreadPoolExecutor(max_workers=min(workers, len(targets))) as pool:
        return list(pool.map(one, targets))


def guard(fn: Callable[[], int]) -> None:
    """Run the command body; exit with its code; a `WarmctlError` -> one line, its exit code."""
    from warmctl.terminal.output import error_line

    try:
        code = fn()
    except WarmctlError as err:
        error_line(err.message)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    sys.exit(code)
