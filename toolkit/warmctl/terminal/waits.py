"""Waits that say what they wait for: one live line per host on a terminal's stderr (what it
waits for, and for how long so far), nothing when stderr is piped or the output is --json.

`board(enabled)` yields `track(label) -> Tracker | None`. A tracker is the warmup's progress
callback (`tracker(phase, done, total)`: a bar) and also `tracker.say(text)`: a wait's own
line (the ready wait, the drain, a wake's steps, verify's measurements and attempts). The
elapsed column counts from the host's first line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from warmctl.terminal.termsafe import safe

Say = Callable[[str], None]


class Tracker:
    def __init__(self, progress: Any, label: str) -> None:
        self._progress = progress
        self._label = label
        self._task = progress.add_task(safe(f"{label}: starting", one_line=True), total=None)

    def __call__(self, phase: str, done: int, total: int) -> None:
        self._progress.update(
            self._task, description=safe(f"{self._label}: {phase}", one_line=True),
            completed=done, total=total,
        )  # fmt: skip

    def say(self, text: str) -> None:
        """A wait's line: it may quote a server's answer (escaped, never markup)."""
        self._progress.update(
            self._task, description=safe(f"{self._label}: {text}", one_line=True),
            completed=0, total=None,
        )  # fmt: skip


@contextmanager
def board(enabled: bool) -> Iterator[Callable[[str], Tracker | None]]:
    """Live lines on stderr when `enabled` and stderr is a terminal; else trackers are None."""
    from warmctl.terminal.output import console

    err = console(stderr=True)
    if not enabled or not err.is_terminal:
        yield lambda label: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column
    from rich.text import Text

    class Bar(BarColumn):  # a wait has no total: no bar, the words say it
        def render(self, task: Any) -> Any:
            return super().render(task) if task.total is not None else Text("")

    class Count(MofNCompleteColumn):
        def render(self, task: Any) -> Any:
            return super().render(task) if task.total is not None else Text("")

    with Progress(
        SpinnerColumn(),
        # the description takes what the other columns leave, cut with "…" on a narrow terminal
        TextColumn(
            "{task.description}",
            markup=False,  # a description may quote a server: plain text (Tracker escapes it)
            table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
        ),
        Bar(bar_width=12),
        Count(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        expand=True,
    ) as progress:
        yield lambda label: Tracker(progress, label)


def say_of(tracker: Tracker | None) -> Say | None:
    return tracker.say if tracker is not None else None
