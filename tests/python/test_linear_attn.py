"""`linac run linear_attn` through the CLI on the CPU interpreter, against the float64 naive reference.

Every case uses its own fixed seed and randn-valued inputs. Shapes stay small (the interpreter runs
each case) except the single T=1000 case.
"""

import numpy as np
import pytest

import reference

FP32_TOL = 1e-5
BF16_TOL = 2e-2


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, B, T, H, K, V, gate=False, gate_bias=0.0, init=False, N=None):
    """float32 inputs: q, k, v ~ randn; g = log(sigmoid(randn + gate_bias)) in (-inf, 0);
    initial_state ~ randn of shape [N or B, H, K, V]."""
    rng = np.random.default_rng(seed)
    inputs = {
        "q": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "k": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
    }
    if gate:
        inputs["g"] = logsigmoid(rng.standard_normal((B, T, H)) + gate_bias).astype(np.float32)
    if init:
        inputs["initial_state"] = rng.standard_normal((N or B, H, K, V)).astype(np.float32)
    return inputs


def ref_of(inputs, scale=None):
    """The reference on exactly the values in `inputs` (whatever their dtype), in float64."""
    return reference.linear_attn(inputs["q"], inputs["k"], inputs["v"], g=inputs.get("g"),
                                 initial_state=inputs.get("initial_state"), cu_seqlens=inputs.get("cu_seqlens"),
                                 scale=scale)


def check_output(name, out, ref, tol=FP32_TOL):
    assert out.dtype == np.float32, f"{name}: dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"{name}: shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), f"{name}: non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def run_and_check(linac, inputs, options=(), scale=None, final_state=True, tol=FP32_TOL):
    outputs = ("o", "final_state") if final_state else ("o",)
    got = linac.run_op("linear_attn", inputs, outputs=outputs, options=options)
    o_ref, s_ref = ref_of(inputs, scale=scale)
    check_output("o", got["o"], o_ref, tol)
    if final_state:
        check_output("final_state", got["final_state"], s_ref, tol)
    return got


# ---------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("T", [1, 63, 64, 65])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_seq_lengths(linac, T, gate):
    inputs = make_inputs(100 + T + 1000 * gate, B=2, T=T, H=2, K=32, V=32, gate=gate)
    run_and_check(linac, inputs)


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_initial_and_final_state(linac, gate):
    # A slow decay (mean g ~ -0.05) so the state carried across chunks matters to the output.
    inputs = make_inputs(200 + gate, B=2, T=100, H=2, K=32, V=32, gate=gate, gate_bias=3.0, init=True)
    run_and_check(linac, inputs)


def test_o_only(linac):
    # Without -o final_state only o is written.
    inputs = make_inputs(210, B=1, T=40, H=2, K=16, V=16, gate=True, init=True)
    run_and_check(linac, inputs, final_state=False)
    assert not (linac.workdir / "out_final_state.npy").exists()


def test_long_sequence(linac):
    # The single long case: 16 chunks of 64, slow decay so early chunks still reach late outputs.
    inputs = make_inputs(300, B=2, T=1000, H=2, K=64, V=64, gate=True, gate_bias=4.0, init=True)
    run_and_check(linac, inputs)


def test_k_differs_from_v(linac):
    inputs = make_inputs(400, B=2, T=70, H=2, K=32, V=48, gate=True, gate_bias=2.0, init=True)
    run_and_check(linac, inputs)


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_non_power_of_two_head_dims(linac, gate):
    inputs = make_inputs(500 + gate, B=1, T=50, H=2, K=48, V=100, gate=gate, gate_bias=2.0, init=True)
    run_and_check(linac, inputs)


def test_chunk_sizes_agree(linac):
    inputs = make_inputs(600, B=1, T=100, H=2, K=32, V=32, gate=True, gate_bias=3.0, init=True)
    results = {}
    for chunk in (16, 32, 64):
        results[chunk] = run_and_check(linac, inputs, options=["--chunk-size", str(chunk)])
    for chunk in (32, 64):
        for name in ("o", "final_state"):
            err = reference.rel_err(results[chunk][name], results[16][name])
            assert err < FP32_TOL, f"{name}: chunk {chunk} vs 16 differ by {err:.3g}"


@pytest.mark.parametrize("gate_bias", [None, 4.0, 0.0], ids=["nogate", "mild_gate", "gate"])
def test_segments_agree_with_the_reference(linac, gate_bias):
    # The segment-parallel forward (--config segment=L; by default where few walks leave the GPU idle):
    # segments of 64 rows, the last one short (T = 200), three sequences x two heads, an initial state;
    # mild gates keep the earlier segments' states alive across segment ends.
    inputs = make_inputs(650 + int(gate_bias or 0), B=3, T=200, H=2, K=32, V=32, gate=gate_bias is not None,
                         gate_bias=gate_bias or 0.0, init=True)
    run_and_check(linac, inputs, options=["--chunk-size", "32", "--config", "segment=256"])  # one segment: the walk
    got = run_and_check(linac, inputs, options=["--chunk-size", "32", "--config", "segment=64"])
    assert got["final_state"].shape == (3, 2, 32, 32)


@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_varlen(linac, gate, init):
    # Sequences of length 1 first, in the middle and near the end; 130 tokens in all, packed in B=1.
    cu = np.array([0, 1, 17, 80, 81, 130], dtype=np.int32 if init else np.int64)
    N = len(cu) - 1
    inputs = make_inputs(700 + 2 * gate + init, B=1, T=130, H=2, K=32, V=32, gate=gate, gate_bias=2.0,
                         init=init, N=N)
    inputs["cu_seqlens"] = cu
    got = run_and_check(linac, inputs, options=["--chunk-size", "16"])
    assert got["final_state"].shape == (N, 2, 32, 32)


def test_explicit_scale(linac):
    inputs = make_inputs(800, B=1, T=40, H=2, K=16, V=24, gate=True, init=True)
    run_and_check(linac, inputs, options=["--scale", "0.3"], scale=0.3)


def test_bf16(linac):
    inputs = make_inputs(900, B=1, T=100, H=2, K=32, V=32, gate=True, gate_bias=2.0, init=True)
    # g and the state are pre-rounded so the comparison holds whether or not the CLI casts them
    # (states are fp32 in the kernels); q, k, v are cast by the CLI itself.
    inputs["g"] = reference.round_to_bf16(inputs["g"])
    inputs["initial_state"] = reference.round_to_bf16(inputs["initial_state"])
    got = linac.run_op("linear_attn", inputs, outputs=("o", "final_state"), options=["--dtype", "bf16"])
    rounded = {name: reference.round_to_bf16(x) for name, x in inputs.items()}
    o_ref, s_ref = ref_of(rounded)
    check_output("o", got["o"], o_ref, BF16_TOL)
    check_output("final_state", got["final_state"], s_ref, BF16_TOL)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_input_dtypes_accepted(linac, dtype):
    # fp16 and fp64 files are converted to the default fp32 compute precision; the reference runs on
    # the values actually stored in the files.
    inputs = make_inputs(1000, B=1, T=40, H=2, K=16, V=16, gate=True, init=True)
    inputs = {name: x.astype(dtype) for name, x in inputs.items()}
    run_and_check(linac, inputs)


# ---------------------------------------------------------------------------------------------------
# Errors: non-zero exit, exactly one line on stderr starting with "linac: error:", no output file.

ERROR_PREFIX = "linac: error:"


def expect_error(linac, args, mentions=None):
    before = linac.files()
    proc = linac.run(*args)
    assert proc.returncode != 0, f"expected failure; stdout: {proc.stdout!r}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected one line on stderr, got: {proc.stderr!r}"
    assert lines[0].startswith(ERROR_PREFIX), f"stderr must start with {ERROR_PREFIX!r}: {lines[0]!r}"
    if mentions is not None:
        assert mentions in lines[0], f"error should mention {mentions!r}: {lines[0]!r}"
    # No output, no temporary left behind.
    assert linac.files() == before, f"files changed: {before} -> {linac.files()}"
    return lines[0]


def write_inputs(linac, inputs):
    return [f"{name}={linac.write(name, x)}" for name, x in inputs.items()]


SMALL = dict(B=2, T=8, H=2, K=8, V=8)


def test_error_missing_file(linac):
    args = write_inputs(linac, make_inputs(1, **SMALL))
    args = [a for a in args if not a.startswith("q=")] + ["q=missing.npy"]
    expect_error(linac, ["run", "linear_attn", *args, "-o", "o=o.npy", "--device", "cpu"], mentions="missing.npy")


def test_error_corrupt_file(linac):
    args = write_inputs(linac, make_inputs(2, **SMALL))
    (linac.workdir / "bad.npy").write_bytes(b"not a numpy file at all")
    args = [a for a in args if not a.startswith("k=")] + ["k=bad.npy"]
    expect_error(linac, ["run", "linear_attn", *args, "-o", "o=o.npy", "--device", "cpu"], mentions="bad.npy")


def test_error_wrong_shape(linac):
    inputs = make_inputs(3, **SMALL)
    inputs["k"] = inputs["k"][:, :5]  # T differs from q's
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"])


def test_error_unknown_op(linac):
    args = write_inputs(linac, make_inputs(4, **SMALL))
    expect_error(linac, ["run", "linear_atn", *args, "-o", "o=o.npy", "--device", "cpu"], mentions="linear_atn")


def test_error_unknown_argument(linac):
    inputs = make_inputs(5, **SMALL)
    inputs["zz"] = inputs["q"]
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"],
                 mentions="zz")


def test_error_missing_required_input(linac):
    inputs = make_inputs(6, **SMALL)
    del inputs["v"]
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"])


def test_error_gate_wrong_rank(linac):
    inputs = make_inputs(7, **SMALL, gate=True)
    inputs["g"] = inputs["g"][..., None]  # [B, T, H, 1] instead of [B, T, H]
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"])


def test_error_initial_state_wrong_shape(linac):
    inputs = make_inputs(8, **SMALL, init=True)
    inputs["initial_state"] = inputs["initial_state"][:1]  # N = 1 but B = 2
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "-o",
                         "final_state=s.npy", "--device", "cpu"])


def test_error_cu_seqlens_with_batch(linac):
    inputs = make_inputs(9, **SMALL)  # B = 2
    inputs["cu_seqlens"] = np.array([0, 3, 8], dtype=np.int32)
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"])


def test_error_cu_seqlens_not_covering_t(linac):
    inputs = make_inputs(10, B=1, T=8, H=2, K=8, V=8)
    inputs["cu_seqlens"] = np.array([0, 3, 7], dtype=np.int64)  # ends at 7, T = 8
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu"])


def test_error_segment_not_a_multiple_of_the_chunk(linac):
    args = write_inputs(linac, make_inputs(12, B=1, T=300, H=1, K=8, V=8))
    expect_error(linac, ["run", "linear_attn", *args, "-o", "o=o.npy", "--device", "cpu", "--chunk-size", "128",
                         "--config", "segment=64"], mentions="multiple of the chunk")


def test_error_segments_of_packed_sequences(linac):
    inputs = make_inputs(13, B=1, T=130, H=1, K=8, V=8)
    inputs["cu_seqlens"] = np.array([0, 70, 130], dtype=np.int32)
    expect_error(linac, ["run", "linear_attn", *write_inputs(linac, inputs), "-o", "o=o.npy", "--device", "cpu",
                         "--config", "segment=64"], mentions="dense inputs")


def test_error_bad_dtype(linac):
    args = write_inputs(linac, make_inputs(11, **SMALL))
    expect_error(linac, ["run", "linear_attn", *args, "-o", "o=o.npy", "--device", "cpu", "--dtype", "bogus"],
                 mentions="bogus")
