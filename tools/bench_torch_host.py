#!/usr/bin/env python3
"""The Python package's own host cost per op call, with the C call stubbed (issue 19, point 9).

Runs on any machine, no GPU: CPU tensors at B1 T64 H1 D64 (bf16 q, k, v; fp32 gates and betas, as
tools/bench_torch_ops.py makes them), forward, no grad. The first call of each op prepares its
`linac_call` for real (linac_call_prepare); every call after it goes to a Python function that returns
0 in place of `linac_call_run`, so what is timed is the Python layer alone: the public function, the
checks, the key and lookup, the outputs, the packing of addresses. Not the C call (nor ctypes' own
argument conversion, nor the interpreter), and not a GPU figure: on CUDA tensors a call also looks up
the stream and takes scratch from torch's caching allocator (about 3 us more on an H100 host,
docs/doors-measured.md), and the C call and the driver's launches add their part.

Per op: the median over `--rounds` rounds of `--calls` calls of the wall time per call, in us. Prints a
table and writes JSON (--json; default $OUT/bench_torch_host.json when $OUT is set). `--grad`: inputs
that require gradients, forward only (the autograd path; the backward is not run). `--profile`: where a
call's time goes (cProfile, its own cost included: read it for shares, not totals). `--python DIR`: the
package from DIR (e.g. an older checkout's python/) instead of this checkout's, for before/after figures.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]

OPS = ["chunk_simple_gla", "chunk_gla", "chunk_delta_rule", "chunk_gated_delta_rule", "fused_recurrent_gla",
       "poly"]


def make_args(fn, grad, B=1, T=64, H=1, D=64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, generator=gen)

    q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
    if "delta" in fn:
        k = F.normalize(k, p=2, dim=-1)
    args = [q.bfloat16(), k.bfloat16(), v.bfloat16()]
    if fn in ("chunk_simple_gla", "chunk_gated_delta_rule"):
        args.append(F.logsigmoid(randn(B, T, H)))
    elif fn in ("chunk_gla", "fused_recurrent_gla"):
        args.append(F.logsigmoid(randn(B, T, H, D)).clamp(min=-5))
    if "delta" in fn:
        args.append(torch.rand(B, T, H, generator=gen).sigmoid())
    return [a.requires_grad_(grad) for a in args]


def stub_c_call():
    """linac_call_run -> a Python no-op returning linac_status OK. Set on the loaded library before any
    op is called, so that every prepared call made afterwards binds the stub."""
    from linac import _lib
    _lib.lib().linac_call_run = lambda *args: 0


def time_op(fn, args, rounds, calls, grad):
    with torch.set_grad_enabled(grad):
        for _ in range(200):
            fn(*args)
        per_round = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            per_round.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_round), min(per_round)


def profile_op(name, fn, args, calls, grad):
    import cProfile
    import pstats
    prof = cProfile.Profile()
    with torch.set_grad_enabled(grad):
        prof.enable()
        for _ in range(calls):
            fn(*args)
        prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:16]
    print(f"--- {name}: us per call, own and with callees ({calls} calls; cProfile's own cost included)")
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        print(f"  {tottime / calls * 1e6:7.2f} {cumtime / calls * 1e6:7.2f}  x{ncalls // calls:<2} "
              f"{Path(path).name}:{line}({func})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--grad", action="store_true", help="inputs requiring gradients (forward only)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--python", default=str(REPO / "python"), help="the folder holding the package linac")
    ap.add_argument("--json")
    args = ap.parse_args()
    sys.path.insert(0, args.python)
    json_path = args.json or (os.path.join(os.environ["OUT"], "bench_torch_host.json") if os.environ.get("OUT")
                              else "bench_torch_host.json")

    import linac
    stub_c_call()
    env = dict(torch=torch.__version__, python=sys.version.split()[0], linac=str(linac.library_path()),
               package=str(Path(linac.__file__).parent), grad=args.grad)
    rows = []
    for name in [o for o in args.ops.split(",") if o]:
        fn = getattr(linac, name)
        op_args = make_args(name, args.grad)
        median, best = time_op(fn, op_args, args.rounds, args.calls, args.grad)
        rows.append(dict(op=name, median_us=median, min_us=best))
        if args.profile:
            profile_op(name, fn, op_args, args.calls, args.grad)
    print(f"{env['package']}: torch {env['torch']}, Python {env['python']}; CPU tensors B1 T64 H1 D64, forward, "
          f"{'inputs requiring gradients' if args.grad else 'no grad'}; linac_call_run stubbed: us per call of "
          f"Python alone (median / best of {args.rounds} rounds of {args.calls})")
    for r in rows:
        print(f"{r['op']:<24} {r['median_us']:7.2f} {r['min_us']:7.2f}")
    Path(json_path).write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print(f"JSON: {json_path}")


if __name__ == "__main__":
    main()
