"""The files an inventory parameter crosses (scripts/param_reach.py, docs/ARCHITECTURE.md "What a
change touches") do not grow back: a template or module that starts deriving from `port`,
`idle_sleep` or `launcher` again fails here until the bound and the doc say why."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the counts of docs/ARCHITECTURE.md's table (now); before the instance plan: 10, 11, 10;
# idle_sleep: its spec, its trigger kind (warmctl.sleepwake.triggers), its detector
BOUND = {"port": 5, "idle_sleep": 3, "launcher": 5}


def _tool():
    spec = importlib.util.spec_from_file_location("param_reach", ROOT / "scripts/param_reach.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["param_reach"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("parameter", sorted(BOUND))
def test_a_parameter_crosses_no_more_files_than_the_doc_says(parameter: str) -> None:
    files = _tool().crossed(parameter)
    assert "roles/vllm_service/meta/argument_specs.yml" in files  # the count sees its spec
    assert len(files) <= BOUND[parameter], files


def test_a_template_that_derives_again_is_counted() -> None:
    tool = _tool()
    code = tool.code_of("x.j2", "{% if c.f.idle_after %}x{% endif %}{# idle_level #}")
    assert "idle_after" in code and "idle_level" not in code
    python = tool.code_of("x.py", '"""port"""\nimport warmctl.launcher\n# port\nx = f.port\n')
    assert python.strip() == "x = f.port"
