"""Instance definitions generated from the roles' own argument specs, some values mutated to
wrong types and shapes: `warmctl render` and preflight's check (the `vllm_validate` filter)
either both accept — and the rendered units pass `systemd-analyze verify` — or both refuse with
the same lines, one per problem. Never a template error or a traceback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.ansible.conftest import stub_paths
from tests.fuzz.conftest import budget, invoke
from warmctl.plan.validate import validate, variable_specs

ROOT = Path(__file__).resolve().parents[2]
NAMES = st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,12}\Z")
CRONS = st.sampled_from(["0 20 * * 1-5", "30 7 * * 1-5", "@daily", "0 0 1,15 * 5",
                         "Fri *-*-* 21:00:00", "Mon *-*-* 07:00:00", "*/15 * * * *"])  # fmt: skip
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(),
              st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)  # fmt: skip
TEXT = st.text(st.characters(exclude_categories=["Cc", "Cs"]), min_size=1, max_size=16)
ENV_NAMES = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,8}\Z")
WINDOW = st.fixed_dictionaries(
    {"name": NAMES, "sleep": CRONS, "wake": CRONS}, optional={"level": st.sampled_from([1, 2])}
).filter(lambda w: w["sleep"] != w["wake"])

# a right value for the keys of an instance (the spec's type and the module's rules)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["/srv/models/qwen", "Qwen/Qwen3-0.6B", "/m"]),
    "served_model_name": TEXT,
    "bind": st.sampled_from(["0.0.0.0", "127.0.0.1", "::", "10.0.0.5", "llm-1"]),
    "gpus": st.lists(st.integers(0, 7), max_size=4, unique=True),
    "cpus": st.sampled_from(["0-3", "0-7|8-15", "2,3"]),
    "max_num_seqs": st.integers(1, 512),
    "max_model_len": st.integers(1, 2**20),
    "gpu_memory_utilization": st.floats(0.05, 1.0),
    "enforce_eager": st.booleans(),
    "compilation_config": st.fixed_dictionaries(
        {}, optional={"cudagraph_mode": st.sampled_from(["PIECEWISE", "FULL", "NONE"]),
                      "cudagraph_capture_sizes": st.lists(st.integers(1, 512), max_size=4),
                      "level": st.integers(0, 3)}),
    "sleep": st.booleans(),
    "hf_hub_offline": st.booleans(),
    "windows": st.lists(WINDOW, max_size=2, unique_by=lambda w: w["name"]),
    "extra_args": st.lists(TEXT, max_size=3),
    "env": st.dictionaries(ENV_NAMES, TEXT | st.integers(), max_size=3),
    "warmup_args": st.lists(TEXT, max_size=2),
}  # fmt: skip
# near misses: the right type, a wrong shape
NEAR: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["Qwen", "a b", "-x", "", "é", "a" * 70, "a/b"]),
    "model": st.sampled_from(["", "../m", "a b", "hub/id/extra"]),
    "model_src": st.sampled_from(["/data/q", ""]),
    "port": st.sampled_from([0, -1, 65536, 8000]),
    "bind": st.sampled_from(["", "a b", "1.2.3.4.5", "::g"]),
    "gpus": st.sampled_from([[0, 0], [-1], [1024]]),
    "cpus": st.sampled_from(["", "0-3; rm -rf /", "a", "1-"]),
    "tensor_parallel_size": st.sampled_from([0, 3, -1]),
    "gpu_memory_utilization": st.sampled_from([0.0, 1.5, -0.1, float("nan"), float("inf")]),
    "compilation_config": st.sampled_from([{"cudagraph_mode": "ALL"},
                                           {"cudagraph_capture_sizes": [1, -2]},
                                           {"cudagraph_capture_sizes": "1,2"},
                                           {"x": float("nan")}, {1: 2}]),
    "env": st.sampled_from([{"1A": "x"}, {"A B": "x"}, {"A": [1]}, {"A": "x\ny"}, {"A": None}]),
    "windows": st.sampled_from([[{"name": "w", "sleep": "0 25 * * *", "wake": "@daily"}],
                                [{"name": "w", "sleep": "@daily", "wake": "@daily"}],
                                [{"name": "W", "sleep": "@daily", "wake": "@hourly"}],
                                [{"name": "w", "sleep": "@daily"}],
                                [{"name": "w", "sleep": "@daily", "wake": "@hourly",
                                  "level": 3}]]),
    "extra_args": st.sampled_from([["a\nb"], [1], "--x"]),
}  # fmt: skip
INSTANCE_KEYS = sorted(variable_specs()["vllm_service_instances"]["options"])


@st.composite
def instances(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One or two right instances, then up to three keys replaced by a near miss or by
    anything at all (a third of the examples are left right)."""
    count = draw(st.integers(1, 2))
    ports = draw(st.lists(st.integers(1024, 30000), min_size=count, max_size=count, unique=True))
    names = draw(st.lists(NAMES, min_size=count, max_size=count, unique=True))
    result = []
    for name, port in zip(names, ports, strict=True):
        keys = draw(st.lists(st.sampled_from(sorted(VALID)), max_size=6, unique=True))
        item = {"name": name, "model": "/srv/models/m", "port": port}
        item.update({k: draw(VALID[k]) for k in keys})
        if item.get("gpus") and draw(st.booleans()):
            item["tensor_parallel_size"] = len(item["gpus"])
        result.append(item)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        target = draw(st.sampled_from(result))
        key = draw(st.sampled_from([*INSTANCE_KEYS, "bogus"]))
        target[key] = draw(NEAR[key] | ANY if key in NEAR else ANY)
    return result


HOST_VARS = st.fixed_dictionaries(
    {"vllm_preflight_device_kind": st.sampled_from(["gpu", "cpu"])},
    optional={
        "vllm_proxy_enabled": st.sampled_from(["auto", True, False, "auto", "maybe"]),
        "vllm_service_hardening": st.sampled_from([True, False, True, "no"]),
        "vllm_service_extra_args": st.lists(TEXT, max_size=2),
        "vllm_service_env": st.dictionaries(ENV_NAMES, TEXT, max_size=2),
        "vllm_service_port": st.sampled_from([8000, 9000, "8000", 0]),
    },
)


def systemd_verify(root: Path, files: list[Path]) -> str:
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, files)],
        capture_output=True, text=True, errors="replace", check=False, timeout=120,
    )  # fmt: skip
    problems = [line for line in proc.stderr.splitlines() if str(root) in line]
    return "" if proc.returncode == 0 and not problems else proc.stderr


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return stub_paths(tmp_path_factory.mktemp("fuzz-stubs"))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze")
@settings(max_examples=budget(120))
@given(instances=instances(), host=HOST_VARS)
@example(  # a YAML date in compilation_config: json.dumps raised TypeError in the template
    instances=[{"name": "a", "model": "/m", "compilation_config": {"when": "DATE"}}],
    host={"vllm_preflight_device_kind": "gpu"},
)
def test_render_and_preflight_agree(tmp_path_factory, stubs, instances, host) -> None:
    root = tmp_path_factory.mktemp("fuzz-render")
    variables = {**host, **stubs, "vllm_service_instances": instances,
                 "vllm_service_unit_dir": str(root / "units"),
                 "vllm_service_config_dir": str(root / "etc")}  # fmt: skip
    text = yaml.safe_dump(variables, allow_unicode=True).replace("'DATE'", "2026-01-01")
    vars_file = root / "vars.yml"
    vars_file.write_text(text)
    loaded = yaml.safe_load(text)  # what both read (a YAML date stays a date)
    expected = validate(loaded, str(vars_file))
    assert expected == _filter()(loaded, str(vars_file))  # preflight's filter: the same lines

    result = invoke("render", str(vars_file), "--out", "/")  # at their paths, under root
    assert "Traceback" not in result.output
    if expected:
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [f"warmctl: error: {line}" for line in expected]
        return
    assert result.exit_code == 0, (result.stderr, text)
    for script in (root / "etc").glob("*.sh"):
        script.chmod(0o755)  # as the role installs it
    units = sorted((root / "units").iterdir())
    assert units
    assert systemd_verify(root, units) == "", text


def _filter():
    """The collection's own filter plugin (plugins/filter/warmctl.py), loaded from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "warmctl_collection_filters", ROOT / "plugins" / "filter" / "warmctl.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["vllm_validate"]
