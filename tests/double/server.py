"""A real HTTP server on loopback that speaks vLLM's routes, with controllable delays, states and
failures, so the CLI's measurements and error paths can be tested without a GPU.

Routes: /health, /v1/models, /version, /load (vLLM's in-flight count of the API server,
`{"server_load": N}`: with `server_load_tracking` the generation requests entered and not yet
sent in full, else always 0; 404 when `load_route` is off, as on older vLLM), /metrics
(Prometheus text with the
vllm:num_requests_running/waiting gauges, vllm:engine_sleep_state, a
vllm:time_to_first_token_seconds histogram, and the traffic families `warmctl tune` reads:
tokens per engine step, prompt/generation tokens, running/queue time, preemptions, KV usage,
vllm:cache_config_info; `record_traffic` fills them with any shape, and every streamed
request adds its own prompt/generation tokens and steps), streaming /v1/completions and
/v1/chat/completions (SSE), /tokenize (a prompt's words are its tokens), and the dev-mode
routes /is_sleeping, /sleep, /wake_up, /collective_rpc, /reset_prefix_cache, /server_info
(404 unless `dev_mode`). Every request's body is read as a real server reads it
(Content-Length or chunked, whatever the method): a body is never taken for the next request
on a kept-alive connection, so a test through the proxy sees the desyncs vLLM would.

Non-streamed `/v1/completions` answer greedy token ids (`return_token_ids`) and logprobs that
depend only on the prompt; `corrupt_answers` / `logprob_drift` make a wake that went wrong.

Like vLLM: a stream's 200 headers go out before the engine counts it: for
`admission_delay` seconds it is only in /load, not yet in vllm:num_requests_running (vLLM
tokenises it and queues it to the engine core, whose gauges move after a step). The API key
guards only /v1/*; `/sleep` aborts in-flight streams (its default
mode), so a client that sleeps without draining cuts them (counted in `aborted`); after a
level-2 sleep the weights are garbage until `reload_weights` (outputs then count in
`garbage_outputs`); a sleeping engine refuses generation.

What a client may see before the double counts it: like vLLM, a stream is `completed` (and its
tokens are in /metrics) before its last token is sent, so a client that read it all finds it
counted; the in-flight counts (`admitted` for /load, `in_flight` for the gauges) drop only
after the last byte is sent, which the client may read first: wait for them with
`srv.wait_for(lambda: ..., "what")`, a poll with a deadline. `counters.streams` keeps each
stream's moments (`StreamTimes`) on the shared monotonic clock: a baseline measured in the same
test, for bounds that hold on a loaded machine.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DEV_ROUTES = {
    "/is_sleeping",
    "/sleep",
    "/wake_up",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/server_info",
}
# dev routes that go to the engine core (a dead engine answers 500 there)
ENGINE_ROUTES = {"/is_sleeping", "/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache"}
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide "
    "a chat template if the tokenizer does not define one."
)
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# a request's body as the double reads it (any method): past these, 400 and the connection closed
BODY_LIMIT = 64 * 1024 * 1024
LINE_LIMIT = 65536
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
# vLLM's own defaults (vllm/v1/metrics/buckets.py)
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)


def request_token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 series up to max_model_len (build_1_2_5_buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)


@dataclass
class DoubleConfig:
    """Knobs; change them on a running double (`srv.config.ttft = 0.05`)."""

    model: str = "double-model"
    max_model_len: int = 4096
    version: str = "0.26.0"
    first_ttft: float | None = None  # TTFT of the first generation (and the first after a wake)
    ttft: float = 0.0  # TTFT of later generations
    token_delay: float = 0.0  # between streamed tokens
    dev_mode: bool = True  # VLLM_SERVER_DEV_MODE=1
    sleep_mode: bool = True  # --enable-sleep-mode (reported by /server_info)
    device: str = "cuda"  # /server_info's device_config.device
    api_key: str | None = None  # --api-key: /v1/* need "Authorization: Bearer KEY"
    engine_dead: bool = False  # /health 503, generation 500
    chat_template: bool = True
    capture_sizes: list[int] | None = field(default_factory=lambda: [1, 2, 4, 8])
    max_num_seqs: int = 256
    server_info_text: bool = False  # old vLLM: vllm_config only as str()
    sleep_state_metric: bool = True  # export vllm:engine_sleep_state
    not_ready_until: float = 0.0  # monotonic time before which /health and /v1/models say 503
    sleep_delay: float = 0.0  # time /sleep takes
    wake_delay: float = 0.0
    extra_waiting: int = 0  # added to vllm:num_requests_waiting
    extra_running: int = 0  # added to vllm:num_requests_running
    server_load_tracking: bool = False  # --enable-server-load-tracking: /load counts
    load_route: bool = True  # /load exists (older vLLM: 404)
    # a stream's 200 headers are sent, then it waits this long before the engine gauges count
    # it (tokenising, queued to the engine core); /load counts it all along
    admission_delay: float = 0.0
    # then, if set, it waits until the test sets this event (an admission as long as the test
    # needs, whatever the machine's load)
    admission_hold: threading.Event | None = None
    empty_first_chunk: bool = False  # completions: a first chunk with text "" before the TTFT
    corrupt_answers: bool = False  # greedy answers change one token (a wake that went wrong)
    logprob_drift: float = 0.0  # added to every logprob of an answer (same tokens)
    max_num_batched_tokens: int = 8192  # /server_info's scheduler_config
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc
    num_gpu_blocks: int = 10000  # vllm:cache_config_info
    block_size: int = 16
    # per-family bucket bounds (vLLM's --custom-histogram-buckets); None: vLLM's defaults
    step_buckets: tuple[float, ...] | None = None
    request_token_buckets: tuple[float, ...] | None = None
    raw: dict[str, RawReply] = field(default_factory=dict)  # path -> this answer, as is
    # called with the count as each streamed generation is admitted (in its request's thread,
    # before its first token): a test's event at an exact point, such as a sleep mid-measurement
    on_generation: Callable[[int], None] | None = None


@dataclass(frozen=True)
class RawReply:
    """An answer sent as is, whatever the request (the fuzz tests' garbage): `cut` announces
    more bytes than it sends, then closes the connection (a truncated body or SSE stream)."""

    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    cut: bool = False


@dataclass
class StreamTimes:
    """One streamed request's moments on the double's monotonic clock (the tests' clock too):
    a baseline the tests compare a client's measurement with, whatever the machine's load."""

    start: float  # the request was parsed, before its 200 headers
    first_token: float | None = None  # its first token chunk was written
    last_token: float | None = None  # its last token chunk was written
    end: float | None = None  # its last byte was sent (or the client went away)
    tokens: int = 0

    def ttft_s(self) -> float:
        """The double's own time to first token: from the request's start to its first token
        chunk written (inf if it never wrote one)."""
        return float("inf") if self.first_token is None else self.first_token - self.start

    def decode_ms_per_token(self) -> float | None:
        """The double's own decode pace: first to last token chunk over the later tokens."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) * 1000.0 / (self.tokens - 1)


@dataclass
class Counters:
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path?query)
    prompts: list[str] = field(default_factory=list)  # prompt / last user message, in order
    connections: int = 0  # TCP connections accepted
    generations: int = 0
    # streams that ended normally: counted, like the engine's metrics, as the last token is
    # decided, before its chunk is written (a client that read the whole stream sees them)
    completed: int = 0
    aborted: int = 0  # streams the server cut (sleep in their middle)
    client_gone: int = 0  # streams whose client went away
    in_flight: int = 0  # streams the engine gauges count (vllm:num_requests_running)
    admitted: int = 0  # generation requests in the API server (/load with tracking)
    max_in_flight: int = 0
    concurrency_seen: set[int] = field(default_factory=set)
    chat_generations: int = 0
    garbage_outputs: int = 0
    sleeps: list[int] = field(default_factory=list)
    wakes: list[tuple[str, ...]] = field(default_factory=list)
    rpcs: list[str] = field(default_factory=list)
    prefix_resets: int = 0
    sleep_with_in_flight: int = 0  # /sleep calls that found streams in flight
    answers: int = 0  # non-streamed completions (the output check's greedy answers)
    streams: list[StreamTimes] = field(default_factory=list)  # in the order they came


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Return once `condition()` is true; fail the test, naming `what`, after `timeout` s. A
    poll with a generous deadline, not a sleep: a loaded machine only makes it slower."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.005)


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # like uvicorn's backlog: a burst of connections queues, not resets
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is no error of the double's (no traceback on
        stderr, where the CLI tests look for the CLI's own)."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class VllmDouble:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, config: DoubleConfig | None = None, **kw: Any
    ) -> None:
        self.config = config or DoubleConfig(**kw)
        self.counters = Counters()
        self.lock = threading.Lock()
        # engine state
        self.awake_tags: set[str] = {"weights", "kv_cache"}
        self.sleep_level = 0
        self.weights_valid = True
        self.first_pending = True
        self._registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self._running = Gauge(
            "vllm:num_requests_running", "Running.", labels, registry=self._registry
        )
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Waiting.", labels, registry=self._registry
        )
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self._registry,
        )
        cfg = self.config

        def hist(name: str, doc: str, buckets: Any) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self._registry)

        tok = cfg.request_token_buckets or request_token_buckets(cfg.max_model_len)
        self._steps = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            cfg.step_buckets or STEP_BUCKETS,
        )
        self._prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok
        )
        self._generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok
        )
        self._inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self._queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self._e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self._preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption.",
            labels,
            registry=self._registry,
        )
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage.", labels, registry=self._registry
        )
        self._cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "gpu_memory_utilization", "engine"],
            registry=self._registry,
        )
        self._sleep_gauge = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state.",
            [*labels, "sleep_state"],
            registry=self._registry,
        )
        self._server = _Server((host, port), _handler(self))
        # a short poll: stop() returns at once (the fuzz tests start one double per example)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._sockets: set[socket.socket] = set()  # open client connections

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def close_connections(self) -> None:
        """Close every open client connection (idle keep-alive ones included), as a server
        process that exits does; call after `stop` to play a restart."""
        with self.lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> VllmDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for(self, condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
        """Return once `condition()` is true (`wait_until`): for what the double counts after
        a client may have seen it (the in-flight counts drop once the last byte is sent, as
        vLLM's do), or a state a test waits for before it acts."""
        wait_until(condition, what, timeout)

    # -- state helpers --------------------------------------------------------------------
    @property
    def is_sleeping(self) -> bool:
        return self.awake_tags != {"weights", "kv_cache"}

    def put_to_sleep(self, level: int) -> None:
        """Make the engine asleep directly (as if slept before the test)."""
        with self.lock:
            self.awake_tags = set()
            self.sleep_level = level
            if level == 2:
                self.weights_valid = False

    def sleep_state(self) -> str:
        if not self.is_sleeping:
            return "awake"
        return "discard_all" if self.sleep_level == 2 else "weights_offloaded"

    def metrics_text(self) -> bytes:
        lv = (self.config.model, "0")
        with self.lock:
            self._running.labels(*lv).set(self.counters.in_flight + self.config.extra_running)
            self._waiting.labels(*lv).set(self.config.extra_waiting)
            self._kv_usage.labels(*lv).set(self.config.kv_usage)
            self._cache_info.labels(
                str(self.config.block_size), str(self.config.num_gpu_blocks), "0.9", "0"
            ).set(1)
            if self.config.sleep_state_metric:
                state = self.sleep_state()
                for s in ("awake", "weights_offloaded", "discard_all"):
                    self._sleep_gauge.labels(*lv, s).set(1 if s == state else 0)
        return generate_latest(self._registry)

    def record_traffic(
        self,
        prompt_tokens: list[int] | tuple[int, ...] = (),
        generation_tokens: list[int] | tuple[int, ...] = (),
        steps: list[int] | tuple[int, ...] = (),
        running_s: float = 0.0,
        queue_s: float = 0.0,
        preemptions: int = 0,
    ) -> None:
        """Count requests (their prompt/generation tokens, each `running_s` running and
        `queue_s` queued) and engine steps of the given token counts, as vLLM would."""
        lv = (self.config.model, "0")
        for n in prompt_tokens:
            self._prompt_tokens.labels(*lv).observe(n)
            self._inference.labels(*lv).observe(running_s)
            self._queue.labels(*lv).observe(queue_s)
            self._e2e.labels(*lv).observe(running_s + queue_s)
        for n in generation_tokens:
            self._generation_tokens.labels(*lv).observe(n)
        for n in steps:
            self._steps.labels(*lv).observe(n)
        if preemptions:
            self._preemptions.labels(*lv).inc(preemptions)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.labels(self.config.model, "0").observe(seconds)

    def server_info(self, text: bool) -> dict[str, Any]:
        cfg = self.config
        comp: dict[str, Any] = {"level": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}
        if cfg.capture_sizes is not None:
            comp["cudagraph_capture_sizes"] = sorted(cfg.capture_sizes, reverse=True)
        config = {
            "model_config": {
                "model": cfg.model,
                "max_model_len": cfg.max_model_len,
                "enable_sleep_mode": cfg.sleep_mode,
            },
            "device_config": {"device": cfg.device},
            "scheduler_config": {
                "max_num_seqs": cfg.max_num_seqs,
                "max_num_batched_tokens": cfg.max_num_batched_tokens,
            },
            "compilation_config": comp,
        }
        if text or cfg.server_info_text:
            vllm_config: Any = (
                f"model={cfg.model!r}, max_seq_len={cfg.max_model_len}, "
                f"enable_sleep_mode={cfg.sleep_mode}, device_config={cfg.device}, "
                f"compilation_config={comp!r}"
            )
        else:
            vllm_config = config
        return {
            "vllm_config": vllm_config,
            "vllm_env": {"VLLM_SERVER_DEV_MODE": True},
            "system_env": {},
        }


def _handler(double: VllmDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        raw_body = b""  # the request's body, read whatever the method (parse_request)

        def setup(self) -> None:
            super().setup()
            with double.lock:
                double.counters.connections += 1
                double._sockets.add(self.connection)
            # like uvicorn: no Nagle delay between the headers and the first small SSE chunk
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def finish(self) -> None:
            with double.lock:
                double._sockets.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        # -- framing --------------------------------------------------------------------------
        def parse_request(self) -> bool:
            """The request line and headers, then its whole body, whatever the method (as
            uvicorn's parser does): a body is never read as the next request on the connection.
            Bad framing: 400 and the connection closed."""
            self.raw_body = b""
            if not super().parse_request():
                return False
            try:
                self.raw_body = self._read_body()
            except ValueError as err:
                self.send_error(400, f"Invalid HTTP request: {err}")  # Connection: close
                return False
            return True

        def _read_body(self) -> bytes:
            lengths = self.headers.get_all("Content-Length") or []
            coding = self.headers.get_all("Transfer-Encoding") or []
            if coding:
                if lengths:
                    raise ValueError("Content-Length and Transfer-Encoding")
                if [c.strip().lower() for c in coding] != ["chunked"]:
                    raise ValueError(f"Transfer-Encoding {', '.join(coding)}")
                return self._read_chunked()
            if not lengths:
                return b""
            if len(set(lengths)) != 1 or not lengths[0].strip().isdigit():
                raise ValueError(f"Content-Length {', '.join(lengths)}")
            length = int(lengths[0])
            if length > BODY_LIMIT:
                raise ValueError(f"a body of {length} bytes")
            data = self.rfile.read(length)
            if len(data) != length:
                raise ValueError("the body ended early")
            return data

        def _read_chunked(self) -> bytes:
            out = bytearray()
            while True:
                line = self.rfile.readline(LINE_LIMIT)
                size = line.split(b";", 1)[0].strip()
                if not line.endswith(b"\r\n") or not CHUNK_SIZE.fullmatch(size):
                    raise ValueError(f"chunk size line {line[:40]!r}")
                n = int(size, 16)
                if n == 0:
                    break
                if len(out) + n > BODY_LIMIT:
                    raise ValueError("a chunked body too large")
                chunk = self.rfile.read(n)
                if len(chunk) != n or self.rfile.read(2) != b"\r\n":
                    raise ValueError("a chunk ended early")
                out += chunk
            while True:  # trailers, up to the empty line
                line = self.rfile.readline(LINE_LIMIT)
                if line == b"\r\n":
                    return bytes(out)
                if not line.endswith(b"\r\n"):
                    raise ValueError("the trailers ended early")

        # -- helpers ------------------------------------------------------------------------
        def _send(self, code: int, body: Any = None, ctype: str = "application/json") -> None:
            if isinstance(body, bytes):
                data = body
            elif body is None:
                data = b""
            else:
                data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_raw(self, reply: RawReply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body) + (100 if reply.cut else 0)))
            if reply.cut:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(reply.body)

        def _error(self, code: int, message: str, kind: str = "BadRequestError") -> None:
            self._send(
                code, {"error": {"message": message, "type": kind, "param": None, "code": code}}
            )

        def _body(self) -> Any:
            raw = self.raw_body
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError:
                return None

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            path, query = parts.path, parse_qs(parts.query)
            with double.lock:
                double.counters.requests.append((method, self.path))
            cfg = double.config
            body = self._body() if method == "POST" else {}
            raw = cfg.raw.get(path)
            if raw is not None:
                self._send_raw(raw)
                return
            if path in DEV_ROUTES and not cfg.dev_mode:
                self._send(404, {"detail": "Not Found"})
                return
            auth = self.headers.get("Authorization")
            if path.startswith("/v1/") and cfg.api_key and auth != f"Bearer {cfg.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return
            if cfg.engine_dead and path in ENGINE_ROUTES:
                self._error(500, ENGINE_DEAD, "EngineDeadError")
                return
            not_ready = time.monotonic() < cfg.not_ready_until
            handler = ROUTES.get((method, path))
            if handler is None:
                known = any(p == path for _, p in ROUTES)
                self._send(405 if known else 404, {"detail": "Not Found"})
                return
            if not_ready and path in ("/health", "/v1/models", "/v1/completions"):
                self._send(503, b"")
                return
            handler(self, query, body)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        # FastAPI's answers to another method: 405 on a known path, else 404 (never HEAD: its
        # answer would carry a body; BaseHTTPRequestHandler answers 501 and closes)
        def do_PUT(self) -> None:
            self._route("PUT")

        def do_PATCH(self) -> None:
            self._route("PATCH")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def do_OPTIONS(self) -> None:
            self._route("OPTIONS")

        # -- plain routes -------------------------------------------------------------------
        def health(self, query: dict[str, list[str]], body: Any) -> None:
            self._send(503 if double.config.engine_dead else 200, b"")

        def models(self, query: dict[str, list[str]], body: Any) -> None:
            cfg = double.config
            model = {
                "id": cfg.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": cfg.model,
                "parent": None,
                "max_model_len": cfg.max_model_len,
            }
            self._send(200, {"object": "list", "data": [model]})

        def version(self, query: dict[str, list[str]], body: Any) -> None:
            self._send(200, {"version": double.config.version})

        def metrics(self, query: dict[str, list[str]], body: Any) -> None:
            self._send(200, double.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")

        def load(self, query: dict[str, list[str]], body: Any) -> None:
            cfg = double.config
            if not cfg.load_route:
                self._send(404, {"detail": "Not Found"})
                return
            with double.lock:  # without the flag vLLM never counts: always 0
                count = double.counters.admitted if cfg.server_load_tracking else 0
            self._send(200, {"server_load": count})

        # -- dev routes ---------------------------------------------------------------------
        def is_sleeping(self, query: dict[str, list[str]], body: Any) -> None:
            self._send(200, {"is_sleeping": double.is_sleeping})

        def sleep(self, query: dict[str, list[str]], body: Any) -> None:
            # without --enable-sleep-mode vLLM still answers 200 (on CPU it only pauses)
            level = int(query.get("level", ["1"])[0])
            if level not in (1, 2):
                self._error(
                    400, "1 validation error: level: Input should be less than or equal to 2"
                )
                return
            time.sleep(double.config.sleep_delay)
            with double.lock:
                double.counters.sleeps.append(level)
                if double.counters.in_flight or double.counters.admitted:
                    double.counters.sleep_with_in_flight += 1
            double.put_to_sleep(level)
            self._send(200, {"status": "sleeping", "level": level})

        def wake_up(self, query: dict[str, list[str]], body: Any) -> None:
            tags = tuple(query.get("tags", []))
            time.sleep(double.config.wake_delay)
            with double.lock:
                double.counters.wakes.append(tags)
                double.awake_tags |= set(tags) if tags else {"weights", "kv_cache"}
                if not double.is_sleeping:
                    double.sleep_level = 0
                    double.first_pending = True
            self._send(200, b"")

        def collective_rpc(self, query: dict[str, list[str]], body: Any) -> None:
            if not isinstance(body, dict) or "method" not in body:
                self._send(400, {"detail": "Missing 'method' in request body"})
                return
            with double.lock:
                double.counters.rpcs.append(body["method"])
                if body["method"] == "reload_weights" and "weights" in double.awake_tags:
                    double.weights_valid = True
            self._send(200, {"results": [None]})

        def reset_prefix_cache(self, query: dict[str, list[str]], body: Any) -> None:
            with double.lock:
                double.counters.prefix_resets += 1
            self._send(200, b"")

        def server_info(self, query: dict[str, list[str]], body: Any) -> None:
            text = query.get("config_format", ["text"])[0] == "text"
            self._send(200, double.server_info(text))

        # -- generation ---------------------------------------------------------------------
        def tokenize(self, query: dict[str, list[str]], body: Any) -> None:
            """Like vLLM's /tokenize; the double's tokens are the prompt's words."""
            if not isinstance(body, dict) or body.get("model") != double.config.model:
                self._error(400, "bad /tokenize request")
                return
            words = str(body.get("prompt", "")).split()
            self._send(
                200,
                {
                    "count": len(words),
                    "max_model_len": double.config.max_model_len,
                    "tokens": list(range(len(words))),
                },
            )

        def completions(self, query: dict[str, list[str]], body: Any) -> None:
            self._generate(body, chat=False)

        def chat(self, query: dict[str, list[str]], body: Any) -> None:
            self._generate(body, chat=True)

        def _generate(self, body: Any, chat: bool) -> None:
            cfg = double.config
            if not isinstance(body, dict):
                self._error(400, "invalid JSON body")
                return
            if cfg.engine_dead:
                self._error(500, ENGINE_DEAD, "EngineDeadError")
                return
            if body.get("model") != cfg.model:
                self._error(
                    404, f"The model `{body.get('model')}` does not exist.", "NotFoundError"
                )
                return
            if double.is_sleeping:
                self._error(503, "The engine is sleeping; wake it up first.", "ServiceUnavailable")
                return
            if chat and not cfg.chat_template:
                self._error(400, NO_CHAT_TEMPLATE)
                return
            text = (
                " ".join(str(m.get("content", "")) for m in body.get("messages", []))
                if chat
                else str(body.get("prompt", ""))
            )
            max_tokens = int(body.get("max_tokens") or 16)
            prompt_tokens = max(1, len(text.split()))
            if prompt_tokens + max_tokens > cfg.max_model_len:
                self._error(
                    400,
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                    f"you requested {prompt_tokens + max_tokens} tokens.",
                )
                return
            if not body.get("stream"):
                if chat:
                    self._error(400, "the double streams chat")
                    return
                self._answer(text, max_tokens, prompt_tokens, body)
                return
            with double.lock:
                double.counters.prompts.append(text)
                first = double.first_pending
                double.first_pending = False
                c = double.counters
                c.generations += 1
                c.chat_generations += int(chat)
                c.admitted += 1
                garbage = not double.weights_valid
                if garbage:
                    c.garbage_outputs += 1
                n = c.generations
            if cfg.on_generation is not None:
                cfg.on_generation(n)
            try:
                self._stream(chat, max_tokens, prompt_tokens, first, garbage, body)
            finally:
                with double.lock:  # like vLLM's BackgroundTask: once the body is sent
                    double.counters.admitted -= 1

        def _answer(self, text: str, max_tokens: int, prompt_tokens: int, body: Any) -> None:
            """A non-streamed completion: greedy token ids that depend only on the prompt (and
            on the weights: garbage after a level-2 sleep without reload, or `corrupt_answers`),
            with `return_token_ids` and `logprobs` as vLLM answers them."""
            with double.lock:
                double.counters.prompts.append(text)
                double.counters.generations += 1
                double.counters.answers += 1
                double.counters.admitted += 1
                garbage = not double.weights_valid
                if garbage:
                    double.counters.garbage_outputs += 1
            try:
                self._answer_body(text, max_tokens, prompt_tokens, body, garbage)
            finally:
                with double.lock:
                    double.counters.admitted -= 1

        def _answer_body(
            self, text: str, max_tokens: int, prompt_tokens: int, body: Any, garbage: bool
        ) -> None:
            cfg = double.config
            seed = zlib.crc32(text.encode())
            ids = [(seed + 7919 * i) % 151_000 for i in range(max_tokens)]
            if garbage:
                ids = [0] * max_tokens
            elif cfg.corrupt_answers and max_tokens > 2:
                ids[2] = (ids[2] + 1) % 151_000
            words = [f" t{t}" for t in ids]
            choice: dict[str, Any] = {
                "index": 0,
                "text": "".join(words),
                "logprobs": None,
                "finish_reason": "length",
            }
            if body.get("logprobs") is not None:
                lps = [-((t % 97) / 50.0) - cfg.logprob_drift for t in ids]
                choice["logprobs"] = {
                    "text_offset": [],
                    "token_logprobs": lps,
                    "tokens": words,
                    "top_logprobs": [{w: lp} for w, lp in zip(words, lps, strict=True)],
                }
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = list(range(prompt_tokens))
            self._send(
                200,
                {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": cfg.model,
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": max_tokens,
                        "total_tokens": prompt_tokens + max_tokens,
                    },
                },
            )

        def _chunk(self, obj: Any) -> None:
            data = (
                b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            )
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream(
            self,
            chat: bool,
            max_tokens: int,
            prompt_tokens: int,
            first: bool,
            garbage: bool,
            body: dict[str, Any],
        ) -> None:
            cfg = double.config
            start = time.monotonic()
            times = StreamTimes(start)
            with double.lock:
                double.counters.streams.append(times)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            # vLLM: the headers are out, the request is tokenised and queued to the engine
            # core; its gauges count it only from the next step
            time.sleep(cfg.admission_delay)
            if cfg.admission_hold is not None:
                cfg.admission_hold.wait(60)
            with double.lock:
                c = double.counters
                c.in_flight += 1
                c.max_in_flight = max(c.max_in_flight, c.in_flight)
                c.concurrency_seen.add(c.in_flight)
            try:
                self._stream_body(chat, max_tokens, prompt_tokens, first, garbage, body, times)
            finally:
                times.end = time.monotonic()
                with double.lock:
                    double.counters.in_flight -= 1

        def _stream_body(
            self,
            chat: bool,
            max_tokens: int,
            prompt_tokens: int,
            first: bool,
            garbage: bool,
            body: dict[str, Any],
            times: StreamTimes,
        ) -> None:
            cfg = double.config
            start = times.start
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
            base = {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()),
                "model": cfg.model,
            }

            def choice(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
                if chat:
                    delta: dict[str, Any] = {"role": "assistant"} if role else {}
                    if text is not None:
                        delta["content"] = text
                    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

            sent = 0
            counted = False

            def traffic(n: int) -> None:
                # like vLLM: one prefill step, then one decode step per further token
                double.record_traffic(
                    [prompt_tokens],
                    [n],
                    [prompt_tokens] + [1] * max(0, n - 1),
                    running_s=time.monotonic() - start,
                )

            def finished() -> None:
                """The engine is done with the request: it counts it, and the metrics, before
                the API server sends the last chunk (so does vLLM's output processor)."""
                nonlocal counted
                counted = True
                with double.lock:
                    double.counters.completed += 1
                traffic(max(0, max_tokens))

            try:
                if chat:  # vLLM's first chat chunk: the role, no text
                    self._chunk({**base, "choices": [choice("", None, role=True)]})
                elif cfg.empty_first_chunk:
                    self._chunk({**base, "choices": [choice("", None)]})
                delay = cfg.first_ttft if (first and cfg.first_ttft is not None) else cfg.ttft
                time.sleep(delay)
                double.observe_ttft(time.monotonic() - start)
                finish = "length"
                for i in range(max_tokens):
                    if i:
                        time.sleep(cfg.token_delay)
                    if double.is_sleeping:  # vLLM's /sleep aborts requests in flight
                        finish = "abort"
                        break
                    word = "#garbage" if garbage else f" tok{i}"
                    last = i == max_tokens - 1
                    if last:
                        finished()
                    now = time.monotonic()
                    if times.first_token is None:
                        times.first_token = now
                    times.last_token, times.tokens = now, i + 1
                    self._chunk({**base, "choices": [choice(word, "length" if last else None)]})
                    sent += 1
                if finish == "abort":
                    with double.lock:
                        double.counters.aborted += 1
                    self._chunk({**base, "choices": [choice(None if chat else "", "abort")]})
                    traffic(sent)
                elif not counted:  # no token asked for
                    finished()
                opts = body.get("stream_options") or {}
                if opts.get("include_usage"):
                    usage = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": sent,
                        "total_tokens": prompt_tokens + sent,
                    }
                    self._chunk({**base, "choices": [], "usage": usage})
                self._chunk(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                with double.lock:
                    double.counters.client_gone += 1
                self.close_connection = True

    ROUTES = {
        ("GET", "/health"): Handler.health,
        ("GET", "/v1/models"): Handler.models,
        ("GET", "/version"): Handler.version,
        ("GET", "/metrics"): Handler.metrics,
        ("GET", "/load"): Handler.load,
        ("GET", "/is_sleeping"): Handler.is_sleeping,
        ("POST", "/sleep"): Handler.sleep,
        ("POST", "/wake_up"): Handler.wake_up,
        ("POST", "/collective_rpc"): Handler.collective_rpc,
        ("POST", "/reset_prefix_cache"): Handler.reset_prefix_cache,
        ("GET", "/server_info"): Handler.server_info,
        ("POST", "/v1/completions"): Handler.completions,
        ("POST", "/tokenize"): Handler.tokenize,
        ("POST", "/v1/chat/completions"): Handler.chat,
    }
    return Handler
