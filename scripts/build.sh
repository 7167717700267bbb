#!/usr/bin/env bash
# Configures (once) and builds linac into build/ with ninja and ccache. Warnings are errors.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINAC_WERROR=ON >/dev/null
fi
ninja -C build "$@"
