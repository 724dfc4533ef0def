"""No function in the warmctl package is longer than MAX_LINES (its `def` line to its last,
docstring included; a click command's option decorators are not its body): a longer one does
several jobs and should be split into named steps. A failure lists every offender."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "toolkit" / "warmctl"
MAX_LINES = 100


def long_functions(root: Path, limit: int) -> list[str]:
    """`path:line name (N lines)` for each function or method under `root` over `limit`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_over_the_limit() -> None:
    offenders = long_functions(PACKAGE, MAX_LINES)
    assert not offenders, f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders)


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(
        f"@staticmethod\ndef long():\n{body}\n\ndef short():\n    pass\n"
    )
    assert long_functions(tmp_path, MAX_LINES) == [f"{tmp_path.name}/m.py:2 long (101 lines)"]
