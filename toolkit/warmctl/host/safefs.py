"""Files in a folder another user can write, touched without trusting what that user left there.

warmctl runs as root in two folders the service user controls: the gate folder (owned by it) and
the textfile folder (its group may write). Whatever sits at a name there may be a symbolic link
to a root file, a FIFO, a hard link, or a link to a device (`/dev/zero`). Everything here works
relative to a descriptor of the folder, opened component by component from `/` (`open_folder`):

- no link is ever followed in the folder (`O_NOFOLLOW`; a new file is `O_CREAT | O_EXCL`, which
  fails on any name that exists, a dangling link included);
- a file is read only when it is a regular file with one name (opened `O_NONBLOCK`, so a FIFO
  cannot hang the open, then `fstat`), and never beyond a bound the caller gives;
- a file is written as a new file of a random name, `fchmod`ed through its descriptor, then
  renamed over the old name (a rename replaces the name, never what a link points to);
- a name is removed with `unlink` (the link itself, never its target).

The folders above the one asked for must not be changeable by who may write in it (its owner
unless root, its group when it may write) nor by everyone (unless sticky, `/tmp`): else the
service user could swap a folder on the way for a link to `/etc`. A link on the way is followed
only when it is root's or this user's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

# the most links followed on the way to a folder (the kernel's own limit)
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafeFileError(OSError):
    """A name that is not what warmctl may touch there (a link, a FIFO, a device, a hard link,
    a folder on the way another user can write). `strerror` says what it is."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, why, str(path))


def _changeable(above: os.stat_result, folder: os.stat_result) -> bool:
    """Can whoever may write in `folder` (its owner, unless root or this user; its group, when
    group-writable) or everyone change the folder `above` it (rename, replace by a link)?"""
    if above.st_mode & stat.S_ISVTX:  # sticky (/tmp): only an entry's owner may move it
        return False
    if above.st_mode & 0o002:
        return True
    if folder.st_uid not in (0, os.geteuid()) and above.st_uid == folder.st_uid:
        return True
    group_writes = folder.st_mode & 0o020 and folder.st_gid != 0
    return bool(group_writes and above.st_gid == folder.st_gid and above.st_mode & 0o020)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def open_folder(path: str | os.PathLike[str]) -> int:
    """A descriptor of the folder `path`, reached from `/` one component at a time. Raises
    FileNotFoundError / NotADirectoryError as `open` would, `UnsafeFileError` when a folder
    above it could be changed by who may write in it, or a link on the way is another user's."""
    stack = [os.open("/", _DIR_FLAGS)]
    names = ["/"]
    todo = list(reversed(Path(os.path.abspath(path)).parts[1:]))
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in (0, os.geteuid()):
                    raise UnsafeFileError(path, f"{name} on the way is another user's link")
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
                target = Path(os.readlink(name, dir_fd=stack[-1]))
                if target.is_absolute():
                    while len(stack) > 1:
                        os.close(stack.pop())
                        names.pop()
                todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
            fd = os.open(name, _DIR_FLAGS, dir_fd=stack[-1])
            stack.append(fd)
            names.append(name)
        # the folder's writers (the service user, its group) must not be able to swap a folder
        # above it for a link to /etc
        folder = os.fstat(stack[-1])
        for name, fd in zip(names[:-1], stack[:-1], strict=True):
            if _changeable(os.fstat(fd), folder):
                raise UnsafeFileError(
                    path, f"{name} above it can be changed by who may write in the folder"
                )
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


@contextlib.contextmanager
def folder(path: str | os.PathLike[str]) -> Iterator[int]:
    """`open_folder` for a `with` block: the descriptor is closed at its end."""
    fd = open_folder(path)
    try:
        yield fd
    finally:
        os.close(fd)


def lexists(dir_fd: int, name: str) -> bool:
    """Something has this name (a dangling link too)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def open_regular(dir_fd: int, name: str) -> int:
    """A read-only descriptor of a regular file with one name; `UnsafeFileError` for anything
    else (a link is not followed, a FIFO does not block). FileNotFoundError when there is none."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(name, "a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(name, _kind(st.st_mode))
        if st.st_nlink != 1:
            raise UnsafeFileError(name, "a file with other hard links")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(dir_fd: int, name: str, limit: int) -> tuple[bytes, os.stat_result]:
    """At most `limit` bytes of a regular file (`open_regular`), and its stat."""
    fd = open_regular(dir_fd, name)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), os.fstat(fd)
    finally:
        os.close(fd)


def replace(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Make `name` a new regular file holding `data` (mode `mode`, whatever the umask): written
    under a random name no link can stand at (O_EXCL), then renamed over `name`."""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(8)}"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                dir_fd=dir_fd,
            )  # fmt: skip
        except FileExistsError:
            continue
        break
    else:
        raise OSError(errno.EEXIST, "no free temporary name", name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def remove(dir_fd: int, name: str) -> bool:
    """Remove the name (a link itself, never its target); False when there was none."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def open_lock(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """A read-only descriptor of the lock file `name` to flock (created when missing). Something
    else at the name (a link, a FIFO, a hard link) is removed and a new file made in its place:
    no process locks such a thing, and the service user must not make warmctl lock a root file
    or block on a FIFO."""
    for _ in range(10):
        try:
            return open_regular(dir_fd, name)
        except FileNotFoundError:
            pass
        except UnsafeFileError:
            remove(dir_fd, name)
        try:
            flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(name, flags, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue  # made meanwhile: look again
    raise UnsafeFileError(name, "keeps being replaced")


def read_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """`read_regular` of a path: at most `limit` bytes of the regular file `path`, its folder
    reached as `open_folder` reaches it (for a path another user may have chosen or planted)."""
    p = Path(path)
    with folder(p.parent) as dir_fd:
        return read_regular(dir_fd, p.name, limit)[0]
