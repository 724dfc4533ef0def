#!/usr/bin/env bash
# Real systemd test hosts (systemd-nspawn) for the end-to-end tests and the demo; needs root.
#   bash scripts/testhosts.sh up N | down | purge | status
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/venv.sh")"
cd "$root"
exec "$venv/bin/python" -m tests.lib.testhosts "$@"
