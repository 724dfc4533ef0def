"""Real vLLM on CPU and real systemd hosts for the tests and the demo."""
