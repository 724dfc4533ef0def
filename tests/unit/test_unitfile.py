"""systemd quoting/parsing used by the templates and warmctl.plan.render: round trips, and the
quoted text is what systemd itself accepts."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from warmctl.plan.unitfile import (
    env_quote,
    parse_env_file,
    systemd_quote,
    systemd_split,
    unit_values,
)

ARGS = [
    "plain",
    "/opt/vllm/venv/bin/python",
    "--host=0.0.0.0",
    '{"cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4]}',
    "hello world",
    "it's",
    "50%",
    "$HOME",
    "back\\slash",
    "mixed ' and \"",
    "",
]


@pytest.mark.parametrize("arg", ARGS)
def test_systemd_quote_round_trips(arg):
    assert systemd_split(systemd_quote(arg)) == [arg]


def test_systemd_quote_forms():
    assert systemd_quote("--port") == "--port"
    assert systemd_quote('{"a": 1}') == "'{\"a\": 1}'"
    assert systemd_quote("50%") == "50%%"
    assert systemd_quote("$X") == "$$X"
    assert systemd_quote("it's") == '"it\'s"'
    assert systemd_split(" ".join(systemd_quote(a) for a in ARGS)) == ARGS


@pytest.mark.parametrize("value", ["0,1", "a b", 'q"uote', "$dollar", "back\\slash", "`tick`"])
def test_env_round_trip(value):
    text = f"# comment\n\nKEY={env_quote(value)}\n"
    assert parse_env_file(text) == {"KEY": value}


def test_env_file_rejects_garbage():
    with pytest.raises(ValueError, match="without '='"):
        parse_env_file("NOT A LINE\n")


def test_unit_values_sections_and_continuations():
    text = "[Unit]\nExecStart=no\n[Service]\nExecStart=/bin/a \\\n  b\nUser=x\n[Install]\nUser=y\n"
    assert unit_values(text, "Service", "ExecStart") == ["/bin/a    b"]
    assert unit_values(text, "Service", "User") == ["x"]
    assert unit_values(text, "Install", "User") == ["y"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_quoted_command_lines(tmp_path):
    exe = tmp_path / "exe"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = tmp_path / "x.env"
    env.write_text("".join(f"K{i}={env_quote(v)}\n" for i, v in enumerate(["a b", 'q"', "$d"])))
    unit = tmp_path / "quoting-test.service"
    line = " ".join(systemd_quote(a) for a in [str(exe), *ARGS])
    unit.write_text(f"[Service]\nType=oneshot\nEnvironmentFile={env}\nExecStart={line}\n")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "quoting-test.service" not in proc.stderr, proc.stderr
