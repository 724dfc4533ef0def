"""First request vs steady ones: the one measurement behind `warmctl verify` and the bench.

The first request after a deploy, restart or wake is "the first user request"; the steady ones
follow it one at a time. Their time to first token is compared as first / median of the steady.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from warmctl.server.stream import median

R = TypeVar("R")


def first_then_steady(
    request: Callable[[], R], steady: int, say: Callable[[str], None] | None = None
) -> Iterator[R]:
    """The first request's result, then `steady` more, sent one at a time (each waits for the
    one before it); `say(text)` is told which request is being measured."""
    if say is not None:
        say("measuring the first request")
    yield request()
    for n in range(steady):
        if say is not None:
            say(f"measuring steady request {n + 1} of {steady}")
        yield request()


def first_vs_steady(
    first: float | None, steady: Sequence[float]
) -> tuple[float | None, float | None]:
    """(median of the steady TTFTs, first / that median); None where there is nothing to say."""
    steady_median = median(list(steady))
    if first is None or not steady_median:
        return steady_median, None
    return steady_median, first / steady_median
