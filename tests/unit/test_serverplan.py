"""The instance plan's server part (warmctl.plan.server): the files print it, and it is all a new
vLLM flag needs besides its argument spec."""

from __future__ import annotations

import pytest
from tests.ansible.cases import GOOD

from warmctl.launcher.vllm_launch import parse, parse_launch
from warmctl.plan import server as serverplan
from warmctl.plan.instance import instance_facts
from warmctl.plan.render import render_instance
from warmctl.plan.roles import argument_specs
from warmctl.plan.unitfile import parse_env_file, systemd_split, unit_values

CASES = [
    (host, instance)
    for host, hostvars in GOOD.items()
    for instance in hostvars.get("vllm_service_instances", [])
]


@pytest.mark.parametrize(("host", "instance"), CASES, ids=[f"{h}/{i['name']}" for h, i in CASES])
def test_the_rendered_files_are_the_plan_printed(host, instance):
    """What the unit, the env file and the launch file say is the plan's, field for field."""
    hostvars = {k: v for k, v in GOOD[host].items() if k != "vllm_service_instances"}
    r = render_instance(instance, hostvars)
    plan = r.plan
    assert plan is not None
    (start,) = unit_values(r.unit_text, "Service", "ExecStart")
    assert systemd_split(start) == list(plan.exec_argv)
    posts = [p for p in unit_values(r.unit_text, "Service", "ExecStartPost") if p[0] != "+"]
    assert [systemd_split(p) for p in posts] == [list(plan.warmup_argv)]
    assert parse_env_file(r.env_text) == dict(plan.env_lines)
    if plan.launcher:
        launch = parse_launch(r.files[plan.launch_file].encode())
        assert (launch.args, launch.env) == (list(plan.launch_args), plan.launch_env)
        options = parse(list(plan.exec_argv[2:]))  # the launcher's own reading of its line
        assert (options.launch_file, options.state_file) == (plan.launch_file, plan.launch_state)
        module = [plan.python, "-m", options.module, *plan.launch_args]
        assert module == list(plan.server_argv)
        assert plan.exec_argv[1] == plan.launcher_script
    else:
        assert plan.exec_argv == plan.server_argv and not plan.launch_env
    assert (serverplan.SLEEP_MODE_FLAG in plan.server_argv) == plan.sleep


def test_every_flag_of_the_table_is_an_instance_key_of_the_spec():
    spec = argument_specs("vllm_service")["main"]["options"]["vllm_service_instances"]["options"]
    assert [row.key for row in serverplan.FLAGS if row.key not in spec] == []


def test_a_new_flag_is_a_row_of_the_table(monkeypatch):
    row = serverplan.Flag("max_num_batched_tokens", "--max-num-batched-tokens", low=1)
    monkeypatch.setattr(serverplan, "FLAGS", (*serverplan.FLAGS, row))
    plan = instance_facts({"name": "a", "model": "/m", "max_num_batched_tokens": 8192}, {})
    argv = list(plan.server_argv)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    assert "--max-num-batched-tokens" in plan.launch_args  # a GPU host: the launcher runs it


@pytest.mark.parametrize(("value", "on"), [("on", True), ("yes", True), ("off", False), (1, True)])
def test_yes_and_no_read_once(value, on):
    """One reading of a yes/no setting: the output check's "on" is on (the template's own list
    once said off), an instance's "false" switch adds no flag (Jinja's truthiness added it)."""
    plan = instance_facts(
        {"name": "a", "model": "/m", "enforce_eager": "false" if on else "true"},
        {"vllm_schedule_output_check": value},
    )
    assert plan.output_check is on
    assert ("--enforce-eager" in plan.server_argv) is not on


def test_the_kv_cache_of_an_instance_that_sleeps():
    windows = [{"name": "night", "sleep": "0 1 * * *", "wake": "0 6 * * *"}]
    sleeping = instance_facts({"name": "a", "model": "/m", "windows": windows}, {})
    assert sleeping.kv_cache_tokens == 131072
    args = list(sleeping.server_argv)
    assert args[args.index("--num-gpu-blocks-override") + 1] == str(131072 // 16)
    own = instance_facts(
        {
            "name": "a",
            "model": "/m",
            "windows": windows,
            "extra_args": ["--kv-cache-memory-bytes=1"],
        },
        {},
    )
    assert own.kv_cache_tokens == 0 and "--num-gpu-blocks-override" not in own.server_argv
    odd = instance_facts({"name": "a", "model": "/m", "kv_cache_tokens": 17}, {})
    assert odd.server_argv[odd.server_argv.index("--num-gpu-blocks-override") + 1] == "2"


def test_the_launcher_script_is_where_the_wheel_installs_it():
    """The plan's launcher path inside warmctl's venv is the wheel's shared-data target."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["toolkit/warmctl/launcher/vllm_launch.py"] == serverplan.LAUNCHER_SCRIPT
    assert serverplan.launcher_script("/opt/w") == f"/opt/w/{serverplan.LAUNCHER_SCRIPT}"
