"""float64 numpy reference of gated linear attention (docs/ops/gla.md), token by token.

The most literal reading of the recurrence, sharing nothing with the C++ kernels: no chunks, no
cumulative sums of gates. For each sequence and head, S = S0 (or zeros K x V); for each token t:

    S = diag(exp(g_t)) S + k_t^T v_t ;  o_t = scale * q_t S
"""

import numpy as np


def gla(q, k, v, g, initial_state=None, cu_seqlens=None, scale=None):
    """q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [N, H, K, V] or None; cu_seqlens: N+1
    offsets into the packed time axis (then B must be 1) or None (then N = B). scale defaults to
    K^-0.5. Returns (o [B, T, H, V], final_state [N, H, K, V]), both float64."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K), k.shape
    assert g.shape == (B, T, H, K), g.shape
    assert v.shape == (B, T, H, V), v.shape
    if scale is None:
        scale = K ** -0.5

    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in np.asarray(cu_seqlens)]
        assert B == 1, "cu_seqlens needs packed input with B == 1"
        assert cu[0] == 0 and cu[-1] == T and all(a <= b for a, b in zip(cu, cu[1:])), cu
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    N = len(seqs)
    if initial_state is not None:
        initial_state = np.asarray(initial_state, dtype=np.float64)
        assert initial_state.shape == (N, H, K, V), initial_state.shape

    o = np.zeros((B, T, H, V))
    final_state = np.zeros((N, H, K, V))
    for n, (b, start, end) in enumerate(seqs):
        for h in range(H):
            S = initial_state[n, h].copy() if initial_state is not None else np.zeros((K, V))
            for t in range(start, end):
                S = np.exp(g[b, t, h])[:, None] * S + np.outer(k[b, t, h], v[b, t, h])
                o[b, t, h] = scale * (q[b, t, h] @ S)
            final_state[n, h] = S
    return o, final_state
