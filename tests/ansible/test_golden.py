"""The rendered files of the test and example inventories are the snapshot under tests/golden/.

A change to the plan, a template or a role default that changes a unit, a launch file, an env
file, a window/trigger/waker file or an nginx file fails here until the snapshot is rewritten
(`python -m tests.lib.golden --update`) in the same commit: every rendered byte that changes is
in the diff, on purpose. A restructure that means to change nothing keeps it as it is.
"""

from __future__ import annotations

import difflib

import pytest
from tests.lib.golden import GOLDEN, cases, render_case

CASES = dict(cases())


def test_the_snapshot_has_every_case_and_no_other() -> None:
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_files_match_the_snapshot(case: str) -> None:
    rendered = render_case(CASES[case])
    stored = {p.name: p.read_text() for p in (GOLDEN / case).iterdir()}
    assert sorted(rendered) == sorted(stored), "files added or gone"
    diffs = []
    for name in sorted(rendered):
        if rendered[name] != stored[name]:
            diffs += difflib.unified_diff(
                stored[name].splitlines(), rendered[name].splitlines(),
                f"golden/{case}/{name}", "rendered", lineterm="", n=1,
            )  # fmt: skip
    assert not diffs, "\n".join(diffs[:80])
