#!/usr/bin/env python3
"""Accuracy of linac's poly at long sequences against a float64 reference (issue 20, point 3: bf16 inputs
within 1e-2 relative error of the float64 reference at T = 64K), forward and gradients.

    python3 tools/poly_accuracy.py [-B 1] [-T 65536] [-H 8] [-D 64] [--dtype bf16] [--seed 0]
        [--a 1 --b 1 --c 0.5] [--scale X] [--no-normalize] [--no-grad] [--ref-chunk 512] [--tol 1e-2]
        [--json F]

Run from anywhere (the `linac` package is taken from this checkout's python/; liblinac from build/).

Inputs: q, k, v and do [B, T, H, D], standard normal from a CPU generator seeded with --seed (the same
numbers on every machine), rounded to --dtype. With q, k ~ N(0, 1) and the default scale D^-1/2 the score
x = scale q.k is about N(0, 1), so f(x) = a + b x + c x^2 stays O(1).

linac: o = linac.poly(q, k, v, a, b, c, scale, normalize) in --dtype on --device, then o.backward(do) for
dq, dk, dv (--no-grad: the output only).

Reference, float64, on the same device, from the *same rounded inputs* (q.to(float64) after the rounding):
chunk by chunk (--ref-chunk tokens), so linear in T. Before each chunk it holds the sums over the
tokens before it of v, k^T v, k, (k (x) k)^T v and k (x) k (the full K*K outer product, [K*K, V] per head:
2 MB at K = V = 64); a chunk's outputs are the states' part plus its own tokens' part taken directly,
f(x) on the causally masked score matrix:

    num_t = a sum_s v_s + b scale q_t S1 + c scale^2 (q_t (x) q_t) S2 + sum_{s in chunk, s <= t} f(x_ts) v_s
    den_t = a n + b scale q_t . z1 + c scale^2 (q_t (x) q_t) . z2 + sum_{s in chunk, s <= t} f(x_ts)
    o_t = num_t / (den_t + 1e-6)     (num_t without normalization)

Gradients: torch autograd through that loop in float64 (each chunk under torch.utils.checkpoint, so only
the states between chunks stay alive: T/chunk x B x H x ~2 MB, about 2 GB at T = 64K, H = 8, chunks of
512). tests/python/test_poly_accuracy_tool.py checks this reference against tests/python/reference_poly.py
(the literal float64 double sum) and its gradients against a pairwise float64 autograd at small T.

Report, per tensor (o, and dq, dk, dv unless --no-grad):
  rel        ||x - ref||_F / ||ref||_F   (the issue's relative error)
  max_ratio  max |x - ref| / max |ref|
and PASS when both are <= --tol (default 1e-2), FAIL otherwise (a non-finite value fails). Nothing is
timed.

JSON (--json; default $OUT/poly_accuracy.json when $OUT is set, else ./poly_accuracy.json): {"tool",
"device", "torch", "cuda", "date", "commit", "settings": {...}, "results": [{"tensor", "rel", "max_ratio",
"max_abs_err", "max_abs_ref", "finite", "passed"}], "passed", "error"}. Non-finite numbers are null;
"error" is null unless linac failed (its message; results are then empty).

Exit status: 0 when every tensor passes; 1 when one fails or linac fails; 2 for a bad command line.
"""

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tools"))  # run_record, also when imported as a module

import torch  # noqa: E402

from run_record import device_name, first_line, git_commit  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6  # the kernels' denominator epsilon (kPolyEps), as tests/python/reference_poly.py has it


# --- the float64 reference ---------------------------------------------------------------------------------

def _chunk_step(q, k, v, n, s0, S1, z1, S2, z2, a, b, c, scale, normalize):
    """One chunk: q, k [B, H, L, K], v [B, H, L, V]; the states sum over the n tokens before the chunk:
    s0 = sum v [B, H, V], S1 = sum k^T v [B, H, K, V], z1 = sum k [B, H, K], S2 = sum (k (x) k)^T v
    [B, H, K*K, V], z2 = sum k (x) k [B, H, K*K]. Returns the chunk's outputs and the states after it."""
    L = q.shape[2]
    x = scale * (q @ k.transpose(-1, -2))
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    f = torch.where(causal, a + b * x + c * x * x, torch.zeros((), dtype=x.dtype, device=x.device))
    qq = (q[..., :, None] * q[..., None, :]).flatten(-2)  # [B, H, L, K*K]
    kk = (k[..., :, None] * k[..., None, :]).flatten(-2)
    c2 = c * scale * scale
    num = f @ v + a * s0[:, :, None, :] + (b * scale) * (q @ S1) + c2 * (qq @ S2)
    den = f.sum(-1) + a * n + (b * scale) * (q @ z1[..., None])[..., 0] + c2 * (qq @ z2[..., None])[..., 0]
    o = num / (den + EPS)[..., None] if normalize else num
    kt = k.transpose(-1, -2)
    return (o, s0 + v.sum(2), S1 + kt @ v, z1 + k.sum(2), S2 + kk.transpose(-1, -2) @ v, z2 + kk.sum(2))


def poly_reference(q, k, v, a=1.0, b=1.0, c=0.5, scale=None, normalize=True, chunk=512):
    """poly in float64 chunk by chunk (see the module doc): q, k [B, T, H, K], v [B, T, H, V] float64
    tensors. Returns o [B, T, H, V] float64, differentiable when the inputs require grad (each chunk under
    torch.utils.checkpoint then)."""
    assert q.dtype == k.dtype == v.dtype == torch.float64, (q.dtype, k.dtype, v.dtype)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K) and v.shape == (B, T, H, V), (q.shape, k.shape, v.shape)
    scale = K ** -0.5 if scale is None else float(scale)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, .]
    zeros = dict(dtype=torch.float64, device=q.device)
    states = (torch.zeros(B, H, V, **zeros), torch.zeros(B, H, K, V, **zeros), torch.zeros(B, H, K, **zeros),
              torch.zeros(B, H, K * K, V, **zeros), torch.zeros(B, H, K * K, **zeros))
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    outs = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        args = (qh[:, :, start:end], kh[:, :, start:end], vh[:, :, start:end], start, *states,
                float(a), float(b), float(c), scale, bool(normalize))
        if grad:
            o, *states = checkpoint(_chunk_step, *args, use_reentrant=False)
        else:
            o, *states = _chunk_step(*args)
        outs.append(o)
    return torch.cat(outs, dim=2).transpose(1, 2)


# --- the comparison ----------------------------------------------------------------------------------------

def compare(name, x, ref, tol):
    """Error figures of x against the float64 ref (both on one device)."""
    diff = x.to(torch.float64) - ref
    ref_norm = ref.norm().item()
    max_abs_ref = ref.abs().max().item()
    max_abs_err = diff.abs().max().item()
    rel = diff.norm().item() / ref_norm if ref_norm > 0 else (0.0 if diff.norm().item() == 0 else math.inf)
    max_ratio = max_abs_err / max_abs_ref if max_abs_ref > 0 else (0.0 if max_abs_err == 0 else math.inf)
    finite = bool(torch.isfinite(x).all().item()) and math.isfinite(rel) and math.isfinite(max_ratio)
    return {"tensor": name, "rel": rel, "max_ratio": max_ratio, "max_abs_err": max_abs_err,
            "max_abs_ref": max_abs_ref, "finite": finite, "passed": finite and rel <= tol and max_ratio <= tol}


def inputs(args):
    """q, k, v, do [B, T, H, D] rounded to the dtype, on the device (the same numbers on every machine)."""
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.B, args.T, args.H, args.D)
    return [torch.randn(*shape, generator=gen, dtype=torch.float32).to(DTYPES[args.dtype]).to(args.device)
            for _ in range(4)]


def run_linac(args, q, k, v, do):
    """linac's o (and dq, dk, dv unless --no-grad), in the input dtype."""
    import linac
    grad = not args.no_grad
    q, k, v = (t.detach().clone().requires_grad_(grad) for t in (q, k, v))
    with torch.set_grad_enabled(grad):
        o = linac.poly(q, k, v, a=args.a, b=args.b, c=args.c, scale=args.scale, normalize=not args.no_normalize)
        if grad:
            o.backward(do)
    out = {"o": o.detach()}
    if grad:
        out.update(dq=q.grad, dk=k.grad, dv=v.grad)
    return out


def run_reference(args, q, k, v, do):
    """The float64 reference's o (and dq, dk, dv) from the same rounded inputs."""
    grad = not args.no_grad
    q, k, v, do = (t.to(torch.float64) for t in (q, k, v, do))
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    with torch.set_grad_enabled(grad):
        o = poly_reference(q, k, v, args.a, args.b, args.c, args.scale, not args.no_normalize, args.ref_chunk)
        out = {"o": o.detach()}
        if grad:
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
            out.update(dq=dq, dk=dk, dv=dv)
    return out


# --- the run -----------------------------------------------------------------------------------------------

def finite_or_none(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_json(args, results, error):
    settings = {key: getattr(args, key) for key in ("B", "T", "H", "D", "dtype", "device", "seed", "a", "b", "c",
                                                     "ref_chunk", "tol")}
    settings.update(scale=args.scale if args.scale is not None else args.D ** -0.5,
                    normalize=not args.no_normalize, grad=not args.no_grad)
    doc = {"tool": "poly_accuracy", "device": device_name(args.device), "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "commit": git_commit(), "settings": settings,
           "results": [{key: finite_or_none(val) for key, val in r.items()} for r in results],
           "passed": error is None and bool(results) and all(r["passed"] for r in results), "error": error}
    Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return doc["passed"]


def print_table(args, results):
    scale = args.scale if args.scale is not None else args.D ** -0.5
    norm = "normalized" if not args.no_normalize else "not normalized"
    print(f"poly accuracy: B={args.B} T={args.T} H={args.H} D={args.D} {args.dtype} on {device_name(args.device)}; "
          f"a={args.a:g} b={args.b:g} c={args.c:g} scale={scale:.6g} {norm}, seed {args.seed}")
    print(f"against float64 (chunks of {args.ref_chunk}, same rounded inputs); tolerance {args.tol:g} on both "
          f"figures")
    print(f"{'tensor':<7}{'rel':>12}{'max_ratio':>12}{'max_abs_err':>13}{'max_abs_ref':>13}  verdict")
    for r in results:
        print(f"{r['tensor']:<7}{r['rel']:>12.3e}{r['max_ratio']:>12.3e}{r['max_abs_err']:>13.3e}"
              f"{r['max_abs_ref']:>13.3e}  {'PASS' if r['passed'] else 'FAIL'}"
              f"{'' if r['finite'] else ' (non-finite)'}")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="poly_accuracy.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-B", type=int, default=1, help="batch (default 1)")
    ap.add_argument("-T", type=int, default=65536, help="sequence length (default 65536)")
    ap.add_argument("-H", type=int, default=8, help="heads (default 8)")
    ap.add_argument("-D", type=int, default=64, help="head dim of q, k and v (default 64)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 on CUDA, fp32 on the CPU")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default cuda when torch sees a GPU, else cpu (linac's interpreter: tiny shapes)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    ap.add_argument("--a", type=float, default=1.0, help="f's constant term (default 1)")
    ap.add_argument("--b", type=float, default=1.0, help="f's linear coefficient (default 1)")
    ap.add_argument("--c", type=float, default=0.5, help="f's quadratic coefficient (default 0.5)")
    ap.add_argument("--scale", type=float, default=None, help="score scale (default D^-1/2)")
    ap.add_argument("--no-normalize", action="store_true", help="the plain numerator (linac's normalize=False)")
    ap.add_argument("--no-grad", action="store_true", help="the output only: no backward, no dq, dk, dv")
    ap.add_argument("--ref-chunk", type=int, default=512, help="the reference's chunk length (default 512)")
    ap.add_argument("--tol", type=float, default=1e-2, help="bar for rel and max_ratio (default 1e-2)")
    ap.add_argument("--json", default=None, help="output JSON (default $OUT/poly_accuracy.json or "
                                                 "./poly_accuracy.json)")
    args = ap.parse_args(argv)

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    for name in ("B", "T", "H", "D"):
        if getattr(args, name) <= 0:
            ap.error(f"-{name} must be positive; got {getattr(args, name)}")
    if args.ref_chunk <= 0:
        ap.error(f"--ref-chunk must be positive; got {args.ref_chunk}")
    if not args.tol > 0:
        ap.error(f"--tol must be positive; got {args.tol}")
    if args.json is None:
        args.json = str(Path(os.environ["OUT"]) / "poly_accuracy.json") if os.environ.get("OUT") else \
            "poly_accuracy.json"
    if not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    q, k, v, do = inputs(args)
    try:
        got = run_linac(args, q, k, v, do)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON and the exit status
        error = f"{type(exc).__name__}: {first_line(exc)}"
        print(f"poly_accuracy: linac failed: {error}", file=sys.stderr)
        write_json(args, [], error)
        print(f"FAIL (linac failed); wrote {args.json}")
        return 1
    ref = run_reference(args, q, k, v, do)
    results = [compare(name, got[name], ref[name], args.tol) for name in got]
    print_table(args, results)
    passed = write_json(args, results, None)
    print(f"{'PASS' if passed else 'FAIL'}: {', '.join(r['tensor'] for r in results)} against tolerance "
          f"{args.tol:g}; wrote {args.json}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
