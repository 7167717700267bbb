#!/bin/bash
# The backward's default configuration of every case, one line each, without a GPU: for OP[:flags]
# (e.g. "linear_attn:--gated", "gla:--config split=1"), dtype bf16/f32, K x V in 32..256, 2 / 64 / 256
# sequences x heads and targets sm_90a / sm_80: the kernels' warps and stages (`linac compile --emit tir`),
# their shared memory (`--emit smem`) and, on sm_90a, the launches' grids (`linac plan`). Run it with the
# binaries before and after a change to the defaults and diff the two outputs: every line that moves
# is a default that moved (and needs a timing).
#   tools/default_table.sh DIR_WITH_linac_AND_liblinac OP[:flags]...
BIN=$1; shift
export LD_LIBRARY_PATH=$BIN:$LD_LIBRARY_PATH
for variant in "$@"; do
 op=${variant%%:*}; flags=${variant#*:}; [ "$flags" = "$variant" ] && flags=""
 for dt in bf16 f32; do for kv in 32x32 64x64 128x128 256x256 64x128 128x64 64x256; do K=${kv%x*}; V=${kv#*x}
  for H in 2 64 256; do T=2048; [ $H = 256 ] && T=256; for tg in sm_90a sm_80; do
   s="B=1,T=$T,H=$H,K=$K,V=$V"
   w=$($BIN/linac compile $op $flags --backward --shape $s --dtype $dt --target $tg --emit tir 2>&1 | grep ^kernel | sed -E 's/^kernel @([a-z_0-9]+)\(.*num_warps = ([0-9]+), num_stages = ([0-9]+).*/\1:w\2s\3/' | tr '\n' ' ')
   m=$($BIN/linac compile $op $flags --backward --shape $s --dtype $dt --target $tg --emit smem 2>&1 | grep "smem total" | awk '{print $3}' | tr '\n' ' ')
   g=""; [ $tg = sm_90a ] && g=$($BIN/linac plan $op $flags --backward --shape $s --dtype $dt 2>&1 | grep "^  launch" | awk '{print $4$5$6}' | tr '\n' ' ')
   echo "$op$flags $dt K$K V$V H$H $tg | $w| $m| $g"
  done; done; done; done
done
