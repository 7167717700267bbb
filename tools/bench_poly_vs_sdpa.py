#!/usr/bin/env python3
"""The polynomial kernel's forward time against causal softmax attention, on the GPU machine.

    python3 tools/bench_poly_vs_sdpa.py [--lengths 4096,16384,65536] [--B 1] [--H 8] [--D 64] [--json F]

Run from the repository root (build/linac built, LD_LIBRARY_PATH set so it runs; torch with CUDA).

  linac  `build/linac bench poly --shape B=..,T=..,H=..,K=D,V=D --dtype bf16 --json F`: median of CUDA-event
         timed runs over rotated inputs (linac's own), default coefficients a=b=1, c=1/2, normalized.
  sdpa   torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in bf16, [B, H, T, D],
         restricted to the flash backend (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION));
         warm-up, then the median of --iters calls between CUDA events.

Prints a table (ms, and each time's growth from the previous length: linear in T means x(T2/T1), softmax
attention's quadratic work x(T2/T1)^2) and writes JSON (--json; default $OUT/poly_vs_sdpa.json when $OUT
is set).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def linac_poly(linac, B, T, H, D, iters):
    with tempfile.TemporaryDirectory(prefix="linac_poly_") as tmp:
        jpath = Path(tmp) / "bench.json"
        cmd = [str(linac), "bench", "poly", "--shape", f"B={B},T={T},H={H},K={D},V={D}", "--dtype", "bf16",
               "--iters", str(iters), "--json", str(jpath)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.strip()[-1000:]}")
        return json.loads(jpath.read_text())["median_ms"]


def sdpa_causal(B, T, H, D, iters):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    fn = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(3):
            fn(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(q, k, v, is_causal=True)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="4096,16384,65536", help="sequence lengths T (comma-separated)")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for T in lengths:
        row = {"B": args.B, "T": T, "H": args.H, "D": args.D}
        try:
            row["poly_ms"] = linac_poly(args.linac, args.B, T, args.H, args.D, args.iters)
        except Exception as exc:  # the table goes on; the error is recorded
            row["poly_error"] = str(exc)
        try:
            row["sdpa_ms"] = sdpa_causal(args.B, T, args.H, args.D, args.iters)
        except Exception as exc:
            row["sdpa_error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    print(f"poly (linac, bf16, a=b=1 c=1/2, normalized) vs causal SDPA (flash), B={args.B} H={args.H} D={args.D}")
    print(f"{'T':>7} {'poly ms':>9} {'growth':>7} {'sdpa ms':>9} {'growth':>7} {'sdpa/poly':>9}")
    prev = None
    for row in rows:
        p, s = row.get("poly_ms"), row.get("sdpa_ms")
        gp = f"x{p / prev['poly_ms']:.2f}" if prev and p and prev.get("poly_ms") else ""
        gs = f"x{s / prev['sdpa_ms']:.2f}" if prev and s and prev.get("sdpa_ms") else ""
        ratio = f"{s / p:.2f}" if p and s else ""
        print(f"{row['T']:>7} {p if p else float('nan'):>9.4f} {gp:>7} {s if s else float('nan'):>9.4f} {gs:>7} {ratio:>9}")
        for key in ("poly_error", "sdpa_error"):
            if key in row:
                print(f"        {key}: {row[key]}")
        prev = row
    path = args.json or (str(Path(os.environ["OUT"]) / "poly_vs_sdpa.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))
    return 0 if all("poly_ms" in r and "sdpa_ms" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
