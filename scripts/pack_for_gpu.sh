#!/usr/bin/env bash
# Packs what the GPU machine needs (it has no LLVM): the built binaries and liblinac, gzip-compressed (the GPU machine has no zstd),
# into .carry/linac.tar.gz (git-ignored). On the GPU machine:
#   tar -xzf .carry/linac.tar.gz && export LD_LIBRARY_PATH=$PWD/build/lib
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .carry
mkdir -p build/lib && cp -L /lib/x86_64-linux-gnu/libfmt.so.9 build/lib/  # the GPU machine may lack fmt
tar -czf .carry/linac.tar.gz build/linac build/liblinac.so build/linac_tests build/linac_cache_stress build/linac_bench_overhead build/linac_c_abi_test build/lib
ls -la .carry/linac.tar.gz
