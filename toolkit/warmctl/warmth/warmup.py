"""Warm a vLLM server so its first user request is as fast as the thousandth: wait until it is
ready, send each prompt once, ramp concurrency over the batch sizes it captured as CUDA graphs,
and exercise the chat route when the model has a chat template."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import StreamResult, stream_completion
from warmctl.server.target import is_loopback
from warmctl.warmth.modelfiles import chat_template
from warmctl.warmth.prompts import PromptSet, resolve_prompts

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
DEFAULT_MAX_BATCH = 64
# progress(phase, done, total): called from worker threads
Progress = Callable[[str, int, int], None]


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    requests: int = 0
    tokens: int = 0
    ttfts_s: list[float] = field(default_factory=list)
    note: str = ""
    began: float = field(default_factory=time.monotonic, repr=False, compare=False)

    def add(self, result: StreamResult) -> None:
        self.requests += 1
        self.tokens += result.tokens
        if result.ttft_s is not None:
            self.ttfts_s.append(result.ttft_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": self.seconds,
            "requests": self.requests,
            "tokens": self.tokens,
            "ttfts_s": self.ttfts_s,
            "note": self.note,
        }


@dataclass
class WarmupReport:
    target: str
    mode: str = "full"  # "full" or "light" (one request per route, no ramp)
    model: str = ""
    max_model_len: int | None = None
    prompt_source: str = ""
    prompts: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    batch_sizes_source: str = ""
    chat: bool | None = None  # None: not tried
    chat_note: str = ""
    phases: list[Phase] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.phases)

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "prompt_source": self.prompt_source,
            "prompts": self.prompts,
            "batch_sizes": self.batch_sizes,
            "batch_sizes_source": self.batch_sizes_source,
            "chat": self.chat,
            "chat_note": self.chat_note,
            "requests": self.requests,
            "total_s": self.total_s,
            "phases": [p.to_dict() for p in self.phases],
        }


def parse_batch_sizes(text: str) -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8] (sorted, unique, each >= 1)."""
    try:
        sizes = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
    except ValueError:
        raise WarmctlError(
            f"bad batch sizes {text!r}: expected numbers separated by commas, e.g. 1,2,4,8",
            kind="input",
        ) from None
    if not sizes or sizes[0] < 1:
        raise WarmctlError(f"bad batch sizes {text!r}: each must be >= 1", kind="input")
    return sizes


def choose_batch_sizes(
    explicit: Sequence[int] | None,
    server_sizes: Sequence[int] | None,
    max_num_seqs: int | None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> tuple[list[int], str]:
    """Explicit sizes win; else the server's captured sizes up to `max_num_seqs` and
    `max_batch`; else the defaults (bounded by `max_num_seqs`)."""
    if explicit:
        return sorted(set(explicit)), "--batch-sizes"
    cap = min(max_batch, max_num_seqs) if max_num_seqs else max_batch
    if server_sizes:
        sizes = sorted({s for s in server_sizes if 1 <= s <= cap})
        return (sizes or [min(server_sizes)]), "server"
    sizes = [s for s in DEFAULT_BATCH_SIZES if s <= cap] or [1]
    return sizes, "default"


def _config_int(config: Any, section: str, key: str) -> int | None:
    if isinstance(config, dict):
        value = (
            (config.get(section) or {}).get(key) if isinstance(config.get(section), dict) else None
        )
        if isinstance(value, int):
            return value
    return None


def _server_facts(client: Client) -> tuple[list[int] | None, int | None]:
    """(captured batch sizes, max_num_seqs) from `/server_info` when dev mode is on. A CPU
    server captures no CUDA graphs: its sizes are ignored (the defaults apply)."""
    from warmctl.server.client import capture_sizes_from_config, device_from_config

    try:
        info = client.server_info()
    except WarmctlError as err:
        if err.kind in ("dev_route", "not_found", "protocol", "bad_request", "generic", "timeout"):
            return None, None
        raise
    config = info.get("vllm_config")
    max_num_seqs = _config_int(config, "scheduler_config", "max_num_seqs")
    if device_from_config(config) == "cpu":
        return None, max_num_seqs
    return capture_sizes_from_config(config), max_num_seqs


def _refuse_if_asleep(client: Client) -> None:
    """A sleeping vLLM holds new requests until woken: warming it would hang."""
    try:
        asleep = client.is_sleeping()
    except WarmctlError as err:
        if err.kind in ("dev_route", "not_found", "protocol"):
            return
        raise
    if asleep:
        raise WarmctlError(
            f"{client.target.label}: the server is asleep; wake it with `warmctl wake` "
            "(which also warms it)",
            kind="asleep",
        )


def _is_no_chat_template(err: WarmctlError) -> bool:
    text = err.message.lower()
    return err.kind == "bad_request" and ("chat template" in text or "chat_template" in text)


def _burst(
    client: Client,
    model: str,
    prompts: Sequence[str],
    size: int,
    max_tokens: int,
    chat: bool,
    tick: Callable[[], None],
    tag: str,
) -> list[StreamResult]:
    """`size` streamed requests released together (a barrier), so the server batches them."""
    barrier = threading.Barrier(size)

    def one(i: int) -> StreamResult:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=30)
        prompt = f"[{tag}-{size}-{i}] {prompts[i % len(prompts)]}"
        result = stream_completion(client, model, prompt, max_tokens=max_tokens, chat=chat)
        tick()
        return result

    with ThreadPoolExecutor(max_workers=size) as pool:
        return list(pool.map(one, range(size)))


def warmup(
    client: Client,
    *,
    prompts: PromptSet | None = None,
    batch_sizes: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_tokens: int = 16,
    chat: bool | None = None,
    ready_timeout: float = 600.0,
    model: str | None = None,
    progress: Progress | None = None,
    light: bool = False,
    completions_warm: bool = False,
    main_pid: int | None = None,
    wait_start: bool = True,
) -> WarmupReport:
    """Warm one server; raises `WarmctlError` if it is not ready or any request fails.

    `prompts`: None -> `WARMCTL_PROMPTS` / `VLLM_PREWARM_PROMPT` / defaults sized to the model.
    `chat`: None -> try the chat route and skip it if the model has no chat template.
    `light`: one short request per route, no ramp (after a wake the server's kernels and CUDA
    graphs are still loaded: a full ramp costs seconds and buys nothing measurable).
    `completions_warm` (light only): the completions route has just answered (a wake's output
    check): warm only the chat route.
    `main_pid`: the server's process (systemd's $MAINPID): stop waiting as soon as it is gone,
    so a server killed during its warmup is restarted at once instead of after the timeout.
    `wait_start`: wait for a server that refuses connections (still starting); else fail.
    """
    report = WarmupReport(target=client.target.label, mode="light" if light else "full")
    started = time.monotonic()
    steps = _Steps(client, report, max_tokens, progress)
    phase = Phase("ready")  # 1. /v1/models answers with a model
    chosen = steps.wait_ready(model, ready_timeout, main_pid, wait_start)
    steps.choose_batch_sizes(light, batch_sizes, max_batch)
    steps.end(phase, note=f"model {report.model}")
    prompt_set = steps.prompt_set(prompts, light)
    steps.each_prompt(prompt_set, skip=light and completions_warm)  # 2.
    steps.ramp(prompt_set)  # 3.
    steps.chat_route(prompt_set, chat, chosen)  # 4.
    report.total_s = time.monotonic() - started
    return report


class _Steps:
    """The steps of one warmup of `client`'s server, in order: each adds what it learns or
    measures to `report` (its phase, timed)."""

    def __init__(
        self, client: Client, report: WarmupReport, max_tokens: int, progress: Progress | None
    ) -> None:
        self.client, self.report, self.max_tokens = client, report, max_tokens
        self.progress = progress
        self._lock = threading.Lock()

    def end(self, phase: Phase, note: str | None = None) -> None:
        """`phase` done: its time since it began, into the report."""
        phase.seconds = time.monotonic() - phase.began
        if note is not None:
            phase.note = note
        self.report.phases.append(phase)

    def tick(self, name: str, total: int) -> Callable[[], None]:
        """One more of `total` requests of phase `name` done (told to `progress`, if any)."""
        done = [0]
        progress = self.progress

        def tick() -> None:
            with self._lock:
                done[0] += 1
                count = done[0]
            if progress:
                progress(name, count, total)

        if progress:
            progress(name, 0, total)
        return tick

    def wait_ready(
        self, model: str | None, ready_timeout: float, main_pid: int | None, wait_start: bool
    ) -> dict[str, Any]:
        """The server's model once /v1/models answers (`model`, else its first), awake."""
        client, report = self.client, self.report
        alive = (lambda: pid_alive(main_pid)) if main_pid else None
        models = client.wait_ready(
            timeout=ready_timeout,
            alive=alive,
            wait_start=wait_start,
            on_wait=getattr(self.progress, "say", None),
        )
        chosen = next((m for m in models if m["id"] == model), None) if model else models[0]
        if chosen is None:
            names = ", ".join(m["id"] for m in models)
            raise WarmctlError(
                f"{client.target.label}: model {model!r} not served (serves: {names})"
            )
        report.model = str(chosen["id"])
        _refuse_if_asleep(client)
        mml = chosen.get("max_model_len")
        report.max_model_len = mml if isinstance(mml, int) else None
        return chosen

    def choose_batch_sizes(
        self, light: bool, batch_sizes: Sequence[int] | None, max_batch: int
    ) -> None:
        report = self.report
        if light:
            report.batch_sizes, report.batch_sizes_source = [], "light: no ramp"
            return
        server_sizes, max_num_seqs = _server_facts(self.client)
        report.batch_sizes, report.batch_sizes_source = choose_batch_sizes(
            batch_sizes, server_sizes, max_num_seqs, max_batch
        )

    def prompt_set(self, prompts: PromptSet | None, light: bool) -> PromptSet:
        """The prompts given, else resolved and sized to the model (one when `light`)."""
        report = self.report
        prompt_set = prompts or resolve_prompts(
            max_model_len=report.max_model_len, max_tokens=self.max_tokens
        )
        if prompt_set.sized:
            prompt_set = fit_sized(
                self.client, report.model, prompt_set, report.max_model_len, self.max_tokens
            )
        if light:
            prompt_set = PromptSet(prompt_set.prompts[:1], prompt_set.source)
        report.prompt_source, report.prompts = prompt_set.source, len(prompt_set.prompts)
        return prompt_set

    def each_prompt(self, prompt_set: PromptSet, skip: bool) -> None:
        """Each prompt once, one at a time (first compile of each prefill shape)."""
        phase = Phase("prompts")
        if skip:
            phase.note = "skipped: the completions route has just answered (output check)"
        else:
            tick = self.tick("prompts", len(prompt_set.prompts))
            for prompt in prompt_set.prompts:
                phase.add(
                    stream_completion(
                        self.client, self.report.model, prompt, max_tokens=self.max_tokens
                    )
                )
                tick()
        self.end(phase)

    def ramp(self, prompt_set: PromptSet) -> None:
        """A concurrency ramp over the batch sizes (none: no phase)."""
        sizes = self.report.batch_sizes
        if not sizes:
            return
        phase = Phase("ramp", note="batch sizes " + ",".join(map(str, sizes)))
        tick = self.tick("ramp", sum(sizes))
        for size in sizes:
            for result in _burst(
                self.client,
                self.report.model,
                prompt_set.prompts,
                size,
                self.max_tokens,
                False,
                tick,
                "warm",
            ):
                phase.add(result)
        self.end(phase)

    def chat_route(self, prompt_set: PromptSet, chat: bool | None, chosen: dict[str, Any]) -> None:
        """The chat route (its own template rendering and detokenizer paths). Asked only when
        the model may have a chat template: vLLM logs a refused chat request as an ERROR
        line."""
        report = self.report
        if chat is None and is_loopback(self.client.target.host):
            has_template, where = chat_template(str(chosen.get("root") or report.model))
            if has_template is False:
                chat = False
                report.chat = False
                report.chat_note = f"skipped: the model has no chat template ({where})"
        if chat is False:
            report.chat_note = report.chat_note or "skipped (--no-chat)"
            return
        phase = Phase("chat")
        tick = self.tick("chat", len(prompt_set.prompts))
        try:
            for prompt in prompt_set.prompts:
                phase.add(
                    stream_completion(
                        self.client, report.model, prompt, max_tokens=self.max_tokens, chat=True
                    )
                )
                tick()
            report.chat = True
        except WarmctlError as err:
            if chat is True or not _is_no_chat_template(err):
                raise
            report.chat = False
            report.chat_note = "skipped: the model has no chat template"
            phase.note = report.chat_note
        self.end(phase)


def tokens_per_word(client: Client, model: str) -> float | None:
    """The server's tokenizer on the generated text (vLLM's /tokenize); None if not served."""
    from warmctl.warmth.prompts import sized_prompts

    words = 400
    (text,) = sized_prompts([words], tokens_per_word=1.0)
    try:
        resp = client.request("POST", "/tokenize", json_body={"model": model, "prompt": text})
    except WarmctlError as err:
        if err.kind in ("not_found", "bad_request", "generic", "auth"):
            return None
        raise
    assert resp is not None
    try:
        count = int(resp.json()["count"])
    except (ValueError, KeyError, TypeError, OverflowError):
        return None
    return count / words if count > 0 else None


def fit_sized(
    client: Client,
    model: str,
    prompt_set: PromptSet,
    max_model_len: int | None,
    max_tokens: int,
) -> PromptSet:
    """Size the --prompt-tokens prompts with the server's own tokenizer (else at the upper
    bound of tokens per word), each within max_model_len."""
    from warmctl.warmth.prompts import TOKENS_PER_WORD, sized_prompts

    ratio = tokens_per_word(client, model)
    lengths = list(prompt_set.sized)
    if max_model_len:
        lengths = [max(1, min(n, max_model_len - max_tokens - 16)) for n in lengths]
    resized = sized_prompts(lengths, tokens_per_word=ratio or TOKENS_PER_WORD)
    given = prompt_set.prompts[: len(prompt_set.prompts) - len(prompt_set.sized)]
    how = f"{ratio:.2f} tokens/word from /tokenize" if ratio else "no /tokenize: 1.5 tokens/word"
    return PromptSet(given + resized, f"{prompt_set.source} ({how})", tuple(lengths))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
