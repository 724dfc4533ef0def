"""The warmup options `warmup` and `wake` share, and the terminal progress display."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def wait_ready_option() -> Callable[[F], F]:
    return click.option(
        "--wait-ready/--no-wait-ready",
        "wait_ready",
        default=False,
        show_default=True,
        envvar="WARMCTL_WAIT_READY",
        show_envvar=True,
        help="Wait up to --ready-timeout for a server that refuses connections or does not "
        "answer yet (one still starting: the unit's own warmup and the deploy's verify ask "
        "for this). Without it such a host is reported at once, in one line, exit 2 (one "
        "that does not answer at all: after --timeout); a server that answers but is still "
        "loading its model is waited for either way.",
    )


def warmup_options(fn: F) -> F:
    opts = [
        click.option(
            "--prompt",
            "prompts",
            multiple=True,
            metavar="TEXT",
            help="A warmup prompt (repeatable). Default: $WARMCTL_PROMPTS, $VLLM_PREWARM_PROMPT, "
            "else short, medium and long prompts bounded by max_model_len.",
        ),
        click.option(
            "--prompt-file",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="Prompts from a file: a JSON list of strings, or paragraphs separated by a "
            "blank line.",
        ),
        click.option(
            "--prompt-tokens",
            metavar="N,N,...",
            help="Also warm with one generated prompt of about each of these many tokens "
            "(the prompt lengths `warmctl tune` read from the host's traffic).",
        ),
        click.option(
            "--batch-sizes",
            metavar="N,N,...",
            help="Concurrency ramp. Default: the CUDA-graph capture sizes the server reports "
            "(dev mode), else 1,2,4,8,16,32.",
        ),
        click.option(
            "--max-batch",
            type=click.IntRange(min=1),
            default=64,
            show_default=True,
            help="Largest burst taken from the server's capture sizes.",
        ),
        click.option(
            "--max-tokens",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Tokens generated per warmup request.",
        ),
        click.option(
            "--chat/--no-chat",
            default=None,
            help="Warm /v1/chat/completions too. Default: when the model has a chat template.",
        ),
        click.option(
            "--ready-timeout",
            type=click.FloatRange(min=0),
            default=1800.0,
            show_default=True,
            help="Seconds to wait for the server to list its model on /v1/models.",
        ),
        wait_ready_option(),
        click.option("--model", metavar="NAME", help="Served model to warm (default: the first)."),
        click.option(
            "--main-pid",
            type=click.IntRange(min=1),
            envvar="MAINPID",
            show_envvar=True,
            metavar="PID",
            help="Stop waiting as soon as this process (the server) exits. Default: $MAINPID, "
            "which systemd sets for ExecStartPost.",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def warmup_kwargs(
    prompts: tuple[str, ...],
    prompt_file: str | None,
    batch_sizes: str | None,
    max_batch: int,
    max_tokens: int,
    chat: bool | None,
    ready_timeout: float,
    model: str | None,
    main_pid: int | None = None,
    wait_ready: bool = False,
    prompt_tokens: str | None = None,
) -> dict[str, Any]:
    """Validate the options (a missing prompt file fails before any server is contacted)."""
    from warmctl.warmth.prompts import (
        PromptSet,
        parse_prompt_tokens,
        resolve_prompts,
        sized_prompts,
    )
    from warmctl.warmth.warmup import parse_batch_sizes

    kwargs: dict[str, Any] = {
        "max_batch": max_batch,
        "max_tokens": max_tokens,
        "chat": chat,
        "ready_timeout": ready_timeout,
        "wait_start": wait_ready,
        "model": model,
    }
    if main_pid:
        kwargs["main_pid"] = main_pid
    if prompts or prompt_file:
        kwargs["prompts"] = resolve_prompts(prompts, prompt_file, max_tokens=max_tokens)
    if prompt_tokens:
        lengths = parse_prompt_tokens(prompt_tokens)
        given: PromptSet | None = kwargs.get("prompts")
        kwargs["prompts"] = PromptSet(
            (given.prompts if given else []) + sized_prompts(lengths),
            (given.source + " + " if given else "") + f"--prompt-tokens {prompt_tokens}",
            tuple(lengths),
        )
    if batch_sizes:
        kwargs["batch_sizes"] = parse_batch_sizes(batch_sizes)
    return kwargs


@contextmanager
def progress_display(enabled: bool) -> Iterator[Callable[[str], Any]]:
    """Yields `make(label) -> tracker | None` (warmctl.terminal.waits.board): live lines on stderr
    when
    it is a terminal, nothing otherwise."""
    from warmctl.terminal.waits import board

    with board(enabled) as make:
        yield make
