#!/usr/bin/env bash
# Proof that a refactoring of kernels/ changed nothing the compiler makes: snapshots the tile IR and the
# PTX of every op's kernels (the representative set of `linac compile OP`, and the plan of each form at a
# few shapes: forward, --gated, --normalize, --backward, the split and token-by-token configurations),
# for two dtypes and both targets, then compares two snapshots.
#
#   tools/ptx_snapshot.sh snapshot DIR [LINAC]   write DIR/<case>/<i>-<kernel>.{tir,ptx} (LINAC: build/linac)
#   tools/ptx_snapshot.sh compare BEFORE AFTER   exit 0 iff every file compares equal
#
# compare reports two levels. Raw: the bytes. Code: the same files without source locations (tile IR's
# loc("file":line:col), PTX's .loc and .file lines), which are all that moving DSL code between files or
# lines changes; a refactoring that keeps the kernels must be identical at this level. A case the CLI
# refuses is recorded as its error text (DIR/<case>/error.txt) and compared like the rest.
set -euo pipefail

# The cases: "name|linac compile arguments". Shapes: small (few heads), many heads at head dim 128, and
# head dim 256 (the wide-head defaults; ops that refuse it record their error).
cases() {
  local small="B=2,T=256,H=2,K=64" many="B=8,T=512,H=16,K=128" wide="B=1,T=256,H=4,K=256,V=64"
  local op dt tg shp sname
  for op in linear_attn poly delta_rule gated_delta_rule gla; do
    for dt in bf16 fp32; do
      for tg in sm_90a sm_80; do
        echo "$op.$dt.$tg.repr|$op --dtype $dt --target $tg"
        for shp in small many wide; do
          # The second target only at the small shape: the kernels are the same, only the backend differs.
          [[ $tg == sm_80 && $shp != small ]] && continue
          sname=${!shp}
          local base="$op.$dt.$tg.$shp" args="$op --dtype $dt --target $tg --shape $sname"
          echo "$base.fwd|$args"
          echo "$base.bwd|$args --backward"
          case $op in
            linear_attn)
              echo "$base.gated|$args --gated"
              echo "$base.gated_bwd|$args --gated --backward"
              echo "$base.normalize|$args --normalize"
              echo "$base.normalize_bwd|$args --normalize --backward"
              echo "$base.bwd_split|$args --backward --config split=1" ;;
            gla)
              echo "$base.bwd_tokenwise|$args --backward --config tokenwise=1"
              echo "$base.split|$args --config split=1"
              echo "$base.bwd_split|$args --backward --config split=1" ;;
            delta_rule | gated_delta_rule)
              echo "$base.bwd_tokenwise|$args --backward --config tokenwise=1"
              echo "$base.split|$args --config split=1" ;;
          esac
        done
      done
    done
  done
}

snapshot() {
  local dir=$1 linac=${2:-build/linac}
  [[ -x $linac ]] || { echo "ptx_snapshot: no linac binary at $linac (build it first)" >&2; exit 2; }
  rm -rf "$dir" && mkdir -p "$dir"
  local n=0 name args
  while IFS='|' read -r name args; do
    mkdir -p "$dir/$name"
    for emit in tir ptx; do
      # shellcheck disable=SC2086
      if ! "$linac" compile $args --emit $emit --out "$dir/$name" >/dev/null 2>"$dir/$name/error.$emit.txt"; then
        : # the error text is the record
      else
        rm -f "$dir/$name/error.$emit.txt"
      fi
    done
    n=$((n + 1))
  done < <(cases)
  echo "ptx_snapshot: $n cases, $(find "$dir" -type f | wc -l) files in $dir"
}

# Source locations out: tile IR's loc(...) suffixes, PTX's .loc and .file directives.
strip_locations() {
  case $1 in
    *.tir) sed -E 's/ loc\("[^"]*":[0-9]+:[0-9]+\)//g' "$1" ;;
    *.ptx) grep -vE '^[[:space:]]*\.(loc|file)[[:space:]]' "$1" || true ;;
    *) cat "$1" ;;
  esac
}

compare() {
  local a=$1 b=$2 total=0 raw_same=0 code_same=0 f
  local -a only=() differ=()
  while IFS= read -r f; do
    [[ -f $b/$f ]] || { only+=("$f (only in $a)"); continue; }
    total=$((total + 1))
    if cmp -s "$a/$f" "$b/$f"; then
      raw_same=$((raw_same + 1)) code_same=$((code_same + 1))
    elif cmp -s <(strip_locations "$a/$f") <(strip_locations "$b/$f"); then
      code_same=$((code_same + 1))
    else
      differ+=("$f")
    fi
  done < <(cd "$a" && find . -type f | sed 's|^\./||' | sort)
  while IFS= read -r f; do
    [[ -f $a/$f ]] || only+=("$f (only in $b)")
  done < <(cd "$b" && find . -type f | sed 's|^\./||' | sort)
  echo "ptx_snapshot: $total files compared: $raw_same byte-identical, $code_same identical without source locations"
  for f in "${only[@]}"; do echo "  missing: $f"; done
  for f in "${differ[@]}"; do
    echo "  differs: $f"
    # (|| true: diff exits 1 for files that differ, which under set -e and pipefail ended the listing here)
    diff <(strip_locations "$a/$f") <(strip_locations "$b/$f") | head -20 | sed 's/^/    /' || true
  done
  [[ ${#only[@]} -eq 0 && ${#differ[@]} -eq 0 ]]
}

case ${1:-} in
  snapshot) shift; snapshot "$@" ;;
  compare) shift; compare "$@" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 1 ;;
esac
