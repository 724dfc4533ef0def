import pytest

from warmctl.server.stream import StreamResult, median, percentile


def test_percentile_interpolates() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    assert percentile(values, 50) == pytest.approx(55.0)
    assert percentile(values, 90) == pytest.approx(91.0)
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 100.0
    assert percentile(list(reversed(values)), 90) == pytest.approx(91.0)
    assert percentile([7.0], 90) == 7.0
    assert percentile([], 90) is None


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert median([]) is None


def test_decode_ms_per_token_uses_first_to_last_text_chunk() -> None:
    # 5 tokens: first at 100 ms, last at 140 ms -> 40 ms over 4 later tokens
    r = StreamResult(
        ttft_s=0.1, total_s=0.15, tokens=5, chunk_times_s=[0.1, 0.11, 0.12, 0.13, 0.14]
    )
    assert r.decode_ms_per_token == pytest.approx(10.0)
    # the server's usage count wins over chunk count (a chunk may carry several tokens)
    r2 = StreamResult(ttft_s=0.1, total_s=0.15, tokens=9, chunk_times_s=[0.1, 0.14])
    assert r2.decode_ms_per_token == pytest.approx(5.0)
    assert (
        StreamResult(ttft_s=0.1, total_s=0.1, tokens=1, chunk_times_s=[0.1]).decode_ms_per_token
        is None
    )
    d = r.to_dict()
    assert d["decode_ms_per_token"] == pytest.approx(10.0)
    assert d["chunk_times_s"] == [0.1, 0.11, 0.12, 0.13, 0.14]


def test_chunk_text_reads_completion_chat_and_reasoning_deltas() -> None:
    from warmctl.server.stream import _chunk_text

    assert _chunk_text({"choices": [{"text": " a"}]}, chat=False) == " a"
    assert _chunk_text({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, True) == ""
    assert _chunk_text({"choices": [{"delta": {"content": "b"}}]}, chat=True) == "b"
    # reasoning models stream their thinking first: it is the first token too
    assert _chunk_text({"choices": [{"delta": {"reasoning_content": "hm"}}]}, chat=True) == "hm"
    assert _chunk_text({"choices": [], "usage": {"completion_tokens": 3}}, chat=False) == ""
