"""`linac run poly ... do=.. --backward` (the segmented form, and the pairwise form with --config
tokenwise=1) against the float64 forward reference (reference_poly.poly): every gradient by directional
central differences (gradcheck.py) of L = sum(o do)."""
import numpy as np
import pytest

import gradcheck
import reference
import reference_poly


def make_inputs(seed, B, T, H, K, V):
    rng = np.random.default_rng(seed)
    x = {n: rng.standard_normal(s) for n, s in (("q", (B, T, H, K)), ("k", (B, T, H, K)), ("v", (B, T, H, V)),
                                                   ("do", (B, T, H, V)))}
    return {n: a.astype(np.float32) for n, a in x.items()}


def check(linac, x, coeffs=(1.0, 1.0, 0.5), normalize=True, options=()):
    a, b, c = coeffs
    opts = ["--backward", "--a", str(a), "--b", str(b), "--c", str(c), *options]
    if not normalize:
        opts.append("--no-normalize")
    got = linac.run_op("poly", x, outputs=("dq", "dk", "dv"), options=opts)

    def loss(y):
        o = reference_poly.poly(y["q"], y["k"], y["v"], a=a, b=b, c=c, cu_seqlens=y.get("cu_seqlens"),
                                normalize=normalize)
        return np.sum(o * y["do"])
    gradcheck.check_directional({n: got["d" + n] for n in ("q", "k", "v")}, x, loss)


@pytest.mark.parametrize("T", [2, 17, 40])
def test_gradients(linac, T):
    check(linac, make_inputs(T, B=2, T=T, H=2, K=8, V=6))


def test_single_token(linac):
    # Normalized, o_1 = v_1 f / (f + eps): dq and dk are O(eps), rounding noise only; unnormalized they are not.
    check(linac, make_inputs(1, B=2, T=1, H=2, K=8, V=6), normalize=False)


def test_no_normalize_and_coefficients(linac):
    check(linac, make_inputs(50, B=1, T=30, H=2, K=8, V=8), coeffs=(0.5, -1.0, 1.0), normalize=False)
    check(linac, make_inputs(51, B=1, T=30, H=2, K=8, V=8), coeffs=(2.0, 0.5, 0.25))


def test_varlen(linac):
    x = make_inputs(60, B=1, T=40, H=1, K=8, V=8)
    x["cu_seqlens"] = np.array([0, 1, 25, 40], dtype=np.int32)
    check(linac, x)


def test_non_power_of_two_head_dims(linac):
    check(linac, make_inputs(70, B=1, T=20, H=1, K=12, V=5))


def test_bf16(linac):
    x = make_inputs(80, B=1, T=30, H=2, K=16, V=16)
    got = linac.run_op("poly", x, outputs=("dq", "dk", "dv"), options=["--backward", "--dtype", "bf16"])
    ref = linac.run_op("poly", {n: reference.round_to_bf16(a) for n, a in x.items()}, outputs=("dq", "dk", "dv"),
                       options=["--backward"])
    for name in ("dq", "dk", "dv"):
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


# Chunks of 16 in segments of 1 and 2 chunks over T = 70: the gradients take the tokens outside their
# segment from the forward's states (dq) and the backward's reversed ones (dk, dv), every degree-2 block
# (K odd, K below the key block, K a power of two), the segment's own tokens directly.
@pytest.mark.parametrize("K", [7, 16])
@pytest.mark.parametrize("segment", [16, 32])
def test_segments(linac, K, segment):
    check(linac, make_inputs(90 + K + segment // 16, B=2, T=70, H=2, K=K, V=6),
          options=["--config", f"chunk=16,segment={segment}"])


@pytest.mark.parametrize("coeffs,normalize", [((0.5, -1.0, 1.0), False), ((2.0, 0.5, 0.0), False), ((3.0, 0.0, 0.0), True)],
                         ids=["no_normalize", "linear_no_normalize", "constant"])
def test_segments_with_options(linac, coeffs, normalize):
    check(linac, make_inputs(95, B=1, T=50, H=2, K=8, V=8), coeffs=coeffs, normalize=normalize,
          options=["--config", "chunk=16,segment=16"])


def test_varlen_segments(linac):
    x = make_inputs(96, B=1, T=70, H=2, K=8, V=8)
    x["cu_seqlens"] = np.array([0, 1, 17, 17, 50, 70], dtype=np.int32)
    check(linac, x, options=["--config", "chunk=16,segment=16"])


def test_pairwise_form_agrees(linac):
    # The O(T^2) pairwise form stays as a reference behind --config tokenwise=1.
    x = make_inputs(97, B=1, T=40, H=2, K=8, V=8)
    opts = ["--backward"]
    seg = linac.run_op("poly", x, outputs=("dq", "dk", "dv"), options=[*opts, "--config", "chunk=16,segment=16"])
    pair = linac.run_op("poly", x, outputs=("dq", "dk", "dv"), options=[*opts, "--config", "tokenwise=1"])
    for name in ("dq", "dk", "dv"):
        assert reference.rel_err(seg[name], pair[name]) < 1e-4, name


def test_wide_keys(linac):
    # K = 72 (key block 128): bf16 takes the segmented form (chunks of 16, one per segment here), fp32
    # the pairwise one (its segmented tiles would not fit a block's shared memory): they agree.
    x = make_inputs(98, B=1, T=40, H=1, K=72, V=16)
    got = linac.run_op("poly", x, outputs=("dq", "dk", "dv"),
                       options=["--backward", "--dtype", "bf16", "--config", "segment=16"])
    rounded = {n: reference.round_to_bf16(a) for n, a in x.items()}
    check(linac, rounded)  # the fp32 (pairwise) gradients are right
    ref = linac.run_op("poly", rounded, outputs=("dq", "dk", "dv"), options=["--backward"])
    for name in ("dq", "dk", "dv"):
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "no_normalize"])
def test_coefficient_gradients(linac, normalize):
    # da, db, dc (the paper's learnable coefficients) against central differences of the float64
    # forward in each coefficient, over two segments (chunks of 16) and varlen.
    x = make_inputs(99, B=1, T=60, H=2, K=8, V=8)
    x["cu_seqlens"] = np.array([0, 5, 40, 60], dtype=np.int32)
    coeffs = {"a": 1.5, "b": 0.5, "c": 0.75}
    opts = ["--backward", "--config", "chunk=16,segment=16"]
    for n, v in coeffs.items():
        opts += [f"--{n}", str(v)]
    if not normalize:
        opts.append("--no-normalize")
    got = linac.run_op("poly", x, outputs=("da", "db", "dc", "dq"), options=opts)
    xd = {n: a.astype(np.float64) for n, a in x.items() if n != "cu_seqlens"}

    def loss(**c):
        o = reference_poly.poly(xd["q"], xd["k"], xd["v"], cu_seqlens=x["cu_seqlens"], normalize=normalize, **c)
        return np.sum(o * xd["do"])
    for name in coeffs:
        h = 1e-4
        plus, minus = dict(coeffs), dict(coeffs)
        plus[name] += h
        minus[name] -= h
        want = (loss(**plus) - loss(**minus)) / (2 * h)
        have = float(got["d" + name].reshape(-1)[0])
        assert abs(have - want) <= 1e-3 * max(1.0, abs(want)), f"d{name}: {have} vs finite differences {want}"


def test_coefficient_gradients_not_in_pairwise_form(linac):
    x = make_inputs(100, B=1, T=8, H=1, K=8, V=8)
    proc = linac.run("run", "poly", *[f"{n}={linac.write(n, a)}" for n, a in x.items()], "-o", "da=da.npy",
                     "--backward", "--config", "tokenwise=1", "--device", "cpu")
    assert proc.returncode == 1 and "computes no da" in proc.stderr, proc.stderr


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "no_normalize"])
def test_saved_tensors(linac, normalize):
    # The training pair: the forward saves its states (and den), the backward takes them with o instead
    # of recomputing: the same gradients. Varlen, segments of one chunk.
    x = make_inputs(101, B=1, T=70, H=2, K=8, V=8)
    x["cu_seqlens"] = np.array([0, 5, 50, 70], dtype=np.int32)
    opts = ["--config", "chunk=16,segment=16"] + ([] if normalize else ["--no-normalize"])
    names = ["saved_states"] + (["saved_zstates", "saved_den"] if normalize else [])
    fwd_in = {n: x[n] for n in ("q", "k", "v", "cu_seqlens")}
    fwd = linac.run_op("poly", fwd_in, outputs=("o", *names), options=opts)
    bwd_in = dict(x, **{n: fwd[n] for n in names})
    if normalize:
        bwd_in["o"] = fwd["o"]
    from_saved = linac.run_op("poly", bwd_in, outputs=("dq", "dk", "dv"), options=["--backward", *opts])
    recomputed = linac.run_op("poly", x, outputs=("dq", "dk", "dv"), options=["--backward", *opts])
    for name in ("dq", "dk", "dv"):
        assert reference.rel_err(from_saved[name], recomputed[name]) < 1e-5, name


def test_saved_tensors_all_or_none(linac):
    x = make_inputs(102, B=1, T=20, H=1, K=8, V=8)
    fwd = linac.run_op("poly", {n: x[n] for n in ("q", "k", "v")}, outputs=("o", "saved_states"))
    bwd_in = dict(x, saved_states=fwd["saved_states"])
    args = ["run", "poly", *[f"{n}={linac.write(n, a)}" for n, a in bwd_in.items()], "-o", "dq=dq.npy",
            "--backward", "--device", "cpu"]
    proc = linac.run(*args)
    assert proc.returncode == 1 and "give all of" in proc.stderr, proc.stderr
