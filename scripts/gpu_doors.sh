#!/usr/bin/env bash
# The doors on the GPU machine (issue 19's measurements), one part per device call, each well inside the
# 10-minute limit. From the repository root after `bash scripts/pack_for_gpu.sh`, carrying .carry and
# third_party/fla (fla's fla/ folder from its repository):
#   bash scripts/gpu_doors.sh tests      # torch tests on CUDA, the C ABI test, the CLI numeric tests (~4 min)
#   bash scripts/gpu_doors.sh overhead   # host cost per call: C++ API, Python ops next to fla's (~3 min)
#   bash scripts/gpu_doors.sh shapes     # Python ops at fla's shapes next to `linac bench` (linac alone, ~3 min;
#                                        # SHAPES=8x4096x16x128,... for fewer)
#   bash scripts/gpu_doors.sh fla OPS    # Python ops against fla at fla's shapes (fla autotunes: minutes per op)
#   bash scripts/gpu_doors.sh train      # 200 bf16 steps of a GLA model (MIXER=gdn: Gated DeltaNet), linac vs fla
#                                        # and a noise-floor run of linac (fla autotunes first: ~2 min)
#   bash scripts/gpu_doors.sh sanitize   # compute-sanitizer memcheck and racecheck over every op and form
# Logs go to $OUT (or ./gpu_out); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
[ -f .carry/linac.tar.gz ] && tar -xzf .carry/linac.tar.gz
# Triton's cache (fla's compiled kernels and autotuning results) in /tmp/triton_cache: from the last run
# when carried, and left in $OUT by the fla and train parts (it may exceed the 16 MB a returned file may
# have: scripts/gpu_validate.sh shows how to split it).
[ -f .carry/triton_cache.tar.gz ] && tar -xzf .carry/triton_cache.tar.gz -C /tmp
export TRITON_CACHE_DIR=/tmp/triton_cache
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LINAC_CACHE_DIR=${LINAC_CACHE_DIR:-/tmp/linac_cache}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
T0=$SECONDS
stamp() { echo "[$((SECONDS - T0)) s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader

case "${1:-}" in
  tests)
    stamp "torch tests, C ABI, CLI numeric tests (in parallel)"
    (LINAC_TEST_DEVICE=cuda timeout -s INT -k 30 400 python3 -m pytest -q -p no:cacheprovider tests/python/torch > "$OUT/pytest_torch.txt" 2>&1
     echo "  torch rc=$? $(tail -1 "$OUT/pytest_torch.txt")") &
    for name in test_linear_attn test_gla test_gla_bwd test_delta_rule test_delta_rule_bwd test_poly test_recurrent test_linear_attn_bwd; do
      (cd tests/python && LINAC_TEST_DEVICE=cuda LINAC_BIN=$PWD/../../build/linac LINAC_AUTOTUNE=0 \
         timeout -s INT -k 30 400 python3 -m pytest -q -p no:cacheprovider "$name.py" > "/tmp/pytest_$name.txt" 2>&1
       echo "  $name rc=$? $(tail -1 "/tmp/pytest_$name.txt")") &
    done
    ./build/linac_c_abi_test | tail -1
    wait
    cat /tmp/pytest_*.txt "$OUT/pytest_torch.txt" | grep -A20 "^____" | head -60 > "$OUT/failures.txt"
    ;;
  overhead)
    stamp "C++ API: host us per call and CUDA-graph replay"
    timeout 200 ./build/linac_bench_overhead --json "$OUT/overhead_cpp.json"
    stamp "Python ops: host us per call and graph replay, linac and fla (B1 T64 H1 D64)"
    timeout 300 python3 tools/bench_torch_ops.py --ops gla,gated_delta_rule,linear_attn,delta_rule --modes "" \
      --profile --json "$OUT/overhead_py.json" 2>&1 | grep -v "^\[" | tail -90
    ;;
  shapes)
    stamp "Python ops at fla's shapes (linac alone, default configurations)"
    LINAC_AUTOTUNE=0 timeout 300 python3 tools/bench_torch_ops.py --no-fla --no-overhead ${SHAPES:+--shapes $SHAPES} \
      --json "$OUT/shapes_py.json" 2>&1 |
      grep -v "^\[" | tail -60
    stamp "linac bench at two of them"
    for op in linear_attn gla delta_rule gated_delta_rule; do
      for s in B=8,T=4096,H=16,K=128 B=2,T=16384,H=16,K=128; do
        g=""; [ $op = linear_attn ] && g=--gated
        LINAC_AUTOTUNE=0 timeout 60 ./build/linac bench $op $g --shape $s --iters 20 2>&1 | grep median
      done
    done
    ;;
  fla)
    stamp "Python ops against fla at fla's shapes: ${2:-gla}"
    timeout 580 python3 tools/bench_torch_ops.py --ops "${2:-gla}" --no-overhead --json "$OUT/fla_${2:-gla}.json" 2>&1 |
      grep -v "^\[" | tail -40
    [ -d /tmp/triton_cache ] && tar -czf "$OUT/triton_cache.tar.gz" -C /tmp triton_cache
    ;;
  train)
    stamp "training: ${MIXER:-gla} mixer, 200 bf16 steps, linac vs fla"
    timeout ${TRAIN_TIMEOUT:-580} python3 tools/train_compare.py --mixer ${MIXER:-gla} --json "$OUT/train_${MIXER:-gla}.json" 2>&1 | tail -30
    [ -d /tmp/triton_cache ] && tar -czf "$OUT/triton_cache.tar.gz" -C /tmp triton_cache
    ;;
  sanitize)
    stamp "compute-sanitizer memcheck and racecheck over every op and form (tools/sanitize_ops.py)"
    for tool in memcheck racecheck; do
      timeout ${SANITIZE_TIMEOUT:-280} compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 tools/sanitize_ops.py > "$OUT/sanitize_$tool.txt" 2>&1
      echo "  $tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUT/sanitize_$tool.txt" | tail -1)"
      tail -3 "$OUT/sanitize_$tool.txt"
    done
    ;;
  *)
    echo "usage: bash scripts/gpu_doors.sh tests|overhead|shapes|fla OPS|train|sanitize" >&2
    exit 2
    ;;
esac
stamp done
