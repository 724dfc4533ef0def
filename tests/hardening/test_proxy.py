"""The proxy's nginx config: `nginx -t` for a matrix of settings, then a real nginx in front of
the vLLM double: only /v1/*, /health and /metrics pass; the gate answers 503 + Retry-After;
a sleep under streaming load cuts nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.double import wait_until
from tests.hardening.proxy_support import Nginx, free_port, render_proxy
from warmctl.errors import WarmctlError

TOKEN = "s3cret-token-0123456789"
DEV_ROUTES = [
    ("POST", "/sleep?level=1"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/server_info"),
    ("GET", "/is_paused"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/version"),
    ("POST", "/tokenize"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/"),
]


def self_signed(root: Path) -> tuple[str, str]:
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        capture_output=True, check=True,
    )  # fmt: skip
    return str(cert), str(key)


CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "tokens": {"vllm_proxy_api_keys": [TOKEN, "another-token-abcdefgh"]},
    "allow-list": {"vllm_proxy_allow": ["10.0.0.0/8", "127.0.0.1", "::1"]},
    "ipv6": {"vllm_proxy_listen_ipv6": True},
    "tls": {"tls": True},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rendered_config_passes_nginx_t(nginx_bin: str, tmp_path: Path, name: str) -> None:
    host = {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": str(tmp_path / "gate"),
            **CONFIGS[name]}  # fmt: skip
    if host.pop("tls", False):
        host["vllm_proxy_tls_cert"], host["vllm_proxy_tls_key"] = self_signed(tmp_path)
    files = render_proxy({"name": "my-model", "model": "/m", "port": 8123}, host)
    proc = Nginx(nginx_bin, tmp_path / "nginx", files).test_config()
    print(f"nginx -t ({name}): rc={proc.returncode} {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def proxied(nginx_bin: str, vllm_double, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """nginx on a free port in front of the double, with a token and a gate."""
    port = free_port()
    gate = tmp_path / "gate"
    gate.mkdir()
    host = {
        "vllm_proxy_enabled": True,
        "vllm_proxy_gate_dir": str(gate),
        "vllm_proxy_upstream_port_offset": vllm_double.port - port,
        "vllm_proxy_api_keys": [TOKEN],
        "vllm_proxy_retry_after": 7,
    }
    files = render_proxy({"name": "tiny", "model": "/m", "port": port}, host)
    n = Nginx(nginx_bin, tmp_path / "nginx", files)
    n.start(port)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "address": f"127.0.0.1:{port}",
               "gate": gate / "tiny.closed", "double": vllm_double, "nginx": n}  # fmt: skip
    finally:
        n.stop()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_only_the_inference_api_passes(proxied: dict[str, Any]) -> None:
    url, double = proxied["url"], proxied["double"]
    answers = []
    for method, path in DEV_ROUTES:
        r = requests.request(method, url + path, headers=auth(), json={}, timeout=5)
        answers.append(f"{method} {path} -> {r.status_code}")
        assert r.status_code == 404, answers[-1]
    print("\n".join(answers))
    seen = {p.split("?")[0] for _, p in double.counters.requests}
    assert not seen & {p.split("?")[0] for _, p in DEV_ROUTES}, seen
    assert not double.is_sleeping
    assert requests.get(url + "/v1/models", headers=auth(), timeout=5).status_code == 200
    assert requests.get(url + "/health", timeout=5).status_code == 200
    assert requests.get(url + "/metrics", headers=auth(), timeout=5).status_code == 200


def test_bearer_token_is_required_on_the_api(proxied: dict[str, Any]) -> None:
    url = proxied["url"]
    for headers in ({}, {"Authorization": "Bearer wrong-token-xxxxxxxx"}, {"Authorization": TOKEN}):
        for path in ("/v1/models", "/metrics"):
            r = requests.get(url + path, headers=headers, timeout=5)
            assert r.status_code == 401, (path, headers, r.status_code)
            assert "bearer token" in r.json()["error"]["message"]


def test_closed_gate_answers_503_with_retry_after(proxied: dict[str, Any]) -> None:
    url, double = proxied["url"], proxied["double"]
    proxied["gate"].write_text("sleep\n")
    before = double.counters.generations
    body = {"model": "double-model", "prompt": "hi", "max_tokens": 2}
    r = requests.post(url + "/v1/completions", headers=auth(), json=body, timeout=5)
    assert r.status_code == 503 and r.headers["Retry-After"] == "7"
    assert "asleep" in r.json()["error"]["message"]
    assert requests.get(url + "/health", timeout=5).status_code == 503
    assert requests.get(url + "/metrics", headers=auth(), timeout=5).status_code == 200
    assert double.counters.generations == before
    proxied["gate"].unlink()
    ok = requests.get(url + "/v1/models", headers=auth(), timeout=5)
    assert ok.status_code == 200 and "Retry-After" not in ok.headers


def test_stopped_instance_answers_503_with_retry_after(run, proxied: dict[str, Any]) -> None:
    proxied["double"].stop()
    r = requests.get(proxied["url"] + "/v1/models", headers=auth(), timeout=10)
    assert r.status_code == 503 and r.headers["Retry-After"] == "7"
    assert "not running" in r.json()["error"]["message"]
    # no gate state: status reports the instance down (no flag says it sleeps)
    status = run("status", proxied["address"], "--api-key", TOKEN)
    assert status.exit_code == 2 and "not running" in status.stderr, status.output


def test_streams_pass_token_by_token(proxied: dict[str, Any]) -> None:
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    proxied["double"].config.token_delay = 0.05
    r = stream_completion(Client(parse_target(proxied["address"]), api_key=TOKEN),
                          "double-model", "hello", max_tokens=20)  # fmt: skip
    assert r.tokens == 20
    assert r.ttft_s < 0.5 * r.total_s, (r.ttft_s, r.total_s)  # not buffered until the end


def test_verify_passes_through_the_proxy(run, proxied: dict[str, Any]) -> None:
    result = run("verify", proxied["address"], "--api-key", TOKEN, "--steady", "3",
                 "--max-ratio", "50", "--max-first-ttft", "5")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_verify_reports_a_closed_gate_as_asleep_at_once(run, proxied: dict[str, Any]) -> None:
    """Behind the proxy the dev routes are 404, so the gate's 503 is how verify learns that the
    instance sleeps: ASLEEP at once (not a 600 s wait for readiness), exit 1; with --asleep-ok
    (what a deploy inside a sleep window passes) exit 0. Nothing reaches the engine."""
    double = proxied["double"]
    proxied["gate"].write_text("sleep\n")
    before = double.counters.generations
    t0 = time.monotonic()
    result = run("verify", proxied["address"], "--api-key", TOKEN, "--json")
    took = time.monotonic() - t0
    [report] = json.loads(result.stdout)["results"]
    assert result.exit_code == 1, result.output
    assert report["status"] == "ASLEEP" and "sleep gate is closed" in report["reasons"][0]
    assert took < 10, f"verify waited {took:.0f} s on a closed gate"
    table = run("verify", proxied["address"], "--api-key", TOKEN, "--asleep-ok")
    assert table.exit_code == 0, table.output
    assert "ASLEEP" in table.output and "Traceback" not in table.output
    assert double.counters.generations == before


def test_sleep_under_streaming_load_cuts_nothing(run, proxied: dict[str, Any]) -> None:
    """8 clients stream through the proxy while `warmctl sleep --gate` runs against the
    upstream: the streams in flight complete, later requests get 503, none hangs or is cut;
    after `warmctl wake --gate` the proxy serves again and verify passes."""
    from warmctl.server.client import Client
    from warmctl.server.stream import stream_completion
    from warmctl.server.target import parse_target

    double, gate = proxied["double"], proxied["gate"]
    double.config.token_delay = 0.02
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        c = Client(parse_target(proxied["address"]), api_key=TOKEN, timeout=10)
        while not stop.is_set():
            with lock:
                counts["started"] += 1
            try:
                r = stream_completion(c, "double-model", "load", max_tokens=25)
            except WarmctlError as err:
                with lock:
                    counts["refused_503" if err.status == 503 else f"error {err}"] += 1
                time.sleep(0.1)
                continue
            with lock:
                counts["completed" if r.tokens == 25 else "cut"] += 1

    def seen(outcome: str, more_than: int) -> Callable[[], bool]:
        def check() -> bool:
            with lock:
                return counts[outcome] > more_than

        return check

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    # the events, not times: 8 streams completed and some in flight when the sleep begins
    wait_until(seen("completed", 8), "8 streams through the proxy")
    double.wait_for(lambda: double.counters.in_flight > 0, "streams in flight")
    slept = run("sleep", double.address, "--gate", str(gate), "--drain-timeout", "30")
    assert slept.exit_code == 0, slept.output
    wait_until(seen("refused_503", 0), "a request refused while asleep")
    asleep_counts = dict(counts)
    woke = run("wake", double.address, "--gate", str(gate), "--no-warmup")
    assert woke.exit_code == 0, woke.output
    done = counts["completed"]
    wait_until(seen("completed", done), "a stream completed after the wake")
    stop.set()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads), "a client hangs"
    print(f"8 clients across a sleep: {dict(counts)} (at wake: {asleep_counts})")
    assert counts["cut"] == 0 and double.counters.aborted == 0
    assert double.counters.sleep_with_in_flight == 0
    assert counts["refused_503"] > 0 and counts["completed"] > 8
    assert set(counts) <= {"started", "completed", "refused_503"}, counts
    assert counts["started"] == counts["completed"] + counts["refused_503"]
    result = run("verify", proxied["address"], "--api-key", TOKEN, "--steady", "3",
                 "--max-ratio", "50", "--max-first-ttft", "5")  # fmt: skip
    assert result.exit_code == 0, result.output


def test_status_tells_the_gate_state_and_version_through_the_proxy(
    run, proxied: dict[str, Any]
) -> None:
    """The proxy passes no dev route and no /version. Through it, status says the gate's state
    the proxy answers with (asleep, draining: no error); on the host, the flags (since when,
    why: the window and level) and vLLM itself behind the proxy (--upstream: its version)."""
    double, closed = proxied["double"], proxied["gate"]
    door = [proxied["address"], "--api-key", TOKEN]
    local = ["--gate-dir", str(closed.parent), "--instance", "tiny", "--upstream", double.address]

    def report(*args: str) -> dict[str, Any]:
        result = run("status", *args, "--json")
        assert result.exit_code == 0, result.output
        [r] = json.loads(result.stdout)["results"]
        return r

    awake = report(*door, *local)
    assert (awake["version"], awake["sleep"], awake["sleeping"]) == ("0.26.0", "awake", False)
    assert report(*door)["version"] is None  # the proxy's door alone: no /version
    slept = run("sleep", double.address, "--level", "2", "--gate", str(closed), "--cause",
                "window", "--window", "nights")  # fmt: skip
    assert slept.exit_code == 0, slept.output
    outside = report(*door)
    assert outside["proxy"] == "asleep" and outside["error"] is None
    # vLLM's own /metrics pass the shut gate: its sleep level, without waking it
    assert outside["sleep"] == "asleep (level 2; the proxy's gate: requests refused)"
    here = report(*door, *local)
    assert (here["version"], here["sleeping"], here["sleep_level"]) == ("0.26.0", True, 2)
    assert here["gate"]["window"] == "nights" and here["gate"]["level"] == 2
    assert here["sleep"].startswith("asleep (level 2) since ")
    assert here["sleep"].endswith("(window nights; requests refused)"), here["sleep"]
    table = run("status", *door, *local)
    assert "0.26.0" in table.stdout and "window nights" in table.stdout, table.stdout
    # the gate shut on a server that is awake (a wake that failed after the engine woke)
    with double.lock:
        double.awake_tags = {"weights", "kv_cache"}  # woken by hand
    assert report(*door, *local)["sleep"].startswith("closed (the server is awake) since ")
    assert report(*door)["sleep"] == "closed (the proxy's gate; the server is awake)"
    closed.unlink()
    (closed.parent / "tiny.draining").write_text("draining\n")
    assert report(*door)["sleep"] == "draining (out of rotation for a restart)"
    assert report(*door, *local)["sleep"].startswith("draining since ")


def test_status_through_the_proxy(run, proxied: dict[str, Any]) -> None:
    """The dev routes are 404 behind the proxy: status still reports health, model and load."""
    result = run("status", proxied["address"], "--api-key", TOKEN)
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
