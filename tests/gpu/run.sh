#!/usr/bin/env bash
# The GPU e2e, on the lent GPU machine (root, no systemd as PID 1, no network), from the checkout
# root, with the kit of tests/gpu/prepare.sh carried as .gpu-e2e:
#   bash tests/gpu/run.sh [PYTEST ARGS...]       e.g. -k "site or windows"
# 1. unpacks the vLLM bundle and builds the random-weight Qwen3-0.6B (as the bundle's setup does),
# 2. boots a systemd GPU host (tests/gpu/gpuhost.sh: systemd-nspawn over the image's /usr, the
#    GPU and driver bound in, D-Bus) and gives it what a GPU server of a team would have: an
#    interpreter that already has vLLM (a venv over the image's torch with the bundle on a .pth:
#    `vllm_install_vllm_python`), nginx, Python 3.12 with venv, a wheelhouse of warmctl's
#    dependencies, and the controller: ansible-core over the image's Python, the collection
#    installed with ansible-galaxy into a project folder,
# 3. runs the GPU e2e module (tests/gpu/test_gpu_e2e.py, marker gpu) from outside the host
#    (it shares the machine's network) and writes its figures and the journals under $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
kit="$root/.gpu-e2e"
out="${OUT:-/tmp/gpu-e2e-out}"
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
export PYTHONPATH=/root/site
[ -f /root/tok/tokenizer.json ] || python3 "$kit/make_tokenizer.py" /root/tok >/dev/null 2>&1 || exit 14
[ -f /root/models/qwen3-0.6b-random/model.safetensors ] \
  || python3 "$kit/make_model.py" /root/models/qwen3-0.6b-random /root/tok >/dev/null 2>&1 || exit 12
unset PYTHONPATH
say "model built"
# the image's torch has no bytecode (its PYTHONDONTWRITEBYTECODE=1) and the host sees it
# read-only: compiled once here, as a GPU server's provisioned venv would have it
python3 -m compileall -q -j 16 /opt/torch/.venv/lib/python3.12/site-packages >/dev/null 2>&1
say "torch bytecode"

export GPUHOST_KIT="$kit"
bash tests/gpu/gpuhost.sh up || exit 15
hroot="${GPUHOST_ROOT:-/tmp/gpuhost}"
H() { bash tests/gpu/gpuhost.sh exec env -i PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin \
        HOME=/root LANG=C.UTF-8 "$@"; }
# nginx (the proxy in front of dev-mode instances, and the load balancer), unpacked as apt would
for d in "$kit"/deb/nginx*.deb; do dpkg -x "$d" "$hroot"; done
rm -f "$hroot/etc/nginx/sites-enabled/default"
mkdir -p "$hroot/var/log/nginx" "$hroot/var/lib/nginx" "$hroot/srv/kit"
cp -r "$kit/wheels" "$hroot/srv/kit/"
cp "$kit"/warmctl-vllm-*.tar.gz "$hroot/srv/kit/"
H systemctl daemon-reload
# venv's pip bootstrap: the image's Python may come without ensurepip (Debian/Ubuntu split it
# into python3-venv); a stand-in installs pip from the carried wheel
if ! H /usr/bin/python3.12 -c 'import ensurepip' 2>/dev/null; then
  mkdir -p "$hroot/usr/lib/python3.12/ensurepip"
  cat > "$hroot/usr/lib/python3.12/ensurepip/__main__.py" <<'EOF'
import glob, subprocess, sys
whl = sorted(glob.glob("/srv/kit/wheels/ctl/pip-*.whl"))[-1]
sys.exit(subprocess.call([sys.executable, whl + "/pip", "install", "-q", "--no-index",
                          "--no-cache-dir", whl]))
EOF
  : > "$hroot/usr/lib/python3.12/ensurepip/__init__.py"
  say "ensurepip stand-in (the image's Python has none)"
fi
# the interpreter a GPU server's image already has vLLM in
H /usr/bin/python3.12 -m venv --without-pip /opt/vllm-provided || exit 16
printf '/opt/torch/.venv/lib/python3.12/site-packages\n/srv/site\n' \
  > "$hroot/opt/vllm-provided/lib/python3.12/site-packages/image.pth"
# the controller: ansible-core over the image's Python (its jinja2, PyYAML, packaging)
H /opt/torch/.venv/bin/python -m pip install -q --no-index --no-deps --no-compile --target /opt/ansible-ctl \
  /srv/kit/wheels/ctl/ansible_core-*.whl /srv/kit/wheels/ctl/resolvelib-*.whl || exit 17
for cli in playbook galaxy; do
  printf '#!/bin/sh\nPYTHONPATH=/opt/ansible-ctl exec /opt/torch/.venv/bin/python -m ansible %s "$@"\n' "$cli" \
    > "$hroot/usr/local/bin/ansible-$cli"
  chmod 755 "$hroot/usr/local/bin/ansible-$cli"
done
mkdir -p "$hroot/srv/project"
printf '[defaults]\ncollections_path = ./collections\nstdout_callback = default\ncallback_result_format = yaml\n' \
  > "$hroot/srv/project/ansible.cfg"
H sh -c 'cd /srv/project && ansible-galaxy collection install -p ./collections /srv/kit/warmctl-vllm-*.tar.gz' \
  || exit 18
say "host ready: $(H systemctl is-system-running)"

export WARMCTL_GPUHOST="$root/tests/gpu/gpuhost.sh" WARMCTL_GPUHOST_ROOT="$hroot" WARMCTL_GPU_OUT="$out"
export PYTHONPATH="$root/toolkit:$root" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
rc=0
python3 -m pytest -m gpu -p no:cacheprovider -rA -o addopts="" tests/gpu/test_gpu_e2e.py "$@" 2>&1 \
  | tee "$out/pytest.log" || rc=$?
rc=${PIPESTATUS[0]}
H journalctl --no-pager -o short-precise -u 'vllm-*' > "$out/journal-vllm.log" 2>&1
H journalctl --no-pager -o short-precise -b -p warning > "$out/journal-warnings.log" 2>&1
say "done (pytest rc $rc)"
bash tests/gpu/gpuhost.sh down >/dev/null 2>&1
exit "$rc"
