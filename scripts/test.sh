#!/usr/bin/env bash
# Sets up a fresh machine, builds linac and runs every test. What CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
echo "== C++ unit and error tests"
./build/linac_tests
echo "== The C ABI from a C program"
./build/linac_c_abi_test
echo "== IR text tests (FileCheck)"
python3 tests/ir/run_filecheck.py
echo "== Python tests (ops on the CPU interpreter vs float64 references)"
LINAC_BIN="$PWD/build/linac" python3 -m pytest -q tests/python
echo "== Out-of-tree examples (install, find_package, build, run on the CPU)" && bash scripts/test_examples.sh build
