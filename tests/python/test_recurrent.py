"""`linac run linear_attn|gla --recurrent` (the token-by-token decode form, docs/ops/README.md) on the
CPU interpreter: against the float64 references, and against the chunked form of the same op on the
same inputs.
"""

import numpy as np
import pytest

import reference
import reference_gla

FP32_TOL = 1e-5
BF16_TOL = 2e-2


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, op, B, T, H, K, V, gate=True, init=False, N=None, gate_bias=2.0):
    """float32 q, k, v ~ randn; g = logsigmoid(randn + gate_bias), [B, T, H] for linear_attn and
    [B, T, H, K] for gla; initial_state ~ randn [N or B, H, K, V]."""
    rng = np.random.default_rng(seed)
    inputs = {
        "q": rng.standard_normal((B, T, H, K)),
        "k": rng.standard_normal((B, T, H, K)),
        "v": rng.standard_normal((B, T, H, V)),
    }
    if gate:
        inputs["g"] = logsigmoid(rng.standard_normal((B, T, H) if op == "linear_attn" else (B, T, H, K)) + gate_bias)
    if init:
        inputs["initial_state"] = rng.standard_normal((N or B, H, K, V))
    return {name: x.astype(np.float32) for name, x in inputs.items()}


def ref_of(op, inputs):
    args = dict(initial_state=inputs.get("initial_state"), cu_seqlens=inputs.get("cu_seqlens"))
    if op == "gla":
        return reference_gla.gla(inputs["q"], inputs["k"], inputs["v"], inputs["g"], **args)
    return reference.linear_attn(inputs["q"], inputs["k"], inputs["v"], g=inputs.get("g"), **args)


def check(name, out, ref, tol):
    assert out.dtype == np.float32 and out.shape == ref.shape, f"{name}: {out.dtype} {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), f"{name}: non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def run_both(linac, op, inputs, options=()):
    """(recurrent, chunked) outputs {o, final_state} of `op` on `inputs`."""
    outputs = ("o", "final_state")
    rec = linac.run_op(op, inputs, outputs=outputs, options=["--recurrent", *options])
    chunked = linac.run_op(op, inputs, outputs=outputs, options=list(options))
    return rec, chunked


CASES = [("linear_attn", False), ("linear_attn", True), ("gla", True)]
CASE_IDS = ["linear_attn", "linear_attn_gated", "gla"]


@pytest.mark.parametrize("op,gate", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("T", [1, 17, 100])
def test_matches_reference_and_chunked(linac, op, gate, T):
    inputs = make_inputs(100 + T + 10 * len(op) + gate, op, B=2, T=T, H=2, K=32, V=16, gate=gate, init=True)
    rec, chunked = run_both(linac, op, inputs)
    o_ref, s_ref = ref_of(op, inputs)
    for name, ref in (("o", o_ref), ("final_state", s_ref)):
        check(f"recurrent {name}", rec[name], ref, FP32_TOL)
        check(f"recurrent vs chunked {name}", rec[name], chunked[name].astype(np.float64), FP32_TOL)
    if T == 100:
        # Different kernels round differently: identical bits would mean --recurrent was ignored.
        assert not np.array_equal(rec["o"], chunked["o"]), "--recurrent gave the chunked form's exact output"


@pytest.mark.parametrize("op,gate", CASES, ids=CASE_IDS)
def test_non_power_of_two_head_dims(linac, op, gate):
    inputs = make_inputs(200 + gate + len(op), op, B=1, T=30, H=1, K=48, V=100, gate=gate, init=True)
    rec, chunked = run_both(linac, op, inputs)
    o_ref, s_ref = ref_of(op, inputs)
    check("o", rec["o"], o_ref, FP32_TOL)
    check("final_state", rec["final_state"], s_ref, FP32_TOL)
    check("recurrent vs chunked o", rec["o"], chunked["o"].astype(np.float64), FP32_TOL)


@pytest.mark.parametrize("op,gate", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
def test_varlen(linac, op, gate, init):
    cu = np.array([0, 1, 17, 40, 41, 60], dtype=np.int32)
    inputs = make_inputs(300 + 2 * gate + init + len(op), op, B=1, T=60, H=2, K=16, V=16, gate=gate, init=init,
                         N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    rec, chunked = run_both(linac, op, inputs, options=["--chunk-size", "16"])
    o_ref, s_ref = ref_of(op, inputs)
    check("o", rec["o"], o_ref, FP32_TOL)
    check("final_state", rec["final_state"], s_ref, FP32_TOL)
    check("recurrent vs chunked final_state", rec["final_state"], chunked["final_state"].astype(np.float64), FP32_TOL)


def test_gla_very_negative_gates(linac):
    # A run of -1e4 gates resets the state: exp(-1e4) underflows to 0, nothing overflows.
    inputs = make_inputs(400, "gla", B=1, T=40, H=1, K=16, V=16, init=True)
    inputs["g"][:, 10:20] = -1e4
    inputs["g"][:, 30:] = np.maximum(inputs["g"][:, 30:] * 20, -5)
    rec, _ = run_both(linac, "gla", inputs)
    o_ref, s_ref = ref_of("gla", inputs)
    check("o", rec["o"], o_ref, FP32_TOL)
    check("final_state", rec["final_state"], s_ref, FP32_TOL)


@pytest.mark.parametrize("op", ["linear_attn", "gla"])
def test_bf16(linac, op):
    inputs = make_inputs(500 + len(op), op, B=1, T=50, H=2, K=32, V=32, init=True)
    got = linac.run_op(op, inputs, outputs=("o", "final_state"), options=["--recurrent", "--dtype", "bf16"])
    rounded = {name: reference.round_to_bf16(x) if name in ("q", "k", "v") else x for name, x in inputs.items()}
    o_ref, s_ref = ref_of(op, rounded)
    check("o", got["o"], o_ref, BF16_TOL)
    check("final_state", got["final_state"], s_ref, BF16_TOL)


def test_o_only(linac):
    inputs = make_inputs(600, "gla", B=1, T=20, H=1, K=16, V=16, init=True)
    got = linac.run_op("gla", inputs, outputs=("o",), options=["--recurrent"])
    check("o", got["o"], ref_of("gla", inputs)[0], FP32_TOL)
    assert not (linac.workdir / "out_final_state.npy").exists()


def test_error_gla_recurrent_gate_wrong_shape(linac):
    inputs = make_inputs(700, "gla", B=1, T=8, H=2, K=8, V=8)
    inputs["g"] = inputs["g"][..., 0]
    args = ["run", "gla", *(f"{n}={linac.write(n, x)}" for n, x in inputs.items()), "-o", "o=o.npy", "--device", "cpu",
            "--recurrent"]
    proc = linac.run(*args)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("linac: error:") and "g" in lines[0], proc.stderr
    assert not (linac.workdir / "o.npy").exists()
