"""warmctl: deploy vLLM with systemd and keep the first request as fast as the thousandth."""

from __future__ import annotations


def _version() -> str:
    """The version the wheel was built with, else galaxy.yml's in a checkout (one source)."""
    try:
        from warmctl._version import __version__ as built

        return str(built)
    except ImportError:
        import re
        from pathlib import Path

        galaxy = Path(__file__).resolve().parents[2] / "galaxy.yml"
        found = (
            re.search(r"^version: (\S+)$", galaxy.read_text(), re.M) if galaxy.is_file() else None
        )
        return found.group(1) if found else "0+unknown"


__version__ = _version()
