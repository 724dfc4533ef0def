#!/usr/bin/env bash
# The GPU e2e, on the lent GPU machine (root, no systemd as PID 1, no network), from the checkout
# root, with the kit of tests/gpu/prepare.sh carried as .gpu-e2e:
#   GPU_HOSTS=1 bash tests/gpu/run.sh [PYTEST ARGS...]     e.g. -k "not lb"
#   GPU_HOSTS=2 bash tests/gpu/run.sh -k lb                 two hosts behind the load balancer
# 1. unpacks the vLLM bundle and builds the random-weight Qwen3-0.6B (as the bundle's setup does),
# 2. boots GPU_HOSTS systemd GPU hosts (tests/gpu/gpuhost.sh: systemd-nspawn over the image's
#    /usr, the GPU and driver bound in, D-Bus) and gives each what a GPU server of a team would
#    have: an interpreter that already has vLLM (a venv over the image's torch with the bundle on
#    a .pth: `vllm_install_vllm_python`), nginx, a wheelhouse of warmctl's dependencies,
# 3. installs the controller beside them (ansible-core over the image's Python, the collection
#    from its tarball with ansible-galaxy into a project folder; the hosts are reached with
#    tests/gpu/connection_plugins/nsenter.py: they run no sshd),
# 4. runs tests/gpu/test_gpu_e2e.py (marker gpu) and writes its figures and journals under $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
kit="$root/.gpu-e2e"
out="${OUT:-/tmp/gpu-e2e-out}"
hosts="${GPU_HOSTS:-1}"
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[gpu-e2e $(( $(date +%s) - t0 ))s] $*"; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -s "$kit/site.tar.xz" ] || { echo "no $kit/site.tar.xz: run tests/gpu/prepare.sh on a CPU machine and carry .gpu-e2e" >&2; exit 2; }

if [ ! -f /root/site/.ok ]; then
  rm -rf /root/site && mkdir -p /root/site
  xz -dc -T0 "$kit/site.tar.xz" | tar -x -C /root/site || exit 11
  python3 -m compileall -q -j 16 /root/site >/dev/null 2>&1
  touch /root/site/.ok
fi
say "vLLM bundle in /root/site"
[ -f /root/tok/tokenizer.json ] || PYTHONPATH=/root/site python3 "$kit/make_tokenizer.py" /root/tok >/dev/null 2>&1 || exit 14
[ -f /root/models/qwen3-0.6b-random/model.safetensors ] \
  || PYTHONPATH=/root/site python3 "$kit/make_model.py" /root/models/qwen3-0.6b-random /root/tok >/dev/null 2>&1 || exit 12
say "model built"
# the image's torch has no bytecode (its PYTHONDONTWRITEBYTECODE=1) and the hosts see it
# read-only: compiled once here, as a GPU server's provisioned venv would have it
python3 -m compileall -q -j 16 /opt/torch/.venv/lib/python3.12/site-packages >/dev/null 2>&1
say "torch bytecode"

export GPUHOST_KIT="$kit"
names=""
for i in $(seq 1 "$hosts"); do
  name=gpuhost; [ "$i" -gt 1 ] && name="gpuhost$i"
  GPUHOST_NAME=$name bash tests/gpu/gpuhost.sh up || exit 15
  r="/tmp/$name"
  H() { GPUHOST_NAME=$name bash tests/gpu/gpuhost.sh exec env -i \
          PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root LANG=C.UTF-8 "$@"; }
  # nginx (the proxy in front of dev-mode instances, and the load balancer), unpacked as apt would
  # (into a folder first: Debian 12's packages put files under /lib, and extracting them over
  # the merged-usr root would replace its /lib symlink with a folder, hiding libc from ld)
  x="$(mktemp -d)"
  for d in "$kit"/deb/nginx*.deb; do dpkg -x "$d" "$x"; done
  for top in lib bin sbin; do
    [ -d "$x/$top" ] && mkdir -p "$r/usr/$top" && cp -a "$x/$top/." "$r/usr/$top/" && rm -rf "${x:?}/$top"
  done
  cp -a "$x/." "$r/" && rm -rf "$x"
  rm -f "$r/etc/nginx/sites-enabled/default"
  mkdir -p "$r/var/log/nginx" "$r/var/lib/nginx" "$r/srv/kit"
  cp -r "$kit/wheels" "$r/srv/kit/"
  H systemctl daemon-reload
  # venv's pip bootstrap: the image's Python may come without ensurepip (Debian and Ubuntu
  # split it into python3-venv): a stand-in installs pip from the carried wheel
  if ! H /usr/bin/python3.12 -c 'import ensurepip' 2>/dev/null; then
    mkdir -p "$r/usr/lib/python3.12/ensurepip"
    : > "$r/usr/lib/python3.12/ensurepip/__init__.py"
    cat > "$r/usr/lib/python3.12/ensurepip/__main__.py" <<'EOF'
import glob, subprocess, sys
whl = sorted(glob.glob("/srv/kit/wheels/ctl/pip-*.whl"))[-1]
sys.exit(subprocess.call([sys.executable, whl + "/pip", "install", "-q", "--no-index",
                          "--no-cache-dir", whl]))
EOF
    say "$name: ensurepip stand-in (the image's Python has none)"
  fi
  # the interpreter a GPU server's image already has vLLM in
  H /usr/bin/python3.12 -m venv --without-pip /opt/vllm-provided || exit 16
  printf '/opt/torch/.venv/lib/python3.12/site-packages\n/srv/site\n' \
    > "$r/opt/vllm-provided/lib/python3.12/site-packages/image.pth"
  names="$names $name:$(cat "/tmp/$name-state/pid")"
  say "$name ready: $(H systemctl is-system-running)"
done

# the controller: ansible-core over the image's Python (its jinja2, PyYAML, packaging)
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/ansible-ctl \
  "$kit"/wheels/ctl/ansible_core-*.whl "$kit"/wheels/ctl/resolvelib-*.whl || exit 17
mkdir -p /root/gpu-project
printf '[defaults]\ncollections_path = ./collections\ninterpreter_python = auto_silent\ncallback_result_format = yaml\nforks = 10\n' \
  > /root/gpu-project/ansible.cfg
(cd /root/gpu-project && PYTHONPATH=/root/ansible-ctl python3 -m ansible galaxy collection install \
  -p ./collections "$kit"/warmctl-vllm-*.tar.gz) || exit 18
say "controller ready (hosts:$names)"

export WARMCTL_GPUHOSTS="${names# }" WARMCTL_GPU_OUT="$out" WARMCTL_GPU_PROJECT=/root/gpu-project
export WARMCTL_ANSIBLE_PATH=/root/ansible-ctl
export PYTHONPATH="$root/toolkit:$root" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 -m pytest -m gpu -p no:cacheprovider -rA -o addopts="" tests/gpu/test_gpu_e2e.py "$@" 2>&1 \
  | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
for nm in $names; do
  name=${nm%%:*}
  GPUHOST_NAME=$name bash tests/gpu/gpuhost.sh exec journalctl --no-pager -o short-precise -u 'vllm-*' \
    > "$out/journal-$name.log" 2>&1
done
say "done (pytest rc $rc)"
for nm in $names; do GPUHOST_NAME=${nm%%:*} bash tests/gpu/gpuhost.sh down >/dev/null 2>&1; done
exit "$rc"
