"""Any bytes, or YAML/JSON of any shape, as the files the CLI reads (render's VARS_FILE, a
prompt file, an inventory): the command works or says why in `warmctl: error:` lines, exit 2,
never the last-resort handler."""

from __future__ import annotations

import json

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import budget, invoke

VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)  # fmt: skip
KEYS = st.sampled_from(["vllm_service_instances", "vllm_service_port", "name", "model", "port",
                        "windows", "hosts", "all", "vars", "children", "ansible_host"])  # fmt: skip
SHAPED = st.recursive(
    VALUES, lambda inner: st.dictionaries(KEYS, inner, max_size=3) | st.lists(inner, max_size=2),
    max_leaves=10,
)  # fmt: skip
CONTENT = st.one_of(
    st.binary(max_size=60),
    SHAPED.map(lambda v: yaml.safe_dump(v).encode()),
    SHAPED.map(lambda v: json.dumps(v).encode()),
)


def check(result) -> None:
    assert "Traceback" not in result.output
    assert "internal error" not in result.stderr, result.stderr
    if result.exit_code != 0:
        assert result.exit_code == 2, (result.exit_code, result.stderr)
        lines = result.stderr.splitlines()
        assert lines and all(line.startswith("warmctl: error: ") for line in lines), lines


@settings(max_examples=budget(80))
@given(content=CONTENT)
@example(content=b"\xff\xfe\x00garbage")  # not UTF-8: was a UnicodeDecodeError
@example(content=b"vllm_service_instances: [{name: a, model: /m, port: 8000}, 5]")
def test_render_vars_file(tmp_path_factory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("vars") / "vars.yml"
    path.write_bytes(content)
    check(invoke("render", str(path)))


@settings(max_examples=budget(40))
@given(content=CONTENT)
def test_prompt_file(tmp_path_factory, content: bytes) -> None:
    """Read before any request: a good file gets as far as the unreachable server."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.json"
    path.write_bytes(content)
    result = invoke("warmup", "127.0.0.1:9", "--prompt-file", str(path), "--ready-timeout", "0.1")
    check(result)
    assert result.exit_code == 2


@settings(max_examples=budget(20))
@given(content=CONTENT)
def test_inventory_file(tmp_path_factory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("inventory") / "inventory.yml"
    path.write_bytes(content)
    check(invoke("status", "--inventory", str(path), "--timeout", "0.5"))
