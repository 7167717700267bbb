"""float64 numpy references for the delta rule and the gated delta rule (docs/ops/delta_rule.md), in the
most literal token-by-token form: the state update is the matrix product alpha_t (I - beta_t k_t^T k_t)
S_{t-1} + beta_t k_t^T v_t itself. Nothing here is shared with the C++ kernels (no chunking, no WY
representation, no triangular inverse).
"""

import numpy as np

# The kernels' --l2norm-qk divides by sqrt(sum x^2 + L2NORM_EPS) (as fla's l2norm does).
L2NORM_EPS = 1e-6


def _sequences(B, T, cu_seqlens):
    """(batch row, start, end) of each sequence in the time axis."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in np.asarray(cu_seqlens)]
    assert B == 1, "cu_seqlens needs packed input with B == 1"
    assert cu[0] == 0 and cu[-1] == T and all(x <= y for x, y in zip(cu, cu[1:])), cu
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def l2normalize(x, eps=L2NORM_EPS):
    """x / sqrt(sum(x^2) + eps) along the last axis, in float64."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def delta_rule(q, k, v, beta, g=None, initial_state=None, cu_seqlens=None, scale=None, l2norm_qk=False):
    """The (gated) delta rule, token by token.

    For each sequence and head: S = S0 (or zeros K x V); for t:
        S = alpha_t (I - beta_t k_t^T k_t) S + beta_t k_t^T v_t,  alpha_t = exp(g_t) (1 without g)
        o_t = scale * q_t S
    with q_t, k_t L2-normalized first when l2norm_qk.

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; g: [B, T, H] or None; initial_state:
    [N, H, K, V] or None; cu_seqlens: N+1 offsets (B must be 1) or None (then N = B). scale defaults
    to K^-0.5. Returns (o [B, T, H, V], final_state [N, H, K, V]), both float64.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K), k.shape
    assert v.shape == (B, T, H, V), v.shape
    assert beta.shape == (B, T, H), beta.shape
    if g is not None:
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == (B, T, H), g.shape
    if scale is None:
        scale = K ** -0.5
    if l2norm_qk:
        q, k = l2normalize(q), l2normalize(k)
    seqs = _sequences(B, T, cu_seqlens)
    N = len(seqs)
    if initial_state is not None:
        initial_state = np.asarray(initial_state, dtype=np.float64)
        assert initial_state.shape == (N, H, K, V), initial_state.shape

    eye = np.eye(K)
    o = np.zeros((B, T, H, V))
    final_state = np.zeros((N, H, K, V))
    for n, (b, start, end) in enumerate(seqs):
        for h in range(H):
            S = initial_state[n, h].copy() if initial_state is not None else np.zeros((K, V))
            for t in range(start, end):
                kt, bt = k[b, t, h], beta[b, t, h]
                alpha = np.exp(g[b, t, h]) if g is not None else 1.0
                S = alpha * (eye - bt * np.outer(kt, kt)) @ S + bt * np.outer(kt, v[b, t, h])
                o[b, t, h] = scale * (q[b, t, h] @ S)
            final_state[n, h] = S
    return o, final_state
