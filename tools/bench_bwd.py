#!/usr/bin/env python3
"""Forward + backward of linear attention: linac against fla in the same run, and linac's device memory
as T grows (issue 5), on the GPU machine.

    python3 tools/bench_bwd.py [--shapes 8x4096x16x128,...] [--mem-lengths 4096,16384,65536] [--json F]

Run from the repository root (build/linac built, LD_LIBRARY_PATH set; fla's package in third_party/fla/).

  linac  `linac bench linear_attn --shape .. --dtype bf16 [--gated] --backward --json F`: the forward and the
         backward (dq, dk, dv [, dg] from q, k, v, do [, g]) each timed as `linac bench` times (CUDA events,
         warm-up, median over rotated inputs); fwd+bwd = the sum of the two medians.
  fla    fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=g or None) with q, k, v requiring grad, then
         o.backward(do): one CUDA-event interval per fwd+bwd call, median over --iters calls (one input
         set: fla's own autograd buffers dominate its memory).
Memory (B1 H16 D128, bf16, T from --mem-lengths): linac's device bytes of the backward call (every tensor it
allocates: inputs, do, gradients; the kernels use no other device memory) and fla's
torch.cuda.max_memory_allocated over one fwd+bwd (inputs included).
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
sys.path.insert(0, str(REPO / "tools"))
import bench_vs_fla  # noqa: E402  (fla import helpers)


def linac_bwd(linac, shape, gated, iters=20):
    B, T, H, D = shape
    with tempfile.TemporaryDirectory(prefix="linac_bwd_") as tmp:
        jpath = Path(tmp) / "b.json"
        cmd = [str(linac), "bench", "linear_attn", "--shape", f"B={B},T={T},H={H},K={D},V={D}", "--dtype", "bf16",
               "--backward", "--iters", str(iters), "--json", str(jpath)] + (["--gated"] if gated else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-800:]}
        return json.loads(jpath.read_text())


def fla_bwd(fn, shape, gated, iters):
    """fla's fwd+bwd timing and peak memory, or {"error": ...} (fla refuses some cases on some Tritons)."""
    try:
        return _fla_bwd(fn, shape, gated, iters)
    except Exception as exc:  # noqa: BLE001 - recorded and printed, the run goes on
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _fla_bwd(fn, shape, gated, iters):
    import torch
    import torch.nn.functional as F
    B, T, H, D = shape
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*s, dtype=torch.bfloat16):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)
    q, k, v = (randn(B, T, H, D).requires_grad_() for _ in range(3))
    g = F.logsigmoid(randn(B, T, H, dtype=torch.float32)).requires_grad_() if gated else None
    do = randn(B, T, H, D)

    def step():
        o, _ = fn(q, k, v, g=g)
        o.backward(do)
        q.grad = k.grad = v.grad = None
        if g is not None:
            g.grad = None
    step()  # autotunes on first use
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return {"ms": statistics.median(times), "peak_bytes": torch.cuda.max_memory_allocated()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8x4096x16x128")
    ap.add_argument("--mem-lengths", default="4096,16384,65536")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"))
    ap.add_argument("--fla-root", default=str(REPO / "third_party"), help="the directory holding the fla package")
    ap.add_argument("--gates", default="none,g", help="none and/or g (fla refuses gated backward on Triton < 3.7.1)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    fns, errors = ({}, {"linear_attn": "--no-fla"}) if args.no_fla else bench_vs_fla.import_fla(args.fla_root,
                                                                                                  ["linear_attn"])[:2]
    fn = fns.get("linear_attn")
    rows = []
    print("fwd+bwd, bf16: linac (fwd + bwd medians) vs fla chunk_simple_gla (fwd + o.backward)")
    print(f"{'shape':<16} {'gate':<5} {'linac fwd':>9} {'linac bwd':>9} {'linac f+b':>9} {'fla f+b':>8} {'speed':>6}")
    for s in args.shapes.split(","):
        shape = tuple(int(x) for x in s.split("x"))
        for gated in (g == "g" for g in args.gates.split(",")):
            lin = linac_bwd(args.linac, shape, gated, args.iters)
            fl = fla_bwd(fn, shape, gated, args.iters) if fn else {"error": errors.get("linear_attn")}
            rows.append({"shape": s, "gated": gated, "linac": lin, "fla": fl})
            lf, lb = lin.get("fwd_ms"), lin.get("bwd_ms")
            tot = lf + lb if lf and lb else None
            speed = f"{fl['ms'] / tot:.2f}" if tot and "ms" in fl else ""
            print(f"{s:<16} {'g' if gated else 'none':<5} {lf or float('nan'):>9.4f} {lb or float('nan'):>9.4f} "
                  f"{tot or float('nan'):>9.4f} {fl.get('ms', float('nan')):>8.4f} {speed:>6}")
            for who, r in (("linac", lin), ("fla", fl)):
                if "error" in r:
                    print(f"    {who} error: {r['error']}")
    print("\ndevice memory of fwd+bwd, B1 H16 D128 bf16, plain (linac: tensors of the backward call; fla: peak)")
    print(f"{'T':>7} {'linac MB':>9} {'per token KB':>12} {'fla peak MB':>11}")
    for T in (int(x) for x in args.mem_lengths.split(",") if x.strip()):
        shape = (1, T, 16, 128)
        lin = linac_bwd(args.linac, shape, False, 5)
        fl = fla_bwd(fn, shape, False, 3) if fn else {}
        fl.setdefault("peak_bytes", float("nan"))
        rows.append({"memory_T": T, "linac": lin, "fla": fl})
        nb = lin.get("bwd_device_bytes")
        print(f"{T:>7} {nb / 1e6 if nb else float('nan'):>9.1f} {nb / T / 1e3 if nb else float('nan'):>12.2f} "
              f"{fl.get('peak_bytes', float('nan')) / 1e6:>11.1f}")
        if "error" in lin:
            print(f"    linac error: {lin['error']}")
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_bwd.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
