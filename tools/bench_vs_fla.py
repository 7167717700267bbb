#!/usr/bin/env python3
"""Forward-pass timing of linac's ops against fla's, on the GPU machine.

Run from the repository root (build/linac built, LD_LIBRARY_PATH set so it runs, fla's package copied
into third_party/fla/). K = V = D, bf16 q, k, v; gates and betas fp32 (what linac reads). Ops (--ops,
default linear_attn,gla,delta_rule,gated_delta_rule) and what each is compared with:

  linear_attn       fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=g or None), for each --gates entry:
                    none, or g = logsigmoid(randn) [B, T, H]                  (linac: --gated for g)
  gla               fla.ops.gla.chunk_gla(q, k, v, g), g = logsigmoid(randn).clamp(min=-5) [B, T, H, K]
  delta_rule        fla.ops.delta_rule.chunk_delta_rule(q, k, v, beta), k L2-normalized (rows of
                    randn, in fp32, then bf16), beta = sigmoid(rand) [B, T, H]
  gated_delta_rule  fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta), k and beta as
                    for delta_rule, g = logsigmoid(randn) [B, T, H]
  --l2norm-qk       the delta rules normalizing q and k inside (what models call): k raw randn, fla with
                    use_qk_l2norm_in_kernel=True, linac with --l2norm-qk

  fla    timed here with CUDA events: a first call (autotunes: fla's GLA and DeltaNet kernels spend
         40-150 s there; progress on stderr), warm-up, then the median of --iters calls, rotating over
         input sets that together exceed twice the L2 cache so that the inputs are not L2-resident.
  linac  `build/linac bench OP --shape B=..,T=..,H=..,K=D,V=D --dtype bf16 [--gated] --json FILE`; its
         median_ms (linac's own random inputs of the same shapes; its gla/delta ops always have their
         gates and betas). An op linac cannot bench yet is recorded with its error; the run goes on.
  floor  max(bytes that must move / measured copy bandwidth, FLOPs / measured bf16 matmul rate).
         bytes = q, k, v read + o written (bf16), plus g read (fp32: [B,T,H] for linear_attn's g and
         gated_delta_rule, [B,T,H,K] for gla) and beta read (fp32, [B,T,H]) for the delta rules.
         FLOPs (BT = 64, the intra-chunk products counted in full, the triangular inverse not at all):
           linear_attn, gla   2*B*H*T*(BT*K + BT*V + 2*K*V)          Q K^T, A V, Q S, K^T V
           delta rules        2*B*H*T*(3*BT*K + 2*BT*V + 3*K*V)      + K K^T, T (beta K), T (beta V), W S

Shapes (B, T, H, D): fla's six benchmark shapes and the issue's bar shape (8, 4096, 16, 128) for
linear_attn; by default gla, delta_rule and gated_delta_rule run only at (8, 4096, 16, 128) and
(4, 2048, 16, 128), because fla's first call of each of them autotunes for 40-150 s: the default run
(4 ops, 20 cases) is meant to finish in about 6 minutes on an H200 (linear_attn alone took ~160 s).
--shapes sets the shapes of every op, --op-shapes OP=S,S those of one op, --all-shapes gives every op
all seven. --time-budget S skips the cases not started after S seconds (they are listed as skipped);
SIGTERM (e.g. from `timeout`) also ends the run after printing the table of what finished.

Prints a table (speed = fla_ms / linac_ms: > 1 means linac is faster; '%floor' = floor_ms / ms), the
geometric mean of the speed per op (and per gate for linear_attn) and over all cases, and writes
everything as JSON (--json; default $OUT/bench.json when $OUT is set, else bench.json).
"""

import argparse
import importlib
import json
import math
import os
import signal
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
# The ops fla's autotuning makes slow to start: by default only these two shapes.
SHORT_SHAPES = [(8, 4096, 16, 128), (4, 2048, 16, 128)]
BT = 64  # chunk size used in the FLOP count
DEFAULT_L2_BYTES = 50 * 1000 * 1000

# op -> fla module and function, default shapes, the 'gate' column of the table.
OPS = {
    "linear_attn": dict(module="fla.ops.simple_gla", fn="chunk_simple_gla", shapes=DEFAULT_SHAPES),
    "gla": dict(module="fla.ops.gla", fn="chunk_gla", shapes=SHORT_SHAPES, gate="gk"),
    "delta_rule": dict(module="fla.ops.delta_rule", fn="chunk_delta_rule", shapes=SHORT_SHAPES, gate="beta"),
    "gated_delta_rule": dict(module="fla.ops.gated_delta_rule", fn="chunk_gated_delta_rule", shapes=SHORT_SHAPES,
                             gate="g+b"),
}
DEFAULT_OPS = "linear_attn,gla,delta_rule,gated_delta_rule"


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def out(msg=""):
    print(msg, flush=True)


def parse_shape(s):
    parts = s.lower().split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"shape '{s}': expected BxTxHxD, e.g. 8x4096x16x128")
    return tuple(int(p) for p in parts)


def parse_shapes(items):
    return [parse_shape(s) for a in items for s in a.split(",") if s.strip()]


def shape_name(shape):
    return "x".join(str(x) for x in shape)


def _stub_fla_packages(fla_root):
    """Registers fla and fla.ops as bare packages so that their __init__ files (which import every op,
    fla.layers and fla.models, hence transformers) do not run."""
    import re
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
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", init)
    sys.modules["fla"].__version__ = m.group(1) if m else "0"
    sys.modules["fla"].__all__ = []


def import_fla(fla_root, ops):
    """Imports fla's function for each op from <fla_root>/fla. Returns ({op: function}, {op: error}, note)."""
    sys.path.insert(0, str(fla_root))
    fns, errors = {}, {}
    first = None
    for op in ops:
        try:
            fns[op] = getattr(importlib.import_module(OPS[op]["module"]), OPS[op]["fn"])
        except Exception as exc:  # noqa: BLE001 - fall back below, report both
            first = f"{OPS[op]['module']}: {type(exc).__name__}: {exc}"
            break
    if first is None:
        return fns, errors, "import fla"
    # fla/__init__.py also imports fla.layers and fla.models (transformers); if that is what broke,
    # load the packages without running their __init__ (and fla.ops's, which imports every op).
    log(f"plain `import fla.ops...` failed ({first}); retrying without fla's package __init__")
    _stub_fla_packages(fla_root)
    fns = {}
    for op in ops:
        try:
            fns[op] = getattr(importlib.import_module(OPS[op]["module"]), OPS[op]["fn"])
        except Exception as exc:  # noqa: BLE001
            errors[op] = f"cannot import {OPS[op]['module']}.{OPS[op]['fn']}: {type(exc).__name__}: {exc}"
            log(f"error: {errors[op]}\n{traceback.format_exc()}")
    return fns, errors, f"stub package __init__ (plain import failed: {first})"


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


def input_bytes(op, B, T, H, K, V, gated):
    """Bytes of the op's inputs: q, k, v (bf16), gates and betas (fp32)."""
    n = 2 * B * T * H * K * 2 + B * T * H * V * 2
    if op == "linear_attn" and gated:
        n += B * T * H * 4  # g [B, T, H]
    elif op == "gla":
        n += B * T * H * K * 4  # g [B, T, H, K]
    elif op == "delta_rule":
        n += B * T * H * 4  # beta
    elif op == "gated_delta_rule":
        n += 2 * B * T * H * 4  # g, beta
    return n


def fwd_bytes(op, B, T, H, K, V, gated):
    return input_bytes(op, B, T, H, K, V, gated) + B * T * H * V * 2  # + o written (bf16)


def fwd_flops(op, B, T, H, K, V):
    if op in ("delta_rule", "gated_delta_rule"):
        return 2 * B * H * T * (3 * BT * K + 2 * BT * V + 3 * K * V)
    return 2 * B * H * T * (BT * K + BT * V + 2 * K * V)


def run_linac_bench(linac, op, shape, gated, iters, timeout, extra=()):
    """Runs `linac bench OP [extra]`; returns (result dict or None, error text or None, wall s)."""
    B, T, H, D = shape
    with tempfile.TemporaryDirectory(prefix="linac_bench_") as tmp:
        jpath = Path(tmp) / "bench.json"
        cmd = [str(linac), "bench", op, "--shape", f"B={B},T={T},H={H},K={D},V={D}",
               "--dtype", "bf16", "--json", str(jpath)]
        if gated:
            cmd.append("--gated")
        cmd += list(extra)
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
            lines = [ln for ln in err.splitlines() if ln.strip()]
            first = next((ln for ln in lines if ln.startswith("linac: error:")), lines[-1] if lines else "")
            return None, f"exit {proc.returncode}: {first}" + (f"\n{err}" if err != first else ""), wall
        try:
            res = json.loads(jpath.read_text())
        except (OSError, ValueError) as exc:
            return None, f"no readable JSON from linac bench ({exc}); stdout: {proc.stdout.strip()[-500:]}", wall
        if not isinstance(res.get("median_ms"), (int, float)):
            return None, f"linac bench JSON has no numeric median_ms: {res}", wall
        return res, None, wall


def make_fla_inputs(op, shape, gated, gen, l2norm=False):
    """One set of fla's inputs: (args, kwargs) of its call (`l2norm`: the delta rules normalizing q and k
    inside, on raw k)."""
    import torch
    import torch.nn.functional as F
    B, T, H, D = shape
    K = V = D

    def randn(*s, dtype=torch.bfloat16):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)

    q, v = randn(B, T, H, K), randn(B, T, H, V)
    if op == "linear_attn":
        g = F.logsigmoid(randn(B, T, H, dtype=torch.float32)) if gated else None
        return (q, randn(B, T, H, K), v), dict(g=g)
    if op == "gla":
        g = F.logsigmoid(randn(B, T, H, K, dtype=torch.float32)).clamp_(min=-5)
        return (q, randn(B, T, H, K), v, g), {}
    k = randn(B, T, H, K) if l2norm else F.normalize(randn(B, T, H, K, dtype=torch.float32), p=2,
                                                       dim=-1).to(torch.bfloat16)
    beta = torch.rand(B, T, H, device="cuda", dtype=torch.float32, generator=gen).sigmoid()
    kwargs = dict(use_qk_l2norm_in_kernel=True) if l2norm else {}
    if op == "delta_rule":
        return (q, k, v, beta), kwargs
    g = F.logsigmoid(randn(B, T, H, dtype=torch.float32))
    return (q, k, v, g, beta), kwargs


def bench_fla(fn, op, shape, gated, iters, warmup, rotate, l2_bytes, seed, l2norm=False):
    """Times fla's forward. Returns a dict (ms, min_ms, sets, note, first_call_s, finite)."""
    import torch
    B, T, H, D = shape
    K = V = D
    set_bytes = input_bytes(op, B, T, H, K, V, gated)
    note = []
    nsets = max(3, math.floor(2 * l2_bytes / set_bytes) + 1) if rotate else 1
    nsets = min(nsets, 64)
    # Memory: the sets, plus fla's outputs and intermediates (a few [B, T, H, D] tensors: o, w, u, v_new
    # for the delta rules), per-chunk states (B*H*ceil(T/64)*K*V, fp32 at most) and some slack.
    work = 8 * B * T * H * max(K, V) * 2 + 2 * B * H * math.ceil(T / BT) * K * V * 4 + (1 << 30)
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
    sets = [make_fla_inputs(op, shape, gated, gen, l2norm) for _ in range(nsets)]

    def call(i):
        args, kwargs = sets[i % nsets]
        return fn(*args, **kwargs)

    with torch.no_grad():
        log(f"    fla   first call of {OPS[op]['fn']} (autotunes on first use; may take minutes) ...")
        t0 = time.time()
        o, _ = call(0)
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


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


class Stop(Exception):
    """Raised by the SIGTERM handler: print what finished, then exit."""


def plan_cases(args, ap):
    """[(op, shape, gate)] in run order."""
    ops = [s.strip() for s in args.ops.split(",") if s.strip()]
    for op in ops:
        if op not in OPS:
            ap.error(f"--ops: unknown op '{op}' (expected a subset of {', '.join(OPS)})")
    gates = [s.strip() for s in args.gates.split(",") if s.strip()]
    for gname in gates:
        if gname not in ("none", "g"):
            ap.error(f"--gates: unknown gate '{gname}' (expected none or g)")
    try:
        common = parse_shapes(args.shapes or [])
        per_op = {}
        for item in args.op_shapes or []:
            op, sep, rest = item.partition("=")
            if not sep or op.strip() not in OPS:
                ap.error(f"--op-shapes '{item}': expected OP=BxTxHxD[,BxTxHxD...] with OP one of {', '.join(OPS)}")
            per_op.setdefault(op.strip(), []).extend(parse_shapes([rest]))
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    cases = []
    for op in ops:
        shapes = per_op.get(op) or common or (DEFAULT_SHAPES if args.all_shapes else OPS[op]["shapes"])
        for shape in shapes:
            if op == "linear_attn":
                cases += [(op, shape, gname) for gname in gates]
            else:
                cases.append((op, shape, OPS[op]["gate"]))
    return ops, cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=DEFAULT_OPS, help=f"comma-separated ops to compare (default {DEFAULT_OPS})")
    ap.add_argument("--shapes", nargs="+", metavar="BxTxHxD",
                    help="shapes of every op, space- or comma-separated, e.g. 8x4096x16x128,8x1024x8x64 "
                         "(default: fla's six benchmark shapes and 8x4096x16x128 for linear_attn; "
                         "8x4096x16x128 and 4x2048x16x128 for the others)")
    ap.add_argument("--op-shapes", action="append", metavar="OP=BxTxHxD,...",
                    help="shapes of one op (repeatable; wins over --shapes), e.g. gla=8x1024x8x64,4x2048x16x128")
    ap.add_argument("--all-shapes", action="store_true", help="every op at all seven default shapes (slow: fla "
                                                               "autotunes GLA/DeltaNet per shape)")
    ap.add_argument("--l2norm-qk", action="store_true", help="the delta rules normalizing q and k inside (fla: "
                                                              "use_qk_l2norm_in_kernel=True; linac: --l2norm-qk)")
    ap.add_argument("--gates", default="none,g", help="linear_attn: comma-separated subset of none,g (default both)")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (warm-up 3, 20 timed)")
    ap.add_argument("--iters", type=int, help="timed calls per measurement (default 50; 20 with --quick)")
    ap.add_argument("--warmup", type=int, help="warm-up calls after the first (default 5; 3 with --quick)")
    ap.add_argument("--time-budget", type=float, default=0, metavar="S",
                    help="skip the cases not started after S seconds (default 0: no budget)")
    ap.add_argument("--plan", action="store_true", help="print the cases (op, shape, gate) and exit; needs no GPU")
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
    ops, cases = plan_cases(args, ap)
    if args.plan:
        for i, (op, shape, gname) in enumerate(cases):
            B, T, H, D = shape
            out(f"[{i + 1}/{len(cases)}] {op:<16} {shape_name(shape):<17} gate={gname:<4} "
                f"bytes {fwd_bytes(op, B, T, H, D, D, gname == 'g') / 1e6:8.1f} MB  "
                f"FLOPs {fwd_flops(op, B, T, H, D, D) / 1e9:8.1f} G")
        return 0
    json_path = Path(args.json) if args.json else (
        Path(os.environ["OUT"]) / "bench.json" if os.environ.get("OUT") else Path("bench.json"))

    def on_term(signum, _frame):
        raise Stop(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

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
        "ops": ops,
    }
    out(f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, GPU {env['gpu']} "
        f"({env['sms']} SMs, L2 {l2_bytes / 1e6:.0f} MB, {props.total_memory / 2**30:.0f} GiB)")
    out(f"fla: {env['fla_source']}")

    fla_fns, fla_import_errors = {}, {}
    if not args.no_fla:
        t0 = time.time()
        try:
            fla_fns, fla_import_errors, how = import_fla(args.fla_root, ops)
            env["fla_import"] = how
            log(f"fla imported ({how}) in {time.time() - t0:.1f} s: {', '.join(sorted(fla_fns)) or 'nothing'}")
        except Exception as exc:  # noqa: BLE001
            env["fla_import"] = f"failed: {type(exc).__name__}: {exc}"
            fla_import_errors = {op: env["fla_import"] for op in ops}
            log(f"error: cannot import fla: {traceback.format_exc()}")
        if fla_import_errors:
            env["fla_import_errors"] = fla_import_errors
    linac_ok = not args.no_linac
    if linac_ok and not (Path(args.linac).is_file() and os.access(args.linac, os.X_OK)):
        log(f"error: linac binary not found at {args.linac}")
        env["linac_error"] = "binary not found"
        linac_ok = False

    results = []

    def save():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"env": env, "results": results}, indent=2))

    t_start = time.time()
    stopped = None
    try:
        # Floors, measured once.
        log("measuring copy bandwidth (2 GiB) and bf16 matmul rate (8192^3) ...")
        bw, bw_bytes, bw_ms = measure_copy_bandwidth(2 << 30, 10)
        mm_rate, mm_ms = measure_matmul_rate(8192, 10)
        env.update({"copy_bw_Bps": bw, "copy_bytes": bw_bytes, "copy_ms": bw_ms,
                    "matmul_flops_per_s": mm_rate, "matmul_ms": mm_ms})
        out(f"copy bandwidth {bw / 1e12:.2f} TB/s (read+write, {bw_bytes / 2**30:.2f} GiB), "
            f"bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")

        for idx, (op, shape, gname) in enumerate(cases):
            B, T, H, D = shape
            gated = gname == "g"
            l2norm = args.l2norm_qk and op in ("delta_rule", "gated_delta_rule")
            r = {"op": op, "shape": list(shape), "B": B, "T": T, "H": H, "K": D, "V": D, "gate": gname,
                 "dtype": "bf16", "l2norm_qk": l2norm}
            r["bytes"] = fwd_bytes(op, B, T, H, D, D, gated)
            r["flops"] = fwd_flops(op, B, T, H, D, D)
            r["mem_floor_ms"] = r["bytes"] / bw * 1e3
            r["flop_floor_ms"] = r["flops"] / mm_rate * 1e3
            r["floor_ms"] = max(r["mem_floor_ms"], r["flop_floor_ms"])
            r["floor_kind"] = "memory" if r["mem_floor_ms"] >= r["flop_floor_ms"] else "flops"
            elapsed = time.time() - t_start
            if args.time_budget and elapsed > args.time_budget:
                r["skipped"] = f"time budget of {args.time_budget:.0f} s spent"
                results.append(r)
                continue
            log(f"[{idx + 1}/{len(cases)}] {op} {shape_name(shape)} gate={gname} (elapsed {elapsed:.0f} s)")

            if linac_ok:
                torch.cuda.empty_cache()
                res, err, wall = run_linac_bench(args.linac, op, shape, gated, linac_iters, args.linac_timeout,
                                                 ["--l2norm-qk"] if l2norm else [])
                r["linac_wall_s"] = wall
                if err:
                    r["linac_error"] = err
                    log(f"    linac failed: {err.splitlines()[0] if err else ''}")
                else:
                    r["linac"] = res
                    r["linac_ms"] = float(res["median_ms"])
                    log(f"    linac {r['linac_ms']:.4f} ms ({wall:.1f} s wall)")

            if op in fla_import_errors:
                r["fla_error"] = fla_import_errors[op]
            elif op in fla_fns:
                try:
                    f = bench_fla(fla_fns[op], op, shape, gated, iters, warmup, not args.no_rotate, l2_bytes,
                                  args.seed + idx, l2norm)
                    r["fla"] = f
                    r["fla_ms"] = f["ms"]
                    log(f"    fla   {f['ms']:.4f} ms (back-to-back {f['loop_ms']:.4f} ms; first call "
                        f"{f['first_call_s']:.1f} s, {f['sets']} input sets{'; ' + f['note'] if f['note'] else ''})")
                    if not f["finite"]:
                        log("    warning: fla's output has non-finite values")
                except Stop:
                    raise
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
    except (Stop, KeyboardInterrupt) as exc:
        stopped = str(exc) or "interrupted"
        env["stopped"] = f"{stopped} after {time.time() - t_start:.0f} s; {len(results)}/{len(cases)} cases done"
        log(f"stopped ({env['stopped']}): printing what finished")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    # Table.
    out("")
    out("fla ms: median of per-call CUDA-event times (host launch gaps included); fla loop: mean of back-to-back "
        "calls; speed = fla_ms / linac_ms (> 1: linac faster); %floor = floor_ms / ms; floor = max(bytes / copy bw, "
        "FLOPs / matmul rate)")
    hdr = (f"{'op':<16} {'shape BxTxHxD':<17} {'gate':<4} {'fla ms':>9} {'fla loop':>9} {'linac ms':>9} "
           f"{'speed':>6} {'floor ms':>9} {'bound':<6} {'fla%fl':>6} {'lin%fl':>6}  notes")
    out(hdr)
    out("-" * len(hdr))
    for r in results:
        notes = ["l2norm-qk"] if r.get("l2norm_qk") else []
        if r.get("skipped"):
            notes.append("skipped: " + r["skipped"])
        if r.get("linac_error"):
            notes.append("linac: " + r["linac_error"].splitlines()[0][:90])
        if r.get("fla_error"):
            notes.append("fla: " + r["fla_error"].splitlines()[0][:90])
        if r.get("fla", {}).get("note"):
            notes.append(r["fla"]["note"])
        frac = lambda x: None if x is None else 100 * x  # noqa: E731
        out(f"{r['op']:<16} {shape_name(r['shape']):<17} {r['gate']:<4} {fmt(r.get('fla_ms'), '9.4f')} "
            f"{fmt(r.get('fla', {}).get('loop_ms'), '9.4f')} "
            f"{fmt(r.get('linac_ms'), '9.4f')} {fmt(r.get('speed_vs_fla'), '6.2f')} "
            f"{r['floor_ms']:9.4f} {r['floor_kind']:<6} {fmt(frac(r.get('fla_frac_floor')), '6.1f')} "
            f"{fmt(frac(r.get('linac_frac_floor')), '6.1f')}  {'; '.join(notes)}")
    for op, shape, gname in cases[len(results):]:
        out(f"{op:<16} {shape_name(shape):<17} {gname:<4} {'':>9} {'':>9} {'':>9} {'':>6} {'':>9} {'':<6} "
            f"{'':>6} {'':>6}  not run ({stopped})")

    # Geometric means of the speed, per op (linear_attn also per gate), then over every case.
    per_op = {}
    for op in ops:
        speeds = [r["speed_vs_fla"] for r in results if r["op"] == op and r.get("speed_vs_fla")]
        n_cases = sum(1 for c in cases if c[0] == op)
        if not speeds:
            out(f"geomean speed vs fla  {op:<16} -      (no case with both timings, of {n_cases})")
            continue
        per_op[op] = gm = geomean(speeds)
        extra = ""
        if op == "linear_attn":
            parts = []
            for gname in ("none", "g"):
                sg = [r["speed_vs_fla"] for r in results
                      if r["op"] == op and r["gate"] == gname and r.get("speed_vs_fla")]
                if sg:
                    per_op[f"{op}/{gname}"] = geomean(sg)
                    parts.append(f"gate {gname} {geomean(sg):.3f}")
            extra = f"; {', '.join(parts)}" if parts else ""
        out(f"geomean speed vs fla  {op:<16} {gm:6.3f} over {len(speeds)}/{n_cases} cases "
            f"(min {min(speeds):.3f}, max {max(speeds):.3f}{extra})")
    env["geomean_speed_vs_fla_per_op"] = per_op
    speeds = [r["speed_vs_fla"] for r in results if r.get("speed_vs_fla")]
    if speeds:
        gm = geomean(speeds)
        env["geomean_speed_vs_fla"] = gm
        out(f"geomean speed vs fla  {'all':<16} {gm:6.3f} over {len(speeds)} cases "
            f"(min {min(speeds):.3f}, max {max(speeds):.3f})")
    save()
    out(f"wrote {json_path}")
    return 124 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
