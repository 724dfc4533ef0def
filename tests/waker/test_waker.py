"""`warmctl waker` alone: a real process, its two unix sockets, real flag files; the test plays
systemd (creates and removes the flags and request files) and nginx (asks /hold, sends the
access log's datagrams). Every wait is for an event (the waker's /state, a file)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.double import VllmDouble, wait_until
from tests.waker.support import GateFiles, Held, UnixHTTPConnection, Waker, send_datagram


def test_awake_instance_passes_at_once(start_waker: Callable[..., Waker], gate: GateFiles) -> None:
    waker = start_waker()
    assert waker.hold() == (204, "awake", 0.0)
    gate.draining.write_text("draining\n")  # nginx's business, not the waker's: it passes
    assert waker.hold()[:2] == (204, "awake")
    assert not gate.wake_request.exists()
    status, _, _ = waker.get("/sleep")  # nothing else is served: no route of vLLM's
    assert status == 404
    conn = UnixHTTPConnection(gate.socket)
    conn.request("POST", "/hold", body=b"x")
    assert conn.getresponse().status == 405
    # no socket_group: this user only (test_waker_door.py: nginx's group, the storm)
    assert oct(gate.socket.stat().st_mode & 0o777) == "0o600"


def test_eight_held_one_wake_all_released(
    start_waker: Callable[..., Waker], gate: GateFiles, tmp_path: Path
) -> None:
    """8 requests reach the instance asleep: one wake-request file, all held until the flag
    goes (the test is systemd: the wake removes the flag, then its service the request)."""
    textfiles = tmp_path / "prom"
    textfiles.mkdir()
    waker = start_waker(hold=60, textfile_dir=textfiles)
    gate.wakeable.write_text("sleep cause=idle level=1 at now\n")
    held = Held(waker.hold).start(8, waker.wait_holding)
    assert gate.wake_request.exists()
    asked = gate.wake_request.read_text()
    assert "wake asked by the waker" in asked and waker.state()["wake_asked"]
    assert held.answers == []  # nobody answered while asleep
    gate.wakeable.unlink()  # `warmctl wake --gate CLOSED --gate WAKEABLE` succeeded
    answers = held.join()
    gate.wake_request.unlink()  # its ExecStopPost
    assert sorted(a[:2] for a in answers) == [(204, "woke")] * 8
    assert all(a[2] > 0 for a in answers)
    assert waker.state()["holding"] == 0
    prom = textfiles / "warmctl_tiny.waker.prom"

    def written() -> dict[tuple[str, str], float]:
        text = prom.read_text() if prom.exists() else ""
        return {
            (s.name, s.labels.get("outcome") or s.labels.get("reason", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if "le" not in s.labels
        }

    wait_until(lambda: written().get(("warmctl_waker_held_requests_total", "woke")) == 8,
               "the waker's textfile counting 8 woken requests")  # fmt: skip
    found = written()
    assert found[("warmctl_waker_wakes_asked_total", "")] == 1
    assert found[("warmctl_waker_hold_seconds_count", "woke")] == 8
    assert found[("warmctl_waker_failed_wakes_total", "failed")] == 0
    assert "8 held requests released" in waker.log()


def test_released_in_the_order_they_came(tmp_path: Path) -> None:
    """The hold itself (in-process, real files): held requests resume first in, first out."""
    from warmctl.sleepwake.gate import Flags
    from warmctl.waker.hold import Hold
    from warmctl.waker.metrics import WakerMetrics

    files = GateFiles(tmp_path)
    flags = Flags(files.wakeable, files.closed, files.warming, files.draining, files.wake_request)
    files.wakeable.write_text("asleep\n")

    async def scenario() -> list[int]:
        hold = Hold("tiny", flags, 60.0, 30.0, WakerMetrics("tiny", None))
        order: list[int] = []

        async def one(i: int) -> None:
            outcome, _ = await hold.hold()
            assert outcome == "woke"
            order.append(i)

        tasks = []
        for i in range(8):
            tasks.append(asyncio.create_task(one(i)))
            while len(hold.queue) < i + 1:  # held, before the next one comes
                await asyncio.sleep(0)
        files.wakeable.unlink()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == list(range(8))
    assert files.wake_request.exists()  # one wake asked, never removed by the waker


def test_a_failed_wake_refuses_the_held_and_backs_off(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=60, failed_backoff=60)
    gate.wakeable.write_text("asleep\n")
    held = Held(waker.hold).start(3, waker.wait_holding)
    gate.wake_request.unlink()  # the wake service ended, the instance still asleep
    answers = held.join()
    assert [a[:2] for a in answers] == [(403, "failed")] * 3
    assert gate.wakeable.exists()  # it stays asleep: the waker changes no flag
    # within the backoff: refused at once, no new wake asked (no storm)
    assert waker.hold() == (403, "failed", 0.0)
    assert not gate.wake_request.exists()
    assert "the wake failed" in waker.log()
    assert waker.stop() == 0


def test_after_the_backoff_the_next_request_asks_again(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=60, failed_backoff=0.3)
    gate.wakeable.write_text("asleep\n")
    held = Held(waker.hold).start(1, waker.wait_holding)
    gate.wake_request.unlink()
    assert [a[:2] for a in held.join()] == [(403, "failed")]
    wait_until(lambda: waker.state()["refusing_s"] == 0, "the backoff over")
    retried = Held(waker.hold).start(1, waker.wait_holding)
    assert gate.wake_request.exists()  # the next request tries again
    gate.wakeable.unlink()
    assert [a[:2] for a in retried.join()] == [(204, "woke")]


def test_held_past_the_bound_is_refused_while_the_wake_goes_on(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=0.5)
    gate.wakeable.write_text("asleep\n")
    status, why, seconds = waker.hold()
    assert (status, why) == (403, "timeout")
    assert seconds >= 0.5
    assert gate.wake_request.exists()  # the wake goes on: the next request waits for it
    later = Held(waker.hold).start(1, waker.wait_holding)
    assert gate.wake_request.read_text()  # still the one wake
    gate.wakeable.unlink()
    assert [a[:2] for a in later.join()] == [(204, "woke")]


def test_a_window_that_refuses_takes_over(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=60)
    gate.wakeable.write_text("asleep\n")
    held = Held(waker.hold).start(2, waker.wait_holding)
    gate.closed.write_text("sleep cause=window level=1\n")
    assert [a[:2] for a in held.join()] == [(403, "refused")] * 2
    assert waker.hold() == (403, "refused", 0.0)


def test_warming_holds_until_the_warmup_ends(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    """CPU: the wake is the unit's start; its warmup (the warming flag) may outlast the
    wakeable flag: requests wait for both."""
    waker = start_waker(hold=60)
    gate.wakeable.write_text("asleep\n")
    held = Held(waker.hold).start(2, waker.wait_holding)
    gate.warming.write_text("")
    gate.wakeable.unlink()
    wait_until(lambda: waker.state()["holding"] == 2, "still held while warming")
    assert held.answers == []
    gate.warming.unlink()
    assert [a[:2] for a in held.join()] == [(204, "woke")] * 2


def test_a_request_nginx_gave_up_on_is_let_go(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=60)
    gate.wakeable.write_text("asleep\n")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(gate.socket))
        s.sendall(b"GET /hold HTTP/1.0\r\nHost: x\r\n\r\n")
        waker.wait_holding(1)
    wait_until(lambda: waker.state()["holding"] == 0, "the closed connection let go")


def test_sigterm_refuses_what_it_holds_and_removes_its_sockets(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    waker = start_waker(hold=60, idle_after=30)
    assert gate.activity.exists()
    gate.wakeable.write_text("asleep\n")
    held = Held(waker.hold).start(1, waker.wait_holding)
    assert waker.stop() == 0
    assert [a[:2] for a in held.join()] == [(403, "failed")]
    assert not gate.socket.exists() and not gate.activity.exists()
    assert "waker stopped" in waker.log()


@pytest.fixture
def loaded(vllm_double_factory: Callable[..., VllmDouble]) -> VllmDouble:
    """vLLM with --enable-server-load-tracking (the unit always passes it): /load counts."""
    return vllm_double_factory(server_load_tracking=True)


def load_polls(double: VllmDouble) -> int:
    return sum(1 for _, path in double.counters.requests if path.startswith("/load"))


def test_idle_sleep_asked_after_idle_after_without_activity(
    start_waker: Callable[..., Waker], gate: GateFiles, loaded: VllmDouble
) -> None:
    waker = start_waker(loaded.address, idle_after=1)
    for _ in range(2):
        send_datagram(gate.activity)
    last = time.time()  # before the last datagram: the waker receives it later
    send_datagram(gate.activity)
    wait_until(lambda: waker.state()["activities"] == 3, "3 datagrams counted")
    wait_until(gate.sleep_request.exists, "the sleep request")
    assert gate.sleep_request.stat().st_mtime >= last + 1.0
    assert "idle sleep asked by the waker" in gate.sleep_request.read_text()
    assert load_polls(loaded) >= 1  # it asked vLLM what is in flight first
    assert "asked for an idle sleep" in waker.log()
    # asleep now (the test is systemd: the sleep closed the wakeable flag, its service ended)
    gate.wakeable.write_text("sleep cause=idle\n")
    gate.sleep_request.unlink()
    wait_until(lambda: not waker.state()["awake"], "asleep, as the waker sees it")
    polls = load_polls(loaded)
    # awake again: its idle time starts from the moment it woke, not from the last request
    woke = time.time()
    gate.wakeable.unlink()
    wait_until(gate.sleep_request.exists, "the next sleep request")
    assert gate.sleep_request.stat().st_mtime >= woke + 1.0
    assert load_polls(loaded) > polls


def test_no_idle_sleep_while_a_request_is_in_flight(
    start_waker: Callable[..., Waker], gate: GateFiles, loaded: VllmDouble
) -> None:
    """A stream longer than idle_after has no log line yet: /load says it is in flight."""
    import requests

    release = threading.Event()
    loaded.config.admission_hold = release  # the stream stays in flight until released
    body = {"model": "double-model", "prompt": "x", "max_tokens": 3, "stream": True}
    stream = threading.Thread(
        target=lambda: requests.post(loaded.url + "/v1/completions", json=body, timeout=60).text,
        daemon=True,
    )
    stream.start()
    loaded.wait_for(lambda: loaded.counters.admitted == 1, "a request in flight")
    start_waker(loaded.address, idle_after=1)
    # the event: the waker looked at /load three times (each a second after the last look)
    loaded.wait_for(lambda: load_polls(loaded) >= 3, "three looks at /load", timeout=60)
    assert not gate.sleep_request.exists()
    released = time.time()
    release.set()
    stream.join(30)
    wait_until(gate.sleep_request.exists, "the sleep request after the stream")
    assert gate.sleep_request.stat().st_mtime > released  # never while it was in flight


class Refuser:
    """A port that accepts connections and closes them at once (vLLM gone mid-restart)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        threading.Thread(target=self._loop, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@pytest.mark.parametrize("vllm", ["unreachable", "no /load route"])
def test_load_unknown_no_sleep_one_line(
    start_waker: Callable[..., Waker], gate: GateFiles, loaded: VllmDouble, vllm: str
) -> None:
    if vllm == "unreachable":
        refuser = Refuser()
        target, looks = refuser.address, lambda: refuser.accepted
    else:
        loaded.config.load_route = False
        target, looks = loaded.address, lambda: load_polls(loaded)
    waker = start_waker(target, idle_after=0.2)
    wait_until(lambda: looks() >= 5, "five looks at /load")
    assert waker.log().count("cannot tell what is in flight") == 1, waker.log()
    assert not gate.sleep_request.exists()


def test_bad_options_change_nothing(run, gate: GateFiles, tmp_path: Path) -> None:
    from tests.waker.support import waker_argv, waker_config, write_config

    def argv(files: GateFiles = gate, **options: object) -> list[str]:
        return waker_argv(files, "127.0.0.1:8000", **options)[1:]

    def config(**changes: object) -> list[str]:
        path = write_config(
            {**waker_config(gate, "127.0.0.1:8000"), **changes}, tmp_path / "c.json"
        )
        return ["waker", "--config", str(path)]

    missing = GateFiles(tmp_path / "nope")
    result = run(*argv(missing))
    assert result.exit_code == 2 and "does not exist" in result.stderr, result.output
    gate.socket.write_text("not a socket")
    result = run(*argv())
    assert result.exit_code == 2 and "is not a socket" in result.stderr
    gate.socket.unlink()
    idle = {"cause": "idle", "request_file": str(gate.sleep_request), "settings": {"after": 5}}
    result = run(*config(triggers=[idle]))  # no activity socket
    assert result.exit_code == 2 and "the idle trigger needs activity_socket" in result.stderr
    result = run(*config(target="https://x:1/prefix"))
    assert result.exit_code == 2 and "HOST:PORT" in result.stderr
    assert sorted(os.listdir(gate.dir)) == []  # nothing bound or written
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"name": "tiny"}', "target: missing"),
        ("HOLD", "hold: a string where a number goes"),
        ("TYPO", "idle_afer: not a key"),
        ("CAUSE", "triggers[0].cause: 'nap' is no sleep trigger's (one of idle)"),
        ("AFTER", "triggers[0].settings.after: 0 where a number of seconds above 0 goes"),
        ("NOLIST", "triggers: an object where a list goes"),
        ("FLAG", "flags.wakeable: missing"),
        ("CHECK", "output_check goes with wake_here"),
        ("GONE", "cannot read it"),
    ],
)
def test_a_bad_config_file_is_one_line_and_nothing_bound(
    run, gate: GateFiles, tmp_path: Path, text: str, why: str
) -> None:
    """`warmctl waker --config FILE` with a file that is not the waker's configuration: one
    line that says what is wrong, exit 2, nothing bound or written."""
    from tests.waker.support import waker_config

    good = waker_config(gate, "127.0.0.1:8000")
    idle = waker_config(gate, "127.0.0.1:8000", idle_after=5)["triggers"][0]
    changed = {
        "HOLD": {**good, "hold": "60"},
        "TYPO": {**good, "idle_afer": 5},
        "CAUSE": {**good, "triggers": [{**idle, "cause": "nap"}]},
        "AFTER": {**good, "triggers": [{**idle, "settings": {"after": 0}}]},
        "NOLIST": {**good, "triggers": {}},
        "FLAG": {**good, "flags": {k: v for k, v in good["flags"].items() if k != "wakeable"}},
        "CHECK": {**good, "output_check": str(tmp_path / "outputs.json")},
    }
    path = tmp_path / "waker.json"
    if text in changed:
        path.write_text(json.dumps(changed[text]))
    elif text != "GONE":
        path.write_text(text)
    result = run("waker", "--config", str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and why in result.stderr, result.stderr
    assert f"--config {path}" in result.stderr and "Traceback" not in result.output
    assert sorted(os.listdir(gate.dir)) == []


def test_a_second_waker_for_the_same_instance_is_refused(
    start_waker: Callable[..., Waker], gate: GateFiles, run
) -> None:
    from tests.waker.support import waker_argv

    start_waker()
    result = run(*waker_argv(gate, "127.0.0.1:8000")[1:])
    assert result.exit_code == 2 and "another process listens" in result.stderr
    assert gate.socket.exists()  # the first one's socket is left alone


def test_it_tells_systemd_it_is_ready(gate: GateFiles, tmp_path: Path) -> None:
    """Type=notify: READY=1 once both sockets are bound (nginx may ask from then on)."""
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(notify))
        listener.settimeout(30)
        waker = Waker(gate, "127.0.0.1:9", tmp_path / "w.log", env={"NOTIFY_SOCKET": str(notify)},
                      idle_after=60).start()  # fmt: skip
        try:
            assert listener.recv(64) == b"READY=1"
            assert gate.socket.exists() and gate.activity.exists()
        finally:
            waker.stop()


def test_wake_here_wakes_a_sleep_mode_engine_itself(
    start_waker: Callable[..., Waker], gate: GateFiles, vllm_double: VllmDouble
) -> None:
    """GPU: the waker runs `warmctl wake` itself (no service to start inside the hold): the
    double's engine really woken over HTTP, both asleep flags opened, the request file made
    and removed around it, the held requests released."""
    vllm_double.put_to_sleep(1)
    gate.wakeable.write_text("sleep cause=idle level=1\n")
    waker = start_waker(f"127.0.0.1:{vllm_double.port}", hold=60, wake_here=True)
    answers = Held(waker.hold).start(4, lambda n: None).join()
    assert sorted(a[:2] for a in answers) == [(204, "woke")] * 4, waker.log()
    assert not vllm_double.is_sleeping
    assert not gate.wakeable.exists() and not gate.closed.exists()
    wait_until(lambda: not gate.wake_request.exists(), "the request file removed after the wake")
    assert "woken by this waker" in waker.log()


def test_wake_here_waits_for_a_sleep_that_holds_the_lock(
    start_waker: Callable[..., Waker], gate: GateFiles, vllm_double: VllmDouble
) -> None:
    """A request while a sleep of the instance still runs (it holds the lock): the wake waits
    for the sleep, then wakes the engine the sleep put to sleep, never the other way round."""
    import fcntl

    lock = gate.dir / f".{gate.name}.lock"  # warmctl.sleepwake.gate.lock_path: the instance's lock
    gate.wakeable.write_text("sleep cause=idle level=1\n")
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the idle sleep's `warmctl sleep --gate`, still draining
    try:
        waker = start_waker(f"127.0.0.1:{vllm_double.port}", hold=60, wake_here=True)
        held = Held(waker.hold).start(2, waker.wait_holding)
        wait_until(lambda: "another sleep or wake" in waker.log(), "the wake waiting for the lock")
        assert held.answers == [] and gate.wakeable.exists()
        vllm_double.put_to_sleep(1)  # the sleep's /sleep, done
    finally:
        os.close(fd)  # the sleep ends
    answers = held.join()
    assert sorted(a[:2] for a in answers) == [(204, "woke")] * 2, waker.log()
    assert not vllm_double.is_sleeping


def test_holding_holds_without_asking_then_releases_when_the_server_answers(
    start_waker: Callable[..., Waker], gate: GateFiles, vllm_double: VllmDouble
) -> None:
    """A single host's restart (the holding flag): requests are held, nothing is asked of
    systemd; once the flag goes, one /health of the server releases them all (relaunched)."""
    waker = start_waker(vllm_double.address, hold=60, holding=True)
    gate.holding.write_text("draining\n")
    held = Held(waker.hold).start(4, waker.wait_holding)
    assert not gate.wake_request.exists() and waker.state()["relaunch"]
    gate.holding.unlink()
    assert sorted(a[:2] for a in held.join()) == [(204, "relaunched")] * 4
    assert "4 held requests released" in waker.log()


def test_a_holding_flag_older_than_the_hold_holds_no_new_request(
    start_waker: Callable[..., Waker], gate: GateFiles
) -> None:
    """A flag a failed hand's reload left behind stops holding after the hold's bound."""
    waker = start_waker(hold=5, holding=True)
    gate.holding.write_text("draining\n")
    old = time.time() - 6
    os.utime(gate.holding, (old, old))
    assert waker.hold()[:2] == (204, "awake")
