"""The benchmark's view of one server, entirely through warmctl's own library: the client,
its streamed completion (TTFT, per-token timings), and its sleep / wake logic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import StreamResult, stream_completion
from warmctl.server.target import parse_target
from warmctl.sleepwake import outputcheck
from warmctl.sleepwake import steps as sleepwake


@dataclass(frozen=True)
class Sample:
    ttft_s: float
    total_s: float
    completion_tokens: int
    prompt_tokens: int | None
    decode_ms_per_token: float | None
    text: str = ""


class Api:
    def __init__(
        self, base_url: str, model: str, timeout: float = 120.0, check_path: Path | None = None
    ) -> None:
        self.target = parse_target(base_url)
        self.model = model
        self.check_path = check_path  # warmctl's sleep records, its wake checks (outputcheck)
        self.client = Client(self.target, timeout=timeout)
        self.probe_client = Client(self.target, timeout=2.0)

    def ready(self) -> bool:
        """`/health` answers 200 (vLLM only listens once its engine is up)."""
        try:
            self.probe_client.health()
        except WarmctlError:
            return False
        return True

    def connect(self) -> None:
        """Open this thread's keep-alive connection (a `/health` call, the engine is not used)."""
        self.client.health()

    def complete(self, prompt: str, max_tokens: int, ignore_eos: bool = False) -> Sample:
        res: StreamResult = stream_completion(
            self.client, self.model, prompt, max_tokens=max_tokens, ignore_eos=ignore_eos
        )
        if res.ttft_s is None:
            raise WarmctlError(
                f"{self.target.label}: a completion streamed no text", kind="protocol"
            )
        return Sample(
            res.ttft_s,
            res.total_s,
            res.tokens,
            res.prompt_tokens,
            res.decode_ms_per_token,
            res.text,
        )

    def answers(self) -> list[outputcheck.Answer]:
        """The output check's greedy answers (outputcheck.PROMPTS: token ids and logprobs)."""
        model = outputcheck.served_model(self.client)
        return [outputcheck.ask(self.client, model, p) for p in outputcheck.PROMPTS]

    # -- sleep / wake ----------------------------------------------------------------------
    def is_sleeping(self) -> bool:
        return self.client.is_sleeping()

    def sleep_route(self, level: int) -> dict[str, Any]:
        """The bare route, as a plain client would call it."""
        self.client.sleep(level, timeout=300)
        return {}

    def wake_route(self, level: int) -> dict[str, Any]:
        """The bare routes: /wake_up, and after level 2 the weight reload vLLM needs."""
        self.client.wake_up(timeout=300)
        if level >= 2:
            self.client.collective_rpc("reload_weights", timeout=300)
            self.client.reset_prefix_cache()
        return {}

    def sleep(self, level: int) -> dict[str, Any]:
        """warmctl's sleep (drains in-flight requests first); its report."""
        record = outputcheck.recorder(self.client, self.check_path) if self.check_path else None
        return sleepwake.sleep(self.client, level, before_sleep=record).to_dict()

    def wake(self, level: int) -> dict[str, Any]:
        """warmctl's wake (reload after level 2, then its warmup); its report."""
        check = (
            outputcheck.checker(self.client, self.check_path, outputcheck.LOGPROB_TOLERANCE)
            if self.check_path
            else None
        )
        report = sleepwake.wake(self.client, level=level, check=check).to_dict()
        warm = report.get("warmup") or {}
        # keep the step timings, not every warmup request
        report["warmup"] = {k: v for k, v in warm.items() if k in ("total_s", "batch_sizes")}
        return report
