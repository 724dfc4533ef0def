"""warmctl: deploy vLLM with systemd and keep the first request as fast as the thousandth."""

__version__ = "0.1.0"
