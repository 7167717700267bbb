#!/usr/bin/env python3
"""Every library op once per form at a small shape, through linac's PyTorch ops: the workload that
compute-sanitizer checks (issue 23, point 8). Each call is followed by a synchronisation, so that a
sanitizer report names the call that caused it (the call is printed before it runs).

  compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_ops.py
  compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_ops.py
  python3 tools/sanitize_ops.py --device cpu          # the same calls on the interpreter (a dry run)
  compute-sanitizer --tool racecheck python3 tools/sanitize_ops.py --only "linear_attn gated" --chunk-size 128
                                                      # one op, its chunked forms at a chunk size

Forms: the chunked forward, forward+backward (gradients of every input, the initial state included),
the token-by-token forward, and a varlen forward+backward (two packed sequences of unequal length, one
not a multiple of the chunk), for linear_attn (plain, gated, normalized), gla, delta_rule,
gated_delta_rule and poly. Default configurations: run with LINAC_AUTOTUNE=0 (the script sets it).
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LINAC_AUTOTUNE", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import linac  # noqa: E402


def cases():
    """(name, function, needs: gate kind, beta)."""
    return [
        ("linear_attn", linac.chunk_simple_gla, linac.fused_recurrent_simple_gla, None, False, {}),
        ("linear_attn gated", linac.chunk_simple_gla, linac.fused_recurrent_simple_gla, "head", False, {}),
        ("linear_attn normalized", linac.chunk_linear_attn, None, None, False, {"normalize": True}),
        ("gla", linac.chunk_gla, linac.fused_recurrent_gla, "key", False, {}),
        ("delta_rule", linac.chunk_delta_rule, linac.fused_recurrent_delta_rule, None, True, {}),
        ("gated_delta_rule", linac.chunk_gated_delta_rule, linac.fused_recurrent_gated_delta_rule, "head", True, {}),
    ]


def inputs(B, T, H, D, gate, beta, device, dtype, grad, states=True):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, generator=gen).to(device)

    q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
    if beta:
        k = F.normalize(k, dim=-1)
    args = [q.to(dtype), k.to(dtype), v.to(dtype)]
    named = {}
    if gate == "head":
        named["g"] = F.logsigmoid(rnd(B, T, H))
    elif gate == "key":
        named["g"] = F.logsigmoid(rnd(B, T, H, D)).clamp(min=-5)
    if beta:
        named["beta"] = torch.rand(B, T, H, generator=gen).to(device).sigmoid()
    h0 = rnd(B, H, D, D) * 0.1 if states else None
    for t in args + list(named.values()) + ([h0] if h0 is not None else []):
        t.requires_grad_(grad)
    return (args, named), h0


def call(fn, args, h0, extra):
    args, named = args
    # fla's token-by-token GLA names its per-key gate gk.
    kw = {("gk" if k == "g" and fn is linac.fused_recurrent_gla else k): t for k, t in named.items()}
    kw.update(extra)
    if h0 is not None:
        kw.update(initial_state=h0, output_final_state=True)
    return fn(*args, **kw)


def run_case(label, fn, device):
    print(f"  {label}", flush=True)
    t0 = time.time()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--T", type=int, default=200, help="tokens per sequence (not a multiple of the chunk)")
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--only", help="run only the op whose name starts with this (e.g. poly, gla, 'linear_attn gated')")
    ap.add_argument("--chunk-size", type=int, help="chunk_size for the chunked forms (default: the op's own)")
    args = ap.parse_args()
    device, D = args.device, args.D
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if device == "cpu":
        dtype = torch.float32  # the interpreter's dry run: small and exact
    B, T, H = 2, args.T, 2
    calls = 0
    for name, chunk, recurrent, gate, beta, extra in cases():
        if args.only and not name.startswith(args.only):
            continue
        states = name != "linear_attn normalized"
        chunked = dict(extra, chunk_size=args.chunk_size) if args.chunk_size else extra
        print(name, flush=True)
        a, h0 = inputs(B, T, H, D, gate, beta, device, dtype, grad=False, states=states)
        with torch.no_grad():
            run_case("chunked forward", lambda: call(chunk, a, h0, chunked), device)
            calls += 1
            if recurrent is not None:
                run_case("token-by-token forward", lambda: call(recurrent, a, h0, extra), device)
                calls += 1
        a, h0 = inputs(B, T, H, D, gate, beta, device, dtype, grad=True, states=states)

        def fwd_bwd(a=a, h0=h0):
            o, ht = call(chunk, a, h0, chunked)
            loss = o.float().square().sum() + (ht.square().sum() if ht is not None else 0)
            loss.backward()

        run_case("chunked forward + backward", fwd_bwd, device)
        calls += 1
        # Varlen: B = 1, two sequences of T and T // 3 + 5 tokens packed.
        lens = [T, T // 3 + 5]
        a, h0 = inputs(1, sum(lens), H, D, gate, beta, device, dtype, grad=True, states=False)
        cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=device)
        if states:
            h0 = (torch.randn(2, H, D, D) * 0.1).to(device).requires_grad_(True)

        def varlen(a=a, h0=h0, cu=cu):
            kw = dict(chunked, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
            if h0 is not None:
                kw.update(initial_state=h0, output_final_state=True)
            o, ht = call(chunk, a, None, kw)
            loss = o.float().square().sum() + (ht.square().sum() if ht is not None else 0)
            loss.backward()

        run_case("varlen forward + backward", varlen, device)
        calls += 1
    if not args.only or "poly".startswith(args.only):
        print("poly", flush=True)
        a, _ = inputs(B, T, H, 16, None, False, device, dtype, grad=True, states=False)
        run_case("forward + backward", lambda: linac.poly(*a[0]).float().square().sum().backward(), device)
        calls += 1
    print(f"done: {calls} calls on {device}")


if __name__ == "__main__":
    main()
