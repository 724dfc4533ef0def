#!/usr/bin/env bash
# The GPU e2e's kit, built on a CPU machine with network, carried to the lent GPU machine (which
# reaches no index) as one ignored folder, within the 64 MiB a call may carry:
#   KIT/site.tar.xz   vLLM 0.26.0 slim bundle (from BUNDLE/site_full.tar.xz), minus the data only
#                     Mistral tokenizers and country-name translations read (~6 MB)
#   KIT/deb/          Debian 12's systemd, nspawn, D-Bus (the container host) + nginx (the proxy)
#   KIT/wheels/ctl/   ansible-core for the controller (inside the host, over the image's Python)
#   KIT/wheels/host/  warmctl's dependencies for Python 3.12, the hashes of files/warmctl-requirements.txt
#   KIT/warmctl-vllm-VERSION.tar.gz   the collection (scripts/build.sh), installed with ansible-galaxy
#   KIT/make_model.py, KIT/make_tokenizer.py   the random-weight Qwen3-0.6B and its tokenizer
# usage, from the checkout root:  bash tests/gpu/prepare.sh [BUNDLE] [KIT]
#   BUNDLE: the folder made by the GPU bundle's build.sh (default .gpu); KIT: default .gpu-e2e
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bundle="$(cd "${1:-.gpu}" && pwd)"
kit="${2:-.gpu-e2e}"
mkdir -p "$kit/deb" "$kit/wheels/ctl" "$kit/wheels/host"
kit="$(cd "$kit" && pwd)"
for f in site_full.tar.xz make_model.py make_tokenizer.py; do
  [ -f "$bundle/$f" ] || { echo "prepare: no $bundle/$f (build the GPU bundle first)" >&2; exit 2; }
done
if [ ! -s "$kit/site.tar.xz" ]; then
  echo "[prepare] slimming the vLLM bundle (xz, a few minutes)"
  w="$(mktemp -d)"; trap 'rm -rf "$w"' EXIT
  xz -dc -T0 "$bundle/site_full.tar.xz" | tar -x -C "$w"
  # read only for Mistral tokenizers (tekken) and translated country names: not this model's
  rm -f "$w"/mistral_common/data/tekken_*.json
  rm -rf "$w"/pycountry/locales
  (cd "$w" && tar -cf - --sort=name . | xz -9 -T2 > "$kit/site.tar.xz.part")
  mv "$kit/site.tar.xz.part" "$kit/site.tar.xz"
fi
cp "$bundle"/make_model.py "$bundle"/make_tokenizer.py "$kit/"
# the debs of the container host; the libraries every Ubuntu 24.04 image has are left out
for d in "$bundle"/deb/*.deb; do
  case "$(basename "$d")" in
    libacl1_*|libaudit1_*|libcap2_*|libcrypt1_*|libgcrypt20_*|libgpg-error0_*|liblz4-1_*|\
    liblzma5_*|libpam0g_*|libzstd1_*|libseccomp2_*) ;;
    *) cp -u "$d" "$kit/deb/" ;;
  esac
done
if ! ls "$kit"/deb/nginx_*.deb >/dev/null 2>&1; then
  (cd "$kit/deb" && apt-get download -q nginx nginx-common 2>&1 | grep -v -i unsandboxed || true)
fi
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
pip download -q --no-deps "${plat[@]}" -d "$kit/wheels/ctl" ansible-core==2.19.14 'resolvelib<2' pip \
  2>&1 | grep -v "is ignored" || true
pip download -q --no-deps "${plat[@]}" -d "$kit/wheels/host" -r files/warmctl-requirements.txt \
  2>&1 | grep -v "is ignored" || true
rm -f "$kit"/warmctl-vllm-*.tar.gz
cp "$(bash scripts/build.sh | tail -1)" "$kit/"
du -sh "$kit"
