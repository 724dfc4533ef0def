#!/usr/bin/env bash
# Build the two artifacts into dist/: warmctl's wheel and the Ansible collection warmctl.vllm,
# which carries that wheel in files/ (the roles install it on every host) beside
# files/warmctl-requirements.txt. One version, galaxy.yml's. Prints the two paths.
#   bash scripts/build.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/venv.sh")"
cd "$root"
version="$(sed -n 's/^version: \(.*\)$/\1/p' galaxy.yml)"
mkdir -p dist files
rm -f dist/warmctl-*.whl files/warmctl-*.whl dist/warmctl-vllm-*.tar.gz
"$venv/bin/python" -m pip wheel -q --no-deps -w dist . >&2
wheel="dist/warmctl-$version-py3-none-any.whl"
[ -f "$wheel" ] || { echo "build: expected $wheel (galaxy.yml version $version)" >&2; exit 1; }
cp "$wheel" files/
"$venv/bin/ansible-galaxy" collection build --force --output-path dist . >&2
collection="dist/warmctl-vllm-$version.tar.gz"
[ -f "$collection" ] || { echo "build: expected $collection" >&2; exit 1; }
echo "$root/$wheel"
echo "$root/$collection"
