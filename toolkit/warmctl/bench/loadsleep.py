"""Sleep and wake a server under streaming load, and count what happened to every request.

`clients` threads stream completions back to back. After `lead_s`, warmctl's own sleep runs
behind the instance's gate (`gate.behind_closed_gate`: close the gate, drain, record the
output check, `/sleep`), the server stays asleep `asleep_s`, then warmctl's wake runs (reload,
output check, warmup) and opens the gate (`gate.open_after`); the clients keep going `tail_s`.

The door: on a host, a sleeping instance sits behind the project's proxy, which refuses a new
request with 503 + Retry-After while the gate flag exists (nginx tests the flag once per
request, when it arrives). The bench machine has no nginx, so each client tests the same flag
file just before it sends, like nginx does at arrival, and counts a closed gate as a clean
refusal (and retries after the Retry-After the proxy sends); every request the gate lets
through goes straight to vLLM's own route and must complete.

Counts: started (sent to vLLM), completed (every token streamed), refused (the gate was
closed), cut (a stream that ended early, or broke off), engine errors (vLLM answered 5xx or
an error event). Target: none cut, no engine error."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmctl.bench.api import Api
from warmctl.bench.prompts import prompt
from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import stream_completion
from warmctl.sleepwake import outputcheck
from warmctl.sleepwake import steps as sleepwake
from warmctl.sleepwake.gate import Gate, behind_closed_gate, open_after

DOOR = (
    "the proxy's gate flag, tested by each client just before it sends (as nginx tests it "
    "when a request arrives); requests it lets through go to vLLM's own /v1/completions"
)
RETRY_AFTER_S = 0.25


@dataclass
class Counts:
    started: int = 0
    completed: int = 0
    refused: int = 0
    cut: int = 0
    engine_errors: int = 0
    errors: list[str] = field(default_factory=list)  # the first few error lines

    def add(self, other: Counts) -> None:
        self.started += other.started
        self.completed += other.completed
        self.refused += other.refused
        self.cut += other.cut
        self.engine_errors += other.engine_errors
        self.errors += other.errors[: max(0, 10 - len(self.errors))]


@dataclass
class LoadSleep:
    door: str
    clients: int
    level: int
    max_tokens: int
    counts: Counts
    sleep_s: float
    wake_s: float
    in_flight_at_sleep: int  # streams running when the gate closed
    sleep_report: dict[str, Any]
    wake_report: dict[str, Any]
    output_check: dict[str, Any] | None
    completed_after_wake: int  # requests completed after the gate reopened

    @property
    def clean(self) -> bool:
        return self.counts.cut == 0 and self.counts.engine_errors == 0


class _Client(threading.Thread):
    def __init__(
        self, n: int, api: Api, gate: Gate, stop: threading.Event, max_tokens: int, state: Any
    ) -> None:
        super().__init__(daemon=True, name=f"load-{n}")
        self.n, self.gate, self.stop, self.max_tokens, self.state = n, gate, stop, max_tokens, state
        self.client = Client(api.target, timeout=120.0)
        self.model = api.model
        self.counts = Counts()
        self.after_wake = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            if self.gate.is_closed():
                self.counts.refused += 1
                time.sleep(RETRY_AFTER_S)
                continue
            i += 1
            self.counts.started += 1
            self.state.enter()
            try:
                res = stream_completion(
                    self.client,
                    self.model,
                    prompt(1000 * self.n + i),
                    max_tokens=self.max_tokens,
                    ignore_eos=True,
                )
            except WarmctlError as err:
                status = err.status or 0
                if status >= 500 or err.kind == "server":
                    self.counts.engine_errors += 1
                else:
                    self.counts.cut += 1
                if len(self.counts.errors) < 3:
                    self.counts.errors.append(str(err)[:200])
                continue
            finally:
                self.state.leave()
            if res.tokens >= self.max_tokens and res.finish_reason in ("length", "stop", None):
                self.counts.completed += 1
                if self.state.woken:
                    self.after_wake += 1
            else:
                self.counts.cut += 1
                if len(self.counts.errors) < 3:
                    self.counts.errors.append(
                        f"stream ended after {res.tokens} of {self.max_tokens} tokens "
                        f"(finish_reason {res.finish_reason})"
                    )


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.woken = False

    def enter(self) -> None:
        with self.lock:
            self.in_flight += 1

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


@dataclass(frozen=True)
class Load:
    """The streaming load a sleep and wake run under, and how long each part lasts."""

    clients: int = 16
    max_tokens: int = 64
    lead_s: float = 3.0  # streaming before the sleep
    asleep_s: float = 2.0  # between the sleep and the wake
    tail_s: float = 3.0  # streaming after the wake


def run(
    api: Api, gate_path: Path, check_path: Path, *, level: int = 1, load: Load = Load()
) -> LoadSleep:
    clients, max_tokens = load.clients, load.max_tokens
    gate = Gate(gate_path)
    gate.open()
    stop = threading.Event()
    state = _State()
    threads = [_Client(n, api, gate, stop, max_tokens, state) for n in range(clients)]
    for t in threads:
        t.start()
    sleep_report: dict[str, Any] = {}
    wake_report: dict[str, Any] = {}
    try:
        time.sleep(load.lead_s)
        in_flight = state.in_flight
        t0 = time.monotonic()
        client = api.client
        sleep_report = behind_closed_gate(
            gate,
            lambda: sleepwake.sleep(
                client, level, before_sleep=outputcheck.recorder(client, check_path)
            ),
        ).to_dict()
        sleep_s = time.monotonic() - t0
        time.sleep(load.asleep_s)
        t0 = time.monotonic()
        wake_report = open_after(
            gate,
            lambda: sleepwake.wake(
                client,
                level=level,
                check=outputcheck.checker(client, check_path, outputcheck.LOGPROB_TOLERANCE),
            ),
        ).to_dict()
        state.woken = True
        wake_s = time.monotonic() - t0
        time.sleep(load.tail_s)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    counts = Counts()
    for t in threads:
        counts.add(t.counts)
    warm = wake_report.get("warmup") or {}
    wake_report["warmup"] = {k: v for k, v in warm.items() if k in ("total_s", "batch_sizes")}
    return LoadSleep(
        door=DOOR,
        clients=clients,
        level=level,
        max_tokens=max_tokens,
        counts=counts,
        sleep_s=sleep_s,
        wake_s=wake_s,
        in_flight_at_sleep=in_flight,
        sleep_report=sleep_report,
        wake_report=wake_report,
        output_check=wake_report.get("output_check"),
        completed_after_wake=sum(t.after_wake for t in threads),
    )


def summary(res: LoadSleep) -> str:
    c = res.counts
    check = (res.output_check or {}).get("status", "not run")
    return (
        f"{res.clients} clients, L{res.level}: started {c.started}, completed {c.completed}, "
        f"refused {c.refused}, cut {c.cut}, engine errors {c.engine_errors}; "
        f"{res.in_flight_at_sleep} in flight when the gate closed, sleep {res.sleep_s:.2f} s, "
        f"wake {res.wake_s:.2f} s, output check {check}"
    )
