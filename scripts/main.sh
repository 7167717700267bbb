#!/usr/bin/env bash
# Sets up, builds and runs the main job: every op of the library on random inputs, on the GPU when
# one is usable, else on the CPU interpreter, checked against float64 references; prints a table.
# Then the PyTorch door: a small language model with a GLA token mixer of linac's ops trained a few steps
# on the CPU beside the same model in plain PyTorch (tools/train_compare.py --cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
LINAC_BIN="$PWD/build/linac" python3 tools/e2e.py "$@"
python3 tools/train_compare.py --cpu --mixer gla
