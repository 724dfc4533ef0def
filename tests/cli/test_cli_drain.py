"""`warmctl drain` (and the sleep's drain) against the double's race: a stream whose 200 headers
are out and which the API server holds (vLLM's `/load`) while the engine's gauges still read 0.
The drain must wait for it; without `/load` (older vLLM) it drains on the gauges alone."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tests.double import VllmDouble

from warmctl.server.client import Client
from warmctl.server.stream import StreamResult, stream_completion
from warmctl.server.target import parse_target
from warmctl.sleepwake.steps import drain

ADMISSION_S = 1.5  # the request is in the API server, not yet in the engine gauges


class OneStream:
    """One streamed request in a thread; `wait_admitted` returns once the API server holds it
    (`/load` counts it) and the engine gauges do not count it yet."""

    def __init__(self, srv: VllmDouble, tokens: int = 10) -> None:
        self.srv = srv
        self.result: StreamResult | Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(tokens,))

    def _run(self, tokens: int) -> None:
        try:
            client = Client(parse_target(self.srv.address))
            self.result = stream_completion(client, "double-model", "hi", max_tokens=tokens)
        except Exception as exc:  # asserted by the test
            self.result = exc

    def start_admitted(self) -> OneStream:
        self.thread.start()
        self.srv.wait_for(lambda: self.srv.counters.admitted == 1, "the stream admitted")
        c = self.srv.counters
        assert (c.admitted, c.in_flight) == (1, 0)  # in the API server, not in the gauges
        return self

    def join(self) -> StreamResult:
        self.thread.join(15)
        assert isinstance(self.result, StreamResult), self.result
        return self.result


def racy(factory, tracking: bool = True, **config: object) -> VllmDouble:
    return factory(server_load_tracking=tracking, admission_delay=ADMISSION_S, token_delay=0.02,
                   **config)  # fmt: skip


def test_drain_waits_for_a_request_the_engine_gauges_do_not_count_yet(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    srv = racy(vllm_double_factory)
    stream = OneStream(srv).start_admitted()
    t0 = time.monotonic()
    result = run("drain", srv.address, "--gate", str(tmp_path / "tiny.draining"), "--json")
    returned = time.monotonic()
    assert result.exit_code == 0, result.output
    assert srv.counters.admitted == 0 and srv.counters.completed == 1  # it finished first
    # its last byte was sent before the drain returned (the double's clock: the client thread
    # may read it a moment later on a loaded machine)
    [times] = srv.counters.streams
    assert stream.join().tokens == 10 and times.end is not None and times.end <= returned
    assert returned - t0 > ADMISSION_S - 0.5
    [report] = json.loads(result.stdout)["results"]
    d = report["drain"]
    assert d["drained"] is True and d["in_flight"] == 0
    assert {"drained", "seconds", "running", "waiting", "polls"} <= set(d)  # the old keys


def test_control_without_load_tracking_the_gauges_alone_return_too_early(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    """The race the test above closes: a server started without --enable-server-load-tracking
    answers /load 0, and the gauges read 0: the drain returns while the stream is still held
    (a restart now would cut it, its 200 already sent)."""
    srv = racy(vllm_double_factory, tracking=False)
    stream = OneStream(srv).start_admitted()
    result = run("drain", srv.address, "--gate", str(tmp_path / "tiny.draining"))
    assert result.exit_code == 0, result.output
    assert srv.counters.admitted == 1 and srv.counters.completed == 0  # not waited for
    stream.join()


def test_a_server_without_load_still_drains_on_the_gauges(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    srv = vllm_double_factory(load_route=False, token_delay=0.05)
    stream = OneStream(srv, tokens=20)
    stream.thread.start()
    srv.wait_for(lambda: srv.counters.in_flight == 1, "the stream in the gauges")
    result = run("drain", srv.address, "--gate", str(tmp_path / "tiny.draining"), "--json")
    assert result.exit_code == 0, result.output
    assert srv.counters.completed == 1 and stream.join().tokens == 20
    [report] = json.loads(result.stdout)["results"]
    assert report["drain"]["drained"] is True and report["drain"]["in_flight"] is None
    assert ("GET", "/load") in srv.counters.requests  # asked once, then the gauges alone


def test_not_drained_says_what_the_api_server_still_holds(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    srv = racy(vllm_double_factory)
    stream = OneStream(srv).start_admitted()
    gate = tmp_path / "tiny.draining"
    result = run("drain", srv.address, "--gate", str(gate), "--drain-timeout", "0.5")
    assert result.exit_code == 1, result.output
    assert (
        f"NOT drained after --drain-timeout 0.5 s: still 0 running, 0 waiting, "
        f"1 in flight at the API server; gate {gate} closed"
    ) in result.output
    stream.join()


def test_sleep_and_drain_only_do_not_go_on_while_the_api_server_holds_a_request(
    run, vllm_double_factory, tmp_path: Path
) -> None:
    srv = racy(vllm_double_factory)
    stream = OneStream(srv).start_admitted()
    slept = run("sleep", srv.address, "--drain-timeout", "0.5")
    assert slept.exit_code == 2
    assert (
        "not put to sleep: still 0 running, 0 waiting, 1 in flight at the API server "
        "after --drain-timeout 0.5 s"
    ) in slept.stderr
    assert slept.stderr.count("\n") == 1 and srv.counters.sleeps == []
    only = run("sleep", srv.address, "--drain-only", "--gate", str(tmp_path / "g"),
               "--drain-timeout", "0.3")  # fmt: skip
    assert only.exit_code == 2
    assert "not drained: still 0 running, 0 waiting, 1 in flight at the API server" in only.stderr
    stream.join()
    assert srv.counters.aborted == 0 and srv.counters.sleep_with_in_flight == 0


def test_on_wait_tells_the_in_flight_count(vllm_double_factory) -> None:
    srv = racy(vllm_double_factory)
    stream = OneStream(srv).start_admitted()
    said: list[str] = []
    result = drain(Client(parse_target(srv.address)), timeout=10, on_wait=said.append)
    stream.join()
    assert result.drained and result.in_flight == 0 and srv.counters.completed == 1
    assert said[0].startswith("draining: 0 running, 0 waiting, 1 in flight at the API server (")
    assert result.still() == "0 running, 0 waiting, 0 in flight at the API server"
