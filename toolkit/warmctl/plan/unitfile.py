"""Quoting and parsing of systemd unit-file command lines and environment files.

The templates quote with these functions (through the `vllm_systemd_quote` and
`vllm_env_quote` filters) and `warmctl.plan.render` parses the rendered text back with the inverse
functions, so the benchmark starts vLLM with exactly the argv/environment systemd would use.
"""

from __future__ import annotations

import re
import shlex

_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(value: object) -> str:
    """One argument of an Exec*= line: `%` and `$` doubled, quoted when needed."""
    text = str(value).replace("%", "%%").replace("$", "$$")
    if text and _SAFE.match(text.replace("%%", "").replace("$$", "")):
        return text
    if "'" not in text and "\\" not in text:
        return f"'{text}'"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_split(line: str) -> list[str]:
    """The argv of an Exec*= value as quoted by `systemd_quote` (specifier `%%`, `$$` undone)."""
    try:
        words = shlex.split(line, posix=True)
    except ValueError as exc:
        raise ValueError(f"cannot parse command line {line!r}: {exc}") from None
    return [word.replace("%%", "%").replace("$$", "$") for word in words]


def env_quote(value: object) -> str:
    """A value of an EnvironmentFile= line, double-quoted when it is not a plain word."""
    text = str(value)
    if text and _SAFE.match(text):
        return text
    escaped = re.sub(r'(["\\$`])', r"\\\1", text)
    return f'"{escaped}"'


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as written by `env_quote` (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"environment line without '=': {line!r}")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        env[key.strip()] = value
    return env


def unit_values(text: str, section: str, key: str) -> list[str]:
    """Every value of `key` in `[section]` of a unit file (continuation lines joined)."""
    values: list[str] = []
    current = ""
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and line.startswith(f"{key}="):
            values.append(line[len(key) + 1 :])
    return values
