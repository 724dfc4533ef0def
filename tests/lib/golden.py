"""Every file the roles render for the test and example inventories, as one snapshot.

The units, env files, launch files, window/trigger/waker/reconcile files (what `warmctl render`
writes) and the proxy's nginx files of every host of tests/ansible/cases.GOOD (the example
inventory is one of them), each host as it is and in three variants: proxied with a textfile
folder, proxied behind a load balancer, and on the other device kind; plus an e2e test host's
instance (tests/lib/testhosts.lab_instance, a fixed window). tests/ansible/test_golden.py holds the
snapshot under tests/golden/ against the renderers byte for byte; a change of a rendered file is a
change of the snapshot in the same commit, on purpose:

    python -m tests.lib.golden --update
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.ansible.cases import GOOD
from tests.hardening.proxy_support import render_proxy

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
LAB_WINDOW = {"name": "quiet", "sleep": "0 3 * * *", "wake": "0 4 * * *", "level": 1}


def _lab_host() -> dict[str, Any]:
    from tests.lib.testhosts import SERVICE_ENV, lab_instance

    instance = lab_instance(Path("/controller/models/tiny-qwen3"), windows=[LAB_WINDOW])
    return {
        "vllm_preflight_device_kind": "cpu",
        "vllm_service_env": {**SERVICE_ENV, "VLLM_CPU_OMP_THREADS_BIND": "0"},
        "vllm_service_instances": [instance],
    }


def cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """(case name, host variables) of every host and variant the snapshot holds."""
    hosts = {**GOOD, "e2e_lab": _lab_host()}
    for host, hostvars in hosts.items():
        other = "cpu" if hostvars.get("vllm_preflight_device_kind", "gpu") == "gpu" else "gpu"
        yield host, dict(hostvars)
        yield f"{host}+proxy", {**hostvars, "vllm_proxy_enabled": True,
                                "vllm_service_textfile_dir": TEXTFILE_DIR}  # fmt: skip
        yield f"{host}+lb", {**hostvars, "vllm_proxy_enabled": True,
                             "vllm_proxy_load_balanced": True}  # fmt: skip
        yield f"{host}+{other}", {**hostvars, "vllm_preflight_device_kind": other}


def _flat(path: str) -> str:
    return path.strip("/").replace("/", "__")


def render_case(hostvars: Mapping[str, Any]) -> dict[str, str]:
    """{file name: text} of every file of every instance of one host."""
    from warmctl.plan.render import render_instance

    host = {k: v for k, v in hostvars.items() if k != "vllm_service_instances"}
    out: dict[str, str] = {}
    for instance in hostvars["vllm_service_instances"]:
        rendered = render_instance(instance, host, label="golden")
        for path, text in rendered.files.items():
            out[_flat(path)] = text
        if not rendered.plan.proxied:
            continue
        for name, text in render_proxy(instance, host).items():
            out[f"nginx__{instance['name']}__{name}"] = text
    return out


def snapshot() -> dict[str, dict[str, str]]:
    return {case: render_case(hostvars) for case, hostvars in cases()}


def write(root: Path = GOLDEN) -> int:
    import shutil

    if root.exists():
        shutil.rmtree(root)
    count = 0
    for case, files in snapshot().items():
        folder = root / case
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
            count += 1
    return count


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.lib.golden --update")
    print(f"{write()} files under {GOLDEN}")
