"""A server that answers generated garbage on some routes (any status, wrong JSON types,
truncated bodies and SSE streams, binary, huge bodies) and like vLLM on the others: every
command ends with its exit code (0, 1 for verify's FAIL, or 2 with one line) within its
timeout, never a traceback or the last-resort handler."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.double.server import RawReply, VllmDouble
from tests.fuzz.conftest import budget, invoke

ROUTES = ["/health", "/v1/models", "/version", "/metrics", "/is_sleeping", "/sleep", "/wake_up",
          "/v1/completions", "/v1/chat/completions", "/server_info", "/collective_rpc",
          "/reset_prefix_cache"]  # fmt: skip
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip
# the right keys with wrong values: what gets past a first `isinstance(data, dict)`
SHAPED = st.one_of(
    st.builds(lambda d: {"object": "list", "data": d}, st.lists(
        st.fixed_dictionaries({}, optional={"id": JSON, "max_model_len": JSON, "root": JSON}),
        max_size=2) | JSON),
    st.builds(lambda v: {"is_sleeping": v}, JSON),
    st.builds(lambda v: {"version": v}, JSON),
    st.builds(lambda v: {"vllm_config": v, "device_config": v}, JSON),
    st.builds(lambda v: {"error": v, "detail": v}, JSON),
)  # fmt: skip
CHUNK = st.one_of(
    st.builds(lambda t, f, u: {"choices": [{"text": t, "finish_reason": f, "delta": t}],
                               "usage": u}, JSON, JSON, JSON),
    JSON,
)  # fmt: skip
SSE = st.builds(
    lambda chunks, done: ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                          + ("data: [DONE]\n\n" if done else "")).encode(),
    st.lists(CHUNK, max_size=4), st.booleans(),
)  # fmt: skip
METRICS = st.lists(
    st.sampled_from(["vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:engine_sleep_state", "vllm:time_to_first_token_seconds_bucket"]).flatmap(
        lambda name: st.builds(lambda labels, value: f"{name}{labels} {value}",
                               st.sampled_from(["", '{le="+Inf"}', "{", '{sleep_state="x"}']),
                               st.sampled_from(["1", "NaN", "-Inf", "x", "1e309", ""]))),
    max_size=4,
).map(lambda lines: "\n".join(lines).encode())  # fmt: skip
HUGE = st.sampled_from([b"x" * 3_000_000, b'{"data": [' + b"1," * 1_000_000 + b"1]}",
                        b'{"is_sleeping": "' + b"a" * 2_000_000 + b'"}'])  # fmt: skip
BODIES = st.one_of(JSON.map(lambda v: json.dumps(v).encode()),
                   SHAPED.map(lambda v: json.dumps(v).encode()),
                   SSE, METRICS, st.binary(max_size=40), HUGE)  # fmt: skip
REPLIES = st.builds(
    RawReply,
    status=st.sampled_from([200, 200, 200, 201, 204, 301, 400, 401, 404, 405, 422, 429, 500, 503]),
    content_type=st.sampled_from(["application/json", "text/event-stream", "text/plain", "x/y"]),
    body=BODIES,
    cut=st.booleans(),
)
PLANS = st.dictionaries(st.sampled_from(ROUTES), REPLIES, min_size=1, max_size=4)

FAST = ["--timeout", "1"]
COMMANDS: dict[str, tuple[list[str], set[int]]] = {
    "status": ([*FAST], {0, 2}),
    "warmup": ([*FAST, "--ready-timeout", "1", "--max-batch", "2", "--max-tokens", "2"], {0, 2}),
    "sleep": ([*FAST, "--drain-timeout", "1"], {0, 2}),
    "wake": ([*FAST, "--ready-timeout", "1", "--max-batch", "2", "--max-tokens", "2"], {0, 2}),
    "verify": ([*FAST, "--ready-timeout", "1", "--steady", "1", "--decode-tokens", "0",
                "--max-tokens", "2"], {0, 1, 2}),
}  # fmt: skip
# --timeout 1 and --ready-timeout 1; sleep and wake confirm the new state on /is_sleeping for
# up to 30 s (a server that accepted /sleep but never says it sleeps)
LIMIT_S = 40.0


def run_against(command: str, plan: dict[str, RawReply]) -> None:
    """A fresh double per example: what one example did (put it to sleep...) does not leak."""
    double = VllmDouble(raw=plan).start()
    args, codes = COMMANDS[command]
    start = time.monotonic()
    try:
        result = invoke(command, double.address, *args)
    finally:
        double.stop()
    took = time.monotonic() - start
    assert took < LIMIT_S, (command, took)
    assert "Traceback" not in result.output
    assert "internal error" not in result.stderr, result.stderr
    assert result.exit_code in codes, (result.exit_code, result.stderr)
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("warmctl: error: "), result.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=budget(25))
@given(plan=PLANS)
@example(plan={"/v1/models": RawReply(body=b'{"object": "list", "data": [{"id": 5}]}')})
@example(
    plan={
        "/v1/completions": RawReply(
            content_type="text/event-stream", body=b'data: {"choices": []}\n\n', cut=True
        )
    }
)
@example(
    plan={"/metrics": RawReply(content_type="text/plain", body=b"vllm:num_requests_running{ x")}
)
@example(plan={"/is_sleeping": RawReply(body=b'{"is_sleeping": "no"}')})
@example(plan={"/health": RawReply(status=204, body=b"null")})  # the double's own traceback
def test_garbage_answers_end_in_one_line_and_the_right_code(command, plan) -> None:
    run_against(command, plan)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unusable_server_is_exit_2(vllm_double, command) -> None:
    """Every route answering 500: an error (2), never a FAIL (1) or a success."""
    plan = {route: RawReply(status=500, body=b"{}") for route in ROUTES}
    vllm_double.config.raw = plan
    result = invoke(command, vllm_double.address, *COMMANDS[command][0])
    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1
