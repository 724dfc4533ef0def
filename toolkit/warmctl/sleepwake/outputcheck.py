"""A wake proven correct: the same greedy answers before the sleep and after the wake.

`/health` answers 200 from a server that wakes with corrupted weights or KV cache (e.g.
vllm-project/vllm-omni#4473: an incomplete wake corrupts generation). So `warmctl sleep
--output-check FILE` records, once the server is drained and before `/sleep`, the greedy
(temperature 0) answers of a few fixed prompts: the token ids and their logprobs as vLLM
returns them (`return_token_ids`, `logprobs`). `warmctl wake --output-check FILE` asks the same
questions after the reload and before the gate reopens; a different token id, or a logprob
further than the tolerance from the recorded one, fails the wake (the gate stays closed).

The prompts run one at a time, alone on a drained (or gated) server, so both sides run the
same batch of one: greedy decoding of the same weights then gives the same tokens.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client

ENV_FILE = "WARMCTL_OUTPUT_CHECK"
FORMAT = 1
# 8 greedy tokens per prompt: a corrupted weight or KV cache shows in the first ones; each token
# is part of the wake -> first token time (H200: 3 x 12 tokens cost 0.14-0.19 s)
MAX_TOKENS = 8
# the largest logprob difference accepted on the same token (bf16 kernels at batch 1 repeat
# exactly; a corrupted weight or KV cache moves logprobs by far more than this)
LOGPROB_TOLERANCE = 0.05
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "List three prime numbers:",
)


@dataclass(frozen=True)
class Answer:
    prompt: str
    text: str
    token_ids: list[int] | None  # None: the server does not return them (older vLLM)
    logprobs: list[float | None] | None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Answer:
        return cls(
            prompt=str(d["prompt"]),
            text=str(d.get("text", "")),
            token_ids=d.get("token_ids"),
            logprobs=d.get("logprobs"),
        )


@dataclass
class Recording:
    target: str
    model: str
    max_tokens: int
    answers: list[Answer]
    recorded_at: str = ""
    format: int = FORMAT
    failed: str = ""  # why the last check failed ("" = it passed or none ran yet)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recording:
        if d.get("format") != FORMAT or not isinstance(d.get("answers"), list):
            raise ValueError(f"not a warmctl output recording (format {d.get('format')!r})")
        return cls(
            target=str(d.get("target", "")),
            model=str(d["model"]),
            max_tokens=int(d["max_tokens"]),
            answers=[Answer.from_dict(a) for a in d["answers"]],
            recorded_at=str(d.get("recorded_at", "")),
            failed=str(d.get("failed") or ""),
        )


@dataclass
class CheckResult:
    """What `verify` found; `status`: passed, failed, not_recorded or other_model."""

    status: str
    prompts: int = 0
    seconds: float = 0.0
    max_logprob_diff: float | None = None
    detail: str = ""
    file: str = ""
    answers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def served_model(client: Client) -> str:
    models = client.models()
    if not models:
        raise WarmctlError(f"{client.target.label}: /v1/models lists no model", kind="protocol")
    return str(models[0]["id"])


def ask(client: Client, model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> Answer:
    """One greedy completion, not streamed, with its token ids and logprobs."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "logprobs": 1,
        "ignore_eos": True,  # a corrupted model that stops at once still shows as different
        "return_token_ids": True,
        "stream": False,
    }
    resp = client.request("POST", "/v1/completions", json_body=body)
    assert resp is not None
    data = client._json(resp, "/v1/completions")
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise WarmctlError(
            f"{client.target.label}: /v1/completions answered no choice", kind="protocol"
        ) from None
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    token_ids = choice.get("token_ids")
    return Answer(
        prompt=prompt,
        text=str(choice.get("text") or ""),
        token_ids=[int(t) for t in token_ids] if isinstance(token_ids, list) else None,
        logprobs=[None if v is None else float(v) for v in logprobs]
        if isinstance(logprobs, list)
        else None,
    )


def record(
    client: Client,
    path: Path,
    prompts: tuple[str, ...] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
) -> Recording:
    """Ask every prompt and write the answers to `path` (atomically, mode 0600).

    Refused while the last check of `path` failed: a server that woke wrong would otherwise
    record its wrong answers at the next sleep and pass the next wake's check."""
    previous = load(path)
    if previous is not None and previous.failed:
        raise WarmctlError(
            f"{client.target.label}: not put to sleep: the last wake failed its output check "
            f"({previous.failed}); restart the instance, then `warmctl wake --output-check "
            f"{path}` checks it again and opens the gate",
            kind="wake_check",
        )
    model = served_model(client)
    answers = [ask(client, model, p, max_tokens) for p in prompts]
    rec = Recording(
        target=client.target.label,
        model=model,
        max_tokens=max_tokens,
        answers=answers,
        recorded_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    _write(rec, path, "not put to sleep")
    return rec


def _write(rec: Recording, path: Path, consequence: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(rec.to_dict(), indent=1) + "\n")
        tmp.chmod(0o600)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise WarmctlError(
            f"cannot write the output recording {path}: {exc.strerror or exc}; {consequence}",
            kind="input",
        ) from None


def load(path: Path) -> Recording | None:
    """The recording at `path`; None when there is none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WarmctlError(
            f"cannot read the output recording {path}: {exc.strerror or exc}", kind="input"
        ) from None
    try:
        return Recording.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise WarmctlError(f"{path}: {exc}", kind="input") from None


def compare(before: Answer, after: Answer, tolerance: float) -> tuple[str | None, float | None]:
    """(why they differ or None, the largest logprob difference on equal tokens)."""
    if before.token_ids is not None and after.token_ids is not None:
        if before.token_ids != after.token_ids:
            pairs = zip(before.token_ids, after.token_ids, strict=False)
            i = next(
                (k for k, (a, b) in enumerate(pairs) if a != b),
                min(len(before.token_ids), len(after.token_ids)),
            )
            return (
                f"token {i + 1} is id {_at(after.token_ids, i)} where "
                f"{_at(before.token_ids, i)} was recorded",
                None,
            )
    elif before.text != after.text:
        return f"answered {after.text[:40]!r} where {before.text[:40]!r} was recorded", None
    diff: float | None = None
    if before.logprobs is not None and after.logprobs is not None:
        pairs = [
            abs(a - b)
            for a, b in zip(before.logprobs, after.logprobs, strict=False)
            if a is not None and b is not None
        ]
        diff = max(pairs) if pairs else None
        if diff is not None and diff > tolerance:
            return f"logprobs moved by up to {diff:.3g} (tolerance {tolerance:g})", diff
    return None, diff


def _at(ids: list[int], i: int) -> str:
    return str(ids[i]) if i < len(ids) else "(none)"


def verify(client: Client, path: Path, tolerance: float = LOGPROB_TOLERANCE) -> CheckResult:
    """Ask the recorded prompts again; raise (kind `wake_check`) when an answer differs."""
    t0 = time.monotonic()
    rec = load(path)
    if rec is None:
        return CheckResult("not_recorded", file=str(path), detail="no recording: not checked")
    model = served_model(client)
    if model != rec.model:
        return CheckResult(
            "other_model",
            file=str(path),
            detail=f"recorded for model {rec.model!r}, the server serves {model!r}: not checked",
        )
    worst: float | None = None
    answers = []
    for n, before in enumerate(rec.answers, 1):
        after = ask(client, model, before.prompt, rec.max_tokens)
        why, diff = compare(before, after, tolerance)
        answers.append({"prompt": n, "token_ids": after.token_ids, "logprob_diff": diff})
        if diff is not None:
            worst = diff if worst is None else max(worst, diff)
        if why:
            what = f"prompt {n} of {len(rec.answers)} {why}"
            rec.failed = (
                f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}: {what}"
            )
            _write(rec, path, "the check failed too")
            raise WarmctlError(
                f"{client.target.label}: the woken server answers differently than before the "
                f"sleep: {what} ({path}); the gate stays closed",
                kind="wake_check",
            )
    if rec.failed:  # checked again (after a restart) and right: sleeps may record again
        rec.failed = ""
        _write(rec, path, "the check passed but stays marked failed")
    return CheckResult(
        "passed",
        prompts=len(rec.answers),
        seconds=time.monotonic() - t0,
        max_logprob_diff=worst,
        file=str(path),
        answers=answers,
    )


def recorder(client: Client, path: Path) -> Callable[[], dict[str, Any]]:
    """`sleepwake.sleep`'s `before_sleep`: record, and say what in the report."""

    def run() -> dict[str, Any]:
        t0 = time.monotonic()
        rec = record(client, path)
        return {
            "status": "recorded",
            "prompts": len(rec.answers),
            "seconds": time.monotonic() - t0,
            "file": str(path),
        }

    return run


def checker(client: Client, path: Path, tolerance: float) -> Callable[[], dict[str, Any]]:
    """`sleepwake.wake`'s `check`: replay, raise on a difference, else the result."""
    return lambda: verify(client, path, tolerance).to_dict()
