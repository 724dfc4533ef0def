"""One gate model (warmctl.sleepwake.gate): the proxy's nginx file, `warmctl status` (the flags
read on
the host, the proxy's answers read back) and the waker's hold all take an instance's state from
its flags in the model's one precedence, and the proxy answers exactly the model's answers."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from tests.hardening.proxy_support import render_proxy

from warmctl.server.client import Answer, http_error
from warmctl.server.target import parse_target
from warmctl.sleepwake.gate import (
    FLAGS,
    GateFiles,
    proxy_answers,
    read_state,
    stopped,
    waker_refusals,
)

# a single proxied GPU host with idle sleep: every flag of the model is one the proxy tests
HOST = {"vllm_proxy_enabled": True, "vllm_proxy_gate_dir": "/run/vllm-gate",
        "vllm_preflight_device_kind": "gpu"}  # fmt: skip
INSTANCE = {"name": "tiny", "model": "/m", "port": 8000, "idle_sleep": {"after": "15m"}}


def _conf() -> str:
    return render_proxy(INSTANCE, HOST)["vllm-tiny.conf"]


def _location(conf: str, head: str) -> str:
    start = conf.index(head)
    return conf[start : conf.index("\n    }\n", start)]


def test_the_proxy_tests_the_flags_in_the_models_order() -> None:
    """nginx's `set` chain: the last `if` that matches wins, so it lists the flags weakest
    first, the model's order reversed."""
    chain = re.findall(r"if \(-f /run/vllm-gate/tiny\.(\w+)\)", _conf())
    assert chain[::-1] == [k.suffix for k in FLAGS]


@pytest.mark.parametrize("where", ["v1", "health"])
def test_the_proxy_answers_the_models_answers(where: str) -> None:
    head = "    location /v1/ {" if where == "v1" else "    location = /health {"
    found = re.findall(
        r"if \(\$vllm_gate = (\w+)\) \{\n\s+return (.+);\n", _location(_conf(), head)
    )
    answers = proxy_answers("tiny", 120)
    column = 0 if where == "v1" else 1
    assert found == [(k.state, answers[k.state][column].nginx) for k in FLAGS]


def test_the_client_reads_every_503_of_the_model_back() -> None:
    """What `warmctl.server.client` makes of each refusal: the state the model put in it."""
    target = parse_target("127.0.0.1:8000")
    for state, (v1, health) in proxy_answers("tiny", 120).items():
        for answer in (v1, health):
            if answer.code != 503:
                continue
            assert answer.body is not None
            body = json.dumps(answer.body).encode() + b"\n"  # what nginx sends
            err = http_error(target, "/health", Answer(503, "", body), None)
            assert err.gate == state
            assert err.kind == ("asleep" if state == "asleep" else "server")


@pytest.mark.parametrize("present", [c for n in range(1, 4)
                                     for c in itertools.combinations(FLAGS, n)])  # fmt: skip
def test_status_and_the_waker_agree_with_the_precedence(present: tuple, tmp_path: Path) -> None:
    files = GateFiles(tmp_path, "tiny")
    for kind in present:
        files.path(kind.suffix).write_text("sleep cause=idle level=1\n")
    strongest = present[0]  # combinations keep the model's order
    flags = files.flags()
    assert flags.strongest() == strongest
    assert flags.state() == strongest.state
    status = read_state(files)
    expected = {"wakeable": "asleep"}.get(strongest.state, strongest.state)
    assert status.state == expected
    assert status.flag is not None and status.flag.path == files.path(strongest.suffix)


def test_the_proxys_refusals_are_the_models() -> None:
    """@wake_refused (the waker's hold refused the request) and @unavailable (nothing runs)."""
    conf = _conf()
    where = _location(conf, "location @wake_refused")
    refused = re.findall(r"if \(\$vllm_wake = ([\w-]+)\) \{\n\s+return (.+);\n", where)
    model = waker_refusals("tiny", 120)
    assert refused == [(k, model[k].nginx) for k in model if k]  # a single host: relaunch too
    assert where.endswith(f"        return {model[''].nginx};")
    assert f"return {stopped('tiny').nginx};" in _location(conf, "location @unavailable")
