import pytest

from warmctl.observe.verify import (
    ASLEEP,
    ERROR,
    FAIL,
    PASS,
    Thresholds,
    VerifyReport,
    evaluate,
    exit_code,
)


def test_pass_within_both_limits() -> None:
    assert evaluate(0.040, 0.025, 2.0, Thresholds()) == []


def test_first_ttft_over_limit() -> None:
    reasons = evaluate(1.2, 0.9, None, Thresholds())
    assert reasons == ["first TTFT 1200 ms > 1000 ms"]


def test_ratio_over_limit_and_exactly_at_limit() -> None:
    assert evaluate(0.30, 0.02, None, Thresholds()) == ["first/steady TTFT 15.00x > 2x"]
    assert evaluate(0.04, 0.02, None, Thresholds()) == []  # 2.0x is still within 2.0
    assert evaluate(0.05, 0.02, None, Thresholds(max_ratio=3)) == []


def test_optional_limits() -> None:
    limits = Thresholds(max_steady_ttft_s=0.05, max_decode_ms=5.0)
    assert evaluate(0.07, 0.06, 6.0, limits) == [
        "steady TTFT 60 ms > 50 ms",
        "decode 6.0 ms/token > 5 ms/token",
    ]


def test_missing_measurements_fail() -> None:
    assert evaluate(None, 0.02, None, Thresholds()) == ["the first request streamed no text"]
    assert evaluate(0.02, None, None, Thresholds()) == ["no steady request streamed text"]


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ([PASS], 0),
        ([PASS, PASS], 0),
        ([PASS, FAIL], 1),
        ([PASS, ASLEEP], 1),
        ([FAIL, ERROR], 2),
        ([ERROR], 2),
    ],
)
def test_exit_code(statuses: list[str], code: int) -> None:
    assert (
        exit_code([VerifyReport(target=f"h{i}", status=s) for i, s in enumerate(statuses)]) == code
    )
