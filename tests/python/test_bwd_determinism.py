"""Issue 5: bitwise identical gradients over repeated runs. Every op's backward (and the delta rules'
training pair) runs three times on the same inputs; every gradient file must be identical to the bit.
The backward kernels write each output element from one program, with no atomics, so the order of
their sums is fixed; this checks it. Meaningful on the GPU (LINAC_TEST_DEVICE=cuda, as
scripts/gpu_validate.sh runs it); the interpreter is deterministic by construction."""
import hashlib

import numpy as np
import pytest

RUNS = 3
B, T, H, K, V = 2, 300, 2, 64, 64

CASES = {
    "linear_attn": ("linear_attn", [], ["dq", "dk", "dv"]),
    "linear_attn_gated": ("linear_attn", [], ["dq", "dk", "dv", "dg"]),
    "linear_attn_normalized": ("linear_attn", ["--normalize"], ["dq", "dk", "dv"]),
    "gla": ("gla", [], ["dq", "dk", "dv", "dg"]),
    "delta_rule": ("delta_rule", [], ["dq", "dk", "dv", "dbeta"]),
    "gated_delta_rule": ("gated_delta_rule", [], ["dq", "dk", "dv", "dbeta", "dg"]),
    "poly": ("poly", [], ["dq", "dk", "dv"]),
}


def make_inputs(case, seed=3):
    rng = np.random.default_rng(seed)
    x = {"q": rng.standard_normal((B, T, H, K)), "k": rng.standard_normal((B, T, H, K)),
         "v": rng.standard_normal((B, T, H, V)), "do": rng.standard_normal((B, T, H, V))}
    if case == "linear_attn_normalized":  # a positive feature map (elu + 1), as the normalized form expects
        x["q"], x["k"] = [np.where(a > 0, a + 1, np.exp(a)) for a in (x["q"], x["k"])]
    if case.startswith("poly"):
        x["q"], x["k"] = x["q"] * 0.3, x["k"] * 0.3
    if case in ("delta_rule", "gated_delta_rule"):
        x["k"] = x["k"] / np.linalg.norm(x["k"], axis=-1, keepdims=True)
        x["beta"] = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    if case in ("linear_attn_gated", "gated_delta_rule"):
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + 2.0))
    if case == "gla":
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H, K)) + 2.0))
    return {n: a.astype(np.float32) for n, a in x.items()}


def digests(arrays):
    return {n: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for n, a in arrays.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_are_bitwise_identical_over_runs(linac, case):
    op, options, grads = CASES[case]
    x = make_inputs(case)
    options = ["--backward", "--dtype", "bf16", *options]
    runs = [digests(linac.run_op(op, x, outputs=grads, options=options)) for _ in range(RUNS)]
    assert all(r == runs[0] for r in runs), f"{case}: gradients differ between runs: {runs}"


@pytest.mark.parametrize("op", ["delta_rule", "gated_delta_rule"])
def test_training_pair_is_bitwise_identical_over_runs(linac, op):
    x = make_inputs(op)
    fwd_in = {n: a for n, a in x.items() if n != "do"}
    saved = ["saved_w", "saved_t", "saved_h", "saved_v_new"]
    grads = CASES[op][2]
    runs = []
    for _ in range(RUNS):
        fwd = linac.run_op(op, fwd_in, outputs=["o", *saved], options=["--dtype", "bf16"])
        got = linac.run_op(op, {**x, **{n: fwd[n] for n in saved}}, outputs=grads,
                           options=["--backward", "--dtype", "bf16"])
        runs.append(digests({**got, "o": fwd["o"]}))
    assert all(r == runs[0] for r in runs), f"{op}: the training pair differs between runs: {runs}"
