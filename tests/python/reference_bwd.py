"""float64 numpy reference gradients of linear_attn (docs/ops/linear_attn.md, "Backward").

Hand-derived reverse recurrences over the naive token-by-token form, sharing nothing with the C++
kernels; test_linear_attn_bwd.py checks them against central finite differences of reference.linear_attn.

One sequence, one head, a_t = exp(g_t) (1 without a gate): S_t = a_t S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.
With dH_t = dL/dS_t (everything flowing into S_t): dH_T = dfinal_state + scale q_T^T do_T,
dH_t = scale q_t^T do_t + a_{t+1} dH_{t+1}. Then dq_t = scale do_t S_t^T, dk_t = v_t dH_t^T,
dv_t = k_t dH_t, dg_t = a_t <dH_t, S_{t-1}>, dinitial_state = a_1 dH_1 (dfinal_state when T = 0).
"""

import numpy as np


def linear_attn_bwd(q, k, v, do, g=None, initial_state=None, dfinal_state=None, cu_seqlens=None, scale=None):
    """Returns dict dq, dk, dv, dinitial_state [, dg] (float64)."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    B, T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    if g is not None:
        g = np.asarray(g, dtype=np.float64)
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in np.asarray(cu_seqlens)]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    N = len(seqs)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dg = np.zeros((B, T, H))
    dh0 = np.zeros((N, H, K, V))
    for n, (b, start, end) in enumerate(seqs):
        for h in range(H):
            a = np.exp(g[b, :, h]) if g is not None else np.ones(T)
            S = np.asarray(initial_state[n, h], np.float64).copy() if initial_state is not None else np.zeros((K, V))
            states = {start - 1: S.copy()}  # S_t after token t (start - 1: the initial state)
            for t in range(start, end):
                S = a[t] * S + np.outer(k[b, t, h], v[b, t, h])
                states[t] = S.copy()
                dq[b, t, h] = scale * (states[t] @ do[b, t, h])
            # dN: dL/dS_t through everything after token t (the seed is dfinal_state at t = end - 1).
            dN = np.asarray(dfinal_state[n, h], np.float64).copy() if dfinal_state is not None else np.zeros((K, V))
            for t in range(end - 1, start - 1, -1):
                dH = dN + scale * np.outer(q[b, t, h], do[b, t, h])
                dk[b, t, h] = dH @ v[b, t, h]
                dv[b, t, h] = k[b, t, h] @ dH
                dg[b, t, h] = a[t] * np.sum(dH * states[t - 1])
                dN = a[t] * dH
            dh0[n, h] = dN
    out = {"dq": dq, "dk": dk, "dv": dv, "dinitial_state": dh0}
    if g is not None:
        out["dg"] = dg
    return out
