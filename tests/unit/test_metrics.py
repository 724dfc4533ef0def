import math

import pytest

from warmctl.errors import WarmctlError
from warmctl.server.metrics import Histogram, parse_metrics

# shaped like vLLM's /metrics: two engines, counters, a histogram, the sleep-state gauge
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:engine_sleep_state Engine sleep state
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 1.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 12.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.45
"""


def test_gauges_are_summed_over_engines() -> None:
    m = parse_metrics(VLLM_TEXT)
    assert m.running == 4.0
    assert m.waiting == 2.0
    assert m.in_flight == 6.0


def test_sleep_state_and_level() -> None:
    m = parse_metrics(VLLM_TEXT)
    assert m.sleep_state == "discard_all"
    assert m.sleep_level == 2
    awake = VLLM_TEXT.replace('"awake"} 0.0', '"awake"} 1.0').replace(
        '"discard_all"} 1.0', '"discard_all"} 0.0'
    )
    assert parse_metrics(awake).sleep_level == 0
    level1 = VLLM_TEXT.replace('"weights_offloaded"} 0.0', '"weights_offloaded"} 1.0').replace(
        '"discard_all"} 1.0', '"discard_all"} 0.0'
    )
    assert parse_metrics(level1).sleep_level == 1


def test_ttft_histogram_and_quantile() -> None:
    hist = parse_metrics(VLLM_TEXT).ttft
    assert hist is not None
    assert hist.count == 10 and math.isclose(hist.total, 0.45)
    assert hist.buckets[0] == (0.01, 0.0) and math.isinf(hist.buckets[-1][0])
    # median: rank 5 falls in (0.02, 0.1] holding counts 4..9 -> 0.02 + 0.08 * 1/5
    assert math.isclose(hist.quantile(0.5) or 0, 0.036)
    assert hist.quantile(0.4) == pytest.approx(0.02)
    # above the last finite bucket -> its bound (what Prometheus does)
    assert hist.quantile(0.99) == pytest.approx(0.1)
    assert Histogram().quantile(0.5) is None


def test_missing_families_are_none() -> None:
    m = parse_metrics("# TYPE process_open_fds gauge\nprocess_open_fds 7.0\n")
    assert m.running is None and m.waiting is None and m.in_flight is None
    assert m.sleep_state is None and m.sleep_level is None and m.ttft is None


def test_not_prometheus_text_is_one_line_error() -> None:
    with pytest.raises(WarmctlError) as info:
        parse_metrics("<html>\n<body>oops</body>\n</html>", "h:1")
    assert info.value.kind == "protocol"
    assert "h:1: /metrics is not Prometheus text format" in str(info.value)
    assert "\n" not in str(info.value)
