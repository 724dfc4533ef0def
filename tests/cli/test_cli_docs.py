import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_doc_is_generated_from_the_current_help() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_doc_covers_every_option_of_my_commands() -> None:
    doc = (ROOT / "docs" / "CLI.md").read_text()
    for heading in (
        "warmctl status",
        "warmctl warmup",
        "warmctl sleep",
        "warmctl wake",
        "warmctl verify",
    ):
        assert f"`{heading}`" in doc
    for option in (
        "--drain-timeout",
        "--max-first-ttft",
        "--max-ratio",
        "--no-warmup",
        "--batch-sizes",
    ):
        assert option in doc
