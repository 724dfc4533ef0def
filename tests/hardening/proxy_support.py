"""Render the proxy's nginx files outside Ansible (same templates, role defaults) and run a
real nginx on loopback in front of the vLLM double."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from warmctl.plan.render import host_variables, instance_variables
from warmctl.plan.roles import roles_dir


def proxy_defaults() -> dict[str, Any]:
    return yaml.safe_load((roles_dir() / "vllm_proxy/defaults/main.yml").read_text())


def render_proxy(instance: Mapping[str, Any], host: Mapping[str, Any]) -> dict[str, str]:
    """{file name: text} of the proxy's conf.d files for one instance (as the role writes)."""
    from warmctl.plan.render import _environment  # the same Jinja2 environment as render_instance

    variables = instance_variables(instance, host_variables({**proxy_defaults(), **host}))
    env = _environment()
    name = instance["name"]
    return {
        "vllm-proxy.conf": env.get_template("nginx-vllm-http.conf.j2").render(variables),
        f"vllm-{name}.conf": env.get_template("nginx-vllm.conf.j2").render(variables),
    }


def ensure_nginx() -> str | None:
    """Path of nginx; installed with apt-get when missing and we are root. None = unavailable."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "nginx"]
    for step in (install, ["apt-get", "update", "-q"], install):
        subprocess.run(step, env=env, capture_output=True, timeout=900, check=False)
        if os.access("/usr/sbin/nginx", os.X_OK):
            return "/usr/sbin/nginx"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx with its own prefix folder, conf.d = the rendered files."""

    def __init__(self, binary: str, root: Path, files: Mapping[str, str]) -> None:
        self.binary, self.root = binary, root
        conf_d = root / "conf.d"
        conf_d.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (conf_d / name).write_text(text)
        user = "user root;\n" if os.geteuid() == 0 else ""
        (root / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log;\n"
            "events { worker_connections 256; }\n"
            f"http {{\n  access_log {root}/access.log;\n"
            f"  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n"
            f"  fastcgi_temp_path {root}/fcgi;\n  uwsgi_temp_path {root}/uwsgi;\n"
            f"  scgi_temp_path {root}/scgi;\n  include {conf_d}/*.conf;\n}}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self, *extra: str) -> list[str]:
        return [self.binary, "-p", str(self.root), "-c", str(self.root / "nginx.conf"), *extra]

    def test_config(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.args("-t"), capture_output=True, text=True, check=False)

    def start(self, port: int) -> Nginx:
        self.proc = subprocess.Popen(
            self.args("-g", "daemon off;"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        pid_file = self.root / "nginx.pid"
        while time.monotonic() < deadline:
            try:
                # nginx writes its pid once it has bound every port: until then, a connection
                # may reach another process on the port (one this nginx fails to bind)
                if pid_file.read_text().strip() != str(self.proc.pid):
                    raise OSError("not listening yet")
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    raise RuntimeError(f"nginx exited: {err}") from None
                time.sleep(0.05)
        raise RuntimeError("nginx did not listen within 10 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def running_nginx(binary: str, root: Path, files: Mapping[str, str], port: int) -> Iterator[Nginx]:
    n = Nginx(binary, root, files)
    try:
        yield n.start(port)
    finally:
        n.stop()


LB_EXAMPLE = Path(__file__).resolve().parents[2] / "docs/examples/nginx-lb.conf"
_LB_SERVER = re.compile(r"^(\s*server )\S+:\d+( .*;)$", re.MULTILINE)
_LB_LISTEN = re.compile(r"^(\s*listen )\d+;$", re.MULTILINE)


def lb_config(backends: Sequence[str | tuple[str, str]], port: int) -> str:
    """docs/examples/nginx-lb.conf as a user applies it: only the upstream's host lines and
    the listen port changed. Each host is (its awake-only door, its instance port): the file's
    primaries get the doors, its backups the ports, in the same order; a host given as one
    address (no wake on request) is that address on both lines."""
    pairs = [(b, b) if isinstance(b, str) else b for b in backends]
    addresses = [door for door, _ in pairs] + [port_ for _, port_ in pairs]
    text = LB_EXAMPLE.read_text()
    servers = _LB_SERVER.findall(text)
    if len(servers) != len(addresses):
        raise ValueError(f"{LB_EXAMPLE} lists {len(servers)} host lines, not {len(addresses)}")
    it = iter(addresses)
    text = _LB_SERVER.sub(lambda m: f"{m.group(1)}{next(it)}{m.group(2)}", text)
    text, listens = _LB_LISTEN.subn(lambda m: f"{m.group(1)}{port};", text)
    if listens != 1:
        raise ValueError(f"{LB_EXAMPLE}: {listens} listen lines, expected 1")
    return text
