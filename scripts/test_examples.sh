#!/usr/bin/env bash
# The out-of-tree path a researcher takes: installs linac from a build directory into a temporary
# prefix, builds each project under examples/ against it with find_package(linac) (each in its own
# build directory), and runs it on the CPU interpreter (f32 and bf16) with its PTX dumped. A failing
# check makes the example, and this script, exit non-zero.
#   bash scripts/test_examples.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
work="$(mktemp -d "${TMPDIR:-/tmp}/linac-examples.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
for dir in examples/*/; do
  name="$(basename "$dir")"
  [ -f "$dir/CMakeLists.txt" ] || continue
  echo "== example $name"
  cmake -S "$dir" -B "$work/build-$name" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  cmake --build "$work/build-$name" >/dev/null
  exe="$work/build-$name/$name"
  "$exe" --device cpu --dump-ptx "$work/$name.ptx"
  "$exe" --device cpu --dtype bf16 --chunk 32 --T 100
  grep -q '^\.visible \.entry' "$work/$name.ptx" || { echo "$name: no PTX entry in the dump" >&2; exit 1; }
  if command -v ptxas >/dev/null || [ -x /usr/local/cuda/bin/ptxas ]; then
    ptxas_bin="$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)"
    "$ptxas_bin" -arch=sm_90a "$work/$name.ptx" -o "$work/$name.cubin"
    echo "$name: ptxas accepted the sm_90a PTX"
  else
    echo "$name: ptxas not found; PTX not assembled"
  fi
done
