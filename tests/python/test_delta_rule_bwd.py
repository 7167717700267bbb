"""`linac run delta_rule|gated_delta_rule ... do=.. [dfinal_state=..] --backward` (delta_rule in chunks,
gated_delta_rule token by token with checkpoints) against the float64 forward reference (reference_delta.delta_rule): every gradient by
directional central differences (gradcheck.py) of L = sum(o do) + sum(S_T dfinal)."""
import numpy as np
import pytest

import gradcheck
from conftest import CliError
import reference
import reference_delta

OPS = ["delta_rule", "gated_delta_rule"]


def make_inputs(seed, op, B, T, H, K, V, init=False, dfinal=False, N=None):
    rng = np.random.default_rng(seed)
    N = N or B
    x = {"q": rng.standard_normal((B, T, H, K)), "k": reference_delta.l2normalize(rng.standard_normal((B, T, H, K))),
         "v": rng.standard_normal((B, T, H, V)), "beta": 1 / (1 + np.exp(-rng.standard_normal((B, T, H)))),
         "do": rng.standard_normal((B, T, H, V))}
    if op == "gated_delta_rule":
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + 2.0))
    if init:
        x["initial_state"] = rng.standard_normal((N, H, K, V))
    if dfinal:
        x["dfinal_state"] = rng.standard_normal((N, H, K, V))
    return {n: a.astype(np.float32) for n, a in x.items()}


def loss(x):
    o, s = reference_delta.delta_rule(x["q"], x["k"], x["v"], x["beta"], g=x.get("g"),
                                      initial_state=x.get("initial_state"), cu_seqlens=x.get("cu_seqlens"))
    total = np.sum(o * x["do"])
    if "dfinal_state" in x:
        total += np.sum(s * x["dfinal_state"])
    return total


def check(linac, op, x, options=()):
    grads = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "initial_state": "dinitial_state"}
    grads = {n: d for n, d in grads.items() if n in x}
    got = linac.run_op(op, x, outputs=list(grads.values()), options=["--backward", *options])
    gradcheck.check_directional({n: got[d] for n, d in grads.items()}, x, loss)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("T", [1, 16, 37])
def test_gradients(linac, op, T):
    check(linac, op, make_inputs(10 + T + 100 * OPS.index(op), op, B=2, T=T, H=2, K=8, V=6))


@pytest.mark.parametrize("op", OPS)
def test_states(linac, op):
    check(linac, op, make_inputs(40 + OPS.index(op), op, B=1, T=40, H=2, K=12, V=8, init=True, dfinal=True))


@pytest.mark.parametrize("op", OPS)
def test_varlen(linac, op):
    x = make_inputs(50 + OPS.index(op), op, B=1, T=45, H=1, K=8, V=8, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = np.array([0, 1, 20, 45], dtype=np.int32)
    check(linac, op, x)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["chunk=16", "chunk=16,bv=16", "chunk=64,warps=8", "chunk=32,bv=32,warps=2",
                                    "chunk=16,cv=16", "chunk=32,ck=16", "chunk=16,ck=16,cv=16,kwarps=4,kstages=2",
                                    "cv=32,warps=4,kstages=2", "tokenwise=1"])
def test_chunked_configs(linac, op, config):
    # The chunked backward over many chunks (T=100 at chunk 16: seven, the last partial), with value
    # blocks (V=40 pads to 64: bv=16 gives four walks per head, the last partly masked), K != V, both
    # states; the per-chunk kernel in value-column steps (cv=16: four, as head dims over 128 run it; cv=32
    # prefetched on 4 warps: two, as 16 bits up to head dim 128 run it) and
    # in key blocks (ck=16: two, K=24 padded to 32; two kernels, as the gated form runs them over 128); and
    # the token-by-token reference form (tokenwise=1).
    x = make_inputs(80 + OPS.index(op), op, B=2, T=100, H=2, K=24, V=40, init=True, dfinal=True)
    check(linac, op, x, options=["--config", config])


SAVED = ["saved_w", "saved_t", "saved_h", "saved_v_new"]
GRADS = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "initial_state": "dinitial_state"}


def forward_inputs(x):
    return {n: a for n, a in x.items() if n not in ("do", "dfinal_state")}


def saved_pair(linac, op, x, fwd_options=(), bwd_options=()):
    """The training pair: the forward with its saved_* outputs, then --backward given them. Returns
    (forward outputs, gradients)."""
    outs = ["o", *SAVED] + (["final_state"] if "dfinal_state" in x else [])
    fwd = linac.run_op(op, forward_inputs(x), outputs=outs, options=list(fwd_options))
    grads = {n: d for n, d in GRADS.items() if n in x}
    bwd_in = {**x, **{n: fwd[n] for n in SAVED}}
    got = linac.run_op(op, bwd_in, outputs=list(grads.values()), options=["--backward", *bwd_options])
    return fwd, {n: got[d] for n, d in grads.items()}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fwd_options,chunk", [((), 32), (("--chunk-size", "16"), 16), (("--chunk-size", "64"), 64),
                                               (("--config", "split=1"), 32)],
                         ids=["default", "chunk16", "chunk64", "split_schedule"])
def test_backward_from_the_saved_forward(linac, op, fwd_options, chunk):
    # The forward saves W, T, the state before each chunk and V_new; the backward given them runs only
    # the reverse walk and the per-chunk kernel. The gradients must be the reference's, over many chunks
    # (K != V, both states) and varlen sequences that start and end inside chunks; and the forward's
    # outputs must be those of the plain forward at the same chunk (saving defaults to the backward's
    # chunk, 32, where the plain forward takes 64 at these head dims). The split schedule's state pass
    # stores the same tables.
    x = make_inputs(85 + OPS.index(op), op, B=2, T=100, H=2, K=24, V=40, init=True, dfinal=True)
    fwd, grads = saved_pair(linac, op, x, fwd_options)
    assert fwd["saved_t"].shape[-1] == chunk
    same = list(fwd_options) if "--chunk-size" in fwd_options else [*fwd_options, "--chunk-size", chunk]
    plain = linac.run_op(op, forward_inputs(x), outputs=["o", "final_state"], options=same)
    np.testing.assert_array_equal(fwd["o"], plain["o"])
    np.testing.assert_array_equal(fwd["final_state"], plain["final_state"])
    gradcheck.check_directional(grads, x, loss)

    x = make_inputs(86 + OPS.index(op), op, B=1, T=120, H=2, K=16, V=16, init=True, dfinal=True, N=4)
    x["cu_seqlens"] = np.array([0, 7, 40, 41, 120], dtype=np.int32)
    _, grads = saved_pair(linac, op, x, fwd_options)
    gradcheck.check_directional(grads, x, loss)


@pytest.mark.parametrize("op", OPS)
def test_backward_from_the_segmented_forward(linac, op):
    # The segment-parallel forward (--config segment=64) saves the same tables: each segment's walk
    # stores its chunks' states at their global rows (two whole segments and a short one, both states).
    x = make_inputs(87 + OPS.index(op), op, B=2, T=150, H=2, K=24, V=40, init=True, dfinal=True)
    fwd, grads = saved_pair(linac, op, x, ("--config", "segment=64"))
    plain = linac.run_op(op, forward_inputs(x), outputs=["o", "final_state", *SAVED])
    for name in ["o", "final_state", *SAVED]:
        np.testing.assert_allclose(fwd[name], plain[name], rtol=1e-5, atol=1e-5, err_msg=name)
    gradcheck.check_directional(grads, x, loss)


@pytest.mark.parametrize("op", OPS)
def test_saved_backward_equals_the_recomputing_one(linac, op):
    # The forward stores what the backward's UT kernel and state walk compute, by the same operations:
    # the gradients agree to rounding (bitwise on the interpreter).
    x = make_inputs(88 + OPS.index(op), op, B=1, T=70, H=2, K=16, V=24, init=True, dfinal=True)
    _, saved = saved_pair(linac, op, x)
    grads = {n: d for n, d in GRADS.items() if n in x}
    got = linac.run_op(op, x, outputs=list(grads.values()), options=["--backward"])
    for n, d in grads.items():
        np.testing.assert_allclose(saved[n], got[d], rtol=1e-6, atol=1e-6, err_msg=n)


def test_saved_tensors_all_or_none_and_at_their_chunk(linac):
    x = make_inputs(89, "delta_rule", B=1, T=40, H=1, K=8, V=8)
    fwd = linac.run_op("delta_rule", forward_inputs(x), outputs=["o", *SAVED], options=["--chunk-size", "16"])
    with pytest.raises(CliError, match="give all of saved_w, saved_t, saved_h, saved_v_new"):
        linac.run_op("delta_rule", {**x, "saved_w": fwd["saved_w"]}, outputs=["dq"], options=["--backward"])
    full = {**x, **{n: fwd[n] for n in SAVED}}
    with pytest.raises(CliError, match="chunk 32 asked for, but the saved tensors are in chunks of 16"):
        linac.run_op("delta_rule", full, outputs=["dq"], options=["--backward", "--chunk-size", "32"])
    with pytest.raises(CliError, match="saved_h has shape"):
        linac.run_op("delta_rule", {**full, "saved_h": fwd["saved_h"][:1]}, outputs=["dq"], options=["--backward"])
    with pytest.raises(CliError, match="saved_\\* outputs are not made with --l2norm-qk"):
        linac.run_op("delta_rule", forward_inputs(x), outputs=["o", *SAVED], options=["--l2norm-qk"])


@pytest.mark.parametrize("op", OPS)
def test_chunked_varlen_many_chunks(linac, op):
    # Sequences that start and end inside chunks: the per-chunk state tables are indexed by global chunk.
    x = make_inputs(82 + OPS.index(op), op, B=1, T=120, H=2, K=16, V=16, init=True, dfinal=True, N=4)
    x["cu_seqlens"] = np.array([0, 7, 40, 41, 120], dtype=np.int32)
    check(linac, op, x, options=["--config", "chunk=16"])


@pytest.mark.parametrize("op", OPS)
def test_chunked_head_dim_128(linac, op):
    # DeltaNet's usual head size, two V blocks of 64 in the walks.
    check(linac, op, make_inputs(84 + OPS.index(op), op, B=1, T=40, H=1, K=128, V=128, init=True, dfinal=True))


@pytest.mark.parametrize("op", OPS)
def test_chunked_head_dim_256(linac, op):
    # fla's widest shape: the per-chunk kernel takes the value columns in steps (delta_bwd_chunk_columns)
    # since S and dS' whole would not fit in shared memory; the gated form's per-chunk work runs in two
    # kernels, by key blocks (delta_bwd_chunk_key_columns).
    check(linac, op, make_inputs(86 + OPS.index(op), op, B=1, T=40, H=1, K=256, V=256, init=True, dfinal=True))


@pytest.mark.parametrize("stop", [-1e4, -3e38, -np.inf])
def test_very_negative_gates(linac, stop):
    # Gates of -1e4 for a stretch (the state forgets), inside and across chunks of 16, both forms. The
    # chunked one sums the decays between rows directly (chunk_decays): taken as differences of the
    # chunk's cumulative log-decays they lost the small gates next to the -1e4 ones (2.6e-4 relative
    # difference from the exact token-by-token gradients; now 1e-7). -inf and -3e38 likewise.
    x = make_inputs(86, "gated_delta_rule", B=1, T=60, H=2, K=16, V=16, init=True, dfinal=True)
    x["g"][:, 20:35] = stop
    check(linac, "gated_delta_rule", x, options=["--config", "tokenwise=1"])
    check(linac, "gated_delta_rule", x, options=["--config", "chunk=16"])
    check(linac, "gated_delta_rule", x)


@pytest.mark.parametrize("op", OPS)
def test_bf16(linac, op):
    x = make_inputs(60 + OPS.index(op), op, B=1, T=30, H=2, K=16, V=16, init=True, dfinal=True)
    outs = ("dq", "dk", "dv", "dbeta")
    got = linac.run_op(op, x, outputs=outs, options=["--backward", "--dtype", "bf16"])
    ref = linac.run_op(op, {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()},
                       outputs=outs, options=["--backward"])
    for name in outs:
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


@pytest.mark.parametrize("dtype,head_dim,header", [("bf16", 128, "num_warps = 4, num_stages = 2,"),
                                                   ("fp16", 128, "num_warps = 4, num_stages = 2,"),
                                                   ("fp32", 128, "num_warps = 8, num_stages = 1,"),
                                                   ("fp32", 64, "num_warps = 4, num_stages = 1,")])
def test_per_chunk_kernel_shape_by_dtype(linac, dtype, head_dim, header):
    # The per-chunk kernel's default shape (op_bwd.cpp chunk_kernel_shapes): in 16 bits value steps of 32
    # on 4 warps, prefetched (two programs per SM: measured faster on an H200); in fp32, whose steps were
    # not measured faster, all of V in one step, on 4 warps at V = 64 (faster, and spill-free where 8
    # spilled) and on 8 at 128.
    r = linac.run("compile", "delta_rule", "--backward", "--shape", f"B=8,T=4096,H=16,K={head_dim}", "--dtype",
                  dtype, "--emit", "tir")
    assert r.returncode == 0, r.stderr
    assert header in r.stdout.split("kernel @delta_rule_bwd_chunk(")[1].split("\n", 1)[0]


@pytest.mark.parametrize("op,accumulating", [("delta_rule", 1), ("gated_delta_rule", 2)])
def test_state_gradient_walk_products_accumulate(linac, op, accumulating):
    # The walk of the state gradients (kernels/delta_rule/bwd.cpp build_delta_bwd_dstates): its [K, V]
    # products of the chunk accumulate into the state (`--emit layouts` marks them "(accumulates)"): the
    # gated form both, the ungated W^T dV_new (Q^T dO keeps its scale after the product). Summed after
    # them as three [K, V] tiles, the fp32 walk spilled 24 bytes (session 38); written `dS * exp(total) +
    # dot(..)` the product was recorded first and ran from zero (ptxas then injected a wait, C7517).
    r = linac.run("compile", op, "--backward", "--shape", "B=8,T=4096,H=16,K=128", "--emit", "layouts")
    assert r.returncode == 0, r.stderr
    walk = r.stdout.split(f"kernel @{op}_bwd_dstates(")[1].split("\nkernel @")[0]
    state_products = [line for line in walk.splitlines() if " dot " in line and "tile<128x128xf32>" in line]
    assert len(state_products) == 2, walk
    assert sum("(accumulates)" in line for line in state_products) == accumulating, "\n".join(state_products)


@pytest.mark.parametrize("op", OPS)
def test_bf16_head_dim_128(linac, op):
    # The per-chunk kernel's 16-bit default up to head dim 128: value steps of 32 columns on 4 warps, the
    # next step's loads prefetched (op_bwd.cpp chunk_kernel_shapes; head dim 16 above takes one step).
    # Three chunks of 32, the last partial.
    x = make_inputs(64 + OPS.index(op), op, B=1, T=70, H=1, K=128, V=128, init=True, dfinal=True)
    outs = ("dq", "dk", "dv", "dbeta") + (("dg",) if "g" in x else ())
    got = linac.run_op(op, x, outputs=outs, options=["--backward", "--dtype", "bf16"])
    ref = linac.run_op(op, {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()},
                       outputs=outs, options=["--backward"])
    for name in outs:
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("form", [[], ["--config", "tokenwise=1"]], ids=["chunked", "tokenwise"])
def test_l2norm_qk(linac, op, form):
    # --l2norm-qk: raw q and k (norms far from 1), normalized inside; the gradients are w.r.t. the raw ones.
    x = make_inputs(70 + OPS.index(op), op, B=1, T=37, H=2, K=12, V=8, init=True, dfinal=True)
    rng = np.random.default_rng(71)
    x["q"] = (3 * rng.standard_normal(x["q"].shape)).astype(np.float32)
    x["k"] = (0.5 * rng.standard_normal(x["k"].shape)).astype(np.float32)

    def loss_l2(y):
        return loss({**y, "q": reference_delta.l2normalize(y["q"]), "k": reference_delta.l2normalize(y["k"])})

    grads = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "initial_state": "dinitial_state"}
    grads = {n: d for n, d in grads.items() if n in x}
    got = linac.run_op(op, x, outputs=list(grads.values()), options=["--backward", "--l2norm-qk", *form])
    gradcheck.check_directional({n: got[d] for n, d in grads.items()}, x, loss_l2)
