"""A loopback HTTP test double of a vLLM OpenAI-compatible server (see `server.py`).

    from tests.double import VllmDouble
    with VllmDouble(first_ttft=0.3, ttft=0.02) as srv:
        srv.url  # http://127.0.0.1:PORT

Pytest fixtures `vllm_double` / `vllm_double_factory` live in `tests.double.fixtures`.
"""

from tests.double.server import DoubleConfig, StreamTimes, VllmDouble, wait_until

__all__ = ["DoubleConfig", "StreamTimes", "VllmDouble", "wait_until"]
