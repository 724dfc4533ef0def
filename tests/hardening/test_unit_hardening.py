"""The units' sandbox is written once: warmctl.plan.units's table (HARDENING). Every rendered unit
of
the test and example inventories has exactly the table's lines for its kind, in its order; no
template writes a sandbox line of its own; every difference between unit kinds is in
docs/SECURITY.md's table of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lib.golden import cases, render_case
from warmctl.plan.units import ALL, HARDENING, KINDS

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
SECURITY = REPO / "docs" / "SECURITY.md"
# the directives of each unit's own lines (the table's {paths} and {devices})
SLOT_DIRECTIVES = {"ReadWritePaths", "PrivateDevices", "DevicePolicy", "DeviceAllow"}
DIRECTIVES = {
    line.split("=", 1)[0] for line, _ in HARDENING if "=" in line and not line.startswith("#")
} | SLOT_DIRECTIVES
SANDBOX_LINE = re.compile(r"^(" + "|".join(sorted(DIRECTIVES)) + r")=", re.MULTILINE)
CASES = dict(cases())


def _kind(name: str) -> str | None:
    """The unit kind of a rendered file's (flattened) name; None: not a service unit."""
    if not name.endswith(".service") or name.startswith("nginx__"):
        return None
    unit = name.rsplit("__", 1)[-1]
    if unit.endswith("-waker.service"):
        return "waker"
    if unit.endswith("-window.service"):
        return "reconcile"
    if re.search(r"-(sleep|wake)-[^-]+\.service$", unit):
        return "window"
    return "instance"


def _table_lines(kind: str) -> list[str]:
    return [line for line, kinds in HARDENING if kind in kinds and not line.startswith("{")]


def _units() -> Iterator[tuple[str, str, str, str]]:
    for case, hostvars in sorted(CASES.items()):
        for name, text in sorted(render_case(hostvars).items()):
            kind = _kind(name)
            if kind:
                yield case, name, kind, text


def test_no_template_writes_a_sandbox_line_of_its_own() -> None:
    """The templates print the plan's lines: a template with a line such as
    `MemoryDenyWriteExecute=yes` (the four copies that had drifted apart) fails here."""
    found = {
        f"{path.name}: {m.group(0)}"
        for path in sorted(TEMPLATES.glob("*.j2"))
        for m in SANDBOX_LINE.finditer(path.read_text())
    }
    assert not found, sorted(found)


def test_every_unit_has_the_table_lines_of_its_kind_in_order() -> None:
    seen: set[str] = set()
    for case, name, kind, text in _units():
        seen.add(kind)
        body = text.split("[Service]", 1)[1].split("\n[", 1)[0].splitlines()
        sandbox = [line for line in body if SANDBOX_LINE.match(line)]
        fixed = [line for line in sandbox if line.split("=", 1)[0] not in SLOT_DIRECTIVES]
        expected = [line for line in _table_lines(kind) if not line.startswith("#")]
        assert fixed == expected, (case, name)
        # the unit's own lines come from the plan too: its paths and devices only
        own = [line for line in sandbox if line.split("=", 1)[0] in SLOT_DIRECTIVES]
        assert own and all(line.split("=", 1)[0] in SLOT_DIRECTIVES for line in own), name
        # one block: from its first sandbox line to its last, nothing but sandbox lines and
        # the table's comments
        lines = [i for i, line in enumerate(body) if SANDBOX_LINE.match(line)]
        between = body[lines[0] : lines[-1] + 1]
        assert all(SANDBOX_LINE.match(x) or x.startswith("#") for x in between), (case, name)
    assert seen == set(KINDS)


def test_the_kinds_share_every_line_but_the_differences_security_md_explains() -> None:
    """A line only some unit kinds have is a difference: docs/SECURITY.md's table names it (and
    says why); every other line is every unit's."""
    doc = SECURITY.read_text()
    section = doc[doc.index("## systemd sandbox") : doc.index("## Tensor parallel")]
    differing = {
        line.split("=", 1)[0]
        for line, kinds in HARDENING
        if kinds != ALL and "=" in line and not line.startswith("#")
    }
    missing = sorted(d for d in differing if f"`{d}=" not in section)
    assert not missing, f"differences docs/SECURITY.md does not explain: {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_hardening_off_leaves_no_sandbox_line(kind: str) -> None:
    host = {**CASES["gpu_idle+proxy"], "vllm_service_hardening": False}
    for name, text in render_case(host).items():
        if _kind(name) == kind:
            assert not SANDBOX_LINE.search(text), name
