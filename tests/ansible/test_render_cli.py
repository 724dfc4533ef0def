"""`warmctl render`: the same files as warmctl.plan.render, printed, as JSON or written out."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner
from tests.ansible.cases import GOOD

from warmctl.commands.render import command
from warmctl.plan.render import render_instance


def write_vars(tmp_path, host: str):
    path = tmp_path / "vars.yml"
    path.write_text(yaml.safe_dump(GOOD[host]))
    return path


def test_json_matches_library(tmp_path):
    result = CliRunner().invoke(command, [str(write_vars(tmp_path, "gpu_two")), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    host = {k: v for k, v in GOOD["gpu_two"].items() if k != "vllm_service_instances"}
    for item, instance in zip(data, GOOD["gpu_two"]["vllm_service_instances"], strict=True):
        expected = render_instance(instance, host)
        plan = json.loads(json.dumps(expected.plan.as_dict()))
        assert item["plan"] == plan and item["plan"]["exec_argv"] == list(expected.plan.exec_argv)
        assert item["files"] == expected.files


def test_device_override_and_instance_filter(tmp_path):
    args = [str(write_vars(tmp_path, "gpu_sleep")), "--device", "cpu", "--instance", "qwen"]
    result = CliRunner().invoke(command, [*args, "--json"])
    (item,) = json.loads(result.output)
    argv = item["plan"]["exec_argv"]
    assert item["device"] == "cpu" and "vllm.entrypoints.openai.api_server" in argv
    assert "--enable-sleep-mode" not in argv


def test_out_writes_files_at_host_paths(tmp_path):
    out = tmp_path / "root"
    result = CliRunner().invoke(command, [str(write_vars(tmp_path, "cpu")), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "etc/systemd/system/vllm-tiny.service").is_file()
    assert (out / "etc/systemd/system/vllm-tiny-sleep-nights.timer").is_file()
    assert (out / "etc/vllm/tiny.env").read_text().startswith("# Ansible managed\n")


def test_printed(tmp_path):
    result = CliRunner().invoke(command, [str(write_vars(tmp_path, "gpu_nosleep"))])
    assert "# ==> /etc/systemd/system/vllm-plain.service <==" in result.output
    assert "# ==> /etc/vllm/plain.env <==" in result.output


def test_errors_are_one_line(tmp_path):
    runner = CliRunner()
    cases = {
        "missing": [str(tmp_path / "nope.yml")],
        "not yaml": None,
        "no instances": None,
        "unknown instance": [str(write_vars(tmp_path, "cpu")), "--instance", "zzz"],
        "bad cron": None,
    }
    bad_yaml = tmp_path / "bad.yml"
    bad_yaml.write_text("a: [1, 2\n")
    cases["not yaml"] = [str(bad_yaml)]
    empty = tmp_path / "empty.yml"
    empty.write_text("vllm_service_port: 9000\n")
    cases["no instances"] = [str(empty)]
    cron = tmp_path / "cron.yml"
    cron.write_text(
        yaml.safe_dump(
            {
                "vllm_service_instances": [
                    {
                        "name": "x",
                        "model": "/m",
                        "windows": [{"name": "w", "sleep": "0 25 * * *", "wake": "@daily"}],
                    }
                ]
            }
        )
    )
    cases["bad cron"] = [str(cron)]
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"\xff\xfe\x00garbage")  # was a UnicodeDecodeError (the last resort)
    cases["binary"] = [str(binary)]
    for name, args in cases.items():
        result = runner.invoke(command, args)
        assert result.exit_code == 2, name
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("warmctl: error: "), (name, result.output)
        assert "internal error" not in lines[0], (name, lines[0])
