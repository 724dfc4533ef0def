"""files/warmctl-requirements.txt (what the roles install beside warmctl's wheel on every host,
with --require-hashes) pins every run-time dependency pyproject.toml declares, at a version that
satisfies it, each with its hashes (regenerate with scripts/lock_host_deps.sh)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pinned() -> dict[str, tuple[str, int]]:
    text = (ROOT / "files" / "warmctl-requirements.txt").read_text()
    out: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=\S)", text):
        head = block.splitlines()[0]
        if head.startswith("#") or not head.strip():
            continue
        name, version = head.split(" ")[0].split(";")[0].split("==")
        out[canonicalize_name(name)] = (version, block.count("--hash=sha256:"))
    return out


def test_every_dependency_is_pinned_with_hashes() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = pinned()
    for line in declared:
        req = Requirement(line)
        version, hashes = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version), (line, version)
        assert hashes >= 1, line
    assert all(hashes >= 1 for _, hashes in pins.values())
