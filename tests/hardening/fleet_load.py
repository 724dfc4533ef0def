"""Client load for the load-balancer tests: N streaming clients in a loop through one address,
counting what they see, and a watch on each host's /health (time out of rotation)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import requests

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import stream_completion
from warmctl.server.target import parse_target


@dataclass
class LoadCounts:
    started: int = 0
    completed: int = 0
    failed: int = 0  # any non-200 the client saw, or a connection error
    cut: int = 0  # a 200 stream that ended short of max_tokens
    longest_wait_s: float = 0.0  # the longest request, sent -> last token (or error)
    errors: Counter[str] = field(default_factory=Counter)
    busy_s: float = 0.0  # the time of every finished request added up
    seconds: float = 0.0  # from the clients' start to this count

    def line(self) -> str:
        return (
            f"started {self.started}, completed {self.completed}, failed {self.failed}, "
            f"cut {self.cut}, longest wait {self.longest_wait_s:.2f} s"
        )

    def rate(self) -> str:
        """Requests per second and the mean number in flight (busy time / wall time)."""
        if self.seconds <= 0:
            return "no time measured"
        return (
            f"{self.started / self.seconds:.1f} requests/s, "
            f"{self.busy_s / self.seconds:.1f} in flight on average"
        )


class StreamLoad:
    """`clients` threads, each streaming completions of exactly `max_tokens` tokens one after
    another through `address` until `stop()` (or `limit_s`, a safety bound). With `pause_s`
    each client waits that long after every request (a user reading the answer) and the
    clients start spread over one pause: the load is bounded (`LoadCounts.rate()`)."""

    def __init__(
        self,
        address: str,
        model: str,
        *,
        clients: int = 16,
        max_tokens: int = 24,
        limit_s: float = 900.0,
        timeout: float = 120.0,
        pause_s: float = 0.0,
    ) -> None:
        self.target = parse_target(address)
        self.model, self.max_tokens, self.timeout = model, max_tokens, timeout
        self.pause_s = pause_s
        self.counts = LoadCounts()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._deadline = self._t0 + limit_s
        self._threads = [
            threading.Thread(target=self._client, args=(i * pause_s / clients,), daemon=True)
            for i in range(clients)
        ]

    def _client(self, delay: float) -> None:
        client = Client(self.target, timeout=self.timeout)
        self._stop.wait(delay)
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            with self._lock:
                self.counts.started += 1
            t0 = time.monotonic()
            try:
                r = stream_completion(
                    client, self.model, "count slowly:", max_tokens=self.max_tokens,
                    ignore_eos=True,
                )  # fmt: skip
                outcome = "completed" if r.tokens == self.max_tokens else "cut"
                why = "" if outcome == "completed" else f"{r.tokens} tokens ({r.finish_reason})"
            except WarmctlError as err:
                outcome, why = "failed", err.message[:160]
            waited = time.monotonic() - t0
            with self._lock:
                c = self.counts
                setattr(c, outcome, getattr(c, outcome) + 1)
                c.longest_wait_s = max(c.longest_wait_s, waited)
                c.busy_s += waited
                if why:
                    c.errors[f"{outcome}: {why}"] += 1
            if self.pause_s:
                self._stop.wait(self.pause_s)

    def start(self) -> StreamLoad:
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def stop(self, join_s: float = 180.0) -> LoadCounts:
        """Stop starting requests, wait for those in flight; a client still hanging after
        `join_s` counts as failed."""
        self._stop.set()
        deadline = time.monotonic() + join_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hanging = sum(t.is_alive() for t in self._threads)
        with self._lock:
            self.counts.failed += hanging
            if hanging:
                self.counts.errors[f"failed: {hanging} client(s) still hanging"] += 1
            self.counts.seconds = time.monotonic() - self._t0
            return self.counts

    def snapshot(self) -> LoadCounts:
        with self._lock:
            c = self.counts
            return LoadCounts(c.started, c.completed, c.failed, c.cut, c.longest_wait_s,
                              Counter(c.errors), c.busy_s,
                              time.monotonic() - self._t0)  # fmt: skip


class RotationWatch:
    """Polls each host's /health every `interval` s (what a health-checking load balancer
    sees) and adds up the time each one answered anything but 200, and its states."""

    def __init__(self, urls: dict[str, str], interval: float = 0.25) -> None:
        self.urls, self.interval = urls, interval
        self.out_s: dict[str, float] = dict.fromkeys(urls, 0.0)
        self.states: dict[str, Counter[str]] = {name: Counter() for name in urls}
        self.all_out_s = 0.0  # time every host was out at once (a rollout of one at a time: 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _state(self, url: str) -> str:
        try:
            r = requests.get(url, timeout=5)
        except requests.RequestException:
            return "unreachable"
        if r.status_code == 200:
            return "serving"
        try:
            return str(r.json().get("state") or r.status_code)
        except ValueError:
            return str(r.status_code)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            out = 0
            for name, url in self.urls.items():
                state = self._state(url)
                self.states[name][state] += 1
                if state != "serving":
                    out += 1
                    self.out_s[name] += time.monotonic() - last
            if out == len(self.urls):
                self.all_out_s += time.monotonic() - last
            last = time.monotonic()
            self._stop.wait(self.interval)

    def start(self) -> RotationWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        return dict(self.out_s)

    def line(self) -> str:
        hosts = "; ".join(
            f"{name} out of rotation {self.out_s[name]:.1f} s ({dict(self.states[name])})"
            for name in self.urls
        )
        return f"{hosts}; all out at once {self.all_out_s:.1f} s"
