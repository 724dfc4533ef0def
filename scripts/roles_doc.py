"""Generate docs/ROLES.md from roles/README.md (the introduction), every role's
meta/argument_specs.yml and defaults/main.yml.

python scripts/roles_doc.py          # rewrite docs/ROLES.md
python scripts/roles_doc.py --check  # exit 1 if docs/ROLES.md is not current
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "toolkit"))
from warmctl.plan.roles import role_names  # noqa: E402  (the one list of the collection's roles)

OUTPUT = ROOT / "docs" / "ROLES.md"
INTRO = ROOT / "roles" / "README.md"  # the hand-written part, copied to the top


def _type(spec: dict[str, Any]) -> str:
    kind = spec.get("type", "str")
    if kind == "list" and "elements" in spec:
        kind = f"list of {spec['elements']}"
    return kind


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _describe(spec: dict[str, Any]) -> str:
    description = spec.get("description", "")
    if isinstance(description, list):
        description = " ".join(description)
    parts = [_cell(description)]
    if "choices" in spec:
        parts.append("One of: " + ", ".join(f"`{c}`" for c in spec["choices"]) + ".")
    if spec.get("required"):
        parts.append("**Required.**")
    return " ".join(p for p in parts if p)


def _default(name: str, defaults: dict[str, Any]) -> str:
    if name not in defaults:
        return ""
    return f"`{_cell(json.dumps(defaults[name]))}`"


def _suboptions(prefix: str, options: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"#### Keys of each item of `{prefix}`",
        "",
        "| key | type | description |",
        "| --- | --- | --- |",
    ]
    nested: list[str] = []
    for key, spec in options.items():
        lines.append(f"| `{key}` | {_type(spec)} | {_describe(spec)} |")
        if "options" in spec:
            nested += _suboptions(f"{prefix}[].{key}", spec["options"])
    return lines + nested


def render() -> str:
    out = [INTRO.read_text()]
    for role in role_names():
        base = ROOT / "roles" / role
        spec = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())
        main = spec["argument_specs"]["main"]
        defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
        out += ["", f"## {role}", "", _cell(main.get("short_description", ""))]
        entries = list(spec["argument_specs"])
        if entries != ["main"]:
            names = ", ".join(f"`{e}`" for e in entries)
            out += ["", f"Entry points (`tasks_from`): {names}; each takes the variables below."]
        for paragraph in main.get("description", []):
            out += ["", _cell(paragraph)]
        out += ["", "| variable | type | default | description |", "| --- | --- | --- | --- |"]
        nested: list[str] = []
        for name, option in main.get("options", {}).items():
            out.append(
                f"| `{name}` | {_type(option)} | {_default(name, defaults)} | {_describe(option)} |"
            )
            if "options" in option:
                nested += _suboptions(name, option["options"])
        out += nested
        undocumented = sorted(set(defaults) - set(main.get("options", {})))
        if undocumented:
            missing = ", ".join(undocumented)
            raise SystemExit(f"{role}: defaults without an argument spec: {missing}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/roles_doc.py")
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
