#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test linac. Idempotent and quiet:
# packages already present are skipped, output goes to a log unless something fails.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp -t linac-setup.XXXXXX)
trap 'rm -f "$log"' EXIT

sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi

apt_pkgs=(llvm-22-dev llvm-22-tools libfmt-dev doctest-dev ninja-build ccache zstd cmake g++ python3-pip zlib1g-dev libzstd-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if ! { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log"; echo "setup: apt-get failed" >&2; exit 1
  fi
fi

py=${PYTHON:-python3}
if ! "$py" -c "import numpy, pytest, torch, matplotlib" >/dev/null 2>&1; then
  echo "setup: installing numpy, pytest, torch, matplotlib (PyPI's torch: about 3 GB with its CUDA libraries, 2 minutes here)"
  if ! "$py" -m pip install -q numpy pytest torch matplotlib >"$log" 2>&1; then
    cat "$log"; echo "setup: pip failed" >&2; exit 1
  fi
fi
# The Python package (python/linac: PyTorch ops over liblinac's C ABI), editable: it loads the
# liblinac.so that scripts/build.sh makes in build/.
if ! "$py" -c "import linac, os, sys; sys.exit(0 if os.path.realpath(linac.__file__).startswith(os.path.realpath('$repo/python')) else 1)" >/dev/null 2>&1; then
  echo "setup: installing the linac Python package (editable, from python/)"
  if ! "$py" -m pip install -q --no-build-isolation --no-deps -e "$repo/python" >"$log" 2>&1; then
    cat "$log"; echo "setup: pip install -e python failed" >&2; exit 1
  fi
fi
