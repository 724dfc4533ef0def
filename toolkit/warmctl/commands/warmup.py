"""`warmctl warmup HOST...`"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from warmctl.commands.options import (
    guard,
    host_options,
    per_host,
    resolve_targets,
    textfile_options,
)
from warmctl.commands.warmup_options import warmup_kwargs, warmup_options

if TYPE_CHECKING:
    from warmctl.warmth.warmup import WarmupReport


@click.command(name="warmup")
@host_options()
@warmup_options
@textfile_options
def command(
    hosts: tuple[str, ...],
    api_key: str | None,
    timeout: float,
    as_json: bool,
    textfile_dir: str | None,
    instance_name: str | None,
    **options: object,
) -> None:
    """Wait until a server is ready, then warm it with real-shaped traffic.

    Ready means /v1/models lists the model (/health answers before the model is loaded). Then:
    each prompt once; bursts of concurrent streamed requests over the batch sizes the server
    captured as CUDA graphs; the same on /v1/chat/completions when the model has a chat
    template. Prints what was sent and how long each phase took.

    A server that refuses connections is reported at once unless --wait-ready is given (the
    unit's ExecStartPost gives it: the server is still starting). On a terminal, each host's
    line says what it waits for and for how long.

    Exit status: 0 when every server is warm, 2 on any error.
    """

    def body() -> int:
        from warmctl.commands.options import check_instance_name
        from warmctl.observe.textfile import write_metrics
        from warmctl.server.client import Client
        from warmctl.terminal.output import emit_json, error_line
        from warmctl.warmth.warmup import WarmupReport, warmup

        kwargs = warmup_kwargs(**options)  # type: ignore[arg-type]
        targets = resolve_targets(hosts)
        check_instance_name(instance_name, targets)
        with_progress = not as_json
        from warmctl.commands.warmup_options import progress_display

        with progress_display(with_progress) as make:
            results = per_host(
                targets,
                lambda t: warmup(Client(t, api_key, timeout), progress=make(t.label), **kwargs),
            )
        code = 0
        for r in results:
            if not isinstance(r, WarmupReport):
                code = 2
                error_line(str(r))
        code = max(code, write_metrics(textfile_dir, instance_name, "warmup", targets, results))
        if as_json:
            emit_json(
                "warmup",
                [
                    r.to_dict()
                    if isinstance(r, WarmupReport)
                    else {"target": t.label, "error": str(r), "error_kind": r.kind}
                    for t, r in zip(targets, results, strict=True)
                ],
                code,
            )
            return code
        _print_reports([r for r in results if isinstance(r, WarmupReport)])
        return code

    guard(body)


def _print_reports(reports: list[WarmupReport]) -> None:
    """One table per warm server: its phases, what each sent and took."""
    from warmctl.server.stream import median
    from warmctl.terminal.output import console, ms, secs, table

    out = console()
    for r in reports:
        title = (
            f"{r.target}: warm in {r.total_s:.1f} s — model {r.model}, "
            f"max_model_len {r.max_model_len or '?'}, {r.prompts} prompt(s) from "
            f"{r.prompt_source}, batch sizes {','.join(map(str, r.batch_sizes))} "
            f"({r.batch_sizes_source})"
        )
        rows = [
            [p.name, secs(p.seconds), str(p.requests), str(p.tokens), ms(median(p.ttfts_s)), p.note]
            for p in r.phases
        ]
        out.print(
            table(title, ["PHASE", "TIME", "REQUESTS", "TOKENS", "MEDIAN TTFT", "NOTE"], rows)
        )
