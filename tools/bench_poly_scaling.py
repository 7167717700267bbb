#!/usr/bin/env python3
"""Time and peak memory against sequence length for linac's poly, linac's linear attention and causal
softmax attention: the founding paper's Figure 1 for linac (issue 20, point 5), and with --bars the
issue's bars for poly (issue 20, point 4).

    python3 tools/bench_poly_scaling.py [--lengths 1024,...,1048576] [--batch 1,4] [--heads 16]
        [--dims 64] [--methods poly,linear,sdpa] [--modes fwd,fwdbwd] [--json F]
    python3 tools/bench_poly_scaling.py --bars [--fla-path third_party/fla] [--json F]
    python3 tools/plot_scaling.py F                  # the figure (docs/poly_scaling.png) and the slopes

Run from anywhere (the `linac` package is taken from this checkout's python/; liblinac from build/).

Methods (every one on the same inputs' shapes, timed by the same timer, in one process):
  poly    linac.poly(q, k, v): f(x) = 1 + x + x^2/2 (a=1, b=1, c=0.5), scale K^-1/2, normalized;
          q, k, v [B, T, H, D].
  linear  linac.chunk_linear_attn(q, k, v, normalize=True) (fla's default), q, k, v [B, T, H, D]; q and
          k are elu(x) + 1 (positive, as a feature map gives them) so the normalizer stays away from 0.
  sdpa    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), [B, H, T, D]; on CUDA
          restricted to the flash backend (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
          on the CPU torch's default backend.

Modes:
  fwd     one forward call (inputs without requires_grad).
  fwdbwd  one forward and one backward together: o = f(q, k, v); o.backward(do) with a fixed random do
          (the gradient of loss = (o * do).sum()); q.grad, k.grad, v.grad are dropped before each call.

Each point (method, mode, B, H, D, T): --warmup untimed calls (the first compiles, loads or tunes linac's
kernels), then the median of --iters timed calls: CUDA events around each call on the GPU, perf_counter
on the CPU. Peak memory (CUDA only; null on the CPU): torch.cuda.max_memory_allocated() over the timed
calls minus the memory held just before them (the inputs, do): what one call adds at its peak. The
memory held before is recorded too (held_bytes), so held_bytes + peak_bytes is the device's peak.

Limits, per series (method, mode, B, H, D), T ascending:
  - torch.OutOfMemoryError (or linac's "out of GPU memory") records status "oom", empties torch's cache
    and skips the larger T of the series (status "skipped").
  - --max-seconds: a point stops timing once its wall time (warm-up included) passes the budget (its
    median is over the calls made, recorded as "iters"); a point over budget skips the larger T of its
    series. A point whose time, extrapolated from the series' last two points (growth exponent at least
    1), would pass the budget is skipped before it starts: a call that runs for an hour cannot be stopped.
  - --total-seconds: no new point starts once the whole run has taken this long (the rest: "skipped").
  - any other exception records status "error" with its message; the series goes on.
Points run T by T (every method, mode, B and D at one T before the next T) and the JSON is rewritten
after every point, so a run cut short still leaves every method measured up to the same length.

JSON (--json; default $OUT/poly_scaling.json when $OUT is set, else ./poly_scaling.json;
$OUT/poly_bars.json / ./poly_bars.json with --bars): {"device", "torch", "cuda", "date", "commit",
"settings": {...}, "points": [{"method", "mode", "B", "H", "D", "T", "ms", "peak_bytes", "held_bytes",
"iters", "status", "detail"}], and with --bars "bars": [{"name", "passed", "detail", ...}]}. status is
"ok", "oom", "skipped" or "error"; ms and peak_bytes are null unless ok (peak_bytes null on the CPU).

--bars: issue 20's bars, B1 H8 D64 (bf16 on CUDA), poly against sdpa in one run:
  fwd_8k           poly forward <= sdpa forward at T = 8192
  fwd_64k_5x       poly forward >= 5x faster than sdpa at T = 65536
  fwdbwd_64k_3x    poly forward+backward >= 3x faster than sdpa's at T = 65536
  linear_fwd       poly forward time(65536) / time(16384) in [3.6, 4.4]
  linear_fwdbwd    the same for forward+backward
  memory_256k      poly forward+backward at T = 262144: device peak (held_bytes + peak_bytes) <= 3x the
                   bytes of q, k, v, o, do, dq, dk, dv together
  Each bar prints PASS, FAIL or "not measured" (e.g. the CPU has no memory figure, a point skipped) with
  the numbers. Then, for reference (no bar): D = 16 and 32, poly and sdpa against fla's Taylor kernels
  fla.ops.based.parallel_based and fused_chunk_based (its K <= 16 only) when fla imports (from
  --fla-path: fla's package folder or the folder holding it; default third_party/fla when it exists;
  --no-fla skips it; fla missing or failing to import is reported, not an error), and poly and sdpa at
  D = 128; forward and forward+backward at the bar lengths 8192, 16384, 65536. fla's Taylor kernels
  compute the same function as poly's default (f(x) = 1 + x + x^2/2, scale K^-1/2, normalized, [B, T, H, K]);
  the largest difference of their outputs from poly's at the first length is recorded.
  --bar-lengths T8K,T16K,T64K,T256K, --bar-heads, --bar-dim, --bar-fla-dims, --bar-big-dim change the
  bars' shapes (for a quick run on the CPU interpreter; the linear bar's band is then 0.9x..1.1x of
  T64K/T16K). Exit status 1 when a bar fails or is not measured.

Exit status: 0 when the run completed (OOM and skipped points included); 1 with --bars when a bar did not
pass; 2 for a bad command line.
"""

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tools"))  # run_record, also when imported as a module

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from run_record import device_name, first_line, git_commit  # noqa: E402

METHODS = ("poly", "linear", "sdpa")
MODES = ("fwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
POLY_COEFFS = {"a": 1.0, "b": 1.0, "c": 0.5, "normalize": True}
DEFAULT_LENGTHS_CUDA = [1024 << i for i in range(11)]  # 1K .. 1M
DEFAULT_LENGTHS_CPU = [64, 128, 256]                   # the interpreter: tiny shapes only
BAR_LENGTHS = (8192, 16384, 65536, 262144)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- the methods -------------------------------------------------------------------------------------------

class Unsupported(Exception):
    """A method that cannot run at this shape (recorded as an error point, not raised)."""


def import_fla(fla_path):
    """fla.ops.based from fla's package folder (or the folder holding it). fla's package __init__ imports
    every layer and model (einops, transformers...): when that fails, fla and fla.ops are stubbed as bare
    namespaces so only the based ops and what they import are loaded. Returns (module, None) or
    (None, reason)."""
    fla_dir = Path(fla_path).resolve()
    if fla_dir.name != "fla" or not (fla_dir / "ops").is_dir():
        fla_dir = fla_dir / "fla"
    if not (fla_dir / "ops" / "based").is_dir():
        return None, f"no fla/ops/based under {fla_path}"
    sys.path.insert(0, str(fla_dir.parent))
    try:
        import fla.ops.based as based
        return based, None
    except Exception:  # noqa: BLE001 - retried below without fla's package __init__ files
        pass
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]
    for name, path in (("fla", fla_dir), ("fla.ops", fla_dir / "ops")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        mod.__version__ = "0"
        sys.modules[name] = mod
    try:
        import fla.ops.based as based
        return based, None
    except Exception as exc:  # noqa: BLE001 - fla missing is reported, not an error
        return None, f"{type(exc).__name__}: {exc}"


def make_fn(method, B, H, D, T, dtype, device, grad, fla=None):
    """The call to time: a closure that runs one forward (and, with grad, one backward). Inputs are made
    here, outside the timing; returns (call, tensors held) ."""
    gen = torch.Generator(device=device).manual_seed(1234)
    sdpa_layout = method == "sdpa"
    shape = (B, H, T, D) if sdpa_layout else (B, T, H, D)

    def randn():
        return torch.randn(*shape, device=device, dtype=torch.float32, generator=gen)

    q, k, v = randn(), randn(), randn()
    if method == "linear":
        q, k = F.elu(q) + 1, F.elu(k) + 1
    q, k, v = (t.to(dtype) for t in (q, k, v))
    do = randn().to(dtype) if grad else None
    leaves = (q, k, v)
    if grad:
        for t in leaves:
            t.requires_grad_(True)

    if method == "poly":
        import linac

        def forward():
            return linac.poly(q, k, v, **POLY_COEFFS)
    elif method == "linear":
        import linac

        def forward():
            return linac.chunk_linear_attn(q, k, v, normalize=True)[0]
    elif method == "sdpa":
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif method == "fla_parallel_based":
        def forward():
            return fla.parallel_based(q, k, v, use_norm=True)
    elif method == "fla_fused_chunk_based":
        if D > 16:
            raise Unsupported(f"fused_chunk_based takes head dims up to 16 (fla's assert); D = {D}")

        def forward():
            return fla.fused_chunk_based(q, k, v, use_norm=True)
    else:
        raise ValueError(method)

    if grad:
        def call():
            for t in leaves:
                t.grad = None
            forward().backward(do)
    else:
        def call():
            with torch.no_grad():
                forward()
    return call, (q, k, v, do), forward


class SdpaFlashOnly:
    """On CUDA, SDPA restricted to the flash backend (a missing kernel raises instead of falling back)."""

    def __init__(self, device):
        self.ctx = None
        if device == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            self.ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False


# --- one point ---------------------------------------------------------------------------------------------

def is_oom(exc):
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "out of gpu memory" in text


def release(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure(call, device, warmup, iters, max_seconds):
    """Median ms of up to `iters` timed calls after `warmup` calls, stopping once `max_seconds` of wall
    time have passed (at least one timed call). Returns (ms, peak_bytes, held_bytes, calls timed,
    over budget)."""
    start_wall = time.perf_counter()
    for _ in range(warmup):
        call()
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        gc.collect()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start_wall > max_seconds:
            break
    peak = torch.cuda.max_memory_allocated() - held if cuda else None
    over = time.perf_counter() - start_wall > max_seconds
    return statistics.median(times), peak, (held if cuda else None), len(times), over


class Runner:
    """Runs points, keeps the per-series skip state and the JSON up to date."""

    def __init__(self, args, device, dtype, fla=None):
        self.args = args
        self.device = device
        self.dtype = dtype
        self.fla = fla
        self.points = []
        self.bars = None
        self.extra = {}
        self.stopped = {}   # series -> why its larger T are skipped
        self.start = time.perf_counter()
        self.header = run_header(args, device)

    def point(self, method, mode, B, H, D, T, warmup=None, iters=None):
        args = self.args
        series = (method, mode, B, H, D)
        p = {"method": method, "mode": mode, "B": B, "H": H, "D": D, "T": T, "ms": None, "peak_bytes": None,
             "held_bytes": None, "iters": 0, "status": "ok", "detail": ""}
        prior = [q for q in self.points if (q["method"], q["mode"], q["B"], q["H"], q["D"]) == series
                 and q["status"] == "ok" and q["T"] < T]
        estimate = extrapolate(prior, T)
        warmup = args.warmup if warmup is None else warmup
        if series in self.stopped:
            p["status"], p["detail"] = "skipped", self.stopped[series]
        elif args.total_seconds and time.perf_counter() - self.start > args.total_seconds:
            p["status"], p["detail"] = "skipped", f"the run passed --total-seconds {args.total_seconds:g}"
        elif estimate is not None and estimate * (warmup + 1) / 1e3 > args.max_seconds:
            p["status"] = "skipped"
            p["detail"] = (f"predicted {estimate / 1e3:.1f} s per call from T = {prior[-1]['T']}: "
                           f"over --max-seconds {args.max_seconds:g}")
            self.stopped[series] = f"a smaller T was predicted over --max-seconds {args.max_seconds:g}"
        else:
            self.run_point(p, series, warmup, args.iters if iters is None else iters)
        self.points.append(p)
        self.report(p)
        self.write()
        return p

    def run_point(self, p, series, warmup, iters):
        method, mode, B, H, D, T = (p[key] for key in ("method", "mode", "B", "H", "D", "T"))
        call = held = None
        try:
            call, held, _ = make_fn(method, B, H, D, T, self.dtype, self.device, mode == "fwdbwd", self.fla)
            with SdpaFlashOnly(self.device):
                ms, peak, held_bytes, n, over = measure(call, self.device, warmup, iters, self.args.max_seconds)
            p.update(ms=ms, peak_bytes=peak, held_bytes=held_bytes, iters=n)
            if over:
                p["detail"] = f"over --max-seconds {self.args.max_seconds:g} (timed {n} of {iters} calls)"
                self.stopped[series] = f"T = {T} took over --max-seconds {self.args.max_seconds:g}"
        except Unsupported as exc:
            p["status"], p["detail"] = "error", str(exc)
            self.stopped[series] = str(exc)
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
            if is_oom(exc):
                p["status"], p["detail"] = "oom", first_line(exc)
                self.stopped[series] = f"out of memory at T = {T}"
            else:
                p["status"], p["detail"] = "error", f"{type(exc).__name__}: {first_line(exc)}"
        finally:
            call = held = None  # noqa: F841 - the inputs go before the cache is emptied
            release(self.device)

    def report(self, p):
        what = f"{p['method']:>22} {p['mode']:>6} B={p['B']} H={p['H']} D={p['D']:<3} T={p['T']:<8}"
        if p["status"] == "ok":
            mem = "" if p["peak_bytes"] is None else f"  peak +{p['peak_bytes'] / 2**20:.1f} MiB"
            log(f"{what} {p['ms']:10.3f} ms{mem}  ({p['iters']} calls){'  ' + p['detail'] if p['detail'] else ''}")
        else:
            log(f"{what} {p['status']}: {p['detail']}")

    def write(self):
        doc = dict(self.header)
        doc["points"] = self.points
        if self.bars is not None:
            doc["bars"] = self.bars
        doc.update(self.extra)
        path = Path(self.args.json)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(path)


def extrapolate(prior, T):
    """The ms of the next point from the series' last two ok points (growth exponent between 1 and 2:
    no method here grows faster than softmax attention's T^2; two noisy points on a loaded machine
    gave exponents near 10, which skipped a point the run had time for), or None with fewer than one."""
    if not prior:
        return None
    last = prior[-1]
    p = 1.0
    if len(prior) >= 2 and prior[-2]["ms"] > 0 and last["ms"] > 0 and last["T"] != prior[-2]["T"]:
        p = min(2.0, max(1.0, math.log(last["ms"] / prior[-2]["ms"]) / math.log(last["T"] / prior[-2]["T"])))
    return last["ms"] * (T / last["T"]) ** p


def run_header(args, device):
    settings = {key: getattr(args, key) for key in
                ("methods", "modes", "lengths", "batch", "heads", "dims", "dtype", "iters", "warmup",
                 "max_seconds", "total_seconds", "bars")}
    settings["device"] = device
    settings["poly"] = POLY_COEFFS
    settings["linear"] = {"normalize": True}
    settings["sdpa"] = {"is_causal": True, "backend": "flash" if device == "cuda" else "default"}
    if args.bars:
        settings.update(bar_lengths=args.bar_lengths, bar_heads=args.bar_heads, bar_dim=args.bar_dim,
                        bar_fla_dims=args.bar_fla_dims, bar_big_dim=args.bar_big_dim)
    return {"benchmark": "bench_poly_scaling", "device": device_name(device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "commit": git_commit(), "settings": settings}


# --- the sweep (Figure 1) ----------------------------------------------------------------------------------

def sweep(runner):
    """T outermost: a run cut short by --total-seconds (or by the device call's limit) still has every
    method up to the same length."""
    a = runner.args
    for T in a.lengths:
        for mode in a.modes:
            for method in a.methods:
                for B in a.batch:
                    for D in a.dims:
                        runner.point(method, mode, B, a.heads, D, T)
    order = {name: i for i, name in enumerate(MODES + METHODS)}
    print_table(sorted(runner.points, key=lambda p: (order[p["mode"]], order[p["method"]], p["B"], p["D"], p["T"])))


def print_table(points):
    print(f"{'method':>22} {'mode':>6} {'B':>2} {'H':>3} {'D':>3} {'T':>8} {'ms':>11} {'peak MiB':>9}  status")
    for p in points:
        ms = f"{p['ms']:.3f}" if p["ms"] is not None else "-"
        mem = f"{p['peak_bytes'] / 2**20:.1f}" if p["peak_bytes"] is not None else "-"
        status = p["status"] if p["status"] == "ok" and not p["detail"] else f"{p['status']}: {p['detail']}"
        print(f"{p['method']:>22} {p['mode']:>6} {p['B']:>2} {p['H']:>3} {p['D']:>3} {p['T']:>8} {ms:>11} {mem:>9}  "
              f"{status}")


# --- the bars (issue 20, point 4) --------------------------------------------------------------------------

def bars(runner):
    a = runner.args
    t8, t16, t64, t256 = a.bar_lengths
    B, H, D = 1, a.bar_heads, a.bar_dim
    ok = {}
    for mode in MODES:
        for method in ("poly", "sdpa"):
            for T in (t8, t16, t64):
                ok[(method, mode, T)] = runner.point(method, mode, B, H, D, T)
    # One call is enough for the memory; its time is recorded too.
    big = runner.point("poly", "fwdbwd", B, H, D, t256, warmup=1, iters=1)

    def ms(method, mode, T):
        p = ok[(method, mode, T)]
        return p["ms"] if p["status"] == "ok" else None

    def why(*keys):
        return "; ".join(f"{m} {mo} T={T}: {ok[(m, mo, T)]['status']} {ok[(m, mo, T)]['detail']}".strip()
                         for m, mo, T in keys if ok[(m, mo, T)]["status"] != "ok")

    results = []

    def bar(name, claim, passed, detail, **numbers):
        results.append({"name": name, "claim": claim, "passed": passed, "detail": detail, **numbers})

    # Time bars.
    p8, s8 = ms("poly", "fwd", t8), ms("sdpa", "fwd", t8)
    if p8 and s8:
        bar("fwd_8k", f"poly fwd <= sdpa fwd at T={t8}", p8 <= s8,
            f"poly {p8:.3f} ms, sdpa {s8:.3f} ms (poly/sdpa {p8 / s8:.2f})", poly_ms=p8, sdpa_ms=s8)
    else:
        bar("fwd_8k", f"poly fwd <= sdpa fwd at T={t8}", None, why(("poly", "fwd", t8), ("sdpa", "fwd", t8)))
    for mode, factor, name in (("fwd", 5.0, "fwd_64k_5x"), ("fwdbwd", 3.0, "fwdbwd_64k_3x")):
        claim = f"poly {mode} >= {factor:g}x faster than sdpa at T={t64}"
        p, s = ms("poly", mode, t64), ms("sdpa", mode, t64)
        if p and s:
            bar(name, claim, s / p >= factor, f"poly {p:.3f} ms, sdpa {s:.3f} ms: {s / p:.2f}x", poly_ms=p, sdpa_ms=s,
                speedup=s / p)
        else:
            bar(name, claim, None, why(("poly", mode, t64), ("sdpa", mode, t64)))
    ratio = t64 / t16
    lo, hi = 0.9 * ratio, 1.1 * ratio
    for mode in MODES:
        claim = f"poly {mode} time(T={t64}) / time(T={t16}) in [{lo:.2f}, {hi:.2f}]"
        p16, p64 = ms("poly", mode, t16), ms("poly", mode, t64)
        if p16 and p64:
            r = p64 / p16
            bar(f"linear_{mode}", claim, lo <= r <= hi, f"{p64:.3f} ms / {p16:.3f} ms = {r:.2f}", ratio=r,
                ms_short=p16, ms_long=p64)
        else:
            bar(f"linear_{mode}", claim, None, why(("poly", mode, t16), ("poly", mode, t64)))
    # Memory bar: the device's peak (inputs held included) against q, k, v, o, do, dq, dk, dv.
    nbytes = 8 * B * t256 * H * D * torch.empty((), dtype=runner.dtype).element_size()
    claim = f"poly fwdbwd peak memory at T={t256} <= 3x the bytes of q,k,v,o,do,dq,dk,dv ({nbytes / 2**20:.1f} MiB)"
    if big["status"] == "ok" and big["peak_bytes"] is not None:
        total = big["held_bytes"] + big["peak_bytes"]
        bar("memory_256k", claim, total <= 3 * nbytes,
            f"peak {total / 2**20:.1f} MiB = {total / nbytes:.2f}x the tensors' {nbytes / 2**20:.1f} MiB "
            f"(time {big['ms']:.3f} ms)", peak_total_bytes=total, tensor_bytes=nbytes)
    elif big["status"] == "ok":
        bar("memory_256k", claim, None, f"no memory figure on {runner.device} (time {big['ms']:.3f} ms)")
    else:
        bar("memory_256k", claim, None, f"{big['status']}: {big['detail']}")
    runner.bars = results
    runner.write()

    # For reference: fla's Taylor kernels at small head dims, and D = 128.
    reference = {"fla": None}
    if runner.fla is None:
        reference["fla"] = f"not run: {runner.fla_reason}"
    for Dr in list(a.bar_fla_dims) + [a.bar_big_dim]:
        methods = ["poly", "sdpa"]
        if runner.fla is not None and Dr in a.bar_fla_dims:
            methods += ["fla_parallel_based", "fla_fused_chunk_based"]
        for mode in MODES:
            for method in methods:
                for T in (t8, t16, t64):
                    runner.point(method, mode, B, H, Dr, T)
    if runner.fla is not None:
        reference["fla"] = "imported"
        reference["fla_vs_poly_max_abs_diff"] = {}
        for Dr in a.bar_fla_dims:
            for method in ("fla_parallel_based", "fla_fused_chunk_based"):
                key = f"{method}_D{Dr}"
                reference["fla_vs_poly_max_abs_diff"][key] = compare_outputs(runner, method, B, H, Dr, t8)
    runner.extra["reference"] = reference
    runner.write()

    print_table(runner.points)
    print()
    print(f"issue 20 bars: B={B} H={H} D={D} {a.dtype} on {runner.header['device']}")
    for r in results:
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[r["passed"]]
        print(f"  {verdict:<12} {r['name']:<14} {r['claim']}: {r['detail']}")
    if reference["fla"] != "imported":
        print(f"  fla: {reference['fla']}")
    else:
        for key, diff in reference["fla_vs_poly_max_abs_diff"].items():
            print(f"  {key} vs poly at T={t8}: max |difference| {diff}")
    return all(r["passed"] for r in results)


def compare_outputs(runner, method, B, H, D, T):
    """Largest |fla's output - poly's| on the same inputs (a check that the two compute one function)."""
    try:
        _, (q, k, v, _), fla_forward = make_fn(method, B, H, D, T, runner.dtype, runner.device, False, runner.fla)
        import linac
        with torch.no_grad():
            diff = (fla_forward().float() - linac.poly(q, k, v, **POLY_COEFFS).float()).abs().max().item()
        return diff
    except Exception as exc:  # noqa: BLE001 - recorded
        return f"{type(exc).__name__}: {first_line(exc)}"
    finally:
        release(runner.device)


# --- command line ------------------------------------------------------------------------------------------

def int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(x <= 0 for x in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def choice_list(choices):
    def parse(text):
        values = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in values if x not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return values
    return parse


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", type=choice_list(METHODS), default=list(METHODS),
                    help="comma-separated, of poly, linear, sdpa (default all)")
    ap.add_argument("--modes", type=choice_list(MODES), default=list(MODES), help="fwd, fwdbwd (default both)")
    ap.add_argument("--lengths", type=int_list, default=None,
                    help="sequence lengths T, ascending (default 1024..1048576 doubling on CUDA; 64,128,256 on "
                         "the CPU)")
    ap.add_argument("--batch", type=int_list, default=[1, 4], help="batch sizes B (default 1,4)")
    ap.add_argument("--heads", type=int, default=16, help="heads H (default 16)")
    ap.add_argument("--dims", type=int_list, default=[64], help="head dims D, e.g. 32,64 (default 64)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 on CUDA, fp32 on the CPU")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default cuda when torch sees a GPU, else cpu (linac's interpreter: tiny shapes)")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per point (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    ap.add_argument("--max-seconds", type=float, default=30.0,
                    help="wall-time budget of one point (default 30); see above")
    ap.add_argument("--total-seconds", type=float, default=None,
                    help="start no point after the run has taken this long (default: no limit)")
    ap.add_argument("--json", default=None, help="output JSON (default $OUT/poly_scaling.json or ./poly_scaling.json)")
    ap.add_argument("--bars", action="store_true", help="issue 20's bars instead of the sweep")
    ap.add_argument("--bar-lengths", type=int_list, default=list(BAR_LENGTHS),
                    help="the bars' T = 8K, 16K, 64K, 256K roles (default 8192,16384,65536,262144)")
    ap.add_argument("--bar-heads", type=int, default=8, help="the bars' H (default 8)")
    ap.add_argument("--bar-dim", type=int, default=64, help="the bars' D (default 64)")
    ap.add_argument("--bar-fla-dims", type=int_list, default=[16, 32], help="D against fla's based ops (16,32)")
    ap.add_argument("--bar-big-dim", type=int, default=128, help="poly's large head dim (default 128)")
    ap.add_argument("--fla-path", default=None, help="fla's package folder (default third_party/fla if present)")
    ap.add_argument("--no-fla", action="store_true", help="do not try to import fla")
    args = ap.parse_args(argv)

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if args.lengths is None:
        args.lengths = DEFAULT_LENGTHS_CUDA if args.device == "cuda" else DEFAULT_LENGTHS_CPU
    if args.lengths != sorted(set(args.lengths)):
        ap.error(f"--lengths must be ascending without repeats (larger T are skipped after an OOM); "
                 f"got {args.lengths}")
    for name in ("heads", "iters", "bar_heads", "bar_dim", "bar_big_dim"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0; got {args.warmup}")
    if args.max_seconds <= 0:
        ap.error(f"--max-seconds must be positive; got {args.max_seconds}")
    if len(args.bar_lengths) != 4:
        ap.error(f"--bar-lengths takes four lengths (the 8K, 16K, 64K and 256K roles); got {args.bar_lengths}")
    if args.json is None:
        name = "poly_bars.json" if args.bars else "poly_scaling.json"
        args.json = str(Path(os.environ["OUT"]) / name) if os.environ.get("OUT") else name
    if not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist")
    if args.fla_path is None and (REPO / "third_party" / "fla").is_dir():
        args.fla_path = str(REPO / "third_party" / "fla")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import linac  # noqa: F401 - fail early, with linac's own message, before any point runs
        linac.describe("poly")
    except Exception as exc:  # noqa: BLE001
        print(f"bench_poly_scaling: error: linac does not load: {type(exc).__name__}: {first_line(exc)}",
              file=sys.stderr)
        return 1
    device, dtype = args.device, DTYPES[args.dtype]
    fla, fla_reason = None, None
    if args.bars:
        if args.no_fla:
            fla_reason = "--no-fla"
        elif args.fla_path is None:
            fla_reason = "no --fla-path and no third_party/fla"
        elif device != "cuda":
            fla_reason = "fla's kernels are Triton: they need CUDA"
        else:
            fla, fla_reason = import_fla(args.fla_path)
    runner = Runner(args, device, dtype, fla)
    runner.fla_reason = fla_reason
    log(f"bench_poly_scaling: {runner.header['device']}, torch {torch.__version__}, {args.dtype}; "
        f"JSON -> {args.json}")
    if args.bars:
        passed = bars(runner)
        print(f"wrote {args.json}")
        return 0 if passed else 1
    sweep(runner)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
