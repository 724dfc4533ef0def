"""HTTP client for a vLLM server's routes. Every failure becomes a one-line `WarmctlError`."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from warmctl.errors import WarmctlError
from warmctl.plan.instance import SLEEP_LEVEL
from warmctl.server import transport
from warmctl.server.target import Target
from warmctl.server.transport import Deadline, LimitHit
from warmctl.sleepwake.gate import ASLEEP_STATES, OUT_OF_ROTATION_STATES, proxy_state

DEFAULT_TIMEOUT = 30.0
# a streamed completion's whole answer, in --timeouts (which is then the most between two reads)
STREAM_TIMEOUTS = 10
# routes vLLM only mounts with VLLM_SERVER_DEV_MODE=1 (sleep ones also need --enable-sleep-mode)
DEV_ROUTES = frozenset(
    {"/is_sleeping", "/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/server_info"}
)
_DEVICE_TEXT = re.compile(
    r"device(?:_config)?['\"]?\s*[:=]\s*['\"]?(cpu|cuda|rocm|xpu|tpu)", re.IGNORECASE
)
_CAPTURE_TEXT = re.compile(r"['\"]?cudagraph_capture_sizes['\"]?\s*[:=]\s*\[([0-9,\s]*)\]")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and everything it wraps (requests -> urllib3 -> socket)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo.extend(a for a in getattr(cur, "args", ()) if isinstance(a, BaseException))
        for attr in ("reason", "__cause__", "__context__"):
            nxt = getattr(cur, attr, None)
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] or type(exc).__name__


def transport_error(target: Target, path: str, exc: BaseException, timeout: float) -> WarmctlError:
    """Map a requests/urllib3/socket exception to one line that says what went wrong."""
    label = target.label
    chain = list(_causes(exc))
    if isinstance(exc, requests.exceptions.SSLError) or any(
        type(c).__name__ in ("SSLError", "SSLCertVerificationError") for c in chain
    ):
        reason = next((c for c in reversed(chain) if "SSL" in type(c).__name__), exc)
        return WarmctlError(f"{label}: TLS error: {_short(reason)}", kind="tls")
    if isinstance(exc, requests.exceptions.Timeout) or any(
        isinstance(c, socket.timeout | TimeoutError) for c in chain
    ):
        return WarmctlError(
            f"{label}: timed out after {timeout:g} s waiting for {path} (raise --timeout?)",
            kind="timeout",
        )
    text = " ".join(str(c) for c in chain)
    if (
        any(isinstance(c, socket.gaierror) for c in chain)
        or any(type(c).__name__ == "NameResolutionError" for c in chain)
        or re.search(
            r"Name or service not known|Temporary failure in name resolution|"
            r"nodename nor servname|No address associated",
            text,
        )
    ):
        return WarmctlError(
            f"{label}: DNS failure: cannot resolve host {target.host!r}", kind="dns"
        )
    if any(isinstance(c, ConnectionRefusedError) for c in chain) or "Connection refused" in text:
        return WarmctlError(
            f"{label}: connection refused (is vLLM running and listening on port {target.port}?)",
            kind="refused",
        )
    if isinstance(exc, requests.exceptions.ChunkedEncodingError) or any(
        type(c).__name__ in ("RemoteDisconnected", "ProtocolError", "IncompleteRead") for c in chain
    ):
        return WarmctlError(
            f"{label}: the server closed the connection during {path} (did the engine die?)",
            kind="server",
        )
    return WarmctlError(f"{label}: cannot reach {path}: {_short(exc)}", kind="refused")


@dataclass(frozen=True)
class Answer:
    """A whole answer, read within its deadline and byte cap."""

    status_code: int
    reason: str
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (too deep a nesting included)."""
        return _loads(self.content)


def _loads(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def error_detail(resp: Answer) -> str:
    """The server's own error message (vLLM: {"error": {"message"}} or FastAPI {"detail"})."""
    text = resp.text
    try:
        body = _loads(text)
    except ValueError:
        body = None
    msg: Any = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
        elif isinstance(err, str):
            msg = err
        msg = msg or body.get("message") or body.get("detail")
    if msg is None:
        msg = text or resp.reason or ""
    return " ".join(str(msg).split())[:300]


def _proxy_state(resp: Answer) -> str | None:
    try:
        return proxy_state(resp.json())
    except ValueError:
        return None


def http_error(target: Target, path: str, resp: Answer, api_key: str | None) -> WarmctlError:
    label, code = target.label, resp.status_code
    if code in (401, 403):
        hint = (
            "the API key was refused (check --api-key / VLLM_API_KEY)"
            if api_key
            else "the server wants an API key: pass --api-key or set VLLM_API_KEY"
        )
        return WarmctlError(f"{label}: HTTP {code} on {path}: {hint}", kind="auth", status=code)
    if code == 404 and path in DEV_ROUTES:
        return WarmctlError(
            f"{label}: {path} is not served (HTTP 404): the server needs VLLM_SERVER_DEV_MODE=1 "
            "in its environment and --enable-sleep-mode",
            kind="dev_route",
            status=code,
        )
    if code == 404:
        return WarmctlError(
            f"{label}: {path} not found (HTTP 404): is {target.base_url} a vLLM server?",
            kind="not_found",
            status=code,
        )
    detail = error_detail(resp)
    gate = _proxy_state(resp) if code == 503 else None  # the proxy's gate (warmctl.sleepwake.gate)
    if gate in ASLEEP_STATES:
        return WarmctlError(
            f"{label}: asleep: the proxy's sleep gate is closed (HTTP 503 on {path}: {detail})",
            kind="asleep",
            status=code,
            gate=gate,
        )
    if code >= 500:
        dead = "EngineDead" in detail or "engine" in detail.lower() or path == "/health"
        what = "engine dead or failing" if dead else "server error"
        if gate in OUT_OF_ROTATION_STATES:
            what = "out of rotation (the proxy's gate)"  # kind stays "server": wait_ready waits
        hint = ""
        if path in ("/sleep", "/wake_up") and not dead:
            hint = " (sleep and wake need a server started with --enable-sleep-mode)"
        return WarmctlError(
            f"{label}: {what}: HTTP {code} on {path}" + (f": {detail}" if detail else "") + hint,
            kind="server",
            status=code,
            gate=gate,
        )
    return WarmctlError(
        f"{label}: HTTP {code} on {path}" + (f": {detail}" if detail else ""),
        kind="bad_request" if code == 400 else "generic",
        status=code,
    )


class Client:
    """One vLLM server. Thread-safe: each thread gets its own HTTP session.

    Every call is bounded (warmctl.server.transport): `timeout` is its whole answer's wall clock, a
    stream's is `stream_timeout` (default `STREAM_TIMEOUTS` x `timeout`; `timeout` is then the
    most between two reads), and each kind of answer has a cap on the bytes read.
    `within(seconds)` narrows every call inside it to what is left of a wait (the ready
    wait's --ready-timeout)."""

    def __init__(
        self,
        target: Target,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        headers: dict[str, str] | None = None,
        stream_timeout: float | None = None,
    ) -> None:
        self.target = target
        self.api_key = api_key or None
        self.timeout = timeout
        self.stream_timeout = (
            STREAM_TIMEOUTS * timeout if stream_timeout is None else stream_timeout
        )
        self.headers = dict(headers or {})
        self._local = threading.local()
        self._env_cache: dict[str, Any] | None = None

    # -- plumbing -------------------------------------------------------------------------
    @property
    def session(self) -> requests.Session:
        sess = getattr(self._local, "session", None)
        if sess is None:
            sess = transport.session()
            sess.headers["User-Agent"] = "warmctl"
            sess.headers.update(self.headers)
            if self.api_key:
                sess.headers["Authorization"] = f"Bearer {self.api_key}"
            self._local.session = sess
        return sess

    @property
    def _env_settings(self) -> dict[str, Any]:
        """Proxies and CA bundle from the environment (REQUESTS_CA_BUNDLE, HTTPS_PROXY...),
        looked up once rather than on every request."""
        if self._env_cache is None:
            merged = self.session.merge_environment_settings(
                self.target.base_url, {}, None, None, None
            )
            self._env_cache = {k: merged[k] for k in ("proxies", "verify", "cert")}
        return self._env_cache

    def url(self, path: str) -> str:
        return self.target.base_url + path

    @contextlib.contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Calls made inside (by this thread) end by `seconds` from now, at the latest."""
        previous = getattr(self._local, "until", None)
        end = time.monotonic() + seconds
        self._local.until = end if previous is None else min(previous, end)
        try:
            yield
        finally:
            self._local.until = previous

    def deadline(self, seconds: float) -> Deadline:
        """A call's deadline: `seconds` from now, or the end of the `within` it is in."""
        until = getattr(self._local, "until", None)
        end = time.monotonic() + seconds
        if until is not None and until < end:
            return Deadline(max(0.0, until - time.monotonic()), until)
        return Deadline(seconds, end)

    def limit_error(self, path: str, hit: LimitHit, deadline: Deadline) -> WarmctlError:
        label = self.target.label
        if hit.what == "deadline":
            part = f", {hit.read} bytes of its answer by then" if hit.read else ""
            return WarmctlError(
                f"{label}: timed out after {deadline.seconds:g} s waiting for {path}{part} "
                "(raise --timeout?)",
                kind="timeout",
            )
        what = "a streamed line longer than" if hit.what == "line" else "an answer past"
        limit = transport.LINE_LIMIT if hit.what == "line" else None
        return WarmctlError(
            f"{label}: {path}: {what} "
            + (f"{limit} bytes" if limit else "the cap on what warmctl reads")
            + f" ({hit.read} bytes read); not read further",
            kind="too_large",
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        json_body: Any = None,
        timeout: float | None = None,
        ok_404: bool = False,
        max_bytes: int = transport.JSON_LIMIT,
    ) -> Answer | None:
        """Send; the whole answer if 2xx (None for a 404 when `ok_404`), else raise. The answer
        is read within `timeout` (default: the client's) and `max_bytes`."""
        deadline = self.deadline(self.timeout if timeout is None else timeout)
        prepared = self.prepare(method, path, params=params, json_body=json_body)
        with transport.watching(deadline):
            resp = self.send(prepared, deadline, path=path)
            try:
                self.check(resp, path, deadline, ok_404=ok_404)
                if resp.status_code == 404 and ok_404:
                    return None
                content = transport.read_body(resp, deadline, max_bytes)
            except LimitHit as hit:
                raise self.limit_error(path, hit, deadline) from None
            except (requests.RequestException, OSError, ValueError) as exc:
                raise self._read_error(path, exc, deadline) from None
            finally:
                resp.close()
        return Answer(resp.status_code, resp.reason or "", content)

    def prepare(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        json_body: Any = None,
    ) -> requests.PreparedRequest:
        """Build the request up front, so timing `send` measures the wire, not requests'
        own bookkeeping."""
        req = requests.Request(method, self.url(path), params=params, json=json_body)
        return self.session.prepare_request(req)

    def send(
        self,
        prepared: requests.PreparedRequest,
        deadline: Deadline,
        *,
        read_timeout: float | None = None,
        path: str = "",
    ) -> requests.Response:
        """Send inside `transport.watching(deadline)`; the response with its body unread.
        `read_timeout`: the most between two reads (default the call's whole deadline)."""
        left = deadline.remaining()
        if left <= 0:
            raise self.limit_error(path, LimitHit("deadline", 0), deadline)
        per_read = left if read_timeout is None else min(read_timeout, left)
        try:
            resp = self.session.send(
                prepared, stream=True, timeout=(left, per_read), **self._env_settings
            )
        except requests.RequestException as exc:
            raise self._read_error(path, exc, deadline, per_read) from None
        if deadline.fired:  # cut in the headers: http.client may take the part as an answer
            resp.close()
            raise self.limit_error(path, LimitHit("deadline", 0), deadline)
        return resp

    def _read_error(
        self, path: str, exc: BaseException, deadline: Deadline, per_read: float | None = None
    ) -> WarmctlError:
        if deadline.passed():
            return self.limit_error(path, LimitHit("deadline", 0), deadline)
        if isinstance(exc, requests.RequestException):
            return transport_error(self.target, path, exc, per_read or deadline.seconds)
        return WarmctlError(f"{self.target.label}: cannot read {path}: {_short(exc)}")

    def check(
        self, resp: requests.Response, path: str, deadline: Deadline, ok_404: bool = False
    ) -> None:
        """Return if `resp` is 2xx (or a 404 when `ok_404`), else raise its error (the
        message read from a bounded part of its body)."""
        if resp.status_code == 404 and ok_404:
            return
        if not 200 <= resp.status_code < 300:
            body = transport.read_some(resp, deadline, transport.ERROR_LIMIT)
            resp.close()
            err = Answer(resp.status_code, resp.reason or "", body)
            raise http_error(self.target, path, err, self.api_key)

    @contextlib.contextmanager
    def stream(self, path: str, json_body: Any) -> Iterator[tuple[float, Iterator[bytes]]]:
        """POST a streamed request: (the monotonic time it was sent, its lines), each line as
        soon as it arrives; the whole stream within `stream_timeout`, at most `timeout`
        between two reads, `transport.STREAM_LIMIT` bytes and `LINE_LIMIT` a line."""
        prepared = self.prepare("POST", path, json_body=json_body)
        deadline = self.deadline(self.stream_timeout)
        with transport.watching(deadline):
            t0 = time.monotonic()
            resp = self.send(prepared, deadline, read_timeout=self.timeout, path=path)
            try:
                self.check(resp, path, deadline)
                yield t0, self._lines(resp, path, deadline)
            finally:
                resp.close()

    def _lines(self, resp: requests.Response, path: str, deadline: Deadline) -> Iterator[bytes]:
        try:
            yield from transport.read_lines(resp, deadline)
        except LimitHit as hit:
            raise self.limit_error(path, hit, deadline) from None
        except (requests.RequestException, OSError, ValueError) as exc:
            # the body broke off or stalled past --timeout
            raise self._read_error(path, exc, deadline, self.timeout) from None

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        resp = self.request("GET", path, params=params)
        assert resp is not None
        return self._json(resp, path)

    def _json(self, resp: Answer, path: str) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise WarmctlError(
                f"{self.target.label}: {path} did not answer JSON: {resp.text[:120]!r}",
                kind="protocol",
            ) from None

    # -- plain routes ---------------------------------------------------------------------
    def health(self) -> str | None:
        """`/health` answers 200 (the API process is up; the model may still be loading).
        Returns the state a host's proxy says in a 200 (`WAKEABLE_HEALTH`: asleep, and a
        request would wake it: warmctl.sleepwake.gate.proxy_answers), None for vLLM's own answer."""
        resp = self.request("GET", "/health")
        assert resp is not None
        try:
            body = resp.json() if resp.text.strip() else None
        except ValueError:
            return None
        state = body.get("state") if isinstance(body, dict) else None
        return state if isinstance(state, str) else None

    def models(self) -> list[dict[str, Any]]:
        """`/v1/models` `data`: each has `id` and (vLLM) `max_model_len`."""
        body = self.get_json("/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise WarmctlError(
                f"{self.target.label}: /v1/models has no 'data' list: is this a vLLM server?",
                kind="protocol",
            )
        return [_model(m) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                and m["id"]]  # fmt: skip

    def version(self) -> str | None:
        resp = self.request("GET", "/version", ok_404=True)
        if resp is None:
            return None
        body = self._json(resp, "/version")
        return str(body.get("version")) if isinstance(body, dict) and "version" in body else None

    def metrics_text(self) -> str:
        resp = self.request("GET", "/metrics", max_bytes=transport.METRICS_LIMIT)
        assert resp is not None
        return resp.text

    def metrics(self) -> Any:
        """`/metrics` parsed into `warmctl.server.metrics.Metrics`."""
        from warmctl.server.metrics import parse_metrics

        return parse_metrics(self.metrics_text(), self.target.label)

    def server_load(self) -> int | None:
        """`/load`'s `server_load`: the generation requests the API server has taken and not yet
        finished sending (counted from the handler's start, before the engine sees them, to the
        last byte of a stream). vLLM counts only with --enable-server-load-tracking and answers
        0 without it. None when the server has no such route (404, or not its JSON answer)."""
        resp = self.request("GET", "/load", ok_404=True)
        if resp is None:
            return None
        try:
            body = resp.json()
        except ValueError:
            return None
        value = body.get("server_load") if isinstance(body, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        return max(0, value)  # below 0 is a miscount of the server's, not requests in flight

    # -- dev-mode routes (VLLM_SERVER_DEV_MODE=1) -----------------------------------------
    def is_sleeping(self) -> bool:
        body = self.get_json("/is_sleeping")
        if not isinstance(body, dict) or "is_sleeping" not in body:
            raise WarmctlError(
                f"{self.target.label}: /is_sleeping answered {str(body)[:120]!r}", kind="protocol"
            )
        if not isinstance(body["is_sleeping"], bool):
            raise WarmctlError(
                f"{self.target.label}: /is_sleeping answered {str(body)[:120]!r}", kind="protocol"
            )
        return body["is_sleeping"]

    def sleep(self, level: int = SLEEP_LEVEL, timeout: float | None = None) -> None:
        self.request("POST", "/sleep", params={"level": str(level)}, timeout=timeout)

    def wake_up(self, tags: Sequence[str] | None = None, timeout: float | None = None) -> None:
        params = [("tags", t) for t in tags] if tags else None
        self.request("POST", "/wake_up", params=params, timeout=timeout)

    def collective_rpc(
        self,
        method: str,
        args: Sequence[str] = (),
        kwargs: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": kwargs or {}}
        resp = self.request("POST", "/collective_rpc", json_body=body, timeout=timeout)
        assert resp is not None
        if not resp.content:
            return None
        return self._json(resp, "/collective_rpc")

    def reset_prefix_cache(self) -> None:
        self.request("POST", "/reset_prefix_cache")

    def server_info(self) -> dict[str, Any]:
        """`/server_info?config_format=json` (`vllm_config` is a dict, or a str on older vLLM)."""
        body = self.get_json("/server_info", params={"config_format": "json"})
        if not isinstance(body, dict):
            raise WarmctlError(
                f"{self.target.label}: /server_info answered {str(body)[:120]!r}", kind="protocol"
            )
        return body

    def capture_sizes(self) -> list[int] | None:
        """Batch sizes the server captured as CUDA graphs when it tells (dev mode), else None."""
        try:
            info = self.server_info()
        except WarmctlError as err:
            if err.kind in ("dev_route", "not_found", "protocol", "bad_request"):
                return None
            raise
        return capture_sizes_from_config(info.get("vllm_config"))

    # -- readiness ------------------------------------------------------------------------
    def wait_ready(
        self,
        timeout: float = 600.0,
        interval: float = 0.5,
        alive: Callable[[], bool] | None = None,
        *,
        wait_start: bool = True,
        on_wait: Callable[[str], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Wait until `/v1/models` lists a model (`/health` alone answers before the model is
        loaded). Retries 5xx and an empty list; refused connections and timeouts too when
        `wait_start` (a server still starting), else they raise at once, as does any other
        failure. `alive`: when given and it turns false (the server process is gone), stop
        waiting. `on_wait(text)`: told what is awaited and for how long so far."""
        with self.within(timeout):  # no call outlives the wait
            return self._wait_ready(timeout, interval, alive, wait_start, on_wait)

    def _wait_ready(
        self,
        timeout: float,
        interval: float,
        alive: Callable[[], bool] | None,
        wait_start: bool,
        on_wait: Callable[[str], None] | None,
    ) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        deadline = t0 + timeout
        last: WarmctlError | None = None
        while True:
            try:
                models = self.models()
                if models:
                    return models
                last = WarmctlError(f"{self.target.label}: /v1/models lists no model yet")
            except WarmctlError as err:
                retry = ("refused", "timeout", "server") if wait_start else ("server",)
                if err.kind not in retry:
                    if err.kind in ("refused", "timeout"):
                        raise WarmctlError(
                            f"{err.message} (--wait-ready waits for a server that is starting)",
                            kind=err.kind,
                        ) from None
                    raise
                last = err
            if on_wait is not None:
                on_wait(
                    f"{_short_reason(last)}: waiting for the model on /v1/models "
                    f"({time.monotonic() - t0:.0f} of {timeout:g} s)"
                )
            if alive is not None and not alive():
                raise WarmctlError(
                    f"{self.target.label}: the server process exited before it was ready",
                    kind="server",
                )
            if time.monotonic() + interval > deadline:
                raise WarmctlError(
                    f"{self.target.label}: not ready after {timeout:g} s; last: "
                    f"{last.message.removeprefix(self.target.label + ': ') if last else '?'}",
                    kind=last.kind if last else "timeout",
                )
            time.sleep(interval)


def _short_reason(err: WarmctlError | None) -> str:
    """What a wait's live line says about the last answer."""
    if err is None or err.kind == "generic":
        return "no model listed yet"
    if err.status:
        return f"HTTP {err.status}"
    return {"refused": "connection refused", "timeout": "no answer"}.get(err.kind, err.kind)


def _model(entry: dict[str, Any]) -> dict[str, Any]:
    """A /v1/models entry with `max_model_len` a positive int or None (a server's JSON is
    input: wrong types end here, not in a later computation)."""
    mml = entry.get("max_model_len")
    return {**entry, "max_model_len": mml if _count(mml) else None}


def _count(value: Any) -> bool:
    """A positive int (not a bool) of sane size."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31


def capture_sizes_from_config(config: Any) -> list[int] | None:
    """`compilation_config.cudagraph_capture_sizes` from a vllm_config dict or its str()."""
    if isinstance(config, dict):
        comp = config.get("compilation_config")
        if isinstance(comp, str):
            try:
                comp = json.loads(comp)
            except ValueError:
                return capture_sizes_from_config(comp)
        if isinstance(comp, dict):
            sizes = comp.get("cudagraph_capture_sizes")
            if isinstance(sizes, list) and all(_count(s) for s in sizes):
                return sorted(set(sizes)) or None
        return None
    if isinstance(config, str):
        match = _CAPTURE_TEXT.search(config)
        if match:
            sizes = [int(s) for s in match.group(1).replace(",", " ").split()]
            return sorted(set(sizes)) or None
    return None


def device_from_config(config: Any) -> str | None:
    """`device_config.device` ("cuda", "cpu", ...) from a vllm_config dict or its str()."""
    if isinstance(config, dict):
        device = config.get("device_config")
        value = device.get("device") if isinstance(device, dict) else device
        return str(value).lower() if isinstance(value, str) and value else None
    if isinstance(config, str):
        match = _DEVICE_TEXT.search(config)
        return match.group(1).lower() if match else None
    return None
