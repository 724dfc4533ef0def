"""What the lab modules share: the cache location, the one-line error, progress lines, a lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


class LabError(RuntimeError):
    """A lab failure the user can act on, said in one line."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """`$WARMCTL_CACHE`, else `.cache/` in the checkout (ignored by git)."""
    env = os.environ.get("WARMCTL_CACHE")
    return Path(env).expanduser().resolve() if env else repo_root() / ".cache"


def toolkit_dir() -> Path:
    """The folder that holds the `warmctl` package (for PYTHONPATH in the lab venv)."""
    return repo_root() / "toolkit"


def log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed); say so when someone else holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process building {what} ({path})")
            t0 = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log(f"got the {what} lock after {time.monotonic() - t0:.0f}s")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_cli(cli: Any, argv: Sequence[str] | None = None) -> int:
    """Run a lab module's click group (`python -m tests.lib.X`): a `LabError` or a usage
    error is one line on stderr and a non-zero exit, never a traceback."""
    import click

    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except LabError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        return 1
    return 0
