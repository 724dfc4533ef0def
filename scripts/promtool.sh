#!/usr/bin/env bash
# Print the path of a promtool (Prometheus' rule and metrics checker) for the tests.
# One on PATH wins; else Debian's `prometheus` package is downloaded (apt-get download, no root,
# nothing installed or started) and only its files are unpacked under .cache/promtool (or
# $WARMCTL_CACHE/promtool). promtool is a static Go binary: it needs nothing else.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then command -v promtool; exit 0; fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${WARMCTL_CACHE:-$root/.cache}/promtool"
bin="$dest/usr/bin/promtool"
mkdir -p "$dest"
exec 9>"$dest.lock"
flock 9
if [ ! -x "$bin" ]; then
  command -v apt-get >/dev/null || { echo "promtool: not on PATH and no apt-get to fetch Debian's prometheus package" >&2; exit 3; }
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # a machine whose package lists were never fetched: fetch them once, then try again
  (cd "$work" && { apt-get download -q prometheus >&2 || { apt-get update -q >&2 && apt-get download -q prometheus >&2; }; })
  dpkg -x "$work"/prometheus_*.deb "$work/x"
  install -D -m 0755 "$work/x/usr/bin/promtool" "$bin"
fi
"$bin" --version >/dev/null
echo "$bin"
