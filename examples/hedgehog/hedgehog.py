#!/usr/bin/env python3
"""Hedgehog linear attention from Python: hedgehog_op.cpp compiled and loaded with linac.load, checked
against a float64 token-by-token reference (CPU: the interpreter, f32; GPU: bf16 too).

  python3 examples/hedgehog/hedgehog.py [--device cpu|cuda] [--B 2 --T 200 --H 4 --K 64 --V 64 --F 32]
"""
import argparse, math, sys
from pathlib import Path

import torch

import linac


def reference(q, k, v, w):
    """phi(x) = [softmax(x W_h), softmax(-x W_h)]; S_t, z_t summed token by token; o_t = phi(q_t) S_t /
    (phi(q_t) . z_t); in float64."""
    def phi(x):
        xw = torch.einsum("bhk,hkf->bhf", x.double(), w.double())
        return torch.cat([xw.softmax(-1), (-xw).softmax(-1)], -1)
    B, T, H, _ = q.shape
    S = torch.zeros(B, H, 2 * w.shape[-1], v.shape[-1], dtype=torch.float64)
    z = torch.zeros(B, H, 2 * w.shape[-1], dtype=torch.float64)
    out = []
    for t in range(T):
        pk, pq = phi(k[:, t]), phi(q[:, t])
        S, z = S + pk[..., None] * v[:, t].double()[..., None, :], z + pk
        out.append(torch.einsum("bhd,bhdv->bhv", pq, S) / (pq * z).sum(-1, keepdim=True))
    return torch.stack(out, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for dim, default in (("B", 2), ("T", 200), ("H", 4), ("K", 64), ("V", 64), ("F", 32)):
        ap.add_argument(f"--{dim}", type=int, default=default)
    a = ap.parse_args()
    hedgehog = linac.load(Path(__file__).with_name("hedgehog_op.cpp")).hedgehog
    q, k, v = (torch.randn(a.B, a.T, a.H, d) for d in (a.K, a.K, a.V))
    w = torch.randn(a.H, a.K, a.F) / math.sqrt(a.K)
    ref = reference(q, k, v, w)
    ok = True
    for dtype, tol in [(torch.float32, 1e-5)] + ([(torch.bfloat16, 2e-2)] if a.device == "cuda" else []):
        o = hedgehog(*(x.to(a.device, dtype) for x in (q, k, v, w)))
        err = ((o.double().cpu() - ref).abs().max() / ref.abs().max()).item()
        print(f"hedgehog {a.device} {str(dtype)[6:]}: max |o - ref| / max |ref| = {err:.2e} (tolerance {tol:g})")
        ok &= err < tol
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
