"""The client against real sockets: every failure is one line with the right kind."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from tests.double import VllmDouble
from tests.double.server import RawReply

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.stream import stream_completion
from warmctl.server.target import parse_target


def client_for(srv: VllmDouble, **kw: object) -> Client:
    return Client(parse_target(srv.address), **kw)  # type: ignore[arg-type]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def vllm_factory_racy(vllm_double_factory) -> VllmDouble:
    """A double started with --enable-server-load-tracking whose streams wait 0.5 s in the API
    server before the engine gauges count them."""
    return vllm_double_factory(server_load_tracking=True, admission_delay=0.5)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def one_line_error(fn: object) -> WarmctlError:
    with pytest.raises(WarmctlError) as info:
        fn()  # type: ignore[operator]
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2
    return info.value


def test_routes(vllm_double: VllmDouble) -> None:
    c = client_for(vllm_double)
    c.health()
    [model] = c.models()
    assert model["id"] == "double-model" and model["max_model_len"] == 4096
    assert c.version() == "0.26.0"
    assert c.is_sleeping() is False
    assert c.capture_sizes() == [1, 2, 4, 8]
    m = c.metrics()
    assert (m.running, m.waiting, m.sleep_state) == (0.0, 0.0, "awake")
    c.sleep(2)
    assert c.is_sleeping() and c.metrics().sleep_level == 2
    c.wake_up(["weights"])
    assert c.collective_rpc("reload_weights") == {"results": [None]}
    c.wake_up(["kv_cache"])
    c.reset_prefix_cache()
    assert not c.is_sleeping()
    assert ("POST", "/wake_up?tags=weights") in vllm_double.counters.requests


def test_capture_sizes_from_text_server_info(vllm_double: VllmDouble) -> None:
    vllm_double.config.server_info_text = True
    vllm_double.config.capture_sizes = [16, 8]
    assert client_for(vllm_double).capture_sizes() == [8, 16]


def test_server_load_counts_a_stream_from_its_headers_to_its_last_byte(
    vllm_factory_racy: VllmDouble,
) -> None:
    srv = vllm_factory_racy
    srv.config.admission_hold = admitted = threading.Event()  # held until the checks are done
    c = client_for(srv)
    assert c.server_load() == 0
    t = threading.Thread(
        target=lambda: stream_completion(c, "double-model", "hi", max_tokens=5), daemon=True
    )
    t.start()
    srv.wait_for(lambda: srv.counters.admitted == 1, "the stream admitted")
    # in the API server, not yet in the engine's gauges: /load counts it, /metrics does not
    assert c.server_load() == 1 and c.metrics().running == 0
    admitted.set()
    t.join(30)
    # the server counts the request out once its last byte is sent (vLLM: a BackgroundTask),
    # which the client may have read a moment before
    srv.wait_for(lambda: c.server_load() == 0, "/load back to 0")


def test_server_load_is_0_without_tracking_and_none_without_the_route(
    vllm_double_factory,
) -> None:
    untracked = vllm_double_factory(admission_hold=(held := threading.Event()))
    c = client_for(untracked)
    t = threading.Thread(target=lambda: stream_completion(c, "double-model", "hi", max_tokens=2))
    t.start()
    untracked.wait_for(lambda: untracked.counters.admitted == 1, "the stream admitted")
    assert c.server_load() == 0  # vLLM: no flag, no count, while the stream is in the API server
    held.set()
    t.join(30)
    assert client_for(vllm_double_factory(load_route=False)).server_load() is None


@pytest.mark.parametrize(
    "body", [b"<html>not json</html>", b'{"load": 3}', b'{"server_load": "1"}', b"[1]"]
)
def test_server_load_of_a_server_without_vllms_route_is_none(vllm_double, body) -> None:
    vllm_double.config.raw["/load"] = RawReply(body=body)
    assert client_for(vllm_double).server_load() is None


def test_server_load_errors_are_one_line(vllm_double) -> None:
    vllm_double.config.raw["/load"] = RawReply(status=500, body=b'{"detail": "boom"}')
    err = one_line_error(client_for(vllm_double).server_load)
    assert err.kind == "server" and "HTTP 500 on /load" in str(err)
    vllm_double.config.raw["/load"] = RawReply(body=b'{"server_load": -1}')  # a miscount
    assert client_for(vllm_double).server_load() == 0


def test_stream_counts_first_text_chunk_not_role_chunk(vllm_double: VllmDouble) -> None:
    vllm_double.config.ttft = 0.15
    vllm_double.config.empty_first_chunk = True
    c = client_for(vllm_double)
    for chat in (False, True):
        r = stream_completion(c, "double-model", "hi", max_tokens=4, chat=chat)
        assert r.tokens == 4 and r.prompt_tokens == 1 and r.finish_reason == "length"
        assert r.text == " tok0 tok1 tok2 tok3"
        # the empty first chunk (or role chunk) came at ~0 ms, the first text >= 150 ms later
        # (the double's sleep: a loaded machine only adds), and the TTFT is that first text
        # chunk's time: no upper bound on an idle machine's latency needed
        assert r.ttft_s >= 0.15 and r.ttft_s == r.chunk_times_s[0]
        assert len(r.chunk_times_s) == 4


def test_streams_reuse_one_connection(vllm_double: VllmDouble) -> None:
    c = client_for(vllm_double)
    c.models()
    for _ in range(5):
        stream_completion(c, "double-model", "hi", max_tokens=3)
    assert vllm_double.counters.connections == 1


def test_refused() -> None:
    c = Client(parse_target(f"127.0.0.1:{closed_port()}"))
    err = one_line_error(c.health)
    assert err.kind == "refused" and "connection refused" in str(err)


def test_dns_failure() -> None:
    err = one_line_error(Client(parse_target("no-such-host.invalid")).health)
    assert err.kind == "dns" and "cannot resolve host 'no-such-host.invalid'" in str(err)


def test_timeout(silent_port: int) -> None:
    c = Client(parse_target(f"127.0.0.1:{silent_port}"), timeout=0.3)
    t0 = time.monotonic()
    err = one_line_error(c.health)
    assert time.monotonic() - t0 < 5
    assert err.kind == "timeout" and "timed out after 0.3 s" in str(err)


def test_stream_stalls_past_timeout(vllm_double: VllmDouble) -> None:
    vllm_double.config.ttft = 1.0
    c = client_for(vllm_double, timeout=0.3)
    err = one_line_error(lambda: stream_completion(c, "double-model", "hi"))
    assert err.kind == "timeout"


def test_tls_error_against_plain_http(vllm_double: VllmDouble) -> None:
    c = Client(parse_target(f"https://127.0.0.1:{vllm_double.port}"))
    err = one_line_error(c.health)
    assert err.kind == "tls" and "TLS error" in str(err)


def test_auth_names_the_option(vllm_double: VllmDouble) -> None:
    vllm_double.config.api_key = "s3cret"
    err = one_line_error(client_for(vllm_double).models)
    assert err.kind == "auth" and "--api-key" in str(err) and "VLLM_API_KEY" in str(err)
    err = one_line_error(client_for(vllm_double, api_key="wrong").models)
    assert "refused" in str(err)
    assert client_for(vllm_double, api_key="s3cret").models()


def test_dev_route_404_says_what_the_server_needs(vllm_double: VllmDouble) -> None:
    vllm_double.config.dev_mode = False
    c = client_for(vllm_double)
    for call in (c.is_sleeping, lambda: c.sleep(1), c.wake_up, c.reset_prefix_cache):
        err = one_line_error(call)
        assert err.kind == "dev_route"
        assert "VLLM_SERVER_DEV_MODE=1" in str(err) and "--enable-sleep-mode" in str(err)
    assert c.capture_sizes() is None  # optional knowledge, not an error


def test_engine_dead(vllm_double: VllmDouble) -> None:
    vllm_double.config.engine_dead = True
    c = client_for(vllm_double)
    err = one_line_error(c.health)
    assert err.kind == "server" and "engine dead" in str(err) and "503" in str(err)
    err = one_line_error(lambda: stream_completion(c, "double-model", "hi"))
    assert err.kind == "server" and "EngineCore encountered an issue" in str(err)


def test_wait_ready_retries_until_model_listed(vllm_double: VllmDouble) -> None:
    vllm_double.config.not_ready_until = time.monotonic() + 0.8
    t0 = time.monotonic()
    models = client_for(vllm_double).wait_ready(timeout=10, interval=0.1)
    assert models[0]["id"] == "double-model"
    assert 0.7 < time.monotonic() - t0 < 5


def test_wait_ready_gives_up_with_last_reason() -> None:
    c = Client(parse_target(f"127.0.0.1:{closed_port()}"))
    err = one_line_error(lambda: c.wait_ready(timeout=0.5, interval=0.1))
    assert "not ready after 0.5 s" in str(err) and "connection refused" in str(err)


def test_wait_ready_does_not_retry_auth(vllm_double: VllmDouble) -> None:
    vllm_double.config.api_key = "k"
    t0 = time.monotonic()
    err = one_line_error(lambda: client_for(vllm_double).wait_ready(timeout=30))
    assert err.kind == "auth" and time.monotonic() - t0 < 5
