#!/usr/bin/env bash
# Profiles one kernel of one linac call with Nsight Compute, on the GPU machine (after
# `bash scripts/pack_for_gpu.sh`, carrying .carry), and summarizes where its time goes:
#   bash scripts/gpu_profile.sh NAME KERNEL_REGEX linac-bench-args...
#   e.g. bash scripts/gpu_profile.sh dchunk '^delta_rule_bwd_chunk$' delta_rule --shape B=8,T=4096,H=16,K=128 --backward
# The tuner is off (LINAC_AUTOTUNE=0), so that the first launch of the kernel is the real one and not a
# tuning candidate: pass the configuration to profile with --config / --bwd-config.
# Writes $OUT/NAME.details.txt (ncu's details page: duration, occupancy, limits), $OUT/NAME.sass.csv
# (per-instruction samples), $OUT/NAME.disasm (nvdisasm -g of the kernel's cubin: SASS with the DSL
# lines ptxas kept from the PTX's .loc) and $OUT/NAME.hotspots.txt (tools/sass_hotspots.py, the source
# lines' shares included), and prints the summary.
# Several profiles in one device call: keep the files returned under the device tool's limit (tar them).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
name=$1 kernel=$2; shift 2
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
[ -f .carry/linac.tar.gz ] && [ ! -x build/linac ] && tar -xzf .carry/linac.tar.gz
export LD_LIBRARY_PATH=$PWD/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LINAC_CACHE_DIR=${LINAC_CACHE_DIR:-/tmp/linac_cache}
export LINAC_AUTOTUNE=0
tmp=$(mktemp -d)
rep=$tmp/$name
# LINAC_DUMP: every kernel the call compiles leaves its stages, the cubin among them, in $tmp/dump.
LINAC_DUMP=$tmp/dump timeout 300 ncu --clock-control none -k "regex:$kernel" -c 1 --set full -o "$rep" -f \
  ./build/linac bench "$@" --iters 1 \
  > "$OUT/$name.ncu.log" 2>&1 || { echo "ncu failed (see $OUT/$name.ncu.log)"; tail -5 "$OUT/$name.ncu.log"; exit 1; }
ncu -i "$rep.ncu-rep" --page details > "$OUT/$name.details.txt" 2>&1
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
rm -f "$rep.ncu-rep"
lines=()
for d in "$tmp"/dump/*/; do
  entry=$(basename "$d"); entry=${entry%-*}
  if [[ "$entry" =~ $kernel ]] && command -v nvdisasm > /dev/null; then
    nvdisasm -g -c "$d/7-kernel.cubin" > "$OUT/$name.disasm" 2>&1 && lines=(--lines "$OUT/$name.disasm")
    break
  fi
done
{
  grep -E '^  [a-z_0-9]+ \(' "$OUT/$name.details.txt" | head -1
  grep -E ' Duration | Registers Per Thread | Achieved Occupancy | Executed Ipc Active | Issue Slots Busy | Dynamic Shared Memory Per Block' \
    "$OUT/$name.details.txt" | head -6
  python3 tools/sass_hotspots.py "$OUT/$name.sass.csv" --top 15 "${lines[@]}"
} | tee "$OUT/$name.hotspots.txt"
