#!/usr/bin/env bash
# `warmctl bench` on the lent GPU machine (no systemd needed: the unit's argv and environment),
# from the checkout root, with the kit of tests/gpu/prepare.sh carried as .gpu-e2e:
#   bash tests/gpu/bench.sh --plan A,L+relaunch,R,R+relaunch --budget 470
# Unpacks the vLLM bundle and builds the model as tests/gpu/run.sh does, compiles the image
# torch's bytecode, then runs the bench with vLLM's interpreter (the image's Python, the bundle
# on PYTHONPATH) and copies bench.json and the server logs (one .tar.xz) to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
kit="$root/.gpu-e2e"
out="${OUT:-/tmp/gpu-bench-out}"
work=/root/bench
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[gpu-bench $(( $(date +%s) - t0 ))s] $*"; }
[ -s "$kit/site.tar.xz" ] || { echo "no $kit/site.tar.xz: run tests/gpu/prepare.sh and carry .gpu-e2e" >&2; exit 2; }
if [ ! -f /root/site/.ok ]; then
  rm -rf /root/site && mkdir -p /root/site
  xz -dc -T0 "$kit/site.tar.xz" | tar -x -C /root/site || exit 11
  touch /root/site/.ok
fi
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
[ -f /root/tok/tokenizer.json ] || python3 "$kit/make_tokenizer.py" /root/tok >/dev/null 2>&1 || exit 14
[ -f /root/models/qwen3-0.6b-random/model.safetensors ] \
  || python3 "$kit/make_model.py" /root/models/qwen3-0.6b-random /root/tok >/dev/null 2>&1 || exit 12
python3 -m compileall -q -j 16 /opt/torch/.venv/lib/python3.12/site-packages >/dev/null 2>&1
say "bundle, model and bytecode ready"
python3 - "$root/toolkit" <<'PY' || exit 13
import sys
sys.path.insert(0, sys.argv[1])
import click, jinja2, requests, rich, yaml, prometheus_client  # noqa: F401  warmctl's own
PY
py="$(command -v python3)"
PYTHONPATH="/root/site:$root/toolkit" python3 -c 'from warmctl.cli import main; main()' bench \
  --model /root/models/qwen3-0.6b-random --python "$py" --out "$work" \
  --env VLLM_USE_FLASHINFER_SAMPLER=0 "$@" 2>&1 | tee "$out/bench.txt"
rc=${PIPESTATUS[0]}
cp "$work/bench.json" "$out/" 2>/dev/null
(cd "$work" && tar -cJf "$out/logs.tar.xz" --exclude='*/cache/*' --exclude='*/home/*' -- *.log 2>/dev/null)
say "done (bench rc $rc)"
exit "$rc"
