"""Unit tests: pure functions, plus the library against the loopback vLLM double."""

from __future__ import annotations

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: F401
