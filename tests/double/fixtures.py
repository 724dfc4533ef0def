"""Pytest fixtures for the vLLM double. Import them into a conftest:

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.double.server import VllmDouble


@pytest.fixture
def vllm_double_factory() -> Iterator[Callable[..., VllmDouble]]:
    """`make(**config)` -> a started double; all are stopped at teardown."""
    started: list[VllmDouble] = []

    def make(**config: Any) -> VllmDouble:
        srv = VllmDouble(**config).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def vllm_double(vllm_double_factory: Callable[..., VllmDouble]) -> VllmDouble:
    """A started double with default config (change `vllm_double.config` in the test)."""
    return vllm_double_factory()
