"""The test suite (a package so `tests.double`, the vLLM test double, imports everywhere)."""
