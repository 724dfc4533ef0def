import pytest

from warmctl.errors import WarmctlError
from warmctl.server.client import capture_sizes_from_config
from warmctl.warmth.warmup import DEFAULT_BATCH_SIZES, choose_batch_sizes, parse_batch_sizes


def test_parse_batch_sizes() -> None:
    assert parse_batch_sizes("8, 1,2,2,4") == [1, 2, 4, 8]
    for bad in ("", "a,b", "0,1", "1,-2"):
        with pytest.raises(WarmctlError):
            parse_batch_sizes(bad)


def test_choose_batch_sizes_precedence() -> None:
    assert choose_batch_sizes([4, 2], [1, 8], 256) == ([2, 4], "--batch-sizes")
    server = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 512]
    assert choose_batch_sizes(None, server, 256, max_batch=64) == (
        [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64],
        "server",
    )
    assert choose_batch_sizes(None, server, 8) == ([1, 2, 4, 8], "server")
    assert choose_batch_sizes(None, None, None) == (list(DEFAULT_BATCH_SIZES), "default")
    assert choose_batch_sizes(None, None, 4) == ([1, 2, 4], "default")
    assert choose_batch_sizes(None, [128], 256, max_batch=64) == ([128], "server")


def test_capture_sizes_from_config_forms() -> None:
    assert capture_sizes_from_config(
        {"compilation_config": {"cudagraph_capture_sizes": [4, 1, 2]}}
    ) == [
        1,
        2,
        4,
    ]
    as_json_string = {"compilation_config": '{"cudagraph_capture_sizes": [2, 1]}'}
    assert capture_sizes_from_config(as_json_string) == [1, 2]
    text = "model='m', compilation_config={'level': 3, 'cudagraph_capture_sizes': [8, 4, 2, 1]}"
    assert capture_sizes_from_config(text) == [1, 2, 4, 8]
    assert capture_sizes_from_config({"compilation_config": {}}) is None
    assert capture_sizes_from_config("no sizes here") is None
    assert capture_sizes_from_config(None) is None


def test_device_and_sleep_flag_from_config() -> None:
    from warmctl.server.client import device_from_config
    from warmctl.sleepwake.steps import sleep_facts

    cfg = {"model_config": {"enable_sleep_mode": False}, "device_config": {"device": "cpu"}}
    assert sleep_facts(cfg) == (False, "cpu")
    assert sleep_facts({"model_config": {"enable_sleep_mode": True}}) == (True, None)
    text = "model='m', enable_sleep_mode=True, device_config=cuda, seed=0"
    assert sleep_facts(text) == (True, "cuda")
    assert sleep_facts("nothing") == (None, None)
    assert device_from_config({"device_config": {"device": "CUDA"}}) == "cuda"
    assert device_from_config(None) is None
