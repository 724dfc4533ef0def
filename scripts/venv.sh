#!/usr/bin/env bash
# Create or refresh the project's dev venv (.venv) with warmctl (editable) and its dev tools.
# Re-runs are a no-op unless pyproject.toml changed. Usage: source-free; prints the venv path.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${WARMCTL_PYTHON:-python3}"
"$py" - <<'PY' || { echo "warmctl needs Python >= 3.11 (set WARMCTL_PYTHON)" >&2; exit 2; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
stamp="$venv/.stamp"
want="$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
link_collection() {  # the checkout is the collection warmctl.vllm (ansible.cfg: collections_path)
  mkdir -p "$venv/ansible_collections/warmctl"
  ln -sfn ../../.. "$venv/ansible_collections/warmctl/vllm"
}
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  link_collection
  echo "$venv"; exit 0
fi
echo "[venv] creating $venv" >&2
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >&2
"$venv/bin/python" -m pip install -q -e "$root[dev]" >&2
link_collection
echo "$want" > "$stamp"
echo "$venv"
