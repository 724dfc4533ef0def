import json
import threading
import time

import pytest
from tests.double import VllmDouble

from warmctl.server.client import Client
from warmctl.server.stream import StreamResult, stream_completion
from warmctl.server.target import parse_target


def streams_in_flight(srv: VllmDouble, n: int, tokens: int) -> tuple[list[threading.Thread], list]:
    """Start `n` streamed requests in threads; wait until the server has them all in flight."""
    results: list[StreamResult | Exception] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            r: StreamResult | Exception = stream_completion(
                Client(parse_target(srv.address)), "double-model", "live", max_tokens=tokens
            )
        except Exception as exc:  # collected, asserted by the test
            r = exc
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    srv.wait_for(lambda: srv.counters.in_flight == n, f"{n} streams in flight")
    return threads, results


def test_sleep_waits_for_live_streams_and_cuts_none(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.token_delay = 0.05  # 20 tokens: each stream lives ~1 s
    threads, results = streams_in_flight(vllm_double, 4, tokens=20)
    t0 = time.monotonic()
    result = run("sleep", vllm_double.address, "--json")
    waited = time.monotonic() - t0
    for t in threads:
        t.join()
    assert result.exit_code == 0, result.output
    assert waited > 0.5  # it drained before sleeping
    c = vllm_double.counters
    assert c.aborted == 0 and c.sleep_with_in_flight == 0 and c.completed == 4
    assert all(isinstance(r, StreamResult) and r.tokens == 20 for r in results), results
    assert all(r.finish_reason == "length" for r in results)  # type: ignore[union-attr]
    assert vllm_double.is_sleeping and c.sleeps == [1]
    [report] = json.loads(result.stdout)["results"]
    assert report["drain"]["drained"] is True and report["drain"]["seconds"] > 0.5


def test_sleeping_without_drain_would_cut_streams(vllm_double: VllmDouble) -> None:
    """The control for the test above: the double does cut streams when sleep races them."""
    vllm_double.config.token_delay = 0.05
    threads, results = streams_in_flight(vllm_double, 2, tokens=20)
    Client(parse_target(vllm_double.address)).sleep(1)
    for t in threads:
        t.join()
    assert vllm_double.counters.aborted == 2
    assert all(isinstance(r, StreamResult) and r.finish_reason == "abort" for r in results)


def test_drain_timeout_does_not_sleep(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.extra_waiting = 2  # requests queued that never finish
    result = run("sleep", vllm_double.address, "--drain-timeout", "0.5")
    assert result.exit_code == 2
    assert "not put to sleep" in result.stderr and "2 waiting" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not vllm_double.is_sleeping and vllm_double.counters.sleeps == []


def test_sleep_level_2_and_already_asleep_is_a_noop(run, vllm_double: VllmDouble) -> None:
    result = run("sleep", vllm_double.address, "--level", "2")
    assert result.exit_code == 0 and "asleep at level 2" in result.stdout
    assert vllm_double.sleep_level == 2
    again = run("sleep", vllm_double.address, "--level", "2")
    assert again.exit_code == 0 and "already asleep" in again.stdout
    assert vllm_double.counters.sleeps == [2]


def test_sleep_needs_dev_mode(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.dev_mode = False
    result = run("sleep", vllm_double.address)
    assert result.exit_code == 2
    assert "VLLM_SERVER_DEV_MODE=1" in result.stderr and "--enable-sleep-mode" in result.stderr


@pytest.mark.parametrize("text_info", [False, True])
def test_sleep_refused_when_server_says_sleep_mode_is_off(
    run, vllm_double: VllmDouble, text_info: bool
) -> None:
    """vLLM answers /sleep with 200 even without --enable-sleep-mode (on CPU it then only
    pauses and new requests hang): warmctl must ask /server_info first and not sleep."""
    vllm_double.config.sleep_mode = False
    vllm_double.config.device = "cpu"
    vllm_double.config.server_info_text = text_info
    result = run("sleep", vllm_double.address)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "sleep mode is not enabled" in result.stderr and "--enable-sleep-mode" in result.stderr
    assert "CPU" in result.stderr
    assert vllm_double.counters.sleeps == [] and not vllm_double.is_sleeping


def test_warmup_refuses_a_sleeping_server(run, vllm_double: VllmDouble) -> None:
    vllm_double.put_to_sleep(1)
    result = run("warmup", vllm_double.address)
    assert result.exit_code == 2 and "asleep" in result.stderr and "warmctl wake" in result.stderr
    assert vllm_double.counters.generations == 0


def test_wake_after_level_2_reloads_weights_then_warms(run, vllm_double: VllmDouble) -> None:
    vllm_double.put_to_sleep(2)
    result = run("wake", vllm_double.address, "--batch-sizes", "1,2", "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    assert (report["level"], report["level_source"]) == (2, "server")
    names = [s["name"] for s in report["steps"]]
    assert names == [
        "wake_up weights",
        "reload_weights",
        "wake_up kv_cache",
        "reset_prefix_cache",
        "confirm",
        "warmup",
    ]
    c = vllm_double.counters
    assert c.wakes == [("weights",), ("kv_cache",)] and c.rpcs == ["reload_weights"]
    assert c.prefix_resets == 1 and not vllm_double.is_sleeping
    assert c.garbage_outputs == 0 and report["warmup"]["requests"] == c.generations > 0


def test_wake_level_1_is_one_call(run, vllm_double: VllmDouble) -> None:
    vllm_double.put_to_sleep(1)
    result = run("wake", vllm_double.address, "--no-warmup")
    assert result.exit_code == 0 and "awake after level 1 (server)" in result.stdout
    assert vllm_double.counters.wakes == [()] and vllm_double.counters.rpcs == []
    assert vllm_double.counters.generations == 0  # --no-warmup


def test_wake_level_when_the_server_does_not_tell(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.sleep_state_metric = False
    vllm_double.put_to_sleep(2)
    result = run("wake", vllm_double.address, "--no-warmup", "--json")
    [report] = json.loads(result.stdout)["results"]
    assert (report["level"], report["level_source"]) == (2, "assumed")
    assert vllm_double.counters.rpcs == ["reload_weights"]
    vllm_double.put_to_sleep(1)
    result = run("wake", vllm_double.address, "--no-warmup", "--level", "1", "--json")
    [report] = json.loads(result.stdout)["results"]
    assert (report["level"], report["level_source"]) == (1, "--level")
    assert vllm_double.counters.rpcs == ["reload_weights"]  # no second reload


def test_wake_when_awake_only_warms(run, vllm_double: VllmDouble) -> None:
    result = run("wake", vllm_double.address, "--batch-sizes", "1", "--no-chat")
    assert result.exit_code == 0 and "already awake" in result.stdout
    assert vllm_double.counters.wakes == [] and vllm_double.counters.generations > 0
    n = vllm_double.counters.generations
    assert f"warmed (full) with {n} requests" in result.stdout
    assert "batch sizes 1, chat no" in result.stdout
    quiet = run("wake", vllm_double.address, "--no-warmup")
    assert quiet.exit_code == 0 and "nothing to do" in quiet.stdout


def test_wake_warmup_is_light_by_default(run, vllm_double: VllmDouble) -> None:
    """After a wake the kernels and graphs are still there: one request per route suffices."""
    vllm_double.config.ttft = 0.05
    vllm_double.put_to_sleep(1)
    result = run("wake", vllm_double.address, "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    warm = report["warmup"]
    assert warm["mode"] == "light" and warm["batch_sizes"] == []
    assert [p["name"] for p in warm["phases"]] == ["ready", "prompts", "chat"]
    c = vllm_double.counters
    assert c.generations == 2 and c.chat_generations == 1 and c.max_in_flight == 1
    vllm_double.put_to_sleep(1)
    vllm_double.config.ttft = 0.3  # the burst of 8 overlaps on the server, even on a busy machine
    full = run("wake", vllm_double.address, "--full-warmup", "--json")
    [report] = json.loads(full.stdout)["results"]
    assert report["warmup"]["mode"] == "full" and report["warmup"]["batch_sizes"] == [1, 2, 4, 8]
    assert vllm_double.counters.max_in_flight == 8
