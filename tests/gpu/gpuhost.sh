#!/bin/bash
# A systemd GPU host on the lent GPU machine, whose PID 1 is not systemd.
# A systemd-nspawn container over the image's own /usr (an overlay adds Debian 12's systemd and
# D-Bus), with the GPU's device nodes and the NVIDIA driver bound in. Inside it systemd is PID 1
# and units run as on a GPU server: User=, the sandbox (ProtectSystem, DevicePolicy,
# SystemCallFilter, ...), timers, journald, `systemctl` over D-Bus as a non-root user.
# It shares the machine's network (vLLM on 127.0.0.1:PORT inside is 127.0.0.1:PORT outside).
#
# The GPU e2e's host (tests/gpu/run.sh boots it); the kit folder ($GPUHOST_KIT, default
# .gpu-e2e, made by tests/gpu/prepare.sh) holds deb/ with Debian 12's systemd, nspawn and D-Bus.
#   bash tests/gpu/gpuhost.sh up            boot it (~10 s); prints HOST_PID and ROOT
#   bash tests/gpu/gpuhost.sh exec CMD...   run CMD inside it, as root, in all its namespaces
#   bash tests/gpu/gpuhost.sh down          power it off, remove its cgroup, unmount and remove
#                                           its root (GPUHOST_KEEP=1: keep the root to look at)
# `up` after `down` on the same machine boots a fresh host (a second GPU e2e on a warm machine).
# What is inside: the image's Python 3.12 (/usr/bin/python3.12) and its torch venv at
# /opt/torch/.venv (read-only); the vLLM bundle at /srv/site and the model at /srv/models/NAME
# (both readable by any user; run .gpu/setup.sh first); /opt, /etc, /var, /srv writable.
# A GPU server's driver lives in the loader's path: here /usr/local/nvidia/lib64 via ld.so.conf.d.
set -euo pipefail
G=$(cd "${GPUHOST_KIT:-.gpu-e2e}" && pwd)
# several hosts side by side: GPUHOST_NAME=gpuhost2 (machine name, root, state, cgroup)
NAME=${GPUHOST_NAME:-gpuhost}
ROOT=${GPUHOST_ROOT:-/tmp/$NAME}
ST=/tmp/$NAME-state
cmd=${1:-}; shift || true

CGROOT=${GPUHOST_CGROOT:-/sys/fs/cgroup}

hostpid() { cat "$ST/pid" 2>/dev/null; }

# The cgroup tree a host of this name left behind: its processes killed, its folders removed
# deepest first. After `systemd-nspawn --keep-unit` the host's cgroup is no leaf (nspawn made
# payload/ and supervisor/ under it and enabled controllers for them), so no process can join it
# again ("echo: write error: Device or resource busy") until the tree is gone. 1: still there.
clean_cgroup() {
  local cg=$1
  [ -d "$cg" ] || return 0
  if [ -e "$cg/cgroup.kill" ]; then
    echo 1 > "$cg/cgroup.kill" 2>/dev/null || true
  else
    find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  fi
  for _ in $(seq 50); do
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$cg" ] || return 0
    sleep 0.1
  done
  return 1
}

up() {
  [ -d "$G/deb" ] || { echo "gpuhost: no $G/deb (run tests/gpu/prepare.sh on a CPU machine)" >&2; exit 2; }
  [ -s "$ST/pid" ] && kill -0 "$(hostpid)" 2>/dev/null && { echo "HOST_PID=$(hostpid) ROOT=$ROOT (already up)"; return; }
  mkdir -p "$ST/sd" "$ST/fs"
  for d in "$G"/deb/*.deb; do dpkg -x "$d" "$ST/sd"; done
  mountpoint -q "$ST/fs" || mount -t tmpfs tmpfs "$ST/fs"
  mkdir -p "$ST/fs/u/usr/lib/x86_64-linux-gnu" "$ST/fs/w"
  # Debian 12 ships systemd under /lib, /bin, /sbin: fold them into usr/ (the image is merged-usr)
  cp -a --update=none "$ST/sd/usr/." "$ST/fs/u/usr/"
  for top in lib bin sbin; do [ -d "$ST/sd/$top" ] && mkdir -p "$ST/fs/u/usr/$top" && cp -a --update=none "$ST/sd/$top/." "$ST/fs/u/usr/$top/"; done
  # the image's own libraries win: an older Debian build must not shadow one the image has
  (cd "$ST/fs/u/usr/lib/x86_64-linux-gnu" && for f in *.so*; do [ -e "/usr/lib/x86_64-linux-gnu/$f" ] && rm -rf "$f"; done) || true
  mkdir -p "$ROOT"/{etc,var,root,tmp,home,opt/torch,srv/site,srv/models,run,proc,sys,dev,mnt,usr}
  for l in bin lib lib64 sbin; do [ -L "/$l" ] && ln -sfn "$(readlink "/$l")" "$ROOT/$l"; done
  mountpoint -q "$ROOT/usr" || mount -t overlay overlay -o "lowerdir=/usr,upperdir=$ST/fs/u/usr,workdir=$ST/fs/w" "$ROOT/usr"
  mountpoint -q "$ROOT/usr/local/nvidia" || mount --bind /usr/local/nvidia "$ROOT/usr/local/nvidia"
  cp -a /etc/. "$ROOT/etc/"; cp -a --update=none "$ST/sd/etc/." "$ROOT/etc/"
  tr -d - < /proc/sys/kernel/random/uuid > "$ROOT/etc/machine-id"
  printf '/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n' > "$ROOT/etc/ld.so.conf.d/zz-nvidia.conf"
  id messagebus >/dev/null 2>&1 || chroot "$ROOT" /usr/sbin/useradd --system --no-create-home messagebus 2>/dev/null || true
  mkdir -p "$ROOT/etc/systemd/system/sockets.target.wants"
  ln -sf /usr/lib/systemd/system/dbus.socket "$ROOT/etc/systemd/system/sockets.target.wants/dbus.socket"
  [ -d /root/models ] && cp -rL --update=none /root/models/. "$ROOT/srv/models/" && chmod -R a+rX "$ROOT/srv/models"
  [ -d /root/site ] && { mountpoint -q "$ROOT/srv/site" || mount --bind /root/site "$ROOT/srv/site"; }
  mkdir -p /run/systemd; mountpoint -q /run/systemd || mount -t tmpfs tmpfs /run/systemd
  # a cgroup of its own, fresh: the tree of a host of this name that ran before is removed
  # first, or when it cannot be (a process that does not die) this boot takes another name
  local cg=$NAME
  clean_cgroup "$CGROOT/$cg" || { cg=$NAME-$(date +%s); echo "gpuhost: $CGROOT/$NAME is still busy: this boot runs in $CGROOT/$cg" >&2; }
  mkdir -p "$CGROOT/$cg"
  echo "$cg" > "$ST/cgroup"
  local devs=()
  for d in /dev/nvidia*; do [ -c "$d" ] && devs+=("--bind=$d"); done
  [ -d /dev/nvidia-caps ] && devs+=("--bind=/dev/nvidia-caps")
  local ldp="$ST/sd/usr/lib/x86_64-linux-gnu/systemd:$ST/sd/usr/lib/x86_64-linux-gnu:$ST/sd/lib/x86_64-linux-gnu"
  # started from a cgroup of its own (nspawn --keep-unit makes payload/ and supervisor/ under it)
  setsid bash -c "echo \$\$ > $CGROOT/$cg/cgroup.procs || exit 1; exec env LD_LIBRARY_PATH=$ldp $ST/sd/usr/bin/systemd-nspawn \
    -D $ROOT -M $NAME --boot --register=no --keep-unit --link-journal=no --console=pipe \
    --bind-ro=/opt/torch ${devs[*]}" > "$ST/nspawn.log" 2>&1 < /dev/null &
  local pid=""
  for _ in $(seq 60); do
    sleep 0.5
    for p in $(pgrep -x systemd || true); do grep -q "/$cg/" "/proc/$p/cgroup" 2>/dev/null && pid=$p; done
    [ -n "$pid" ] && break
  done
  [ -n "$pid" ] || { echo "gpuhost: systemd did not start" >&2; tail -20 "$ST/nspawn.log" >&2; exit 1; }
  echo "$pid" > "$ST/pid"
  timeout 60 nsenter -t "$pid" -a /usr/bin/systemctl is-system-running --wait >/dev/null || true
  nsenter -t "$pid" -a /usr/sbin/ldconfig
  echo "HOST_PID=$pid ROOT=$ROOT state=$(nsenter -t "$pid" -a /usr/bin/systemctl is-system-running || true)"
}

# Every mount under DIR (deepest first) unmounted, a busy one detached (umount -l: gone from
# this namespace, so nothing below DIR reaches the host's /root/site or driver any more).
unmount_under() {
  local m
  for m in $(awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  ! awk -v d="$1" '$2 == d || index($2, d "/") == 1 {found = 1} END {exit !found}' /proc/self/mounts
}

case "$cmd" in
  up) up ;;
  exec) [ -n "$(hostpid)" ] || { echo "gpuhost: not up" >&2; exit 2; }; exec nsenter -t "$(hostpid)" -a "$@" ;;
  down)
    p=$(hostpid) || true
    if [ -n "$p" ]; then nsenter -t "$p" -a /usr/bin/systemctl poweroff >/dev/null 2>&1 || kill "$p" 2>/dev/null || true; fi
    for _ in $(seq 30); do [ -n "$p" ] && kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    # what is left of it (nspawn, a unit that ignored the poweroff) and its cgroup tree: the
    # next `up` starts from a cgroup of this name again
    cg=$(cat "$ST/cgroup" 2>/dev/null || echo "$NAME")
    clean_cgroup "$CGROOT/$cg" || echo "gpuhost: $CGROOT/$cg could not be removed" >&2
    rm -f "$ST/pid" "$ST/cgroup"
    # the host's files: the next `up` starts from the image again, not from this run's /etc
    # (its units enabled), /var and /opt; removed only once nothing is mounted below them
    if [ -z "${GPUHOST_KEEP:-}" ] && ! { [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }; then
      if unmount_under "$ROOT"; then rm -rf --one-file-system "$ROOT"; else echo "gpuhost: $ROOT still has mounts: kept" >&2; fi
      if unmount_under "$ST/fs"; then rm -rf --one-file-system "$ST/fs" "$ST/sd"; fi
    fi
    echo "gpuhost: down" ;;
  *) echo "usage: gpuhost.sh up | exec CMD... | down" >&2; exit 2 ;;
esac
