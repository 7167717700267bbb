"""float64 numpy references for polynomial-kernel attention (poly) and normalized linear attention, in
their most literal form: poly as the double sum over s <= t, normalized linear attention token by token.
Nothing here is shared with the C++ kernels (no chunking, no factorized state).
"""

import numpy as np

# The kernels add this to the denominator (kPolyEps, kNormalizedLinearAttnEps).
EPS = 1e-6


def _sequences(B, T, cu_seqlens):
    """(batch row, start, end) of each sequence in the time axis."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in np.asarray(cu_seqlens)]
    assert B == 1, "cu_seqlens needs packed input with B == 1"
    assert cu[0] == 0 and cu[-1] == T and all(x <= y for x, y in zip(cu, cu[1:])), cu
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def poly(q, k, v, a=1.0, b=1.0, c=0.5, cu_seqlens=None, scale=None, normalize=True, eps=EPS):
    """Polynomial-kernel attention (docs/ops/poly.md).

    For each sequence, head and t: x_s = scale * q_t . k_s and f_s = a + b x_s + c x_s^2 for s <= t in
    the same sequence; o_t = sum_s f_s v_s / (sum_s f_s + eps), or sum_s f_s v_s without normalize.

    q, k: [B, T, H, K]; v: [B, T, H, V]; cu_seqlens: N+1 offsets (B must be 1) or None. scale
    defaults to K^-0.5. Returns o [B, T, H, V] in float64.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K) and v.shape == (B, T, H, V)
    if scale is None:
        scale = K ** -0.5
    o = np.zeros((B, T, H, V))
    for bi, start, end in _sequences(B, T, cu_seqlens):
        for h in range(H):
            for t in range(start, end):
                num = np.zeros(V)
                den = 0.0
                for s in range(start, t + 1):
                    x = scale * float(q[bi, t, h] @ k[bi, s, h])
                    f = a + b * x + c * x * x
                    num += f * v[bi, s, h]
                    den += f
                o[bi, t, h] = num / (den + eps) if normalize else num
    return o


def linear_attn_normalized(q, k, v, g=None, cu_seqlens=None, scale=None, eps=EPS):
    """Normalized linear attention (docs/ops/linear_attn.md), token by token.

    For each sequence and head, from S = 0 (K x V) and z = 0 (K): S = exp(g_t) S + k_t^T v_t,
    z = exp(g_t) z + k_t, o_t = scale q_t S / (scale q_t . z + eps). g: [B, T, H] log-decays or None.
    Returns o [B, T, H, V] in float64.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K) and v.shape == (B, T, H, V)
    if g is not None:
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == (B, T, H)
    if scale is None:
        scale = K ** -0.5
    o = np.zeros((B, T, H, V))
    for bi, start, end in _sequences(B, T, cu_seqlens):
        for h in range(H):
            S = np.zeros((K, V))
            z = np.zeros(K)
            for t in range(start, end):
                decay = np.exp(g[bi, t, h]) if g is not None else 1.0
                S = decay * S + np.outer(k[bi, t, h], v[bi, t, h])
                z = decay * z + k[bi, t, h]
                o[bi, t, h] = scale * (q[bi, t, h] @ S) / (scale * (q[bi, t, h] @ z) + eps)
    return o
