#!/usr/bin/env python3
"""Forward-pass timing of linac's linear_attn against fla's chunk_simple_gla, on the GPU machine.

Run from the repository root (build/linac built, LD_LIBRARY_PATH set so it runs, fla's package copied
into third_party/fla/). For every shape (B, T, H, D) (K = V = D, bf16 inputs) and gate in {none, g}
(g = logsigmoid(randn) [B, T, H] fp32):

  fla    chunk_simple_gla(q, k, v, g=g or None) timed here with CUDA events: warm-up (the first call
         autotunes), then the median of --iters calls, rotating over input sets that together exceed
         twice the L2 cache so that the inputs are not L2-resident.
  linac  `build/linac bench linear_attn --shape ... --dtype bf16 [--gated] --json FILE`; its median_ms.
  floor  max(bytes that must move / measured copy bandwidth, FLOPs / measured bf16 matmul rate), with
         bytes = q, k, v read + o written (bf16) (+ g read, fp32) and FLOPs = 2*B*H*T*(BT*K + BT*V + 2*K*V),
         BT = 64.

Prints a table (speed = fla_ms / linac_ms: > 1 means linac is faster; '%floor' = floor_ms / ms) and
writes everything as JSON (--json; default $OUT/bench.json when $OUT is set, else bench.json).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# fla's benchmark shapes (B, T, H, D), then the issue's bar shape.
DEFAULT_SHAPES = [
    (1, 8192, 96, 128),
    (2, 16384, 16, 128),
    (4, 2048, 16, 128),
    (4, 4096, 64, 128),
    (8, 2048, 32, 256),
    (8, 1024, 8, 64),
    (8, 4096, 16, 128),
]
BT = 64  # chunk size used in the FLOP count
DEFAULT_L2_BYTES = 50 * 1000 * 1000


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def out(msg=""):
    print(msg, flush=True)


def parse_shape(s):
    parts = s.lower().split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"shape '{s}': expected BxTxHxD, e.g. 8x4096x16x128")
    return tuple(int(p) for p in parts)


def shape_name(shape):
    return "x".join(str(x) for x in shape)


def import_fla(fla_root):
    """Imports fla.ops.simple_gla.chunk_simple_gla from <fla_root>/fla. Returns (function, note)."""
    sys.path.insert(0, str(fla_root))
    try:
        from fla.ops.simple_gla import chunk_simple_gla  # noqa: E402
        return chunk_simple_gla, "import fla"
    except Exception as exc:  # noqa: BLE001 - fall back below, report both
        first = f"{type(exc).__name__}: {exc}"
    # fla/__init__.py also imports fla.layers and fla.models (transformers); if that is what broke,
    # load the package without running its __init__ (and fla.ops's, which imports every op).
    log(f"plain `import fla.ops.simple_gla` failed ({first}); retrying without fla's package __init__")
    import importlib
    import types
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]
    pkg = Path(fla_root) / "fla"
    for name, path in (("fla", pkg), ("fla.ops", pkg / "ops")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        mod.__file__ = str(path / "__init__.py")
        mod.__package__ = name
        sys.modules[name] = mod
    init = (pkg / "__init__.py").read_text()
    import re
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", init)
    sys.modules["fla"].__version__ = m.group(1) if m else "0"
    sys.modules["fla"].__all__ = []
    mod = importlib.import_module("fla.ops.simple_gla")
    return mod.chunk_simple_gla, f"stub package __init__ (plain import failed: {first})"


def fla_commit(fla_root):
    f = Path(fla_root) / "fla" / "LINAC_SOURCE.txt"
    try:
        return f.read_text().strip()
    except OSError:
        return "unknown (no third_party/fla/LINAC_SOURCE.txt)"


def is_oom(exc):
    import torch
    if isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    return "out of memory" in str(exc).lower()


def cuda_time_calls(fn, n, warmup):
    """Runs fn(i) warmup times, then n times each between CUDA events; returns the list of ms."""
    import torch
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def measure_copy_bandwidth(nbytes, reps):
    """Device-to-device copy bandwidth in bytes/s, read + write counted (median of reps)."""
    import torch
    while True:
        try:
            n = nbytes // 2
            src = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_()
            dst = torch.empty_like(src)
            break
        except Exception as exc:  # noqa: BLE001
            if not is_oom(exc) or nbytes <= 256 << 20:
                raise
            torch.cuda.empty_cache()
            nbytes //= 2
    times = cuda_time_calls(lambda i: dst.copy_(src), reps, 3)
    ms = statistics.median(times)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3), nbytes, ms


def measure_matmul_rate(n, reps):
    """bf16 n x n x n matmul rate in FLOP/s (median of reps)."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    times = cuda_time_calls(lambda i: torch.matmul(a, b, out=c), reps, 3)
    ms = statistics.median(times)
    del a, b, c
    torch.cuda.empty_cache()
    return 2 * n ** 3 / (ms * 1e-3), ms


def fwd_bytes(B, T, H, K, V, gated):
    n = 2 * B * T * H * K * 2 + B * T * H * V * 2 + B * T * H * V * 2  # q, k, v read; o written (bf16)
    if gated:
        n += B * T * H * 4  # g read (fp32)
    return n


def fwd_flops(B, T, H, K, V):
    return 2 * B * H * T * (BT * K + BT * V + 2 * K * V)


def run_linac_bench(linac, shape, gated, iters, timeout):
    """Runs `linac bench linear_attn`; returns (result dict or None, error text or None, wall s)."""
    B, T, H, D = shape
    with tempfile.TemporaryDirectory(prefix="linac_bench_") as tmp:
        jpath = Path(tmp) / "bench.json"
        cmd = [str(linac), "bench", "linear_attn", "--shape", f"B={B},T={T},H={H},K={D},V={D}",
               "--dtype", "bf16", "--json", str(jpath)]
        if gated:
            cmd.append("--gated")
        if iters is not None:
            cmd += ["--iters", str(iters)]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout} s: {' '.join(cmd)}", time.time() - t0
        except OSError as exc:
            return None, f"cannot run {cmd[0]}: {exc}", time.time() - t0
        wall = time.time() - t0
        if proc.stdout.strip():
            log(f"    linac: {proc.stdout.strip()}")
        if proc.returncode != 0:
            err = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
            return None, f"exit {proc.returncode}: {err}", wall
        try:
            res = json.loads(jpath.read_text())
        except (OSError, ValueError) as exc:
            return None, f"no readable JSON from linac bench ({exc}); stdout: {proc.stdout.strip()[-500:]}", wall
        if not isinstance(res.get("median_ms"), (int, float)):
            return None, f"linac bench JSON has no numeric median_ms: {res}", wall
        return res, None, wall


def bench_fla(chunk_simple_gla, shape, gated, iters, warmup, rotate, l2_bytes, seed):
    """Times fla's forward. Returns a dict (ms, min_ms, sets, note, first_call_s, finite)."""
    import torch
    import torch.nn.functional as F
    B, T, H, D = shape
    K = V = D
    set_bytes = B * T * H * (2 * K + V) * 2 + (B * T * H * 4 if gated else 0)  # q, k, v (+ g): the inputs
    note = []
    nsets = max(3, math.floor(2 * l2_bytes / set_bytes) + 1) if rotate else 1
    nsets = min(nsets, 64)
    # Memory: the sets, plus fla's outputs (a few alive at once) and per-chunk states
    # (B*H*ceil(T/64)*K*V, fp32 at most) and some slack.
    work = 4 * B * T * H * V * 2 + 2 * B * H * math.ceil(T / BT) * K * V * 4 + (1 << 30)
    free, _total = torch.cuda.mem_get_info()
    if nsets > 1 and nsets * set_bytes + work > 0.9 * free:
        fit = int((0.9 * free - work) // set_bytes)
        if fit >= 3:
            nsets = fit
        else:
            nsets = 1
            note.append(f"no input rotation: {3} sets of {set_bytes / 1e9:.2f} GB do not fit in "
                        f"{free / 1e9:.1f} GB free")
    if nsets * set_bytes <= 2 * l2_bytes and nsets > 1:
        note.append(f"rotation over {nsets} sets = {nsets * set_bytes / 1e6:.0f} MB only")

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    sets = []
    for _ in range(nsets):
        q = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = None
        if gated:
            g = F.logsigmoid(torch.randn(B, T, H, device="cuda", dtype=torch.float32, generator=gen))
        sets.append((q, k, v, g))

    def call(i):
        q, k, v, g = sets[i % nsets]
        return chunk_simple_gla(q, k, v, g=g)

    with torch.no_grad():
        t0 = time.time()
        o, _ = call(0)  # the first call autotunes (may take long)
        torch.cuda.synchronize()
        first_call_s = time.time() - t0
        finite = bool(torch.isfinite(o).all().item())
        del o
        times = cuda_time_calls(call, iters, warmup)
        # Back-to-back calls between two events: the mean hides the host's launch overhead as far as
        # the GPU queue stays full (per-call events above include any launch gap).
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(iters):
            call(i)
        end.record()
        torch.cuda.synchronize()
        loop_ms = start.elapsed_time(end) / iters
    del sets
    torch.cuda.empty_cache()
    return {
        "ms": statistics.median(times),
        "min_ms": min(times),
        "loop_ms": loop_ms,
        "iters": iters,
        "sets": nsets,
        "set_bytes": set_bytes,
        "first_call_s": first_call_s,
        "finite": finite,
        "note": "; ".join(note),
    }


def fmt(x, spec):
    if x is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return format("-", ">" + width) if width else "-"
    return format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", metavar="BxTxHxD",
                    help="shapes to run, space- or comma-separated, e.g. 8x4096x16x128,8x1024x8x64 "
                         "(default: fla's six benchmark shapes and 8x4096x16x128)")
    ap.add_argument("--gates", default="none,g", help="comma-separated subset of none,g (default both)")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (warm-up 3, 20 timed)")
    ap.add_argument("--iters", type=int, help="timed calls per measurement (default 50; 20 with --quick)")
    ap.add_argument("--warmup", type=int, help="warm-up calls after the first (default 5; 3 with --quick)")
    ap.add_argument("--no-rotate", action="store_true", help="time fla on one input set (L2 may hold it)")
    ap.add_argument("--no-fla", action="store_true", help="skip fla")
    ap.add_argument("--no-linac", action="store_true", help="skip linac")
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"), help="linac binary (default build/linac)")
    ap.add_argument("--linac-timeout", type=float, default=300, help="seconds per linac bench call (default 300)")
    ap.add_argument("--fla-root", default=str(REPO / "third_party"),
                    help="folder holding fla/ (default third_party)")
    ap.add_argument("--json", help="where to write the results (default $OUT/bench.json if $OUT is set, "
                                   "else bench.json)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    iters = args.iters or (20 if args.quick else 50)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    warmup = max(warmup, 2)  # + the first (autotuning) call = at least 3 calls before timing
    linac_iters = args.iters if args.iters else (20 if args.quick else None)
    gates = [s.strip() for s in args.gates.split(",") if s.strip()]
    for gname in gates:
        if gname not in ("none", "g"):
            ap.error(f"--gates: unknown gate '{gname}' (expected none or g)")
    try:
        shapes = [parse_shape(s) for a in (args.shapes or []) for s in a.split(",") if s.strip()] or DEFAULT_SHAPES
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    json_path = Path(args.json) if args.json else (
        Path(os.environ["OUT"]) / "bench.json" if os.environ.get("OUT") else Path("bench.json"))

    import torch
    import triton

    if not torch.cuda.is_available():
        log("error: torch sees no CUDA device")
        return 2
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES
    env = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "l2_bytes": l2_bytes,
        "gpu_mem_bytes": props.total_memory,
        "fla_source": fla_commit(args.fla_root),
        "linac": args.linac,
        "iters": iters,
        "warmup": warmup + 1,
    }
    out(f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, GPU {env['gpu']} "
        f"({env['sms']} SMs, L2 {l2_bytes / 1e6:.0f} MB, {props.total_memory / 2**30:.0f} GiB)")
    out(f"fla: {env['fla_source']}")

    chunk_simple_gla = None
    if not args.no_fla:
        t0 = time.time()
        try:
            chunk_simple_gla, how = import_fla(args.fla_root)
            env["fla_import"] = how
            log(f"fla imported ({how}) in {time.time() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001
            env["fla_import"] = f"failed: {type(exc).__name__}: {exc}"
            log(f"error: cannot import fla: {traceback.format_exc()}")
    linac_ok = not args.no_linac
    if linac_ok and not (Path(args.linac).is_file() and os.access(args.linac, os.X_OK)):
        log(f"error: linac binary not found at {args.linac}")
        env["linac_error"] = "binary not found"
        linac_ok = False

    # Floors, measured once.
    log("measuring copy bandwidth (2 GiB) and bf16 matmul rate (8192^3) ...")
    bw, bw_bytes, bw_ms = measure_copy_bandwidth(2 << 30, 10)
    mm_rate, mm_ms = measure_matmul_rate(8192, 10)
    env.update({"copy_bw_Bps": bw, "copy_bytes": bw_bytes, "copy_ms": bw_ms,
                "matmul_flops_per_s": mm_rate, "matmul_ms": mm_ms})
    out(f"copy bandwidth {bw / 1e12:.2f} TB/s (read+write, {bw_bytes / 2**30:.2f} GiB), "
        f"bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")

    results = []

    def save():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"env": env, "results": results}, indent=2))

    cases = [(s, gname) for s in shapes for gname in gates]
    t_start = time.time()
    for idx, (shape, gname) in enumerate(cases):
        B, T, H, D = shape
        gated = gname == "g"
        r = {"shape": list(shape), "B": B, "T": T, "H": H, "K": D, "V": D, "gate": gname, "dtype": "bf16"}
        r["bytes"] = fwd_bytes(B, T, H, D, D, gated)
        r["flops"] = fwd_flops(B, T, H, D, D)
        r["mem_floor_ms"] = r["bytes"] / bw * 1e3
        r["flop_floor_ms"] = r["flops"] / mm_rate * 1e3
        r["floor_ms"] = max(r["mem_floor_ms"], r["flop_floor_ms"])
        r["floor_kind"] = "memory" if r["mem_floor_ms"] >= r["flop_floor_ms"] else "flops"
        log(f"[{idx + 1}/{len(cases)}] {shape_name(shape)} gate={gname} "
            f"(elapsed {time.time() - t_start:.0f} s)")

        if linac_ok:
            torch.cuda.empty_cache()
            res, err, wall = run_linac_bench(args.linac, shape, gated, linac_iters, args.linac_timeout)
            r["linac_wall_s"] = wall
            if err:
                r["linac_error"] = err
                log(f"    linac failed: {err.splitlines()[0] if err else ''}")
            else:
                r["linac"] = res
                r["linac_ms"] = float(res["median_ms"])
                log(f"    linac {r['linac_ms']:.4f} ms ({wall:.1f} s wall)")

        if chunk_simple_gla is not None:
            try:
                f = bench_fla(chunk_simple_gla, shape, gated, iters, warmup, not args.no_rotate, l2_bytes,
                              args.seed + idx)
                r["fla"] = f
                r["fla_ms"] = f["ms"]
                log(f"    fla   {f['ms']:.4f} ms (back-to-back {f['loop_ms']:.4f} ms; first call {f['first_call_s']:.1f} s, {f['sets']} input sets"
                    f"{'; ' + f['note'] if f['note'] else ''})")
                if not f["finite"]:
                    log("    warning: fla's output has non-finite values")
            except Exception as exc:  # noqa: BLE001
                if is_oom(exc):
                    r["fla_error"] = f"out of memory, skipped: {str(exc).splitlines()[0]}"
                else:
                    r["fla_error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    log(traceback.format_exc())
                log(f"    fla failed: {r['fla_error'].splitlines()[0]}")
                torch.cuda.empty_cache()

        if r.get("fla_ms") and r.get("linac_ms"):
            r["speed_vs_fla"] = r["fla_ms"] / r["linac_ms"]
        for who in ("fla", "linac"):
            if r.get(f"{who}_ms"):
                r[f"{who}_frac_floor"] = r["floor_ms"] / r[f"{who}_ms"]
        results.append(r)
        save()

    # Table.
    out("")
    out("fla ms: median of per-call CUDA-event times (host launch gaps included); fla loop: mean of back-to-back "
        "calls; speed = fla_ms / linac_ms (> 1: linac faster); %floor = floor_ms / ms; floor = max(bytes / copy bw, "
        "FLOPs / matmul rate)")
    hdr = (f"{'shape BxTxHxD':<17} {'gate':<4} {'fla ms':>9} {'fla loop':>9} {'linac ms':>9} {'speed':>6} "
           f"{'floor ms':>9} {'bound':<6} {'fla%fl':>6} {'lin%fl':>6}  notes")
    out(hdr)
    out("-" * len(hdr))
    for r in results:
        notes = []
        if r.get("linac_error"):
            notes.append("linac: " + r["linac_error"].splitlines()[0][:60])
        if r.get("fla_error"):
            notes.append("fla: " + r["fla_error"].splitlines()[0][:60])
        if r.get("fla", {}).get("note"):
            notes.append(r["fla"]["note"])
        frac = lambda x: None if x is None else 100 * x  # noqa: E731
        out(f"{shape_name(r['shape']):<17} {r['gate']:<4} {fmt(r.get('fla_ms'), '9.4f')} "
            f"{fmt(r.get('fla', {}).get('loop_ms'), '9.4f')} "
            f"{fmt(r.get('linac_ms'), '9.4f')} {fmt(r.get('speed_vs_fla'), '6.2f')} "
            f"{r['floor_ms']:9.4f} {r['floor_kind']:<6} {fmt(frac(r.get('fla_frac_floor')), '6.1f')} "
            f"{fmt(frac(r.get('linac_frac_floor')), '6.1f')}  {'; '.join(notes)}")
    speeds = [r["speed_vs_fla"] for r in results if r.get("speed_vs_fla")]
    if speeds:
        gm = math.exp(sum(math.log(s) for s in speeds) / len(speeds))
        env["geomean_speed_vs_fla"] = gm
        out(f"geomean speed vs fla over {len(speeds)} cases: {gm:.3f} (min {min(speeds):.3f}, max {max(speeds):.3f})")
    save()
    out(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
