"""The warmctl wheel as a host or an operator gets it: built from this checkout, installed with
pip into a clean venv outside it. It carries the collection's templates and role defaults (one
source), so its `warmctl render` writes exactly what the collection's roles write on a host,
and it carries no test bed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.lib import collection


@pytest.fixture(scope="module")
def artifacts() -> collection.Artifacts:
    return collection.build()


@pytest.fixture(scope="module")
def clean_venv(artifacts: collection.Artifacts, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, str(artifacts.wheel)], capture_output=True, text=True,
                          timeout=600, check=False, cwd=venv.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


def test_the_wheel_carries_the_cli_and_the_collections_data_and_no_test_bed(artifacts):
    names = zipfile.ZipFile(artifacts.wheel).namelist()
    assert "warmctl/cli.py" in names
    assert "warmctl/_templates/vllm-instance.service.j2" in names
    assert "warmctl/_roles/vllm_service/defaults/main.yml" in names
    # the launcher at its fixed path, and what its standby checks the next server with beside it
    shared = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
    assert {"share/warmctl/vllm_launch.py", "share/warmctl/vllm_args.py"} <= shared, shared
    bed = [n for n in names if "/lab/" in n or n.startswith("tests/") or "testhosts" in n
           or "wheelhouse" in n or "commands/lab" in n]  # fmt: skip
    assert not bed, bed


def test_the_collection_carries_the_same_wheel(artifacts):
    import tarfile

    with tarfile.open(artifacts.collection) as tar:
        members = tar.getnames()
        inside = tar.extractfile(f"files/{artifacts.wheel.name}")
        assert inside is not None and inside.read() == artifacts.wheel.read_bytes()
    assert "files/warmctl-requirements.txt" in members
    assert "plugins/filter/warmctl.py" in members
    assert not [m for m in members if m.startswith(("tests/", "toolkit/"))]


def test_wheel_render_equals_what_the_roles_write(clean_venv: Path, rendered_by_ansible) -> None:
    """`warmctl render --out` from the clean venv, for every host the roles rendered (the
    example inventory's instances among them): the same files, byte for byte."""
    hosts: dict[str, dict[str, Any]] = rendered_by_ansible["hosts"]
    assert "example" in hosts
    compared = 0
    for name, host_vars in hosts.items():
        work = clean_venv.parent / name
        work.mkdir()
        (work / "vars.yml").write_text(yaml.safe_dump(host_vars, sort_keys=False))
        done = subprocess.run(
            [str(clean_venv / "bin/warmctl"), "render", "vars.yml", "--out", "root"],
            cwd=work, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        )  # fmt: skip
        assert done.returncode == 0, f"{name}: {done.stderr}"
        written = [p for p in (work / "root").rglob("*") if p.is_file()]
        assert written, name
        for path in written:
            on_host = Path("/") / path.relative_to(work / "root")
            assert on_host.read_text() == path.read_text(), f"{name}: {on_host}"
            compared += 1
    print(f"{compared} files rendered by the wheel's warmctl equal the roles' files")
    assert compared >= 30


# ansible-test's sanity tests that need no download (the others bootstrap pip from a host this
# machine cannot reach; ansible-lint's production profile covers the YAML side)
SANITY = ("compile", "line-endings", "no-smart-quotes", "shebang", "symlinks", "empty-init",
          "no-illegal-filenames", "ignores", "action-plugin-docs", "no-assert",
          "replace-urlopen", "use-compat-six", "no-get-exception")  # fmt: skip


def test_ansible_test_sanity_on_the_installed_collection(artifacts, tmp_path):
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(bin_dir / "ansible-galaxy"), "collection", "install", "--force", "-p", str(tmp_path),
         str(artifacts.collection)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    root = tmp_path / "ansible_collections" / "warmctl" / "vllm"
    args = [arg for test in SANITY for arg in ("--test", test)]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    done = subprocess.run(
        [str(bin_dir / "ansible-test"), "sanity", "--python", python, *args],
        cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
