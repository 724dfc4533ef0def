"""One sleep or wake of an instance at a time: `warmctl sleep/wake --lock FILE` hold an
exclusive `flock` on FILE for their whole run, and so does the waker's wake on request.

A wake asked while an idle sleep still drains (the waker's, the path unit's) would find the
server awake, open the gate and leave, and the sleep would then put it to sleep behind an open
gate; with the lock, the wake waits for the sleep and then wakes it. The kernel drops the lock
with the process, so a killed sleep never leaves it held. A read-only descriptor takes it: root
and the service user share one file whoever created it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

from warmctl.errors import WarmctlError


@contextlib.contextmanager
def held(path: str | None, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock on `path` (None: no lock) while the block runs; `waiting(line)` is told
    once when another sleep or wake holds it."""
    if not path:
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise WarmctlError(
            f"cannot open the lock {path}: {exc.strerror or exc} (its folder must exist and "
            "be writable by this user, or the file exist)",
            kind="input",
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting(f"another sleep or wake of this instance runs: waiting for it ({path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
