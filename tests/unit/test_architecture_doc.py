"""docs/ARCHITECTURE.md's module map is the package as it is: every module of toolkit/warmctl
has its row (or, in bench/ and tune/, its name in the folder's row), every row names a module
or folder that exists, and every sub-package says what it is in its __init__.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "toolkit" / "warmctl"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## Python package `toolkit/warmctl/`")
    return text[start : text.index("\n## ", start + 1)]


def _rows() -> dict[str, str]:
    """First cell's names (without the bold and backticks) -> the row."""
    rows = {}
    for line in _section().splitlines():
        if (
            line.startswith("| ")
            and not line.startswith("| ---")
            and not line.startswith("| module")
        ):
            first = line.split("|")[1]
            for name in re.findall(r"`([^`]+)`", first):
                rows[name] = line
    return rows


def _modules() -> list[str]:
    return sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def test_every_module_has_its_row() -> None:
    rows = _rows()
    missing = []
    for module in _modules():
        folder, _, name = module.rpartition("/")
        in_folder_row = folder and f"`{name}`" in rows.get(f"{folder}/", "")
        if module not in rows and not in_folder_row:
            missing.append(module)
    assert not missing, f"modules without a row in docs/ARCHITECTURE.md: {missing}"


def test_every_row_names_what_exists() -> None:
    stale = [name for name in _rows() if not (PACKAGE / name).exists()]
    assert not stale, f"rows of docs/ARCHITECTURE.md naming nothing in toolkit/warmctl: {stale}"


def test_every_sub_package_says_what_it_is() -> None:
    silent = []
    for init in PACKAGE.glob("*/__init__.py"):
        if not ast.get_docstring(ast.parse(init.read_text())):
            silent.append(str(init.relative_to(ROOT)))
    assert not silent, f"sub-packages without a docstring: {silent}"
