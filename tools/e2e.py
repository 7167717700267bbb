#!/usr/bin/env python3
"""The main job: every op of the library, compiled and run through `linac run` on random inputs (on
the GPU when one is usable, else the CPU interpreter), checked against the float64 references of
tests/python/reference.py. Prints one table row per case and exits non-zero if any case fails.

  python3 tools/e2e.py [--device cpu|cuda|auto] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
import reference  # noqa: E402

LINAC = os.environ.get("LINAC_BIN", str(ROOT / "build" / "linac"))


def gpu_usable() -> bool:
    """A GPU is used when the CLI can run a tiny case on it."""
    with tempfile.TemporaryDirectory() as d:
        x = np.ones((1, 16, 1, 16), np.float32)
        for n in "qkv":
            np.save(f"{d}/{n}.npy", x)
        r = subprocess.run([LINAC, "run", "linear_attn", f"q={d}/q.npy", f"k={d}/k.npy", f"v={d}/v.npy",
                            "-o", f"o={d}/o.npy", "--device", "cuda"], capture_output=True, text=True)
        return r.returncode == 0


def cases():
    """(name, dtype, inputs, options) for linear_attn: plain, gated, states, varlen, odd head dims."""
    rng = np.random.default_rng(0)

    def qkv(B, T, H, K, V):
        return (rng.standard_normal((B, T, H, K)).astype(np.float32),
                rng.standard_normal((B, T, H, K)).astype(np.float32),
                rng.standard_normal((B, T, H, V)).astype(np.float32))

    def gate(B, T, H):
        return np.log(1 / (1 + np.exp(-(rng.standard_normal((B, T, H)) + 3)))).astype(np.float32)

    for dtype in ("fp32", "bf16"):
        q, k, v = qkv(2, 300, 4, 64, 64)
        yield "plain B2 T300 H4 D64", dtype, dict(q=q, k=k, v=v), []
        yield "gated B2 T300 H4 D64", dtype, dict(q=q, k=k, v=v, g=gate(2, 300, 4)), []
        q, k, v = qkv(1, 130, 2, 48, 100)
        s0 = rng.standard_normal((4, 2, 48, 100)).astype(np.float32)
        cu = np.array([0, 1, 17, 80, 130], np.int32)
        yield "varlen+state K48 V100", dtype, dict(q=q, k=k, v=v, g=gate(1, 130, 2), initial_state=s0,
                                                   cu_seqlens=cu), ["final_state"]


def run_case(device, name, dtype, inputs, extra_outputs):
    with tempfile.TemporaryDirectory() as d:
        args = [LINAC, "run", "linear_attn"]
        for n, a in inputs.items():
            np.save(f"{d}/{n}.npy", a)
            args.append(f"{n}={d}/{n}.npy")
        for n in ["o"] + extra_outputs:
            args += ["-o", f"{n}={d}/{n}.npy"]
        args += ["--device", device, "--dtype", dtype]
        t0 = time.perf_counter()
        r = subprocess.run(args, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            return None, wall, r.stderr.strip()
        outs = {n: np.load(f"{d}/{n}.npy") for n in ["o"] + extra_outputs}
    ref_in = dict(inputs)
    if dtype == "bf16":  # the reference sees the same rounded inputs as the kernel
        for n in "qkv":
            ref_in[n] = reference.round_to_bf16(ref_in[n])
    o_ref, s_ref = reference.linear_attn(**ref_in)
    errs = [reference.rel_err(outs["o"], o_ref)]
    if "final_state" in outs:
        errs.append(reference.rel_err(outs["final_state"], s_ref))
    return max(errs), wall, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--json")
    a = ap.parse_args()
    device = a.device
    if device == "auto":
        device = "cuda" if gpu_usable() else "cpu"
    print(f"linac end-to-end over the kernel library on {device} "
          f"({'GPU' if device == 'cuda' else 'CPU interpreter'})")
    print(f"{'op':<12} {'case':<24} {'dtype':<5} {'rel err':>9} {'bound':>7} {'wall s':>7}  result")
    rows, failed = [], 0
    for name, dtype, inputs, extra in cases():
        bound = 1e-4 if dtype == "fp32" and device == "cuda" else (1e-5 if dtype == "fp32" else 2e-2)
        err, wall, msg = run_case(device, name, dtype, inputs, extra)
        ok = err is not None and np.isfinite(err) and err < bound
        failed += not ok
        status = "ok" if ok else f"FAIL {msg}"
        print(f"{'linear_attn':<12} {name:<24} {dtype:<5} {err if err is not None else float('nan'):>9.2e} "
              f"{bound:>7.0e} {wall:>7.2f}  {status}")
        rows.append(dict(op="linear_attn", case=name, dtype=dtype, rel_err=err, bound=bound, ok=ok,
                         wall_s=wall, device=device))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows) - failed}/{len(rows)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
