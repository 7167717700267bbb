"""Checks the naive reference (reference.py) against two independent float64 formulations.

- The chunked form of docs/ops/linear_attn.md (FlashLinearAttention with a scalar gate), written here
  with zero padding of the last chunk the way a kernel masks it.
- The quadratic "parallel" form: o_t = scale * (exp(b_t) q_t S0 + sum_{s<=t} exp(b_t - b_s) (q_t.k_s) v_s).

Runs without the CLI: this is what makes the CLI tests' expectations trustworthy.
"""

import numpy as np
import pytest

import reference


def chunked_linear_attn(q, k, v, g=None, initial_state=None, cu_seqlens=None, scale=None, chunk=64):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = np.zeros((B, T, H, V))
    final = np.zeros((len(seqs), H, K, V))
    for n, (b, start, end) in enumerate(seqs):
        # All heads at once: S is [H, K, V].
        S = np.zeros((H, K, V)) if initial_state is None else np.array(initial_state[n], dtype=np.float64)
        for c0 in range(start, end, chunk):
            rows = min(chunk, end - c0)
            # Pad the last chunk to C rows: zero q/k/v and zero log-decay leave the sums unchanged.
            Q = np.zeros((chunk, H, K))
            Kc = np.zeros((chunk, H, K))
            Vc = np.zeros((chunk, H, V))
            gc = np.zeros((chunk, H))
            Q[:rows] = q[b, c0:c0 + rows]
            Kc[:rows] = k[b, c0:c0 + rows]
            Vc[:rows] = v[b, c0:c0 + rows]
            if g is not None:
                gc[:rows] = g[b, c0:c0 + rows]
            bcum = np.cumsum(gc, axis=0)  # [C, H], chunk-local inclusive
            mask = np.tril(np.ones((chunk, chunk), dtype=bool))
            diff = bcum[:, None, :] - bcum[None, :, :]  # [r, c, H] = b_r - b_c
            # Mask before exponentiating: the upper triangle has b_r - b_c > 0 and may overflow.
            gamma = np.where(mask[:, :, None], np.exp(np.where(mask[:, :, None], diff, 0.0)), 0.0)
            scores = np.einsum("rhk,chk->rch", Q, Kc) * gamma
            inter = np.einsum("rhk,hkv->rhv", np.exp(bcum)[:, :, None] * Q, S)
            intra = np.einsum("rch,chv->rhv", scores, Vc)
            o[b, c0:c0 + rows] = (scale * (inter + intra))[:rows]
            last = bcum[-1]  # [H]
            S = np.exp(last)[:, None, None] * S + np.einsum(
                "chk,chv->hkv", np.exp(last[None, :] - bcum)[:, :, None] * Kc, Vc)
        final[n] = S
    return o, final


def parallel_linear_attn(q, k, v, g=None, initial_state=None, scale=None):
    """Quadratic form, one sequence per batch row (no varlen)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    gg = np.zeros((B, T, H)) if g is None else np.asarray(g, dtype=np.float64)
    bcum = np.cumsum(gg, axis=1)  # [B, T, H]
    diff = bcum[:, :, None, :] - bcum[:, None, :, :]  # [B, t, s, H]
    mask = np.tril(np.ones((T, T), dtype=bool))[None, :, :, None]
    decay = np.where(mask, np.exp(np.where(mask, diff, 0.0)), 0.0)
    att = np.einsum("bthk,bshk->btsh", q, k) * decay
    o = scale * np.einsum("btsh,bshv->bthv", att, v)
    if initial_state is not None:
        o += scale * np.exp(bcum)[..., None] * np.einsum("bthk,bhkv->bthv", q, initial_state)
    return o


def make(seed, B, T, H, K, V, gate=False, init=False, N=None, gate_bias=0.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    g = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + gate_bias)) if gate else None  # log(sigmoid(x))
    s0 = rng.standard_normal((N or B, H, K, V)) if init else None
    return q, k, v, g, s0


def close(a, b, tol=1e-12):
    err = reference.rel_err(a, b)
    assert err < tol, err


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("init", [False, True])
def test_naive_matches_chunked(T, gate, init):
    q, k, v, g, s0 = make(T * 4 + gate * 2 + init, 2, T, 3, 8, 12, gate=gate, init=init, gate_bias=2.0)
    o, s = reference.linear_attn(q, k, v, g=g, initial_state=s0)
    for chunk in (16, 64):
        oc, sc = chunked_linear_attn(q, k, v, g=g, initial_state=s0, chunk=chunk)
        close(o, oc)
        close(s, sc)


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("init", [False, True])
def test_naive_matches_parallel(gate, init):
    q, k, v, g, s0 = make(11 + gate * 2 + init, 2, 70, 2, 5, 7, gate=gate, init=init, gate_bias=3.0)
    o, _ = reference.linear_attn(q, k, v, g=g, initial_state=s0, scale=0.37)
    close(o, parallel_linear_attn(q, k, v, g=g, initial_state=s0, scale=0.37))


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("init", [False, True])
def test_varlen(gate, init):
    cu = np.array([0, 1, 17, 80, 81, 130], dtype=np.int64)
    N = len(cu) - 1
    q, k, v, g, s0 = make(5 + gate * 2 + init, 1, 130, 2, 6, 10, gate=gate, init=init, N=N, gate_bias=2.0)
    o, s = reference.linear_attn(q, k, v, g=g, initial_state=s0, cu_seqlens=cu)
    assert o.shape == (1, 130, 2, 10) and s.shape == (N, 2, 6, 10)
    oc, sc = chunked_linear_attn(q, k, v, g=g, initial_state=s0, cu_seqlens=cu, chunk=16)
    close(o, oc)
    close(s, sc)
    # Packing must be the same as running each sequence on its own from its own initial state.
    for n in range(N):
        a, e = cu[n], cu[n + 1]
        on, sn = reference.linear_attn(q[:, a:e], k[:, a:e], v[:, a:e], g=None if g is None else g[:, a:e],
                                       initial_state=None if s0 is None else s0[n:n + 1])
        np.testing.assert_array_equal(o[:, a:e], on)
        np.testing.assert_array_equal(s[n:n + 1], sn)


def test_default_scale_and_one_token():
    q, k, v, _, s0 = make(3, 1, 1, 1, 4, 3, init=True)
    o, s = reference.linear_attn(q, k, v, initial_state=s0)
    S = s0[0, 0] + np.outer(k[0, 0, 0], v[0, 0, 0])
    np.testing.assert_allclose(o[0, 0, 0], 0.5 * q[0, 0, 0] @ S, rtol=1e-14)
    np.testing.assert_allclose(s[0, 0], S, rtol=1e-14)


def test_gate_decays_state():
    # With g = log(0.5) and zero keys after the first token, the state halves every step.
    q = np.ones((1, 4, 1, 1))
    k = np.array([1.0, 0, 0, 0]).reshape(1, 4, 1, 1)
    v = np.ones((1, 4, 1, 1))
    g = np.full((1, 4, 1), np.log(0.5))
    o, s = reference.linear_attn(q, k, v, g=g, scale=1.0)
    np.testing.assert_allclose(o[0, :, 0, 0], [1.0, 0.5, 0.25, 0.125], rtol=1e-14)
    np.testing.assert_allclose(s[0, 0], [[0.125]], rtol=1e-14)


def test_round_to_bf16():
    f = np.float32
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5, 0.0, -0.0, np.inf, -np.inf,
                  3.4028235e38, 1e-40], dtype=f)
    want = np.array([1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.5, 0.0, -0.0, np.inf, -np.inf, np.inf, 0.0], dtype=f)
    got = reference.round_to_bf16(x)
    assert got.dtype == np.float32
    assert np.signbit(got[6])
    # 1e-40 is a float32 subnormal: bits 0x000116c2 round to 0x0001 << 16 = 9.18e-41, not 0.
    want[-1] = np.array([0x00010000], dtype=np.uint32).view(np.float32)[0]
    np.testing.assert_array_equal(got, want)
    assert np.isnan(reference.round_to_bf16(np.array([np.nan], dtype=f)))[0]

    # On random values the result has 8 mantissa bits and is the nearer of the two bf16 neighbours.
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100000) * 10.0 ** rng.integers(-20, 20, 100000)).astype(f)
    r = reference.round_to_bf16(x)
    assert np.all(r.view(np.uint32) & 0xFFFF == 0)
    lo = (x.view(np.uint32) & 0xFFFF0000).view(f).astype(np.float64)  # truncation toward zero
    hi = ((x.view(np.uint32) & 0xFFFF0000) + 0x10000).view(f).astype(np.float64)
    xd = x.astype(np.float64)
    err = np.abs(r.astype(np.float64) - xd)
    assert np.all(err <= np.minimum(np.abs(xd - lo), np.abs(hi - xd)))
    rel = err / np.abs(xd)
    assert rel.max() <= 2.0**-8  # unit roundoff of an 8-bit significand


def test_rel_err():
    assert reference.rel_err([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert reference.rel_err([3.0, 4.0], [0.0, 5.0]) == pytest.approx(np.sqrt(10) / 5)
