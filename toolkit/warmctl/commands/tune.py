"""`warmctl tune HOST... | --inventory FILE`"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from warmctl.commands.options import guard, host_options, per_host
from warmctl.errors import WarmctlError
from warmctl.server.target import Target

if TYPE_CHECKING:
    from warmctl.tune import Proposal, Scrape

# target label -> (inventory host, instance name, the host's instances or None, sleeps or None)
Where = dict[str, tuple[str, str, list[dict[str, Any]] | None, bool | None]]
# target label -> False when the inventory says the instance captures no CUDA graphs
Graphs = dict[str, bool]


@click.command(name="tune")
@host_options(inventory=True)
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Scrape /metrics, wait this long (sampling the running/waiting/KV gauges), scrape "
    "again: only the traffic in between counts.",
)
@click.option(
    "--since",
    "since_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Instead of waiting a window: the traffic since the scrapes a earlier "
    "`tune --save FILE` kept (gauge peaks are then not sampled).",
)
@click.option(
    "--save",
    "save_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Keep this run's last scrapes, for a later `tune --since FILE`.",
)
@click.option(
    "--every",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Gauge sampling interval inside the window.",
)
@click.option(
    "--max-padding",
    type=click.FloatRange(min=0.05, max=1.0),
    default=0.25,
    show_default=True,
    help="Padding bound of the capture sizes: a step of n tokens runs in a graph of at most "
    "max(n x (1 + this), n + 7) tokens.",
)
@click.option(
    "--max-capture",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Largest capture size proposed (bigger steps run without a graph).",
)
@click.option(
    "--kv-headroom",
    type=click.FloatRange(min=1.0),
    default=1.5,
    show_default=True,
    help="KV cache of a sleeping instance: this many times the peak it needed.",
)
@click.option(
    "--write",
    "write_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Write the proposals as an inventory snippet (YAML, the roles' variable names): "
    "`ansible-playbook -i INVENTORY -i FILE playbooks/deploy.yml` applies it.",
)
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    inventory_path: str | None,
    limit: str | None,
    window: float,
    since_path: str | None,
    save_path: str | None,
    every: float,
    max_padding: float,
    max_capture: int,
    kv_headroom: float,
    write_path: str | None,
) -> None:
    """Propose capture sizes, scheduler limits, a warmup and a KV cache size from each
    instance's own traffic, read from vLLM's /metrics. Never changes a host.

    Two scrapes of /metrics --window seconds apart (or since a file `--save` wrote) give the
    histograms of tokens per engine step, prompt and generation tokens, running and queue
    time, and the preemptions in between; the running, waiting and KV-usage gauges are
    sampled every --every seconds. Per instance it proposes: cudagraph_capture_sizes covering
    the step sizes traffic reached, within --max-padding, and none it never reached;
    max_num_seqs and --max-num-batched-tokens only when traffic says the current ones are
    wrong; the warmup's prompt lengths and concurrency ramp; and, for instances that sleep, a
    KV cache sized to the peak (a wake re-maps the whole KV cache). Each choice is printed with
    the percentiles it comes from; where vLLM's buckets are too coarse for a choice it says so
    and keeps the current value. See docs/TUNE.md.

    Exit status: 0, or 2 when any host could not be read.
    """

    def body() -> int:
        from warmctl.server.client import Client
        from warmctl.tune import Knobs, Observation, load_scrapes, observe, propose

        ctx = click.get_current_context()
        if since_path and ctx.get_parameter_source("window") is not (
            click.core.ParameterSource.DEFAULT
        ):
            raise WarmctlError("--window and --since exclude each other", kind="input")
        targets, where, graphs = _targets(hosts, inventory_path, limit)
        saved = load_scrapes(since_path) if since_path else None

        def one(t: Target) -> tuple[Proposal, Scrape]:
            from warmctl.tune import parse_scrape

            start = None
            if saved is not None:
                if t.base_url not in saved:
                    raise WarmctlError(
                        f"{t.label}: not in {since_path!r} (it holds "
                        f"{', '.join(saved) or 'nothing'})",
                        kind="input",
                    )
                at, text = saved[t.base_url]
                start = parse_scrape(text, at, t.label)
            obs: Observation
            obs, last = observe(
                Client(t, api_key, timeout), start=start, window_s=window, every_s=every
            )
            knobs = Knobs(
                max_padding, max_capture, kv_headroom, where[t.label][3], graphs.get(t.label, True)
            )
            return propose(obs, knobs), last

        results = per_host(targets, one)
        return _report(targets, results, where, as_json, save_path, write_path, window)

    guard(body)


def _targets(
    hosts: tuple[str, ...], inventory_path: str | None, limit: str | None
) -> tuple[list[Target], Where, Graphs]:
    from warmctl.server.target import parse_target

    if limit and not inventory_path:
        raise WarmctlError("--limit needs --inventory", kind="input")
    targets: list[Target] = []
    where: Where = {}
    graphs: Graphs = {}
    for h in hosts:
        t = parse_target(h)
        targets.append(t)
        where[t.label] = (t.host, str(t.port), None, None)
    if inventory_path:
        from warmctl.plan.instance import inventory_facts
        from warmctl.plan.inventory import INSTANCES_VAR, host_vars, targets_for_host

        loaded = host_vars(inventory_path, limit)
        if not loaded:
            what = f" matching --limit {limit!r}" if limit else ""
            raise WarmctlError(f"inventory {inventory_path!r} has no hosts{what}", kind="input")
        for name, hv in loaded:
            instances = hv.get(INSTANCES_VAR) or None
            for i, t in enumerate(targets_for_host(name, hv)):
                targets.append(t)
                if instances:
                    inst = instances[i]
                    # the roles' sleep rule (warmctl.plan.instance)
                    facts = inventory_facts(inst, hv)
                    graphs[t.label] = facts.gpu and not inst.get("enforce_eager")
                    where[t.label] = (name, str(inst.get("name", i)), instances, facts.sleep)
                else:
                    where[t.label] = (name, str(t.port), None, None)
    if not targets:
        raise WarmctlError(
            "no host given: pass HOST[:PORT] or a URL (or --inventory)", kind="input"
        )
    first: dict[str, Target] = {}
    for t in targets:
        first.setdefault(t.base_url, t)  # one target per door, the first to name it
    return list(first.values()), where, graphs


def _report(
    targets: list[Target],
    results: list[Any],
    where: Where,
    as_json: bool,
    save_path: str | None,
    write_path: str | None,
    window: float,
) -> int:
    from warmctl.terminal.output import console, emit_json, error_line, styled, table
    from warmctl.tune import instance_changes, save_scrapes, snippet

    code = 0
    done: list[Proposal] = []
    lasts: dict[str, Scrape] = {}
    dicts: list[dict[str, Any]] = []
    for t, r in zip(targets, results, strict=True):
        if isinstance(r, WarmctlError):
            code = 2
            error_line(r.message)
            dicts.append({"target": t.label, "error": r.message, "error_kind": r.kind})
            continue
        proposal, last = r
        done.append(proposal)
        lasts[t.base_url] = last
        item = proposal.to_dict()
        host, name, instances, _ = where[t.label]
        base = next((i for i in instances or [] if str(i.get("name")) == name), None)
        item["instance"] = {"host": host, "name": name, "changes": instance_changes(proposal, base)}
        dicts.append(item)
    if save_path and lasts:
        save_scrapes(save_path, lasts)
    if write_path and done:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        header = (
            f"# warmctl tune, {stamp}: {', '.join(p.target for p in done)}\n"
            "# Apply: ansible-playbook -i INVENTORY -i THIS_FILE playbooks/deploy.yml\n"
            "# (a host given by address, not from an inventory, has only the tuned keys: "
            "merge them into its instance)\n"
        )
        try:
            Path(write_path).write_text(snippet(done, where, header), encoding="utf-8")
        except OSError as exc:
            raise WarmctlError(
                f"cannot write {write_path!r}: {exc.strerror}", kind="input"
            ) from None
    if as_json:
        emit_json("tune", dicts, code)
        return code
    out = console()
    for p in done:
        o = p.observation
        rate = o.requests / o.seconds if o.seconds > 0 else 0.0
        out.print(
            styled(
                "[bold]{}[/]: {}",
                p.target,
                f"{o.requests} requests in {o.seconds:.0f} s "
                f"({rate:.2f}/s), {o.steps.count:.0f} engine steps, "
                f"{o.preemptions:.0f} preemptions{', sleeps' if p.sleeps else ''}",
            )
        )
        rows = [
            [
                c.key,
                "keep" if c.keep else _show(c.value),
                _show(c.now),
                c.observed,
                c.why,
            ]
            for c in p.choices
        ]
        out.print(table(None, ["CHOICE", "PROPOSED", "NOW", "OBSERVED", "WHY"], rows))
    if write_path and done:
        out.print(f"inventory snippet written to {write_path}")
    return code


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
