#!/usr/bin/env bash
# The test bed's real vLLM on this machine's CPU (venv, tiny model, a loopback server), from the
# checkout: bash scripts/lab.sh check|venv|model|serve ... (not part of the shipped warmctl).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/venv.sh")"
cd "$root"
exec "$venv/bin/python" -m tests.lib.cli "$@"
