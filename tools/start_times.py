#!/usr/bin/env python3
"""Cold and warm start of every op on the GPU machine (issue 6): compile + tune + first run from an empty
cache, then the same in a new process with the cache and tuning database present.

    python3 tools/start_times.py [--ops linear_attn,gla,...] [--shape B=8,T=4096,H=16,K=128] [--json F]

Each op runs `linac bench OP --shape S --dtype bf16 --iters 5 --json F` twice with LINAC_CACHE_DIR set to
a fresh directory: cold (empty), then warm. From its JSON: setup_ms.to_first_launch = CUDA init (driver and
context) + choosing the configuration (tuning database lookup, or tuning) + getting the kernels (disk
cache, or compiling): what a process pays before its first launch, apart from its inputs. The table shows
that and the whole process's wall time (which also includes generating and casting the random inputs:
3 x 67M values at the default shape).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPS = "linear_attn,gla,delta_rule,gated_delta_rule,poly"


def bench(linac, op, shape, cache):
    env = dict(os.environ, LINAC_CACHE_DIR=str(cache), LINAC_PRINT_AUTOTUNING="1")
    jpath = Path(cache) / f"bench_{time.time_ns()}.json"
    cmd = [str(linac), "bench", op, "--shape", shape, "--dtype", "bf16", "--iters", "5", "--json", str(jpath)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    wall = time.time() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:], "wall_s": wall}
    res = json.loads(jpath.read_text())
    return {"wall_s": wall, "median_ms": res["median_ms"], "config": res["config"], **{
        f"{k}_ms": v for k, v in res["setup_ms"].items()},
        "tuning": [ln for ln in proc.stderr.splitlines() if "autotune" in ln]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=OPS)
    ap.add_argument("--shape", default="B=8,T=4096,H=16,K=128")
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"cold/warm start at {args.shape}, bf16. setup = to the first launch: CUDA init + configuration (tuning, or")
    print("the tuning db) + kernels (compiled, or the disk cache); wall = the whole process (incl. making its inputs)")
    print(f"{'op':<18} {'cold setup':>11} {'cold wall':>10} {'warm setup':>11} {'(cuda init)':>11} {'warm wall':>10} "
          f"{'fwd ms':>8}")
    for op in args.ops.split(","):
        with tempfile.TemporaryDirectory(prefix="linac_start_") as cache:
            cold = bench(args.linac, op, args.shape, cache)
            warm = bench(args.linac, op, args.shape, cache)
        rows.append({"op": op, "cold": cold, "warm": warm})

        def ms(r, key):
            return f"{r[key]:.1f} ms" if r.get(key) is not None else "error"
        print(f"{op:<18} {ms(cold, 'to_first_launch_ms'):>11} {cold['wall_s']:>8.2f} s "
              f"{ms(warm, 'to_first_launch_ms'):>11} {ms(warm, 'cuda_init_ms'):>11} {warm['wall_s']:>8.2f} s "
              f"{warm.get('median_ms') or float('nan'):>8.4f}")
        for r in (cold, warm):
            if "error" in r:
                print(f"    error: {r['error']}")
    path = args.json or (str(Path(os.environ["OUT"]) / "start_times.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r["cold"] and "error" not in r["warm"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
