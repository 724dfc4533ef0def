"""Every HTTP client warmctl runs, against a hostile server (tests/lib/hostile.py): a drip in the
headers or the body, an endless chunked body, a 2 GiB body, an answer that is not JSON, JSON
nested past the parser's depth, escape sequences in error messages, model names and versions.

Each probe: the command ends within a bound of its configured deadline (the machine is busy:
generous), its memory stays under a cap (tracemalloc's peak), it says one clean line with the
documented exit code (2), and no raw control character reaches the output. Probes per client:
len(BEHAVIOURS) (7); clients: the CLI's status, verify, warmup, sleep, wake, drain and tune, the
waker's /load reader and the benchmark's streamed completion.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hardening.conftest import one_error_line
from tests.lib.hostile import BEHAVIOURS, MODEL, RAW_BYTES, Hostile
from warmctl.errors import WarmctlError
from warmctl.server import client as client_module

TIMEOUT = 0.5  # --timeout of every probe: the most a plain answer may take, whole
STREAM_TIMEOUTS = 2  # a stream's whole answer, in --timeouts (the product's is 10)
STREAM = STREAM_TIMEOUTS * TIMEOUT
MEMORY_CAP = 32 * 2**20  # the largest cap on a read (/metrics) is 8 MiB


@dataclass(frozen=True)
class Cli:
    """A command and the route where the server turns hostile (`escapes`: the route that
    answers the error, when it is another: the model names and version are shown first)."""

    name: str
    args: Callable[[str, Path], list[str]]
    route: str
    budget: float  # the hostile call's deadline
    escapes_route: str | None = None
    asleep: bool = False


WARMUP = ["--no-wait-ready", "--batch-sizes", "1", "--no-chat", "--max-tokens", "4"]
CLIS = [
    Cli("status", lambda u, d: ["status", u], "/v1/models", TIMEOUT, "/is_sleeping"),
    Cli(
        "verify",
        lambda u, d: ["verify", u, "--steady", "1", "--attempts", "1", "--ready-timeout", "2"],
        "/v1/completions",
        STREAM,
    ),
    Cli(
        "warmup",
        lambda u, d: ["warmup", u, *WARMUP],
        "/v1/completions",
        STREAM,
    ),
    Cli("sleep", lambda u, d: ["sleep", u, "--drain-timeout", "2"], "/metrics", TIMEOUT),
    Cli("wake", lambda u, d: ["wake", u, "--no-warmup"], "/is_sleeping", TIMEOUT, asleep=True),
    Cli(
        "drain",
        lambda u, d: ["drain", u, "--gate", str(d / "vllm.draining"), "--drain-timeout", "2"],
        "/metrics",
        TIMEOUT,
    ),
    Cli("tune", lambda u, d: ["tune", u, "--window", "1", "--every", "0.5"], "/metrics", TIMEOUT),
]


@pytest.fixture(autouse=True)
def short_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "STREAM_TIMEOUTS", STREAM_TIMEOUTS)


@pytest.fixture
def memory() -> Iterator[Callable[[], int]]:
    """The peak of Python's allocations since the probe started."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def assert_bounded(t0: float, budget: float) -> None:
    elapsed = time.monotonic() - t0
    assert elapsed < 3 * budget + 5, f"{elapsed:.1f} s for a {budget:g} s deadline"


def assert_terminal_safe(text: str) -> None:
    for raw in RAW_BYTES:
        assert raw not in text, (raw, text)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("cli", CLIS, ids=[c.name for c in CLIS])
def test_cli_against_a_hostile_server(
    run, tmp_path: Path, memory: Callable[[], int], cli: Cli, behaviour: str
) -> None:
    route = (cli.escapes_route or cli.route) if behaviour == "escapes" else cli.route
    with Hostile(behaviour, on={route}, asleep=cli.asleep) as srv:
        t0 = time.monotonic()
        result = run(*cli.args(srv.url, tmp_path), "--timeout", str(TIMEOUT))
        assert_bounded(t0, cli.budget)
        assert memory() < MEMORY_CAP, f"peak {memory() / 2**20:.0f} MiB"
        assert srv.hits, f"the command never reached {route}"
    line = one_error_line(result, code=2)
    assert "internal error" not in line
    assert_terminal_safe(result.output)
    if behaviour == "escapes":
        assert "\\x1b]0;owned\\x07" in line  # shown, escaped
        assert "[bold]b[/bold]" in line  # rich markup shown as it is
        if cli.name == "status":  # the table: the model name and the version, escaped too
            assert result.stdout.count("\\x1b[2J") == 2, result.stdout
            assert "[bold]b[/bold]" in result.stdout
    if behaviour in ("drip_head", "drip_body"):
        assert "timed out" in line
    if behaviour in ("endless", "huge"):
        assert "not read further" in line or "timed out" in line


def test_waits_stay_within_ready_timeout(run) -> None:
    """A server that drips its /v1/models: `verify --wait-ready` gives up at --ready-timeout,
    not after the last call it started (each call is cut at what is left of the wait)."""
    with Hostile("drip_body", on={"/v1/models"}) as srv:
        t0 = time.monotonic()
        result = run("verify", srv.url, "--wait-ready", "--ready-timeout", "1.5", "--timeout", "20")
        elapsed = time.monotonic() - t0
    assert elapsed < 1.5 + 5, elapsed
    one_error_line(result, "not ready after 1.5 s", code=2)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_waker_load_reader(
    monkeypatch: pytest.MonkeyPatch, memory: Callable[[], int], behaviour: str
) -> None:
    """The waker's only call to vLLM (/load, its idle sleep): a clean error or 'no answer'."""
    from warmctl.waker import service

    monkeypatch.setattr(service, "LOAD_TIMEOUT_S", TIMEOUT)
    with Hostile(behaviour, on={"/load"}) as srv:
        t0 = time.monotonic()
        try:
            value = service._load_reader(srv.url)()
        except WarmctlError as err:
            assert "\n" not in err.message
            value = err
        assert_bounded(t0, TIMEOUT)
        assert memory() < MEMORY_CAP
        assert srv.hits
    assert value is None or isinstance(value, WarmctlError), value


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_bench_streamed_completion(memory: Callable[[], int], behaviour: str) -> None:
    """The benchmark's client (warmctl's own, a longer --timeout): a clean error."""
    from warmctl.bench.api import Api

    with Hostile(behaviour, on={"/v1/completions"}) as srv:
        api = Api(srv.url, MODEL, timeout=TIMEOUT)
        t0 = time.monotonic()
        with pytest.raises(WarmctlError) as info:
            api.complete("hello", 4)
        assert_bounded(t0, STREAM)
        assert memory() < MEMORY_CAP
    assert "\n" not in info.value.message
