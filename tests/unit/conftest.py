"""Unit tests: pure functions, plus the library against the loopback vLLM double."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # so `tests.double` imports however pytest was started
    sys.path.insert(0, str(ROOT))

from tests.double.fixtures import vllm_double, vllm_double_factory  # noqa: E402, F401
