#!/usr/bin/env python3
"""linac's PyTorch ops against fla's, from PyTorch, same inputs, same timer, same process (issue 19,
points 9 and 10).

Per op and shape (B, T, H, D; K = V = D; bf16 q, k, v): forward and forward+backward times, the median of
CUDA-event-timed rounds of 5 back-to-back calls after warm-up (fla's first call autotunes: minutes per op and shape). Inputs as
fla's benchmarks make them: g = logsigmoid(randn) ([B,T,H], or [B,T,H,K] clamped at -5 for GLA), beta =
sigmoid(rand) [B,T,H], keys L2-normalized for the delta rules; gates and betas fp32.

  ops       linear_attn -> chunk_simple_gla (g [B,T,H]), gla -> chunk_gla, delta_rule -> chunk_delta_rule,
            gated_delta_rule -> chunk_gated_delta_rule (linac.ops.* and fla.ops.*)
  shapes    fla's (1,8192,96,128) (2,16384,16,128) (4,2048,16,128) (4,4096,64,128) (8,2048,32,256)
            (8,1024,8,64) and (8,4096,16,128)
  overhead  at B1 T64 H1 D64, where GPU time is negligible: the host cost of one Python op call after
            warm-up (wall time of N back-to-back calls / N, synchronised at the ends), and the time per
            call of a CUDA graph of 100 captured calls, replayed (warmed up once before capture)

Prints a table (speed = fla / linac: > 1 means linac is faster) and writes JSON (--json; default
$OUT/bench_torch_ops.json when $OUT is set). Needs a GPU; --fla-path is fla's fla/ folder
(default third_party/fla); --no-fla times linac alone.
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tools"))

SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128), (4, 2048, 16, 128), (4, 4096, 64, 128), (8, 2048, 32, 256),
          (8, 1024, 8, 64), (8, 4096, 16, 128)]
OPS = {"linear_attn": ("simple_gla", "chunk_simple_gla"), "gla": ("gla", "chunk_gla"),
       "delta_rule": ("delta_rule", "chunk_delta_rule"),
       "gated_delta_rule": ("gated_delta_rule", "chunk_gated_delta_rule")}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def import_fns(fla_path, ops):
    import linac.ops
    mine = {op: getattr(linac.ops, OPS[op][1]) for op in ops}
    theirs = {}
    if fla_path:
        from train_compare import import_fla  # noqa: F401 - also sets sys.path and stubs fla's __init__
        import importlib
        import_fla(fla_path)
        for op in ops:
            try:
                theirs[op] = getattr(importlib.import_module(f"fla.ops.{OPS[op][0]}"), OPS[op][1])
            except Exception as exc:  # noqa: BLE001
                theirs[op] = f"{type(exc).__name__}: {exc}"
    return mine, theirs


def make_inputs(op, shape, grad, seed=0):
    B, T, H, D = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, device="cuda", generator=gen)

    q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
    if "delta" in op:
        k = F.normalize(k, p=2, dim=-1)
    args = [q.bfloat16(), k.bfloat16(), v.bfloat16()]
    if op == "linear_attn":
        args.append(F.logsigmoid(randn(B, T, H)))
    elif op == "gla":
        args.append(F.logsigmoid(randn(B, T, H, D)).clamp(min=-5))
    elif op == "gated_delta_rule":
        args.append(F.logsigmoid(randn(B, T, H)))
    if "delta" in op:
        args.append(torch.rand(B, T, H, device="cuda", generator=gen).sigmoid())
    return [a.requires_grad_(grad) for a in args]


def time_cuda(fn, warmup, iters, batch=5):
    """Median ms per call over `iters` rounds of `batch` calls queued back to back between two CUDA
    events: the host's cost of a call overlaps the GPU's work on the previous one, as in a model and in
    `linac bench` (one call per event pair would add the host cost of each call to its time)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    return statistics.median(times)


def bench_case(fn, op, shape, mode, warmup, iters):
    args = make_inputs(op, shape, grad=mode == "fwdbwd")
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn(*args)
    else:
        do = torch.randn(*shape[:3], shape[3], device="cuda", dtype=torch.bfloat16)

        def call():
            o, _ = fn(*args)
            o.backward(do)
    t0 = time.time()
    call()  # first call: compiles (linac) or autotunes (fla)
    torch.cuda.synchronize()
    first = time.time() - t0
    ms = time_cuda(call, warmup, iters)
    del args
    return ms, first


def overhead(fn, op, rounds=15, calls=100, profile=False):
    """Host us per Python op call (forward, no grad) at B1 T64 H1 D64: the median over `rounds` rounds of
    the wall time of `calls` calls queued back to back / `calls`, the GPU drained between rounds (so that
    the launch queue never fills and the GPU's time never shows); and us per call of a replayed CUDA graph
    of 100 calls. `profile`: prints where the host time of linac's calls goes (cProfile)."""
    args = make_inputs(op, (1, 64, 1, 64), grad=False)
    with torch.no_grad():
        for _ in range(50):
            fn(*args)
        torch.cuda.synchronize()
        per_round = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            per_round.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        host_us = statistics.median(per_round)
        if profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(10):
                for _ in range(calls):
                    fn(*args)
                torch.cuda.synchronize()  # the launch queue never fills
            prof.disable()
            torch.cuda.synchronize()
            rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:14]
            print(f"--- where a call of {op} spends its host time: us per call, own and with callees "
                  f"({calls * 10} calls; cProfile's own cost included)")
            for (path, line, name), (_, ncalls, tottime, cumtime, _) in rows:
                print(f"  {tottime / calls / 10 * 1e6:7.2f} {cumtime / calls / 10 * 1e6:7.2f}  x{ncalls // (calls * 10):<2} "
                      f"{Path(path).name}:{line}({name})")
        graph_us = None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn(*args)  # warm-up on the capture stream
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(100):
                    fn(*args)
            graph.replay()
            torch.cuda.synchronize()
            reps = 20
            t0 = time.perf_counter()
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
            graph_us = (time.perf_counter() - t0) / (reps * 100) * 1e6
        except Exception as exc:  # noqa: BLE001
            graph_us = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return host_us, graph_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ",".join(OPS))
    ap.add_argument("--shapes", help="BxTxHxD,... (default: the seven above)")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--fla-path", default=str(REPO / "third_party" / "fla"))
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print cProfile's view of linac's per-call host cost")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    modes = [m for m in args.modes.split(",") if m]
    json_path = args.json or (os.path.join(os.environ["OUT"], "bench_torch_ops.json") if os.environ.get("OUT")
                              else "bench_torch_ops.json")

    mine, theirs = import_fns(None if args.no_fla else args.fla_path, ops)
    import linac
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, python=sys.version.split()[0],
               linac=str(linac.library_path()))
    results = []
    for op in ops:
        for shape in shapes:
            for mode in modes:
                r = dict(op=op, shape=list(shape), mode=mode)
                for who, fns in (("linac", mine), ("fla", theirs)):
                    fn = fns.get(op)
                    if fn is None:
                        continue
                    if isinstance(fn, str):
                        r[f"{who}_error"] = fn
                        continue
                    try:
                        ms, first = bench_case(fn, op, shape, mode, args.warmup, args.iters)
                        r[f"{who}_ms"], r[f"{who}_first_s"] = ms, first
                        log(f"{op} {shape} {mode} {who}: {ms:.3f} ms (first call {first:.1f} s)")
                    except Exception as exc:  # noqa: BLE001
                        r[f"{who}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                        log(f"{op} {shape} {mode} {who} failed: {traceback.format_exc()}")
                    torch.cuda.empty_cache()
                if r.get("linac_ms") and r.get("fla_ms"):
                    r["speed"] = r["fla_ms"] / r["linac_ms"]
                results.append(r)
    overheads = []
    if not args.no_overhead:
        for op in ops:
            for who, fns in (("linac", mine), ("fla", theirs)):
                fn = fns.get(op)
                if fn is None or isinstance(fn, str):
                    continue
                try:
                    host_us, graph_us = overhead(fn, op, profile=args.profile and who == "linac")
                except Exception as exc:  # noqa: BLE001
                    host_us, graph_us = None, f"{type(exc).__name__}: {exc}"
                overheads.append(dict(op=op, who=who, host_us=host_us, graph_us=graph_us))

    print(f"{env['device']}, torch {env['torch']}, Python {env['python']}; median ms per call (rounds of 5 calls between CUDA events); "
          f"speed = fla / linac")
    print(f"{'op':<17} {'B,T,H,D':<17} {'mode':<7} {'linac ms':>9} {'fla ms':>9} {'speed':>6}  notes")
    for r in results:
        def f(key):
            return f"{r[key]:.3f}" if isinstance(r.get(key), float) else "-"
        notes = "; ".join(f"{w}: {r[w + '_error']}" for w in ("linac", "fla") if r.get(w + "_error"))
        speed = f"{r['speed']:.2f}" if r.get("speed") else "-"
        print(f"{r['op']:<17} {','.join(map(str, r['shape'])):<17} {r['mode']:<7} {f('linac_ms'):>9} "
              f"{f('fla_ms'):>9} {speed:>6}  {notes[:150]}")
    if overheads:
        print("\nper-call host cost at B1 T64 H1 D64 (forward, no grad): Python call us; CUDA graph replay us per call")
        for o in overheads:
            g = f"{o['graph_us']:.2f}" if isinstance(o["graph_us"], float) else str(o["graph_us"])[:120]
            h = f"{o['host_us']:.2f}" if isinstance(o["host_us"], float) else "-"
            print(f"{o['op']:<17} {o['who']:<6} {h:>8} {g:>10}")
    Path(json_path).write_text(json.dumps(dict(env=env, results=results, overhead=overheads), indent=1))
    print(f"\nJSON: {json_path}")


if __name__ == "__main__":
    main()
