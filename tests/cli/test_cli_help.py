import subprocess
import sys
import time

import pytest

from warmctl.cli import COMMANDS

MINE = ["status", "warmup", "sleep", "wake", "verify"]
HEAVY = ["requests", "rich", "jinja2", "ansible", "prometheus_client", "urllib3", "yaml"]


def test_help_is_fast_in_a_fresh_process() -> None:
    """`warmctl --help` answers in < 0.3 s on a quiet machine; the bound here leaves room for
    a loaded CI box, and the import check below is the exact guard."""
    best = float("inf")
    for _ in range(3):
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", "from warmctl.cli import main; main()", "--help"],
            capture_output=True,
            text=True,
            check=True,
        )
        best = min(best, time.monotonic() - t0)
        assert "warmup" in out.stdout
    assert best < 0.9, f"warmctl --help took {best:.2f} s"


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from warmctl.cli import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Commands:" in out.stdout
    assert out.stderr.strip() == "HEAVY=", out.stderr


def test_group_help_lists_the_commands(run) -> None:
    result = run("--help")
    assert result.exit_code == 0
    flat = " ".join(result.stdout.split())
    for name in MINE:
        assert f"{name} {COMMANDS[name][1]}" in flat


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("status", ["HOST...", "--api-key", "VLLM_API_KEY", "--timeout", "--json", "--inventory"]),
        (
            "warmup",
            ["--prompt", "--prompt-file", "--batch-sizes", "--chat / --no-chat", "--ready-timeout"],
        ),
        ("sleep", ["--level", "--drain-timeout", "VLLM_SERVER_DEV_MODE=1"]),
        ("wake", ["--no-warmup", "--level", "reload_weights", "--prompt"]),
        (
            "verify",
            ["--max-first-ttft", "--max-ratio", "--steady", "--inventory", "--limit", "ASLEEP"],
        ),
    ],
)
def test_subcommand_help_reads_well(run, name: str, needles: list[str]) -> None:
    result = run(name, "--help")
    assert result.exit_code == 0
    for needle in needles:
        assert needle in result.stdout, needle
    assert "Exit status:" in result.stdout
