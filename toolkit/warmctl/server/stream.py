"""Streamed completions with honest timings: a monotonic clock started just before the request
is sent; TTFT is the arrival of the first streamed chunk that carries text."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client


@dataclass
class StreamResult:
    ttft_s: float | None  # None: no chunk carried text
    total_s: float  # request sent -> stream ended
    tokens: int  # completion tokens: the server's usage if it sent one, else text chunks
    chunk_times_s: list[float] = field(default_factory=list)  # per text chunk, from send
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    chat: bool = False

    @property
    def decode_ms_per_token(self) -> float | None:
        """Time between the first and the last text chunk over the tokens generated after the
        first one; None with fewer than two tokens."""
        if len(self.chunk_times_s) < 2 or self.tokens < 2:
            return None
        span = self.chunk_times_s[-1] - self.chunk_times_s[0]
        return span * 1000.0 / (self.tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["decode_ms_per_token"] = self.decode_ms_per_token
        return data


def _chunk_text(obj: dict[str, Any], chat: bool) -> str:
    parts: list[str] = []
    for choice in _choices(obj):
        if not isinstance(choice, dict):
            continue
        if chat:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for key in ("content", "reasoning_content", "reasoning"):
                val = delta.get(key)
                if isinstance(val, str):
                    parts.append(val)
        else:
            val = choice.get("text")
            if isinstance(val, str):
                parts.append(val)
    return "".join(parts)


def _choices(obj: dict[str, Any]) -> list[Any]:
    choices = obj.get("choices")
    return choices if isinstance(choices, list) else []


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None


def _finish(obj: dict[str, Any]) -> str | None:
    for choice in _choices(obj):
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


def stream_completion(
    client: Client,
    model: str,
    prompt: str,
    *,
    max_tokens: int = 16,
    chat: bool = False,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    extra: dict[str, Any] | None = None,
) -> StreamResult:
    """POST a streamed `/v1/completions` (or `/v1/chat/completions` with `chat`) and time it."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(extra or {})
    label = client.target.label
    chunk_times: list[float] = []
    texts: list[str] = []
    usage: dict[str, Any] | None = None
    finish: str | None = None
    with client.stream(path, body) as (t0, lines):  # bounded: Client.stream
        for raw in lines:
            now = time.monotonic()
            line = raw.decode("utf-8", "replace").strip() if raw else ""
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                for _ in lines:  # read the chunked terminator: the connection stays reusable
                    pass
                break
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):
                raise WarmctlError(
                    f"{label}: {path} streamed a line that is not JSON: {data[:80]!r}",
                    kind="protocol",
                ) from None
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                err = obj["error"]
                msg = err.get("message") if isinstance(err, dict) else err
                msg = " ".join(str(msg).split())[:300]
                raise WarmctlError(f"{label}: error during {path} stream: {msg}", kind="server")
            text = _chunk_text(obj, chat)
            if text:
                chunk_times.append(now - t0)
                texts.append(text)
            finish = _finish(obj) or finish
            if isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
    total = time.monotonic() - t0
    tokens = len(chunk_times)
    prompt_tokens = None
    if usage:  # a server's numbers: used only when they are counts
        tokens = _int(usage.get("completion_tokens")) or tokens
        prompt_tokens = _int(usage.get("prompt_tokens"))
    return StreamResult(
        ttft_s=chunk_times[0] if chunk_times else None,
        total_s=total,
        tokens=tokens,
        chunk_times_s=chunk_times,
        prompt_tokens=prompt_tokens,
        finish_reason=finish,
        text="".join(texts),
        chat=chat,
    )


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
