#!/usr/bin/env bash
# Sets up, builds and runs the main job: every op of the library on random inputs, on the GPU when
# one is usable, else on the CPU interpreter, checked against float64 references; prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
LINAC_BIN="$PWD/build/linac" python3 tools/e2e.py "$@"
