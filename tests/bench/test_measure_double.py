"""The bench's request-side measurements and sleep cycles through warmctl's client, against the
loopback vLLM double (its first request slow, later ones fast; sleep mode with level-2 garbage
weights until reloaded)."""

import statistics

import pytest

from warmctl.bench import measure, sleepcycle
from warmctl.bench.api import Api


def api_for(double):
    return Api(double.url, double.config.model, timeout=10)


def test_first_request_and_steady_ttft(vllm_double_factory):
    double = vllm_double_factory(first_ttft=0.3, ttft=0.005)
    single = measure.single(api_for(double), measure.Counter(), n=5)
    # the double's sleeps are floors (a loaded machine only adds): 300 ms first, 5 ms later
    assert single.first_ms >= 300 and single.samples_ms[0] == single.first_ms
    assert len(single.samples_ms) == 5 and min(single.samples_ms[1:]) >= 5
    # steady: the median of the later requests, not a mean with the first in it
    assert single.steady_ms == statistics.median(single.samples_ms[1:])
    assert single.ratio > 2  # unless the machine stalled 150 ms in two of four requests
    prompts = double.counters.prompts
    assert len(set(prompts)) == len(prompts) == 5  # no prefix-cache hits between requests


def test_bursts_are_concurrent(vllm_double_factory):
    # width 4: the double's listen backlog is 5 (uvicorn's is 2048)
    # each request lasts >= 300 ms: a burst released together overlaps even on a busy machine
    double = vllm_double_factory(ttft=0.3)
    res = measure.bursts(api_for(double), measure.Counter(), width=4, n=3)
    assert len(res.bursts_ms) == 3 and all(len(b) == 4 for b in res.bursts_ms)
    assert double.counters.max_in_flight == 4  # released together, not one by one
    assert min(min(b) for b in res.bursts_ms) >= 300.0


def test_decode_ms_per_token(vllm_double_factory):
    double = vllm_double_factory(ttft=0.2, token_delay=0.004)
    res = measure.decode(api_for(double), measure.Counter(), tokens=40, n=2)
    assert len(res.runs) == 2
    # against the double's own pace on the same streams (its sleeps overshoot on a loaded
    # machine; the client may read a late first token with the next): within a factor of 1.5,
    # where counting the 200 ms TTFT in (>= 9 ms/token) or half the tokens would be off by 2x
    own = [t.decode_ms_per_token() for t in double.counters.streams]
    assert all(o is not None and o >= 4.0 for o in own)
    for mine, theirs in zip(res.runs, own, strict=True):
        assert theirs / 1.5 <= mine <= theirs * 1.5, (res.runs, own)


@pytest.mark.parametrize("how", ["warmctl", "route"])
def test_level2_cycle_reloads_weights_before_the_first_request(vllm_double, how):
    api = api_for(vllm_double)
    res = sleepcycle.cycle(api, measure.Counter(), 2, how, list, None, after=2)
    c = vllm_double.counters
    assert c.sleeps == [2]
    assert "reload_weights" in c.rpcs
    assert c.garbage_outputs == 0  # no request saw the discarded weights
    assert c.aborted == 0
    assert not vllm_double.is_sleeping
    assert res.wake_to_first_token_s >= res.wake_s
    if how == "warmctl":  # warmctl's wake ran its warmup before the user request
        assert any(s["name"] == "warmup" for s in res.wake_detail["steps"])


def test_level1_cycle(vllm_double_factory):
    double = vllm_double_factory(sleep_delay=0.05, wake_delay=0.02)
    res = sleepcycle.cycle(api_for(double), measure.Counter(), 1, "warmctl", list, None, after=1)
    assert res.sleep_s >= 0.05 and res.wake_s >= 0.02
    assert double.counters.sleeps == [1]
    assert "reload_weights" not in double.counters.rpcs
