"""The benchmark's requests: chat-sized prompts (~110 tokens, the length the baseline used) that
each start with a distinct line, so no request is served from another one's prefix cache."""

from __future__ import annotations

_BODY = (
    "You are the on-call assistant for a platform team that runs language models on its own "
    "GPU hosts. Summarise the incident below for the status page in three short sentences, "
    "name the component that failed, say whether customers saw errors or only higher latency, "
    "and end with the time the service was back to normal. Incident: after the nightly "
    "deploy the inference servers restarted, the first requests waited on kernel compilation, "
    "and the load balancer marked two hosts unhealthy for four minutes before they recovered."
)


def prompt(index: int) -> str:
    """The `index`-th prompt of a run: a unique first line, then the shared body."""
    return f"Ticket {index:05d}-{(index * 7919) % 100003:05d}.\n{_BODY}"
