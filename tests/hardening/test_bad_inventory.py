"""Bad proxy settings in an inventory fail before anything changes (warmctl.plan.validate through
preflight: the argument specs and the proxy's rules), one line per problem; tests/ansible
covers the other roles' variables. One ansible-playbook run (connection=local; nothing is
touched)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.conftest import problem_lines, run_playbook, write_inventory
from warmctl.plan.roles import roles_dir

NIGHTS = {"name": "nights", "sleep": "0 20 * * *", "wake": "0 7 * * *"}
GPU_SLEEP = {"name": "qwen", "model": "/srv/m", "port": 8000, "windows": [NIGHTS]}


def host(instances: list[dict[str, Any]] | None = None, **proxy: Any) -> dict[str, Any]:
    return {"vllm_preflight_device_kind": "gpu",
            "vllm_service_instances": instances or [GPU_SLEEP], **proxy}  # fmt: skip


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "tls_cert_without_key": (host(vllm_proxy_tls_cert="/etc/ssl/c.pem"),
                             "set vllm_proxy_tls_cert and vllm_proxy_tls_key together"),
    "allow_bad_cidr": (host(vllm_proxy_allow=["10.0.0.0/33"]),
                       'vllm_proxy_allow[0]: is the string "10.0.0.0/33" (an address'),
    "allow_injection": (host(vllm_proxy_allow=["all; return 200"]),
                        'vllm_proxy_allow[0]: is the string "all; return 200"'),
    "allow_empty": (host(vllm_proxy_allow=[]), "vllm_proxy_allow: is empty"),
    "api_key_short": (host(vllm_proxy_api_keys=["abc"]),
                      "vllm_proxy_api_keys[0]: is a malformed token (16 or more"),
    "api_key_quote": (host(vllm_proxy_api_keys=['0123456789abcdef"; allow']),
                      "no spaces or quotes"),
    "upstream_clash": (
        host([GPU_SLEEP, {"name": "b", "model": "/srv/b", "port": 18000}],
             vllm_proxy_enabled="true"),
        "[1].port: 18000 is used twice (each port is one process's; vLLM behind the proxy of "
        "vllm_service_instances[0] listens on it)"),
    "upstream_over_65535": (host([{**GPU_SLEEP, "port": 60000}]),
                            "vLLM behind the proxy would listen on 70000"),
    "enabled_maybe": (host(vllm_proxy_enabled="maybe"), "vllm_proxy_enabled"),
    "retry_after_text": (host(vllm_proxy_retry_after="soon"), "vllm_proxy_retry_after"),
    "offset_text": (host(vllm_proxy_upstream_port_offset="ten"),
                    "vllm_proxy_upstream_port_offset"),
}  # fmt: skip
GOOD: dict[str, tuple[dict[str, Any], list[str]]] = {
    "gpu_sleep_auto": (host(), ["qwen"]),
    "cpu_auto": (host(vllm_preflight_device_kind="cpu"), []),
    "cpu_forced": (host(vllm_preflight_device_kind="cpu", vllm_proxy_enabled=True), ["qwen"]),
    "off": (host(vllm_proxy_enabled=False), []),
    "full": (host(vllm_proxy_allow=["10.0.0.0/8", "::1", "fd00::/8"],
                  vllm_proxy_api_keys=["0123456789abcdef-XYZ"],
                  vllm_proxy_tls_cert="/etc/ssl/c.pem", vllm_proxy_tls_key="/etc/ssl/k.pem"),
             ["qwen"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("proxy-validate")
    defaults = yaml.safe_load((roles_dir() / "vllm_proxy/defaults/main.yml").read_text())
    hosts = {f"bad_{n}": {**defaults, **v} for n, (v, _) in BAD.items()}
    hosts.update({f"good_{n}": {**defaults, **v} for n, (v, _) in GOOD.items()})
    inventory = write_inventory(root / "inventory.json", hosts)
    tree = root / "tree"
    proc = run_playbook(
        "tests/hardening/validate.yml",
        inventory,
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tree),
    )
    results = {p.name: json.loads(p.read_text()) for p in Path(tree).iterdir()}
    return {"proc": proc, "results": results}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_proxy_inventory_fails_before_anything_changes(outcome, name):
    stdout = outcome["proc"].stdout
    lines = problem_lines(stdout, f"bad_{name}")
    print(f"{name}: {lines}")
    assert failed(stdout, f"bad_{name}") == 1, stdout[-3000:]
    assert any(BAD[name][1] in line for line in lines), lines
    assert all(stdout.count(line) == 1 for line in lines), lines
    assert "Traceback" not in stdout
    assert f"bad_{name}: VALID" not in stdout


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_proxy_inventory_passes(outcome, name):
    result = outcome["results"][f"good_{name}"]
    assert failed(outcome["proc"].stdout, f"good_{name}") == 0
    assert result.get("msg") == f"good_{name}: VALID ({json.dumps(GOOD[name][1])})", result


def failed(stdout: str, host: str) -> int:
    """failed=N of `host` in the PLAY RECAP."""
    match = re.search(rf"^{host}\s*:.*\bfailed=(\d+)", stdout, re.M)
    assert match, stdout[-2000:]
    return int(match.group(1))
