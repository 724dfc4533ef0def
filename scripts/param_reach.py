"""How many of the product's files a parameter of the inventory crosses on its way to the process.

A parameter crosses a file when the file reads it, or a value that the plan derives from it alone,
by name: the instance key and the plan's fields named below (PARAMETERS), as an attribute
(`x.port`), a key (`['port']`, `"port":`, `port:` in YAML), a keyword (`port=`) or a Jinja
variable (`c.port`). The product's files: roles/, templates/, plugins/, playbooks/ and
toolkit/warmctl/ (tests, docs and the generated snapshot are not the product). Run:

    python scripts/param_reach.py port idle_sleep launcher      # counts
    python scripts/param_reach.py --files port                  # and the files
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("roles", "templates", "plugins", "playbooks", "toolkit/warmctl")
SOURCES = (".py", ".yml", ".yaml", ".j2")
# the parameter -> the names it has on its way: the inventory key, then what the plan derives
# from it alone (a field that also depends on other parameters is not listed). The sleep
# triggers' generic names (the plan's `triggers`, which also hold windows' request wake; a
# trigger's `settings`; the waker's `triggers`; the gate's `asks`) carry every kind of
# warmctl.sleepwake.triggers.KINDS, not idle_sleep alone: what is idle's alone is its kind's
# row there (the key), its detector (warmctl/waker/idle.py) and the names below
PARAMETERS: dict[str, tuple[str, ...]] = {
    "port": ("port", "upstream", "public_port"),
    "idle_sleep": (
        "idle_sleep",
        "idle_after",
        "idle_level",
        "sleep_request",
        "idle_timeout",
    ),
    "launcher": (
        "launcher",
        "launch_file",
        "launch_state",
        "runtime_dir",
        "launch_argv",
        "exec_argv",
        "relaunch_argv",
        "relaunch_check_argv",
        "launch_env",
    ),
}
# the running process the parameter reaches (the unit's main process: the launcher, which mirrors
# vLLM's own reading of its arguments): where the way ends, not a file on it (for every parameter)
PROCESS: dict[str, str] = {
    "toolkit/warmctl/launcher/vllm_launch.py": "the launcher: the unit's running process",
    "toolkit/warmctl/launcher/vllm_args.py": "vLLM's own argument parser, as the launcher uses it",
}
# files where a name means something else, with why (the same before and after)
ELSEWHERE: dict[str, dict[str, str]] = {
    "port": {
        "toolkit/warmctl/bench/": "the bench's own server, started by the bench",
        "toolkit/warmctl/commands/bench.py": "the bench's own server",
        "toolkit/warmctl/target.py": "a URL's port, parsed from what the operator types",
        "toolkit/warmctl/server/target.py": "a URL's port, parsed from what the operator types",
        "toolkit/warmctl/client.py": "a URL's port",
        "toolkit/warmctl/server/client.py": "a URL's port",
        "toolkit/warmctl/fleet.py": "a Target's port (the URL a host's verify measures)",
        "toolkit/warmctl/observe/fleet.py": "a Target's port (the URL a host's verify measures)",
        "toolkit/warmctl/commands/tune.py": "a Target's port (the URL tune observes)",
        "toolkit/warmctl/commands/status.py": "status's --upstream: an address the operator types",
        "toolkit/warmctl/observe/status.py": "status's --upstream: an address the operator types",
    },
    "launcher": {
        "toolkit/warmctl/bench/": "the bench's own launcher runs, not an inventory's",
        "toolkit/warmctl/commands/bench.py": "the bench's own launcher runs",
    },
}
# how a name is read: an attribute, a key, a keyword, a YAML key; in a template also a variable
READ = r"(\.{n}\b|\[['\"]{n}['\"]\]|['\"]{n}['\"]|\b{n}\s*=[^=]|^\s*-?\s*{n}:)"
JINJA = r"(\b{n}\b(?=\s*(\}}\}}|\||%|\)|,|\s+if\b|\s+else\b)))"


@functools.cache
def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


def _docstrings(tree: ast.AST) -> list[tuple[int, int]]:
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                spans.append((body[0].lineno, body[0].end_lineno or body[0].lineno))
    return spans


def code_of(path: str, text: str) -> str:
    """The text without what is prose: comments, docstrings, a task's name."""
    if path.endswith(".py"):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return text
        lines = text.splitlines()
        for first, last in _docstrings(tree):
            for i in range(first - 1, last):
                lines[i] = ""
        out = []
        tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
        comments = {(t.start[0], t.start[1]) for t in tokens if t.type == tokenize.COMMENT}
        for number, line in enumerate(lines, 1):
            cut = [col for (row, col) in comments if row == number]
            out.append(line[: min(cut)] if cut else line)
        # an import names a module (warmctl.launcher), not the parameter
        return "\n".join(re.sub(r"^\s*(from|import)\s.*$", "", line) for line in out)
    if path.endswith(".j2"):
        return re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    if path.endswith((".yml", ".yaml")):
        text = re.sub(r"(?m)(^|\s)#.*$", "", text)
        return re.sub(r"(?m)^\s*-?\s*(name|description|short_description):.*$", "", text)
    return text


def crossed(parameter: str, rev: str = "", repo: Path = ROOT) -> list[str]:
    """The product's files that read the parameter, or a name it has on its way, in their code."""
    names = PARAMETERS[parameter]
    pattern = re.compile("|".join(READ.format(n=re.escape(n)) for n in names), re.M)
    jinja = re.compile("|".join(JINJA.format(n=re.escape(n)) for n in names), re.M)
    elsewhere = {**PROCESS, **ELSEWHERE.get(parameter, {})}
    if rev:
        listing = _git(repo, "ls-tree", "-r", "--name-only", rev, "--", *PRODUCT)
    else:  # the working tree: its files, committed or not (not those git ignores)
        listing = _git(repo, "ls-files", "--cached", "--others", "--exclude-standard", "--",
                       *PRODUCT)  # fmt: skip
    hits = []
    for path in sorted(set(listing.splitlines())):
        if not path.endswith(SOURCES) or any(path.startswith(p) for p in elsewhere):
            continue
        if not rev and not (repo / path).is_file():  # removed, not yet committed
            continue
        text = _git(repo, "show", f"{rev}:{path}") if rev else (repo / path).read_text()
        code = code_of(path, text)
        if pattern.search(code) or (path.endswith(".j2") and jinja.search(code)):
            hits.append(path)
    return hits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parameters", nargs="+", choices=sorted(PARAMETERS))
    parser.add_argument("--rev", default="", help="count at this commit (default: the checkout)")
    parser.add_argument("--files", action="store_true", help="list the files too")
    parser.add_argument("--repo", type=Path, default=ROOT, help="another checkout")
    args = parser.parse_args()
    for parameter in args.parameters:
        files = crossed(parameter, args.rev, args.repo)
        print(f"{parameter}: {len(files)} files")
        if args.files:
            print("".join(f"  {f}\n" for f in files), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
