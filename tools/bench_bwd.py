#!/usr/bin/env python3
"""Forward + backward of every op with a backward: linac against fla in the same run, and linac's device
memory as T grows (issue 5), on the GPU machine.

    python3 tools/bench_bwd.py [--cases plain,normalized,gated,gla,delta_rule,gated_delta_rule]
                               [--shapes 8x4096x16x128,...] [--mem-lengths 4096,16384,65536] [--json F]
                               [--time-budget S] [--no-tune]

Run from the repository root (build/linac built, LD_LIBRARY_PATH set; fla's package in third_party/fla/).

  linac  `linac tune OP --shape .. --dtype bf16 [--gated] --backward` first (fla autotunes its backward on
         first use; linac's backward is tuned only when asked; --no-tune skips it, and --normalize has no
         tuning space), then
         `linac bench OP --shape .. --dtype bf16 [--gated] [--normalize] --backward --json F`: the forward and
         the backward (every input's gradient from q, k, v, do [, g, beta]) each timed as `linac bench` times
         (CUDA events, warm-up, median over rotated inputs); fwd+bwd = the sum of the two medians. For the
         delta rules that is the training pair: the forward saving W, T, the per-chunk states and V_new
         (outputs saved_*), and the backward given them (as fla's forward saves A for its backward).
  fla    the same op with q, k, v (and g, beta) requiring grad, then o.backward(do): one CUDA-event interval
         per fwd+bwd call, median over --iters calls (one input set: fla's own autograd buffers dominate
         its memory). Cases and fla's functions (inputs as tools/bench_vs_fla.py makes them):
           plain             fla.ops.linear_attn.chunk_linear_attn(q, k, v, normalize=False)
           normalized        fla.ops.linear_attn.chunk_linear_attn(q, k, v, normalize=True)
           gated             fla.ops.simple_gla.chunk_simple_gla(q, k, v, g)   (linac: linear_attn --gated)
           gla               fla.ops.gla.chunk_gla(q, k, v, g)
           delta_rule        fla.ops.delta_rule.chunk_delta_rule(q, k, v, beta)
           gated_delta_rule  fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta)
Memory (B1 H16 D128, bf16, plain, T from --mem-lengths): linac's device bytes of the backward call (every
tensor it allocates: inputs, saved tensors, do, gradients, scratch; the kernels use no other device memory) and fla's
torch.cuda.max_memory_allocated over one fwd+bwd (inputs included).
"""

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import bench_vs_fla  # noqa: E402  (fla import helpers)


# case -> (linac op, linac flags, fla op of bench_vs_fla (inputs), fla module, fla function, fla kwargs)
CASES = {
    "plain": ("linear_attn", [], "linear_attn", "fla.ops.linear_attn", "chunk_linear_attn", {"normalize": False}),
    "normalized": ("linear_attn", ["--normalize"], "linear_attn", "fla.ops.linear_attn", "chunk_linear_attn",
                   {"normalize": True}),
    "gated": ("linear_attn", ["--gated"], "linear_attn", "fla.ops.simple_gla", "chunk_simple_gla", {}),
    "gla": ("gla", [], "gla", "fla.ops.gla", "chunk_gla", {}),
    "delta_rule": ("delta_rule", [], "delta_rule", "fla.ops.delta_rule", "chunk_delta_rule", {}),
    "gated_delta_rule": ("gated_delta_rule", [], "gated_delta_rule", "fla.ops.gated_delta_rule",
                         "chunk_gated_delta_rule", {}),
}


def linac_tune_bwd(linac, shape, case):
    """`linac tune OP --backward` at the shape (stored in the tuning database, which the bench then reads),
    as fla autotunes its backward on first use: {"seconds", "best": the tuner's line for the winner},
    {"skipped": why} or {"error": stderr}."""
    B, T, H, D = shape
    op, flags = CASES[case][:2]
    if "--normalize" in flags:
        return {"skipped": "linear_attn --normalize has no tuning space"}
    cmd = [str(linac), "tune", op, "--shape", f"B={B},T={T},H={H},K={D},V={D}", "--dtype", "bf16",
           "--backward"] + flags
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-800:]}
    best = [line for line in proc.stdout.splitlines() if "fastest" in line]
    return {"seconds": round(time.monotonic() - t0, 1), "best": best[-1].strip() if best else proc.stdout.strip()[-200:]}


def linac_bwd(linac, shape, case, iters=20):
    B, T, H, D = shape
    op, flags = CASES[case][:2]
    with tempfile.TemporaryDirectory(prefix="linac_bwd_") as tmp:
        jpath = Path(tmp) / "b.json"
        cmd = [str(linac), "bench", op, "--shape", f"B={B},T={T},H={H},K={D},V={D}", "--dtype", "bf16",
               "--backward", "--iters", str(iters), "--json", str(jpath)] + flags
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-800:]}
        return json.loads(jpath.read_text())


def fla_function(fla_root, case):
    """fla's function for a case, or the import error as a string."""
    module, name = CASES[case][3:5]
    if str(fla_root) not in sys.path:
        sys.path.insert(0, str(fla_root))
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as first:  # noqa: BLE001
        # fla/__init__.py also imports fla.layers and fla.models (transformers): load the packages
        # without running their __init__, as bench_vs_fla does.
        try:
            bench_vs_fla._stub_fla_packages(fla_root)
            return getattr(importlib.import_module(module), name)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            return f"cannot import {module}.{name}: {type(exc).__name__}: {exc} (plain import: {first})"


def fla_bwd(fn, shape, case, iters):
    """fla's fwd+bwd timing and peak memory, or {"error": ...} (fla refuses some cases on some Tritons)."""
    if isinstance(fn, str):
        return {"error": fn}
    try:
        return _fla_bwd(fn, shape, case, iters)
    except Exception as exc:  # noqa: BLE001 - recorded and printed, the run goes on
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _fla_bwd(fn, shape, case, iters):
    import torch
    B, T, H, D = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    args, kwargs = bench_vs_fla.make_fla_inputs(CASES[case][2], shape, case == "gated", gen)
    kwargs = {n: a for n, a in kwargs.items() if a is not None}
    kwargs.update(CASES[case][5])
    leaves = [a.detach().requires_grad_() for a in args]
    leaves_kw = {n: a.detach().requires_grad_() for n, a in kwargs.items() if isinstance(a, torch.Tensor)}
    kwargs.update(leaves_kw)
    do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)

    def step():
        o = fn(*leaves, **kwargs)[0]
        o.backward(do)
        for a in leaves + list(leaves_kw.values()):
            a.grad = None
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
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--shapes", default="8x4096x16x128")
    ap.add_argument("--mem-lengths", default="4096,16384,65536")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--slow-iters", type=int, default=3,
                    help="timed runs of the token-by-token backwards (gla, delta rules): seconds per call")
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"))
    ap.add_argument("--fla-root", default=str(REPO / "third_party"), help="the directory holding the fla package")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-tune", action="store_true",
                    help="time linac's backward at its default configuration instead of tuning it for each shape first")
    ap.add_argument("--json", default=None)
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="start no case after S seconds (fla's first fwd+bwd of a shape autotunes for minutes); "
                         "the cases left are listed as not run, and the JSON is written after every case")
    args = ap.parse_args()
    t_start = time.monotonic()
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_bwd.json") if os.environ.get("OUT") else None)

    def out_of_time():
        return args.time_budget is not None and time.monotonic() - t_start > args.time_budget

    def save():
        if path:
            Path(path).write_text(json.dumps(rows, indent=1))
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case '{c}' (expected some of {', '.join(CASES)})")
    rows = []
    print("fwd+bwd, bf16: linac (fwd + bwd medians) vs fla (fwd + o.backward); speed = fla / linac")
    print(f"{'case':<17} {'shape':<16} {'linac fwd':>9} {'linac bwd':>9} {'linac f+b':>9} {'fla f+b':>8} {'speed':>6}")
    for s in args.shapes.split(","):
        shape = tuple(int(x) for x in s.split("x"))
        for case in cases:
            if out_of_time():
                rows.append({"case": case, "shape": s, "not_run": "time budget"})
                print(f"{case:<17} {s:<16} not run (--time-budget {args.time_budget:g} s spent)", flush=True)
                continue
            slow = CASES[case][0] != "linear_attn"
            tuned = {"skipped": "--no-tune"} if args.no_tune else linac_tune_bwd(args.linac, shape, case)
            lin = linac_bwd(args.linac, shape, case, args.slow_iters if slow else args.iters)
            lin["backward_tuning"] = tuned
            fn = "--no-fla" if args.no_fla else fla_function(args.fla_root, case)
            fl = fla_bwd(fn, shape, case, args.iters)
            rows.append({"case": case, "shape": s, "linac": lin, "fla": fl})
            lf, lb = lin.get("fwd_ms"), lin.get("bwd_ms")
            tot = lf + lb if lf and lb else None
            speed = f"{fl['ms'] / tot:.2f}" if tot and "ms" in fl else ""
            print(f"{case:<17} {s:<16} {lf or float('nan'):>9.4f} {lb or float('nan'):>9.4f} "
                  f"{tot or float('nan'):>9.4f} {fl.get('ms', float('nan')):>8.4f} {speed:>6}", flush=True)
            if "best" in tuned:
                print(f"    linac backward tuned in {tuned['seconds']:.0f} s: {tuned['best']}")
            for who, r in (("linac", lin), ("linac tune", tuned), ("fla", fl)):
                if "error" in r:
                    print(f"    {who} error: {r['error']}")
            save()
    mem_lengths = [int(x) for x in args.mem_lengths.split(",") if x.strip()]
    if mem_lengths:  # --mem-lengths "" leaves the memory table out
        print("\ndevice memory of fwd+bwd, B1 H16 D128 bf16, plain (linac: tensors of the backward call; fla: peak)")
        print(f"{'T':>7} {'linac MB':>9} {'per token KB':>12} {'fla peak MB':>11}")
    fn = "--no-fla" if args.no_fla or not mem_lengths else fla_function(args.fla_root, "plain")
    for T in mem_lengths:
        if out_of_time():
            rows.append({"memory_T": T, "not_run": "time budget"})
            print(f"{T:>7} not run (--time-budget spent)", flush=True)
            continue
        shape = (1, T, 16, 128)
        lin = linac_bwd(args.linac, shape, "plain", 5)
        fl = fla_bwd(fn, shape, "plain", 3)
        rows.append({"memory_T": T, "linac": lin, "fla": fl})
        nb = lin.get("bwd_device_bytes")
        print(f"{T:>7} {nb / 1e6 if nb else float('nan'):>9.1f} {nb / T / 1e3 if nb else float('nan'):>12.2f} "
              f"{fl.get('peak_bytes', float('nan')) / 1e6:>11.1f}", flush=True)
        if "error" in lin:
            print(f"    linac error: {lin['error']}")
        save()
    save()


if __name__ == "__main__":
    main()
