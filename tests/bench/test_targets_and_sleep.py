"""The issue's targets on a benchmark document, and the sleep cycle against a scripted server."""

import dataclasses

import pytest

from warmctl.bench import sleepcycle
from warmctl.bench.api import Sample
from warmctl.bench.measure import Counter
from warmctl.bench.targets import evaluate
from warmctl.errors import WarmctlError
from warmctl.sleepwake.outputcheck import PROMPTS, Answer


def step(
    config, state, *, first=20.0, steady=20.0, burst=(60.0, 60.0), warm=40.0, ready=38.0, sleep=None
):
    return {
        "name": f"x-{config}-{state}",
        "config": config,
        "state": state,
        "ready_s": ready,
        "warm_s": warm,
        "single": {"first_ms": first, "steady_ms": steady, "ratio": first / steady},
        "bursts": {
            "first_mean_ms": burst[0],
            "steady_mean_ms": burst[1],
            "ratio": burst[0] / burst[1],
        },
        "sleep": sleep or [],
    }


def test_targets_met_and_missed():
    cycles = [
        {
            "level": 1,
            "how": "warmctl",
            "wake_to_first_token_s": 0.45,
            "wake_s": 0.43,
            "freed_fraction": 0.989,
        },
        {
            "level": 2,
            "how": "warmctl",
            "wake_to_first_token_s": 1.9,
            "wake_s": 1.8,
            "freed_fraction": None,
        },
    ]
    doc = {
        "steps": [
            step("A", "cold", ready=120.0, warm=120.0, first=80.0),
            step("B", "cold", first=21.0, warm=130.0),
            step("B", "restart", first=25.0, burst=(80.0, 60.0), warm=55.0, sleep=cycles),
            {"name": "x-C-cold", "config": "C", "state": "cold", "skipped": "budget"},
        ]
    }
    v = evaluate(doc)
    by = {(x.target, x.config): x for x in v}
    first = by[("first request after warm / steady TTFT (c=1)", "B")]
    assert first.met is False and first.value == pytest.approx(1.25)  # the worst start counts
    burst = by[("first 16-wide burst / steady burst (mean TTFT)", "B")]
    assert burst.met is False
    restart = by[("restart to warm / plain vLLM cold start", "B")]
    assert restart.met is False and restart.value == pytest.approx(55.0 / 120.0)  # > 25 %
    cold = by[("cold start to warm / plain vLLM cold start", "B")]
    assert cold.met is False and cold.value == pytest.approx(130.0 / 120.0)
    assert by[("L1: warmctl wake -> first token", "B")].met is False  # 0.45 s > 0.3 s
    l2 = "L2: warmctl wake (reload, output check, warmup) -> first token"
    assert by[(l2, "B")].met is False and by[(l2, "B")].value == pytest.approx(1.9)
    assert by[("L1: share of the server's GPU memory freed", "B")].met is True
    assert not [x for x in v if x.config == "C"]  # C was skipped: no verdicts


def test_first_request_is_also_set_against_a_request_after_an_idle_pause():
    a = step("C", "cold", first=21.0, steady=18.0)
    b = step("C", "restart", first=16.0, steady=13.0)
    a["single"]["after_idle_ms"] = 20.0
    b["single"]["after_idle_ms"] = 16.5
    by = {x.target: x for x in evaluate({"steps": [a, b]}, configs=("C",))}
    first = by["first request after warm / steady TTFT (c=1)"]
    assert first.met is False  # judged against back-to-back steady TTFT, as the target says
    assert first.measured.endswith("vs a request after the idle pause 0.97-1.05x")


def test_unmeasured_targets_are_not_judged():
    doc = {"steps": [step("B", "cold")]}
    by = {x.target: x for x in evaluate(doc)}
    assert by["restart to warm / plain vLLM cold start"].met is None
    assert by["L1: warmctl wake -> first token"].met is None


class ScriptedApi:
    """Stands in for a sleep-mode server: records the calls, asleep between sleep and wake."""

    def __init__(self, stays_awake=False, garbles_after_wake=False):
        self.calls = []
        self.asleep = False
        self.stays_awake = stays_awake
        self.garbles_after_wake = garbles_after_wake
        self.woken = False

    def sleep(self, level):
        self.calls.append(("sleep", level))
        self.asleep = not self.stays_awake
        return {"steps": [{"name": "drain", "seconds": 0.0}]}

    def sleep_route(self, level):
        self.calls.append(("sleep_route", level))
        self.asleep = True
        return {}

    def wake(self, level):
        self.calls.append(("wake", level))
        self.asleep = False
        self.woken = True
        return {"steps": [{"name": "warmup", "seconds": 0.1}]}

    def wake_route(self, level):
        self.calls.append(("wake_route", level))
        self.asleep = False
        self.woken = True
        return {}

    def is_sleeping(self):
        return self.asleep

    def answers(self):
        assert not self.asleep, "a request reached a sleeping server"
        garbled = self.garbles_after_wake and self.woken
        ids = [9, 9, 9] if garbled else [1, 2, 3]
        return [Answer(p, "x", ids, [-0.5, -0.25, -0.125]) for p in PROMPTS]

    def complete(self, prompt, max_tokens, ignore_eos=False):
        assert not self.asleep, "a request reached a sleeping server"
        garbled = self.garbles_after_wake and self.woken
        text = "!!!!" if garbled else f"answer to {prompt[:24]}"
        return Sample(0.02, 0.03, max_tokens, 100, 1.0, text)


def test_cycle_sleeps_wakes_then_measures_the_first_request():
    api = ScriptedApi()
    res = sleepcycle.cycle(api, Counter(), 2, "warmctl", list, None, after=3)
    assert api.calls == [("sleep", 2), ("wake", 2)]
    assert res.first_ttft_ms == pytest.approx(20.0)
    assert res.wake_to_first_token_s == pytest.approx(res.wake_s + 0.02)
    assert res.wake_detail["steps"][0]["name"] == "warmup"
    assert res.freed_fraction is None  # no GPU here


def test_cycle_checks_the_output_after_the_wake():
    """The same greedy prompt before the sleep and after the wake: a server that answers it
    differently after the wake (bad reload, stale prefix cache) is recorded as such."""
    good = sleepcycle.cycle(ScriptedApi(), Counter(), 2, "warmctl", list, None, after=2)
    assert good.output_same and good.output_logprob_diff == 0.0
    bad = sleepcycle.cycle(
        ScriptedApi(garbles_after_wake=True), Counter(), 2, "warmctl", list, None, after=2
    )
    assert not bad.output_same
    assert bad.output_diff == "prompt 1 of 3 token 1 is id 9 where 1 was recorded"


def test_cycle_route_variant_uses_the_bare_routes():
    api = ScriptedApi()
    sleepcycle.cycle(api, Counter(), 1, "route", list, None, after=1)
    assert api.calls == [("sleep_route", 1), ("wake_route", 1)]


def test_cycle_fails_when_the_server_does_not_sleep():
    with pytest.raises(WarmctlError, match="did not report sleeping"):
        sleepcycle.cycle(ScriptedApi(stays_awake=True), Counter(), 1, "warmctl", list, None)


def test_freed_fraction_is_of_the_servers_own_memory():
    c = sleepcycle.SleepCycle(1, "route", 1.0, 0.4, 20.0, 0.42, 20.0, 134_000, 1_400, 400)
    assert c.freed_fraction == pytest.approx((134_000 - 1_400) / (134_000 - 400))


def test_sleep_table_shows_the_output_check():
    from rich.console import Console

    from warmctl.bench.report import sleep_table

    rows = []
    for api in (ScriptedApi(), ScriptedApi(garbles_after_wake=True)):
        res = sleepcycle.cycle(api, Counter(), 1, "route", list, None, after=1)
        rows.append(dataclasses.asdict(res) | {"output_same": res.output_same})
    console = Console(record=True, width=200)
    console.print(sleep_table({"steps": [{"name": "2-C-cold", "sleep": rows}]}))
    text = console.export_text()
    assert text.count("same") == 1 and text.count("DIFFERS") == 1


def test_restart_met_at_a_quarter_and_correctness_verdicts():
    ok = {"status": "passed", "seconds": 0.15}
    cycles = [
        {"level": 1, "how": "warmctl", "wake_to_first_token_s": 0.25, "wake_s": 0.2,
         "wake_detail": {"output_check": ok}},
        {"level": 2, "how": "warmctl", "wake_to_first_token_s": 0.9, "wake_s": 0.8,
         "wake_detail": {"output_check": {"status": "not_recorded"}}},
    ]  # fmt: skip
    counts = {"started": 10, "completed": 10, "refused": 4, "cut": 0, "engine_errors": 0}
    loads = [{"clients": 16, "level": 1, "counts": counts, "output_check": ok}]
    restart = step("B", "restart", warm=24.0, sleep=cycles)
    restart["sleep_under_load"] = loads
    doc = {"steps": [step("A", "cold", ready=100.0, warm=100.0), step("B", "cold", warm=90.0),
                     restart]}  # fmt: skip
    by = {x.target: x for x in evaluate(doc)}
    assert by["restart to warm / plain vLLM cold start"].met is True  # 24 %
    assert by["cold start to warm / plain vLLM cold start"].met is True
    assert by["L1: warmctl wake -> first token"].met is True
    assert by["L2: warmctl wake (reload, output check, warmup) -> first token"].met is True
    check = by["output check after warmctl wake (greedy answers as before the sleep)"]
    assert check.met is False and check.measured == "2 of 3 wakes passed"  # one not recorded
    load = by["sleep under load (16 streaming clients)"]
    assert load.met is True and "4 refused by the gate, 0 cut" in load.measured
    loads[0]["counts"] = {**counts, "cut": 1, "completed": 9}
    by = {x.target: x for x in evaluate(doc)}
    assert by["sleep under load (16 streaming clients)"].met is False


def test_relaunch_judged_at_a_tenth_and_the_primed_restart_at_a_quarter():
    """Issue 25: under the launcher both are judged, each against A's cold start."""
    launched = step("R", "restart", warm=24.0)
    launched["relaunch"] = {"warm_s": 9.5, "ready_s": 7.0}
    doc = {"steps": [step("A", "cold", ready=100.0, warm=100.0), launched]}
    by = {(x.target, x.config): x for x in evaluate(doc)}
    restart = by[("restart to warm / plain vLLM cold start", "R")]
    relaunch = by[("relaunch to warm / plain vLLM cold start", "R")]
    assert (restart.met, restart.limit) == (True, "<= 25%")
    assert (relaunch.met, relaunch.limit, relaunch.measured) == (
        True,
        "<= 10%",
        "9.5 s / 100.0 s = 10%",
    )
    launched["relaunch"]["warm_s"] = 18.0
    by = {(x.target, x.config): x for x in evaluate(doc)}
    assert by[("relaunch to warm / plain vLLM cold start", "R")].met is False  # 18 %: not 25 %
    assert ("relaunch to warm / plain vLLM cold start", "B") not in by  # no launcher, no relaunch
