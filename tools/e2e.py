#!/usr/bin/env python3
"""The main job: every op of the library, compiled and run through `linac run` on random inputs (on
the GPU when one is usable, else the CPU interpreter), checked against the float64 references of
tests/python/reference*.py. Prints one table row per case and exits non-zero if any case fails.

  python3 tools/e2e.py [--device cpu|cuda|auto] [--ops linear_attn,gla,...] [--dtypes fp32,bf16]
                       [--json out.json]

The ops and their inputs come from `linac list`; every listed op that has a reference here is checked:

  linear_attn       plain, gated, --normalize (elu+1 q and k: a positive feature map, else q.z can be
                    ~0 and a relative error says nothing), --recurrent, varlen + initial/final state
  gla               per-channel gate, --recurrent, varlen + state
  delta_rule        pre-normalized keys, --l2norm-qk (raw q, k), --recurrent, varlen + state
  gated_delta_rule  the same, with a per-head gate
  poly              default coefficients, --no-normalize, --recurrent, varlen

and, for every op with --backward, its gradients at B1 T24 H2 K8 V8 (linear_attn gated and
--normalize; states' gradients where the op has states; for the delta rules also the training pair:
the forward writing its saved_* outputs, then --backward given them) against reference_bwd (plain linear attention)
or central finite differences of the float64 forward (the others; bf16 bound 3e-2, issue 5's);
each in fp32 and bf16 (the reference then sees the same bf16-rounded q, k, v, do; gates, betas and states
are fp32 in every kernel and stay unrounded). Inputs: q, k, v randn; gates logsigmoid(randn) ([B,T,H,K]
for gla, [B,T,H] otherwise); beta = sigmoid(randn); DeltaNet keys L2-normalized unless --l2norm-qk.
Varlen+state cases are only made for ops whose `linac list` entry has cu_seqlens (and
initial_state/final_state). A case whose switch the op rejects ("OP does not take --X") is reported
as 'skip', not as a failure; any other failed run is FAIL with the CLI's one-line error.
Bounds on ||o - ref|| / ||ref|| (and the same for final_state): fp32 1e-5 on the CPU, 1e-4 on the GPU;
bf16 2e-2.
"""
import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
import reference  # noqa: E402

LINAC = os.environ.get("LINAC_BIN", str(ROOT / "build" / "linac"))
CASE_TIMEOUT_S = 600
# The forward's saved intermediates (delta rules), and e2e's own marker in a case's switches for the
# training pair (the forward writing them, then --backward given them); never passed to the CLI.
SAVED = ("saved_w", "saved_t", "saved_h", "saved_v_new")
TRAINING_PAIR = "(saved pair)"


def gpu_usable() -> bool:
    """A GPU is used when the CLI can run a tiny case on it."""
    with tempfile.TemporaryDirectory() as d:
        x = np.ones((1, 16, 1, 16), np.float32)
        for n in "qkv":
            np.save(f"{d}/{n}.npy", x)
        try:
            r = subprocess.run([LINAC, "run", "linear_attn", f"q={d}/q.npy", f"k={d}/k.npy", f"v={d}/v.npy",
                                "-o", f"o={d}/o.npy", "--device", "cuda"], capture_output=True, text=True,
                               timeout=CASE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0


def list_ops():
    """Parses `linac list`: {op: {"inputs": {name: (shape, optional)}, "outputs": {name: (shape, optional)}}}."""
    r = subprocess.run([LINAC, "list"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"`{LINAC} list` failed (exit {r.returncode}): {r.stderr.strip()[:300]}")
    ops, cur = {}, None
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            cur = ops.setdefault(line.split()[0], {"inputs": {}, "outputs": {}})
            continue
        m = re.match(r"\s+(in|out)\s+(\S+)\s+(\S+)\s*(.*)$", line)
        if m and cur is not None:
            kind, name, shape, desc = m.groups()
            cur["inputs" if kind == "in" else "outputs"][name] = (shape, "(optional)" in desc)
    return ops


# ---------------------------------------------------------------------------------------------------
# References. Each takes the inputs (dict of arrays, bf16-rounded where the kernel rounds) and the case's
# switches and returns {"o": ..., "final_state": ...} (final_state only where the op has one).


def _ref_module(name):
    return importlib.import_module(name)


def ref_linear_attn(inp, opts):
    if "--normalize" in opts:
        rp = _ref_module("reference_poly")
        return {"o": rp.linear_attn_normalized(inp["q"], inp["k"], inp["v"], g=inp.get("g"),
                                               cu_seqlens=inp.get("cu_seqlens"))}
    o, s = reference.linear_attn(**inp)
    return {"o": o, "final_state": s}


def ref_gla(inp, opts):
    o, s = _ref_module("reference_gla").gla(**inp)
    return {"o": o, "final_state": s}


def ref_delta_rule(inp, opts):
    o, s = _ref_module("reference_delta").delta_rule(**inp, l2norm_qk="--l2norm-qk" in opts)
    return {"o": o, "final_state": s}


def ref_poly(inp, opts):
    return {"o": _ref_module("reference_poly").poly(inp["q"], inp["k"], inp["v"], cu_seqlens=inp.get("cu_seqlens"),
                                                    normalize="--no-normalize" not in opts)}


GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "initial_state": "dinitial_state"}


def fd_gradients(forward, inp, eps=1e-6):
    """Every gradient of L = sum(o do) [+ sum(final_state dfinal_state)] by central differences of the
    float64 forward reference `forward(inputs) -> {"o", ["final_state"]}` (small shapes only)."""
    x = {n: (a.astype(np.float64) if a.dtype.kind == "f" else a) for n, a in inp.items()}

    def loss(y):
        r = forward(y)
        total = np.sum(r["o"] * y["do"])
        if "dfinal_state" in y:
            total += np.sum(r["final_state"] * y["dfinal_state"])
        return total
    grads = {}
    for name in (n for n in GRAD_NAMES if n in x):
        g = np.zeros_like(x[name])
        for idx in np.ndindex(*x[name].shape):
            xp, xm = dict(x), dict(x)
            xp[name], xm[name] = x[name].copy(), x[name].copy()
            xp[name][idx] += eps
            xm[name][idx] -= eps
            g[idx] = (loss(xp) - loss(xm)) / (2 * eps)
        grads[GRAD_NAMES[name]] = g
    return grads


def with_backward(fwd_ref):
    """The reference for forward and --backward cases: gradients from reference_bwd for plain linear
    attention, else by finite differences of the forward reference."""
    def ref(inp, opts):
        if "--backward" not in opts:
            return fwd_ref(inp, opts)
        if fwd_ref is ref_linear_attn and "--normalize" not in opts:
            return _ref_module("reference_bwd").linear_attn_bwd(
                inp["q"], inp["k"], inp["v"], inp["do"], g=inp.get("g"), initial_state=inp.get("initial_state"),
                dfinal_state=inp.get("dfinal_state"), cu_seqlens=inp.get("cu_seqlens"))
        fwd_in = lambda y: {n: a for n, a in y.items() if n not in ("do", "dfinal_state")}  # noqa: E731
        return fd_gradients(lambda y: fwd_ref(fwd_in(y), [o for o in opts if o != "--backward"]), inp)
    return ref


# op -> (reference, reference module that must import)
REFERENCES = {
    "linear_attn": (with_backward(ref_linear_attn), "reference"),
    "gla": (with_backward(ref_gla), "reference_gla"),
    "delta_rule": (with_backward(ref_delta_rule), "reference_delta"),
    "gated_delta_rule": (with_backward(ref_delta_rule), "reference_delta"),
    "poly": (with_backward(ref_poly), "reference_poly"),
}


# ---------------------------------------------------------------------------------------------------
# Cases


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


def l2normalize(x):
    return x / np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)


class Inputs:
    """Random inputs for one op, following GPU.md's conventions."""

    def __init__(self, op, seed):
        self.op = op
        self.rng = np.random.default_rng(seed)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def make(self, B, T, H, K, V, keys="randn", qk_map=None, state_n=None, cu=None):
        """q, k, v and the op's required gates/betas; initial_state [state_n, H, K, V] when state_n."""
        q, k, v = self.randn(B, T, H, K), self.randn(B, T, H, K), self.randn(B, T, H, V)
        if qk_map is not None:
            q, k = qk_map(q).astype(np.float32), qk_map(k).astype(np.float32)
        if keys == "l2":
            k = l2normalize(k).astype(np.float32)
        d = dict(q=q, k=k, v=v)
        if self.op == "gla":
            d["g"] = logsigmoid(self.randn(B, T, H, K)).astype(np.float32)
        if self.op == "gated_delta_rule":
            d["g"] = logsigmoid(self.randn(B, T, H)).astype(np.float32)
        if self.op in ("delta_rule", "gated_delta_rule"):
            d["beta"] = (1.0 / (1.0 + np.exp(-self.randn(B, T, H)))).astype(np.float32)
        if state_n:
            d["initial_state"] = self.randn(state_n, H, K, V)
        if cu is not None:
            d["cu_seqlens"] = np.asarray(cu, np.int32)
        return d

    def gate(self, B, T, H):
        return logsigmoid(self.randn(B, T, H)).astype(np.float32)


# The main shape (B, T, H, K, V); varlen cases use B = 1, K = 48, V = 100 (padded tiles, two V blocks)
# and sequences of length 1 (twice), 16, 63 and 69.
MAIN = (2, 150, 2, 64, 64)
VARLEN_T, VARLEN_K, VARLEN_V = 150, 48, 100
VARLEN_CU = [0, 1, 17, 80, 81, 150]
# --backward cases: small enough for finite-difference references.
BWD = (1, 24, 2, 8, 8)


def op_cases(op, spec, seed):
    """(case name, inputs, switches, outputs) for op (dtype-independent)."""
    ins, outs = spec["inputs"], spec["outputs"]
    has_state = "initial_state" in ins and "final_state" in outs
    has_varlen = "cu_seqlens" in ins
    delta = op in ("delta_rule", "gated_delta_rule")
    keys = "l2" if delta else "randn"
    B, T, H, K, V = MAIN
    gen = Inputs(op, seed)
    main = f"B{B} T{T} H{H} K{K}"

    if op == "linear_attn":
        yield f"plain {main}", gen.make(B, T, H, K, V), [], ["o"]
        d = gen.make(B, T, H, K, V)
        d["g"] = gen.gate(B, T, H)
        yield f"gated {main}", d, [], ["o"]
        d = gen.make(B, T, H, K, V, qk_map=elu1)
        d["g"] = gen.gate(B, T, H)
        yield "--normalize gated (elu+1)", d, ["--normalize"], ["o"]
    elif op == "gla":
        yield f"chunked {main}", gen.make(B, T, H, K, V), [], ["o"]
    elif delta:
        yield f"unit keys {main}", gen.make(B, T, H, K, V, keys="l2"), [], ["o"]
        yield f"--l2norm-qk {main}", gen.make(B, T, H, K, V), ["--l2norm-qk"], ["o"]
    elif op == "poly":
        yield f"a,b,c=1,1,.5 {main}", gen.make(B, T, H, K, V), [], ["o"]
        yield f"--no-normalize {main}", gen.make(B, T, H, K, V), ["--no-normalize"], ["o"]

    # --recurrent: the token-by-token form, with both states where the op has them.
    d = gen.make(B, T, H, K, V, keys=keys, state_n=B if has_state else None)
    if op == "linear_attn":
        d["g"] = gen.gate(B, T, H)
    yield ("--recurrent" + (" +state" if has_state else "") + (" gated" if op == "linear_attn" else ""),
           d, ["--recurrent"], ["o"] + (["final_state"] if has_state else []))

    # --backward at a small shape (the references of most ops are finite differences), with the
    # states' gradients where the op has states.
    if "do" in ins:
        Bb, Tb, Hb, Kb, Vb = BWD
        cases = [("", [], None)]
        if op == "linear_attn":
            cases = [("gated ", [], None), ("--normalize gated ", ["--normalize"], elu1)]
        for label, switches, qk_map in cases:
            with_state = has_state and "--normalize" not in switches
            d = gen.make(Bb, Tb, Hb, Kb, Vb, keys=keys, qk_map=qk_map, state_n=Bb if with_state else None)
            if op == "linear_attn":
                d["g"] = gen.gate(Bb, Tb, Hb)
            d["do"] = gen.randn(Bb, Tb, Hb, Vb)
            if with_state:
                d["dfinal_state"] = gen.randn(Bb, Hb, Kb, Vb)
            grads = [GRAD_NAMES[n] for n in GRAD_NAMES if n in d]
            yield f"--backward {label}B{Bb} T{Tb} K{Kb}", d, ["--backward", *switches], grads
            if "saved_h" in outs:
                yield f"--backward saved_* {label}B{Bb} T{Tb}", d, ["--backward", TRAINING_PAIR, *switches], grads

    if has_varlen:
        N = len(VARLEN_CU) - 1
        d = gen.make(1, VARLEN_T, H, VARLEN_K, VARLEN_V, keys=keys, state_n=N if has_state else None, cu=VARLEN_CU)
        if op == "linear_attn":
            d["g"] = gen.gate(1, VARLEN_T, H)
        yield (f"varlen{'+state' if has_state else ''} K{VARLEN_K} V{VARLEN_V}", d, [],
               ["o"] + (["final_state"] if has_state else []))


def first_error_line(stderr, rc):
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("linac: error:"):
            return ln
    if lines:
        return lines[-1]
    return f"exit status {rc}" + (f" (signal {-rc})" if rc < 0 else "")


def run_saved_forward(d, device, op, dtype, inputs, options):
    """The training pair's first half: `linac run OP <forward inputs> -o saved_*=..` into folder d.
    Returns (CLI bindings of the saved tensors for the backward, None) or (None, error message)."""
    args = [LINAC, "run", op]
    for n in inputs:
        if n not in ("do", "dfinal_state"):
            args.append(f"{n}={d}/{n}.npy")
    for n in SAVED:
        args += ["-o", f"{n}={d}/{n}.npy"]
    args += ["--device", device, "--dtype", dtype] + [o for o in options if o != "--backward"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    if r.returncode != 0:
        return None, "the saving forward: " + first_error_line(r.stderr, r.returncode)
    return [f"{n}={d}/{n}.npy" for n in SAVED], None


def run_case(device, op, dtype, inputs, options, outputs, ref_fn):
    """Returns (err or None, wall s, status) with status 'ok' / 'FAIL msg' / 'skip msg'. Options holding
    TRAINING_PAIR run the forward with its saved_* outputs first and give them to the backward."""
    pair = TRAINING_PAIR in options
    options = [o for o in options if o != TRAINING_PAIR]
    with tempfile.TemporaryDirectory() as d:
        args = [LINAC, "run", op]
        for n, a in inputs.items():
            np.save(f"{d}/{n}.npy", a)
            args.append(f"{n}={d}/{n}.npy")
        for n in outputs:
            args += ["-o", f"{n}={d}/out_{n}.npy"]  # fresh folder: no stale output can pass
        args += ["--device", device, "--dtype", dtype] + options
        t0 = time.perf_counter()
        try:
            if pair:
                saved, msg = run_saved_forward(d, device, op, dtype, inputs, options)
                if msg:
                    return None, time.perf_counter() - t0, f"FAIL {msg}"
                args[3:3] = saved
            r = subprocess.run(args, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, time.perf_counter() - t0, f"FAIL timed out after {CASE_TIMEOUT_S} s"
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            msg = first_error_line(r.stderr, r.returncode)
            for sw in options:
                if sw.startswith("--") and f"does not take {sw}" in msg:
                    return None, wall, f"skip ({msg.replace('linac: error: ', '')})"
            return None, wall, f"FAIL {msg}"
        try:
            outs = {n: np.load(f"{d}/out_{n}.npy") for n in outputs}
        except (OSError, ValueError) as exc:
            return None, wall, f"FAIL exit 0 but no readable output: {exc}"
    ref_in = dict(inputs)
    if dtype != "fp32":  # the reference sees the same rounded inputs as the kernel
        rnd = reference.round_to_bf16 if dtype == "bf16" else (lambda x: x.astype(np.float16).astype(np.float32))
        for n in ("q", "k", "v", "do"):
            if n in ref_in:
                ref_in[n] = rnd(ref_in[n])
    try:
        ref = ref_fn(ref_in, options)
    except Exception as exc:  # noqa: BLE001 - a broken reference is a failed case, not a crash
        return None, wall, f"FAIL reference raised {type(exc).__name__}: {exc}"
    errs = []
    for n in outputs:
        if ref.get(n) is None:
            return None, wall, f"FAIL no reference for output {n}"
        if outs[n].shape != ref[n].shape:
            return None, wall, f"FAIL {n} has shape {outs[n].shape}, reference {ref[n].shape}"
        if not np.all(np.isfinite(outs[n])):
            return float("nan"), wall, f"FAIL {n} has non-finite values"
        errs.append(reference.rel_err(outs[n], ref[n]))
    return max(errs), wall, "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--ops", help="comma-separated subset of the ops (default: every op in `linac list` "
                                  "that has a reference)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated (default fp32,bf16)")
    ap.add_argument("--json")
    a = ap.parse_args()
    t_start = time.perf_counter()
    try:
        listed = list_ops()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"e2e: cannot list the ops: {exc}", file=sys.stderr)
        return 1
    device = a.device
    if device == "auto":
        device = "cuda" if gpu_usable() else "cpu"
    print(f"linac end-to-end over the kernel library on {device} "
          f"({'GPU' if device == 'cuda' else 'CPU interpreter'})")

    notes = []
    wanted = [s.strip() for s in a.ops.split(",") if s.strip()] if a.ops else None
    ops = []
    order = list(REFERENCES) + [op for op in listed if op not in REFERENCES]
    for op in (wanted or [op for op in order if op in listed]):
        if op not in listed:
            notes.append(f"{op}: not in `linac list`, not checked")
        elif op not in REFERENCES:
            notes.append(f"{op}: no reference in tools/e2e.py, not checked")
        else:
            try:
                importlib.import_module(REFERENCES[op][1])
                ops.append(op)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{op}: reference {REFERENCES[op][1]} does not import ({exc}), not checked")
    if not wanted:
        for op in REFERENCES:
            if op not in listed:
                notes.append(f"{op}: has a reference but is not in `linac list`, not checked")
    dtypes = [s.strip() for s in a.dtypes.split(",") if s.strip()]

    print(f"{'op':<16} {'case':<30} {'dtype':<5} {'rel err':>9} {'bound':>7} {'wall s':>7}  result")
    rows, failed, skipped = [], 0, 0
    for op in ops:
        ref_fn = REFERENCES[op][0]
        for dtype in dtypes:
            for name, inputs, options, outputs in op_cases(op, listed[op], seed=zlib.crc32(f"{op}/{dtype}".encode())):
                # fp32 1e-5 (1e-4 on the GPU); bf16 2e-2 for outputs, 3e-2 for gradients (issue 5)
                bound = (1e-4 if device == "cuda" else 1e-5) if dtype == "fp32" else (
                    3e-2 if "--backward" in options else 2e-2)
                err, wall, status = run_case(device, op, dtype, inputs, options, outputs, ref_fn)
                ok = status == "ok" and err is not None and np.isfinite(err) and err < bound
                skip = status.startswith("skip")
                if status == "ok" and not ok:
                    status = "FAIL"
                failed += not ok and not skip
                skipped += skip
                shown = status if len(status) <= 110 else status[:107] + "..."
                print(f"{op:<16} {name:<30} {dtype:<5} {err if err is not None else float('nan'):>9.2e} "
                      f"{bound:>7.0e} {wall:>7.2f}  {shown}", flush=True)
                rows.append(dict(op=op, case=name, dtype=dtype, options=options, rel_err=err, bound=bound,
                                 ok=ok, skipped=skip, result=status, wall_s=wall, device=device))
    for n in notes:
        print(f"note: {n}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    ran = len(rows) - skipped
    print(f"{ran - failed}/{ran} cases passed" + (f", {skipped} skipped" if skipped else "")
          + f" ({time.perf_counter() - t_start:.1f} s)")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
