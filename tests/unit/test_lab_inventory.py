"""The test bed's generated inventory: each test host's engine gets its own CPU core."""

from __future__ import annotations

from pathlib import Path

import yaml
from tests.lib import testhosts

ROLE_DEFAULTS = Path(__file__).parents[2] / "roles/vllm_service/defaults/main.yml"


def fleet(count: int) -> testhosts.Fleet:
    hosts = tuple(testhosts.Host(i) for i in range(1, count + 1))
    return testhosts.Fleet(hosts, Path("/k"), Path("/kh"))


def test_host_env_keeps_the_role_default_and_adds_one_core_per_host(monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())["vllm_service_env"]
    envs = [testhosts.host_env(h) for h in fleet(3).hosts]
    for env in envs:
        assert {k: v for k, v in env.items() if k in defaults} == defaults
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0", "1", "0"]


def test_inventory_host_vars_win_over_the_bed_defaults(monkeypatch) -> None:
    monkeypatch.setattr(testhosts, "controller_address", lambda: "10.77.0.1")
    inv = testhosts.vllm_inventory(
        fleet(2),
        find_links="http://10.77.0.1:1/",
        instances=[{"name": "tiny"}],
        host_vars={"wt2": {"vllm_service_env": {"X": "1"}}},
    )
    hosts = inv["all"]["children"]["vllm"]["hosts"]
    assert hosts["wt1"]["vllm_service_env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert hosts["wt2"]["vllm_service_env"] == {"X": "1"}
