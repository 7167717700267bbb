#!/usr/bin/env python3
"""RetNet retention from Python: retnet_op.cpp compiled and loaded with linac.load, checked against a
float64 token-by-token reference (CPU: the interpreter, f32; GPU: bf16 too, the chunk size tuned).

  python3 examples/retnet/retnet.py [--device cpu|cuda] [--B 2 --T 200 --H 4 --K 64 --V 64]
"""
import argparse, math, sys
from pathlib import Path

import torch

import linac


def reference(q, k, v):
    """o_t = q_t S_t, S_t = gamma_h S_{t-1} + k_t^T v_t, gamma_h = 1 - 2^(-5-h), in float64."""
    B, T, H, K = q.shape
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=torch.float64)[None, :, None, None]
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(T):
        S = gamma * S + k[:, t].double()[..., None] * v[:, t].double()[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t].double(), S))
    return torch.stack(out, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for dim, default in (("B", 2), ("T", 200), ("H", 4), ("K", 64), ("V", 64)):
        ap.add_argument(f"--{dim}", type=int, default=default)
    a = ap.parse_args()
    retnet = linac.load(Path(__file__).with_name("retnet_op.cpp")).retnet
    q, k, v = (torch.randn(a.B, a.T, a.H, d) / math.sqrt(d) for d in (a.K, a.K, a.V))
    ref = reference(q, k, v)
    ok = True
    for dtype, tol in [(torch.float32, 1e-5)] + ([(torch.bfloat16, 2e-2)] if a.device == "cuda" else []):
        o = retnet(*(x.to(a.device, dtype) for x in (q, k, v)))
        err = ((o.double().cpu() - ref).abs().max() / ref.abs().max()).item()
        print(f"retnet {a.device} {str(dtype)[6:]}: max |o - ref| / max |ref| = {err:.2e} (tolerance {tol:g})")
        ok &= err < tol
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
