"""`linac run linear_attn --normalize --backward` against float64 gradients.

The reference composes plain linear attention's reference gradients (reference_bwd, itself checked
by finite differences) through o = N / (D + eps), N = LA(q, k, v), D = LA(q, k, 1); the composition is
checked here against central finite differences of the naive normalized forward
(reference_poly.linear_attn_normalized), which shares nothing with it. q and k are elu+1 features so
the denominator stays away from zero."""
import numpy as np
import pytest

import reference
import reference_bwd
import reference_poly

FP32_TOL = 1e-5
BF16_TOL = 3e-2


def elu1(x):
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def make_inputs(seed, B, T, H, K, V, gate=False):
    rng = np.random.default_rng(seed)
    x = {
        "q": elu1(rng.standard_normal((B, T, H, K))),
        "k": elu1(rng.standard_normal((B, T, H, K))),
        "v": rng.standard_normal((B, T, H, V)),
        "do": rng.standard_normal((B, T, H, V)),
    }
    if gate:
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + 2.0))
    return {n: a.astype(np.float32) for n, a in x.items()}


def reference_grads(x, scale=None):
    """dq, dk, dv [, dg] in float64 by composition (see the module docstring)."""
    q, k, v, do = (np.asarray(x[n], dtype=np.float64) for n in ("q", "k", "v", "do"))
    g, cu = x.get("g"), x.get("cu_seqlens")
    ones = np.ones(v.shape[:-1] + (1,))
    num, _ = reference.linear_attn(q, k, v, g=g, cu_seqlens=cu, scale=scale)
    den, _ = reference.linear_attn(q, k, ones, g=g, cu_seqlens=cu, scale=scale)
    den = den + reference_poly.EPS
    o = num / den
    d_num = do / den
    d_den = -np.sum(do * o, axis=-1, keepdims=True) / den
    a = reference_bwd.linear_attn_bwd(q, k, v, d_num, g=g, cu_seqlens=cu, scale=scale)
    b = reference_bwd.linear_attn_bwd(q, k, ones, d_den, g=g, cu_seqlens=cu, scale=scale)
    out = {"dq": a["dq"] + b["dq"], "dk": a["dk"] + b["dk"], "dv": a["dv"]}
    if g is not None:
        out["dg"] = a["dg"] + b["dg"]
    return out


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_reference_matches_finite_differences(gate, varlen):
    x = make_inputs(11 + gate, B=1, T=6, H=2, K=3, V=2, gate=gate)
    x = {n: a.astype(np.float64) for n, a in x.items()}
    if varlen:
        x["cu_seqlens"] = np.array([0, 2, 6], dtype=np.int32)
    scale = 0.7

    def loss(y):
        o = reference_poly.linear_attn_normalized(y["q"], y["k"], y["v"], g=y.get("g"),
                                                  cu_seqlens=y.get("cu_seqlens"), scale=scale)
        return np.sum(o * y["do"])

    grads = reference_grads(x, scale=scale)
    for name in ["q", "k", "v"] + (["g"] if gate else []):
        fd = np.zeros_like(x[name])
        for idx in np.ndindex(*x[name].shape):
            xp = dict(x); xp[name] = x[name].copy(); xp[name][idx] += 1e-6
            xm = dict(x); xm[name] = x[name].copy(); xm[name][idx] -= 1e-6
            fd[idx] = (loss(xp) - loss(xm)) / 2e-6
        err = reference.rel_err(grads["d" + name], fd)
        assert err < 1e-6, f"d{name}: composed reference vs finite differences rel err {err:.3g}"


def check(linac, x, options=(), tol=FP32_TOL, rounded=None):
    outputs = ["dq", "dk", "dv"] + (["dg"] if "g" in x else [])
    got = linac.run_op("linear_attn", x, outputs=outputs, options=["--normalize", "--backward", *options])
    ref = reference_grads(rounded or x)
    for name in outputs:
        assert got[name].shape == ref[name].shape, f"{name}: shape {got[name].shape}"
        assert np.all(np.isfinite(got[name])), f"{name}: non-finite values"
        err = reference.rel_err(got[name], ref[name])
        assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
@pytest.mark.parametrize("T", [2, 17, 100])
def test_gradients(linac, T, gate):
    check(linac, make_inputs(100 + T + gate, B=2, T=T, H=2, K=32, V=24, gate=gate))


@pytest.mark.parametrize("T", [17, 100])
def test_split_schedule(linac, T):
    # The split schedule (the default at few heads over long sequences in 16-bit): N's and D's backwards
    # apart, dq and dk summed.
    check(linac, make_inputs(120 + T, B=2, T=T, H=2, K=32, V=24), options=["--config", "split=1"])


def test_split_schedule_bf16(linac):
    x = make_inputs(310, B=1, T=70, H=2, K=32, V=32)
    rounded = {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()}
    check(linac, x, options=["--dtype", "bf16", "--config", "split=1"], tol=BF16_TOL, rounded=rounded)


def test_split_schedule_takes_no_gate(linac):
    x = make_inputs(320, B=1, T=8, H=1, K=16, V=16, gate=True)
    with pytest.raises(Exception, match="no g"):
        linac.run_op("linear_attn", x, outputs=("dq",), options=["--normalize", "--backward", "--config", "split=1"])


def test_single_token(linac):
    # o_1 = v_1 (q.k) / (q.k + eps): dq and dk are O(eps), all cancellation noise (no relative error
    # makes sense for them); dv is exact.
    x = make_inputs(150, B=2, T=1, H=2, K=32, V=24, gate=True)
    got = linac.run_op("linear_attn", x, outputs=("dq", "dk", "dv"), options=["--normalize", "--backward"])
    ref = reference_grads(x)
    assert reference.rel_err(got["dv"], ref["dv"]) < FP32_TOL
    for name in ("dq", "dk"):
        assert np.max(np.abs(got[name])) < 1e-6 and np.max(np.abs(ref[name])) < 1e-6


def test_varlen(linac):
    x = make_inputs(200, B=1, T=90, H=2, K=16, V=16, gate=True)
    x["cu_seqlens"] = np.array([0, 1, 40, 90], dtype=np.int32)
    check(linac, x)


def test_bf16(linac):
    x = make_inputs(300, B=1, T=70, H=2, K=32, V=32, gate=True)
    rounded = {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()}
    check(linac, x, options=["--dtype", "bf16"], tol=BF16_TOL, rounded=rounded)


def test_states_are_rejected(linac):
    x = make_inputs(400, B=1, T=8, H=1, K=16, V=16)
    x["dfinal_state"] = np.zeros((1, 1, 16, 16), dtype=np.float32)
    args = ["run", "linear_attn", *(f"{n}={linac.write(n, a)}" for n, a in x.items()), "-o", "dq=dq.npy",
            "--normalize", "--backward", "--device", "cpu"]
    proc = linac.run(*args)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "dfinal_state" in lines[0], proc.stderr
