"""Sleep and wake under streaming load against the double: every request is counted, the gate
refuses cleanly, nothing in flight is cut, and the wake's output check runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.double import VllmDouble

from warmctl.bench import loadsleep
from warmctl.bench.api import Api
from warmctl.errors import WarmctlError

# the run's phases are fixed durations (the bench's design): long enough against 0.1 s streams
# that a loaded machine still has streams in flight at the sleep and completes one after the
# wake (tail: a refused client's retry pause plus a stream, several times over)
FAST = loadsleep.Load(clients=6, max_tokens=10, lead_s=0.8, asleep_s=0.3, tail_s=1.2)


@pytest.mark.parametrize("level", [1, 2])
def test_nothing_cut_every_request_counted(vllm_double: VllmDouble, tmp_path: Path, level) -> None:
    vllm_double.config.token_delay = 0.01  # each stream lives ~0.1 s: the sleep finds them
    api = Api(vllm_double.url, "double-model")
    res = loadsleep.run(api, tmp_path / "g.closed", tmp_path / "o.json", level=level, load=FAST)
    c = res.counts
    assert c.cut == 0 and c.engine_errors == 0, c.errors
    assert c.started == c.completed > 0 and c.refused > 0
    assert res.in_flight_at_sleep > 0  # the drain had streams to wait for
    assert res.completed_after_wake > 0
    assert res.clean and res.output_check and res.output_check["status"] == "passed"
    d = vllm_double.counters
    assert d.aborted == 0 and d.sleep_with_in_flight == 0 and d.sleeps == [level]
    assert d.garbage_outputs == 0  # level 2: reloaded before the gate opened
    assert not (tmp_path / "g.closed").exists()
    assert "cut 0, engine errors 0" in loadsleep.summary(res)
    assert res.door == loadsleep.DOOR


def test_a_bare_sleep_under_load_is_counted_as_cut(
    vllm_double: VllmDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without the drain, /sleep aborts the streams, and the counts say so."""
    vllm_double.config.token_delay = 0.01
    api = Api(vllm_double.url, "double-model")

    def bare_sleep(client, level, before_sleep=None):
        client.sleep(level)
        from warmctl.sleepwake.steps import SleepReport

        return SleepReport(target="x", level=level)

    monkeypatch.setattr(loadsleep.sleepwake, "sleep", bare_sleep)
    res = loadsleep.run(api, tmp_path / "g.closed", tmp_path / "o.json", load=FAST)
    assert res.counts.cut > 0 and not res.clean
    assert res.output_check and res.output_check["status"] == "not_recorded"


def test_a_wake_that_answers_differently_fails_the_run(
    vllm_double: VllmDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Api(vllm_double.url, "double-model")
    real_sleep = loadsleep.sleepwake.sleep

    def sleep_then_corrupt(*args, **kwargs):
        report = real_sleep(*args, **kwargs)
        vllm_double.config.corrupt_answers = True
        return report

    monkeypatch.setattr(loadsleep.sleepwake, "sleep", sleep_then_corrupt)
    with pytest.raises(WarmctlError, match="answers differently"):
        loadsleep.run(api, tmp_path / "g.closed", tmp_path / "o.json", load=FAST)
    assert (tmp_path / "g.closed").exists()  # the gate stayed closed
