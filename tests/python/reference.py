"""float64 numpy references for the linac ops, in the naive token-by-token recurrent form.

These are deliberately the slowest, most literal reading of docs/ops/ (the math of each op): no chunking, no
cumulative sums, nothing shared with the C++ kernels. test_reference.py checks them against an
independent chunked implementation.
"""

import numpy as np


def linear_attn(q, k, v, g=None, initial_state=None, cu_seqlens=None, scale=None):
    """Linear attention with an optional per-head scalar log-decay (docs/ops/linear_attn.md).

    For each sequence and head: S = S0 (or zeros K x V); for t: S = exp(g_t) S + k_t^T v_t;
    o_t = scale * q_t S.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] or None; initial_state: [N, H, K, V] or None;
    cu_seqlens: N+1 offsets into the packed time axis (then B must be 1) or None (then N = B).
    scale defaults to K^-0.5. Returns (o [B, T, H, V], final_state [N, H, K, V]), both float64.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert k.shape == (B, T, H, K), k.shape
    assert v.shape == (B, T, H, V), v.shape
    if g is not None:
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == (B, T, H), g.shape
    if scale is None:
        scale = K ** -0.5

    # Each sequence is (batch row, start, end) in the time axis.
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
                if g is not None:
                    S = np.exp(g[b, t, h]) * S
                S = S + np.outer(k[b, t, h], v[b, t, h])
                o[b, t, h] = scale * (q[b, t, h] @ S)
            final_state[n, h] = S
    return o, final_state


def round_to_bf16(x):
    """Rounds float32 values to the nearest bfloat16 (ties to even); returns float32.

    bf16 is the top 16 bits of a float32, so rounding adds 0x7fff plus the lowest kept bit and
    truncates. NaNs are kept as (quiet) NaNs; values that round past the largest bf16 become inf.
    """
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def rel_err(out, ref):
    """||out - ref|| / ||ref|| over all elements, in float64."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
