import subprocess
import sys
import time

import pytest

from warmctl.cli import COMMANDS

MINE = ["status", "warmup", "sleep", "wake", "verify"]
HEAVY = ["requests", "rich", "jinja2", "ansible", "prometheus_client", "urllib3", "yaml"]


def test_help_is_fast_in_a_fresh_process() -> None:
    """`warmctl --help` answers in < 0.3 s on a quiet machine. The bound is a ratio to what no
    click CLI can beat, a fresh interpreter importing click, timed in the same loop (a loaded
    machine slows both alike): 5x leaves room for warmctl's own modules and catches a start
    that does real work (a heavy import, a probe); the import check below is the exact guard."""

    def best_of_3(*argv: str) -> tuple[float, str]:
        best, out = float("inf"), ""
        for _ in range(3):
            t0 = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-c", *argv], capture_output=True, text=True, check=True
            )
            best, out = min(best, time.monotonic() - t0), done.stdout
        return best, out

    click_s, _ = best_of_3("import click")
    help_s, out = best_of_3("from warmctl.cli import main; main()", "--help")
    assert "warmup" in out
    assert help_s < 5 * click_s, (
        f"warmctl --help took {help_s:.2f} s, importing click {click_s:.2f} s"
    )


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
