"""`linac run linear_attn --normalize` through the CLI on the CPU interpreter, against the float64
token-by-token reference of reference_poly.py.

q and k go through elu + 1 (a positive feature map, as normalized linear attention is used): then
q . z > 0 and the denominator is well conditioned. With randn q and k it can be near zero, and a
relative error says nothing.
"""

import numpy as np
import pytest

import reference
import reference_poly

FP32_TOL = 1e-5
BF16_TOL = 2e-2
ERROR_PREFIX = "linac: error:"


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, B, T, H, K, V, gate=False, gate_bias=2.0):
    rng = np.random.default_rng(seed)
    inputs = {
        "q": elu1(rng.standard_normal((B, T, H, K))).astype(np.float32),
        "k": elu1(rng.standard_normal((B, T, H, K))).astype(np.float32),
        "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
    }
    if gate:
        inputs["g"] = logsigmoid(rng.standard_normal((B, T, H)) + gate_bias).astype(np.float32)
    return inputs


def ref_of(inputs, scale=None):
    return reference_poly.linear_attn_normalized(inputs["q"], inputs["k"], inputs["v"], g=inputs.get("g"),
                                                 cu_seqlens=inputs.get("cu_seqlens"), scale=scale)


def check_output(out, ref, tol=FP32_TOL):
    assert out.dtype == np.float32, f"dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), "non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"relative error {err:.3g} >= {tol:g}"


def run_and_check(linac, inputs, options=(), scale=None, tol=FP32_TOL):
    o = linac.run_op("linear_attn", inputs, options=["--normalize", *options])["o"]
    check_output(o, ref_of(inputs, scale=scale), tol)
    return o


@pytest.mark.parametrize("T", [1, 63, 64, 65])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_seq_lengths(linac, T, gate):
    run_and_check(linac, make_inputs(100 + T + 1000 * gate, B=2, T=T, H=2, K=32, V=32, gate=gate))


def test_long_sequence(linac):
    # Slow decay: early chunks still reach late outputs, through S and through z.
    run_and_check(linac, make_inputs(200, B=1, T=300, H=2, K=32, V=32, gate=True, gate_bias=4.0))


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_non_power_of_two_head_dims(linac, gate):
    run_and_check(linac, make_inputs(300 + gate, B=1, T=50, H=2, K=48, V=100, gate=gate))


def test_chunk_sizes_agree(linac):
    inputs = make_inputs(400, B=1, T=100, H=2, K=32, V=16, gate=True, gate_bias=3.0)
    results = {chunk: run_and_check(linac, inputs, options=["--chunk-size", str(chunk)]) for chunk in (16, 32, 64)}
    for chunk in (32, 64):
        err = reference.rel_err(results[chunk], results[16])
        assert err < FP32_TOL, f"chunk {chunk} vs 16 differ by {err:.3g}"


@pytest.mark.parametrize("chunk", [16, 32])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_segments(linac, gate, chunk):
    # The segment-parallel schedule (the default where few walks leave the GPU idle): S and z entering
    # each segment come from the segments before it, through the combine; a last segment shorter than
    # the others, V in two blocks.
    inputs = make_inputs(450 + gate + chunk, B=2, T=150, H=2, K=32, V=80, gate=gate, gate_bias=4.0)
    run_and_check(linac, inputs, options=["--chunk-size", str(chunk), "--config", "segment=64,bv=64"])


def test_segment_must_be_a_multiple_of_the_chunk(linac):
    inputs = make_inputs(460, B=1, T=64, H=1, K=16, V=16)
    expect_error(linac, inputs, ["o"], ["--chunk-size", "128", "--config", "segment=64"], "multiple of the chunk")


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_varlen(linac, gate):
    inputs = make_inputs(500 + gate, B=1, T=130, H=2, K=32, V=32, gate=gate)
    inputs["cu_seqlens"] = np.array([0, 1, 17, 80, 81, 130], dtype=np.int32)
    run_and_check(linac, inputs, options=["--chunk-size", "16"])


def test_explicit_scale(linac):
    inputs = make_inputs(600, B=1, T=40, H=2, K=16, V=24, gate=True)
    run_and_check(linac, inputs, options=["--scale", "0.3"], scale=0.3)


def test_bf16(linac):
    inputs = make_inputs(700, B=1, T=100, H=2, K=32, V=32, gate=True)
    # g is pre-rounded so the comparison holds whether or not the CLI casts it (gates are fp32 in the
    # kernel); q, k, v are cast by the CLI itself.
    inputs["g"] = reference.round_to_bf16(inputs["g"])
    o = linac.run_op("linear_attn", inputs, options=["--normalize", "--dtype", "bf16"])["o"]
    rounded = {name: reference.round_to_bf16(x) for name, x in inputs.items()}
    check_output(o, ref_of(rounded), BF16_TOL)


def test_differs_from_unnormalized(linac):
    # --normalize reaches the normalized kernel (the outputs are not linear_attn's).
    inputs = make_inputs(800, B=1, T=20, H=1, K=16, V=16)
    plain = linac.run_op("linear_attn", inputs)["o"]
    normalized = run_and_check(linac, inputs)
    assert reference.rel_err(plain, normalized) > 0.5


# ---------------------------------------------------------------------------------------------------
# Errors: exit status 1, one line on stderr starting with "linac: error:", no output file.


def expect_error(linac, inputs, outputs, options, mentions):
    args = ["run", "linear_attn", *[f"{n}={linac.write(n, x)}" for n, x in inputs.items()]]
    for name in outputs:
        args += ["-o", f"{name}={name}.npy"]
    args += ["--device", "cpu", "--normalize", *options]
    before = linac.files()
    proc = linac.run(*args)
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}; stderr: {proc.stderr!r}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), f"expected one error line, got {proc.stderr!r}"
    assert mentions in lines[0], f"error should mention {mentions!r}: {lines[0]!r}"
    assert linac.files() == before, f"files changed: {before} -> {linac.files()}"


def test_error_initial_state(linac):
    inputs = make_inputs(1, B=1, T=8, H=1, K=8, V=8)
    inputs["initial_state"] = np.zeros((1, 1, 8, 8), dtype=np.float32)
    expect_error(linac, inputs, ["o"], [], mentions="initial_state")


def test_error_final_state(linac):
    expect_error(linac, make_inputs(2, B=1, T=8, H=1, K=8, V=8), ["o", "final_state"], [], mentions="final_state")
