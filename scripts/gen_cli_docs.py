#!/usr/bin/env python3
"""Generate docs/CLI.md from warmctl's own --help texts (one source: the click commands).

python scripts/gen_cli_docs.py           # rewrite docs/CLI.md
python scripts/gen_cli_docs.py --check   # exit 1 if docs/CLI.md is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "CLI.md"
WIDTH = 100
HEADER = """\
# warmctl command line

Generated from the commands' own `--help` by `scripts/gen_cli_docs.py`; do not edit by hand
(`python scripts/gen_cli_docs.py` rewrites it, a test checks it is current).

Exit status, for every command: 0 success; 1 `verify` found a host failing or asleep (and
`calendar --in-window` outside the window); 2 error — unreachable host, HTTP failure, bad input.
Every error is one line on stderr, `warmctl: error: ...`. Options that an environment
variable can set say so in their help (`[env var: NAME]`); the command line wins over it.

Shell completion (click's own): add one line to your shell's startup file —

```sh
eval "$(_WARMCTL_COMPLETE=bash_source warmctl)"   # ~/.bashrc
eval "$(_WARMCTL_COMPLETE=zsh_source warmctl)"    # ~/.zshrc
_WARMCTL_COMPLETE=fish_source warmctl | source    # ~/.config/fish/completions/warmctl.fish
```

It completes subcommands, options and choices (e.g. `sleep --level`).
"""


Ctx = click.Context | None


def _context(cmd: click.Command, name: str, parent: Ctx) -> click.Context:
    settings = {**cmd.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    return click.Context(cmd, info_name=name, parent=parent, **settings)


def _walk(cmd: click.Command, path: list[str], parent: Ctx, out: list[str]) -> None:
    ctx = _context(cmd, path[-1], parent)
    level = "#" * min(len(path) + 1, 4)
    out.append(f"{level} `{' '.join(path)}`\n")
    out.append("```text\n" + cmd.get_help(ctx).rstrip() + "\n```\n")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _walk(sub, [*path, name], ctx, out)


def render() -> str:
    from warmctl.cli import cli

    out = [HEADER]
    _walk(cli, ["warmctl"], None, out)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC.relative_to(ROOT)} is out of date: run python scripts/gen_cli_docs.py")
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
