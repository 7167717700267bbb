"""`linac run poly` (polynomial-kernel attention) through the CLI on the CPU interpreter, against the
float64 literal double sum of reference_poly.py.

Every case uses its own fixed seed and randn-valued inputs. Shapes stay small: the interpreter walks
the degree-2 state one key column at a time.
"""

import numpy as np
import pytest

import reference
import reference_poly

FP32_TOL = 1e-5
BF16_TOL = 2e-2
ERROR_PREFIX = "linac: error:"


def make_inputs(seed, B, T, H, K, V):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "k": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
    }


def coefficient_options(a=None, b=None, c=None):
    opts = []
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x is not None:
            opts += [f"--{name}", repr(float(x))]
    return opts


def ref_of(inputs, a=1.0, b=1.0, c=0.5, scale=None, normalize=True):
    return reference_poly.poly(inputs["q"], inputs["k"], inputs["v"], a=a, b=b, c=c,
                               cu_seqlens=inputs.get("cu_seqlens"), scale=scale, normalize=normalize)


def check_output(out, ref, tol=FP32_TOL):
    assert out.dtype == np.float32, f"dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), "non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"relative error {err:.3g} >= {tol:g}"


def run_and_check(linac, inputs, options=(), tol=FP32_TOL, **ref_args):
    o = linac.run_op("poly", inputs, options=list(options))["o"]
    check_output(o, ref_of(inputs, **ref_args), tol)
    return o


# ---------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("T", [1, 17, 64, 100])
def test_seq_lengths(linac, T):
    # K != V; T = 100 crosses a chunk boundary with a partial last chunk.
    run_and_check(linac, make_inputs(100 + T, B=2, T=T, H=2, K=16, V=32))


def test_non_power_of_two_head_dims(linac):
    # K = 48 in a 64-wide key block; V = 100 over two 64-column programs.
    run_and_check(linac, make_inputs(200, B=1, T=40, H=1, K=48, V=100), options=["--chunk-size", "16"])


def test_widest_keys(linac):
    # K = 128: the largest degree-2 state (8256 rows of the symmetric part).
    run_and_check(linac, make_inputs(210, B=1, T=20, H=1, K=128, V=16), options=["--chunk-size", "16"])


def test_chunk_sizes_agree(linac):
    inputs = make_inputs(300, B=1, T=70, H=2, K=16, V=16)
    results = {chunk: run_and_check(linac, inputs, options=["--chunk-size", str(chunk)]) for chunk in (16, 32, 64)}
    for chunk in (32, 64):
        err = reference.rel_err(results[chunk], results[16])
        assert err < FP32_TOL, f"chunk {chunk} vs 16 differ by {err:.3g}"


# Segments of 16, 32 and 64 tokens over T = 150: outputs take the tokens before their segment from the
# stored per-segment states (every feature block of the circulant degree-2 split: K odd, K < the key
# block, K a power of two), and the segment's own tokens directly.
@pytest.mark.parametrize("K", [7, 16, 24])
@pytest.mark.parametrize("segment", [16, 32, 64])
def test_segments(linac, K, segment):
    inputs = make_inputs(150 + K + segment // 16, B=2, T=150, H=2, K=K, V=20)
    run_and_check(linac, inputs, options=["--config", f"chunk=16,segment={segment}"])


@pytest.mark.parametrize("options,ref_args", [
    (["--no-normalize"], dict(normalize=False)),
    (coefficient_options(2.0, 0.5, 0.0) + ["--no-normalize"], dict(a=2.0, b=0.5, c=0.0, normalize=False)),
    (coefficient_options(3.0, 0.0, 0.0), dict(a=3.0, b=0.0, c=0.0)),
], ids=["no_normalize", "linear_no_normalize", "constant"])
def test_segments_with_options(linac, options, ref_args):
    inputs = make_inputs(160, B=1, T=100, H=2, K=16, V=16)
    run_and_check(linac, inputs, options=["--config", "chunk=16,segment=32", *options], **ref_args)


def test_varlen_segments(linac):
    # Sequences cross segments of 32 tokens at different offsets; an empty one and length-1 ones have
    # zero or one segment each.
    inputs = make_inputs(170, B=1, T=130, H=2, K=16, V=16)
    inputs["cu_seqlens"] = np.array([0, 1, 17, 17, 80, 81, 130], dtype=np.int32)
    run_and_check(linac, inputs, options=["--config", "chunk=16,segment=32"])


def test_varlen(linac):
    # Sequences of length 1 first, in the middle and near the end, and an empty one; each restarts
    # from an empty state.
    inputs = make_inputs(400, B=1, T=130, H=2, K=16, V=16)
    inputs["cu_seqlens"] = np.array([0, 1, 17, 17, 80, 81, 130], dtype=np.int32)
    run_and_check(linac, inputs, options=["--chunk-size", "16"])


def test_config_does_not_change_results(linac):
    # Three 16-column V blocks (each computes the denominator itself), 2 warps, no pipelining.
    inputs = make_inputs(410, B=1, T=50, H=2, K=16, V=40)
    default = run_and_check(linac, inputs)
    tuned = run_and_check(linac, inputs, options=["--config", "bv=16,warps=2,stages=1"])
    err = reference.rel_err(tuned, default)
    assert err < FP32_TOL, f"--config changed the result by {err:.3g}"


def tuning_space(linac, K, V, T):
    """The candidates `linac tune poly --list` prints for the size ("default" first)."""
    proc = linac.run("tune", "poly", "--shape", f"B=1,T={T},H=1,K={K},V={V}", "--list")
    assert proc.returncode == 0, proc.stderr
    configs = proc.stdout.split()
    assert configs and configs[0] == "default", proc.stdout
    return configs


# One size per half of the space: BK <= 64 (chunks of 128, 32 value columns) and BK = 128. T crosses
# a chunk boundary with a ragged last chunk at every chunk size the half has.
@pytest.mark.parametrize("K,V,T", [(16, 48, 150), (72, 16, 70)], ids=["narrow_keys", "wide_keys"])
def test_every_tuning_candidate_matches_reference(linac, K, V, T):
    # The tuner checks each candidate against the interpreter at the defaults before timing it; here
    # each one is checked against the float64 reference, so a candidate the kernels mishandle fails
    # on any machine, GPU or not.
    inputs = make_inputs(420 + K, B=1, T=T, H=2, K=K, V=V)
    ref = ref_of(inputs)
    configs = tuning_space(linac, K, V, T)
    assert len(configs) >= 2, configs
    # Configurations the wide half no longer times (measured slower on an H200) stay valid for --config:
    # they are checked too.
    if K > 64:
        configs += [c for c in ("chunk=16", "stages=1", "warps=8") if c not in configs]
    failures = []
    for config in configs:
        options = [] if config == "default" else ["--config", config]
        try:
            check_output(linac.run_op("poly", inputs, options=options)["o"], ref)
        except AssertionError as e:
            failures.append(f"{config}: {e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("a,b,c", [(2.0, 0.5, 0.25), (0.5, -1.0, 1.0), (3.0, 0.0, 0.0)],
                         ids=["wider", "negative_b", "constant"])
def test_custom_coefficients(linac, a, b, c):
    # c = 0 takes the kernel without the degree-2 state; f = a is the running mean of v.
    inputs = make_inputs(500, B=1, T=50, H=2, K=16, V=24)
    run_and_check(linac, inputs, options=coefficient_options(a, b, c), a=a, b=b, c=c)


def test_explicit_scale(linac):
    inputs = make_inputs(600, B=1, T=40, H=2, K=16, V=16)
    run_and_check(linac, inputs, options=["--scale", "0.4"], scale=0.4)


@pytest.mark.parametrize("a,b,c", [(None, None, None), (1.0, 2.0, -1.0)], ids=["default", "sign_changing"])
def test_no_normalize(linac, a, b, c):
    # Without the denominator any finite coefficients are fine.
    inputs = make_inputs(700, B=1, T=70, H=2, K=16, V=16)
    ref_args = {} if a is None else dict(a=a, b=b, c=c)
    run_and_check(linac, inputs, options=["--no-normalize", *coefficient_options(a, b, c)], normalize=False, **ref_args)


def test_no_normalize_linear_is_linear_attention(linac):
    # f(x) = x without normalization is plain linear attention: check against the other reference.
    inputs = make_inputs(710, B=2, T=70, H=2, K=16, V=16)
    o = linac.run_op("poly", inputs, options=["--no-normalize", *coefficient_options(0, 1, 0)])["o"]
    check_output(o, reference.linear_attn(inputs["q"], inputs["k"], inputs["v"])[0])


def test_bf16(linac):
    inputs = make_inputs(800, B=1, T=100, H=2, K=32, V=32)
    o = linac.run_op("poly", inputs, options=["--dtype", "bf16"])["o"]
    rounded = {name: reference.round_to_bf16(x) for name, x in inputs.items()}
    check_output(o, ref_of(rounded), BF16_TOL)


@pytest.mark.parametrize("options", [[], ["--no-normalize"], coefficient_options(2.0, 0.0, 0.0)],
                         ids=["normalized", "no_normalize", "constant"])
def test_recurrent_matches_chunked(linac, options):
    inputs = make_inputs(900, B=1, T=90, H=2, K=24, V=20)
    inputs["cu_seqlens"] = np.array([0, 5, 5, 70, 90], dtype=np.int64)
    ref_args = dict(normalize="--no-normalize" not in options)
    if "--a" in options:
        ref_args.update(a=2.0, b=0.0, c=0.0)
    chunked = run_and_check(linac, inputs, options=["--chunk-size", "32", *options], **ref_args)
    recurrent = run_and_check(linac, inputs, options=["--recurrent", *options], **ref_args)
    err = reference.rel_err(recurrent, chunked)
    assert err < FP32_TOL, f"recurrent vs chunked differ by {err:.3g}"


# ---------------------------------------------------------------------------------------------------
# Errors: exit status 1, exactly one line on stderr starting with "linac: error:", no output file.


def expect_error(linac, inputs, options, mentions=None):
    args = ["run", "poly", *[f"{n}={linac.write(n, x)}" for n, x in inputs.items()], "-o", "o=o.npy", "--device", "cpu",
            *options]
    before = linac.files()
    proc = linac.run(*args)
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}; stderr: {proc.stderr!r}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), f"expected one error line, got {proc.stderr!r}"
    if mentions is not None:
        for m in mentions:
            assert m in lines[0], f"error should mention {m!r}: {lines[0]!r}"
    assert linac.files() == before, f"files changed: {before} -> {linac.files()}"
    return lines[0]


@pytest.mark.parametrize("a,b,c", [
    (1.0, 1.0, -0.5),   # c < 0: negative for large |x|
    (1.0, 1.0, 0.0),    # linear: changes sign
    (1.0, 2.0, 1.0),    # b^2 = 4ac: a real (double) root
    (0.0, 1.0, 1.0),    # a = 0: root at x = 0
    (-1.0, 0.0, 0.0),   # non-positive constant
], ids=["negative_c", "linear", "double_root", "zero_a", "negative_constant"])
def test_error_coefficients_not_positive(linac, a, b, c):
    line = expect_error(linac, make_inputs(1, B=1, T=8, H=1, K=8, V=8), coefficient_options(a, b, c),
                        mentions=[f"a={a:g}", f"b={b:g}", f"c={c:g}", "--no-normalize"])
    assert "poly" in line


def test_error_coefficient_not_finite(linac):
    expect_error(linac, make_inputs(2, B=1, T=8, H=1, K=8, V=8), ["--no-normalize", "--c", "nan"], mentions=["c=nan"])


def test_error_keys_too_wide(linac):
    expect_error(linac, make_inputs(3, B=1, T=4, H=1, K=136, V=8), [], mentions=["K=136"])


def test_error_unsupported_switch(linac):
    expect_error(linac, make_inputs(4, B=1, T=8, H=1, K=8, V=8), ["--normalize"], mentions=["--normalize"])


def test_error_gate_not_an_input(linac):
    inputs = make_inputs(5, B=1, T=8, H=1, K=8, V=8)
    inputs["g"] = np.zeros((1, 8, 1), dtype=np.float32)
    expect_error(linac, inputs, [], mentions=["'g'"])
