"""Talking to a vLLM server: bounded HTTP, its routes, streamed completions, /metrics, what an
operator types for a server."""
