"""`linac run delta_rule` and `linac run gated_delta_rule` through the CLI on the CPU interpreter, against
the float64 token-by-token reference (reference_delta.py).

Every case uses its own fixed seed. Keys are L2-normalized on the host unless the case runs with
--l2norm-qk (then q and k are raw randn and the kernels normalize them); beta = sigmoid(randn) unless
a case says otherwise.

LINAC_TEST_DEVICE=cuda runs the numerics on the GPU instead of the interpreter (same references, same
bounds), for the GPU machine.
"""

import os
import re

import numpy as np
import pytest

import reference
import reference_delta

FP32_TOL = 1e-5
BF16_TOL = 2e-2
OPS = ["delta_rule", "gated_delta_rule"]
DEVICE = os.environ.get("LINAC_TEST_DEVICE", "cpu")


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, op, B, T, H, K, V, l2norm=False, beta=None, gate_bias=2.0, init=False, N=None):
    """float32 inputs for `op`: q ~ randn; k ~ randn, L2-normalized unless `l2norm` (the kernel does it);
    v ~ randn; beta = sigmoid(randn), or the constant `beta`; g = logsigmoid(randn + gate_bias) for the
    gated op; initial_state ~ randn [N or B, H, K, V] when `init`."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    inputs = {
        "q": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "k": (k if l2norm else reference_delta.l2normalize(k)).astype(np.float32),
        "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
    }
    if op == "gated_delta_rule":
        inputs["g"] = logsigmoid(rng.standard_normal((B, T, H)) + gate_bias).astype(np.float32)
    b = 1 / (1 + np.exp(-rng.standard_normal((B, T, H)))) if beta is None else np.full((B, T, H), beta)
    inputs["beta"] = b.astype(np.float32)
    if init:
        inputs["initial_state"] = rng.standard_normal((N or B, H, K, V)).astype(np.float32)
    return inputs


def ref_of(inputs, scale=None, l2norm=False):
    """The reference on exactly the values in `inputs` (whatever their dtype), in float64."""
    return reference_delta.delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], g=inputs.get("g"),
                                      initial_state=inputs.get("initial_state"),
                                      cu_seqlens=inputs.get("cu_seqlens"), scale=scale, l2norm_qk=l2norm)


def check_output(name, out, ref, tol=FP32_TOL):
    assert out.dtype == np.float32, f"{name}: dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"{name}: shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), f"{name}: non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def run_and_check(linac, op, inputs, options=(), scale=None, l2norm=False, final_state=True, tol=FP32_TOL):
    outputs = ("o", "final_state") if final_state else ("o",)
    options = [*options, "--l2norm-qk"] if l2norm else list(options)
    got = linac.run_op(op, inputs, outputs=outputs, options=options, device=DEVICE)
    o_ref, s_ref = ref_of(inputs, scale=scale, l2norm=l2norm)
    check_output("o", got["o"], o_ref, tol)
    if final_state:
        check_output("final_state", got["final_state"], s_ref, tol)
    return got


def check_config_against(linac, op, config, without, inputs, tol=FP32_TOL, options=(), **kw):
    """run_and_check with --config `config`, and on the CPU the same outputs bit for bit as with `without`
    (a schedule of the same products: the interpreter runs either the same way)."""
    got = run_and_check(linac, op, inputs, options=["--config", config, *options], tol=tol, **kw)
    if DEVICE == "cpu":
        ref = linac.run_op(op, inputs, outputs=tuple(got), options=["--config", without, *options,
                           *(["--l2norm-qk"] if kw.get("l2norm") else [])], device=DEVICE)
        for name in got:
            assert np.array_equal(got[name], ref[name]), name


def check_schedule_cases(linac, op, config, without, seed, l2norm=True):
    """check_config_against on dense inputs with both states, a partial last chunk and V = 40 padded; in
    bf16; with --l2norm-qk unless `l2norm` is false (seeds seed .. seed + 4)."""
    def both(inputs, **kw):
        check_config_against(linac, op, config, without, inputs, **kw)

    both(make_inputs(seed + OPS.index(op), op, B=2, T=150, H=2, K=32, V=40, gate_bias=4.0, init=True))
    both(make_inputs(seed + 2 + OPS.index(op), op, B=1, T=100, H=2, K=32, V=32, gate_bias=4.0, init=True),
         tol=BF16_TOL, options=["--dtype", "bf16"])
    if l2norm:
        both(make_inputs(seed + 4 + OPS.index(op), op, B=1, T=90, H=2, K=32, V=32, l2norm=True, gate_bias=4.0),
             l2norm=True)


# ---------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("T", [1, 17, 64, 100])
@pytest.mark.parametrize("op", OPS)
def test_seq_lengths(linac, op, T):
    inputs = make_inputs(100 + T + 1000 * OPS.index(op), op, B=2, T=T, H=2, K=32, V=32)
    run_and_check(linac, op, inputs)


@pytest.mark.parametrize("op", OPS)
def test_initial_and_final_state(linac, op):
    # A slow decay (mean g ~ -0.02) so the state carried across chunks matters to the output.
    inputs = make_inputs(200 + OPS.index(op), op, B=2, T=100, H=2, K=32, V=32, gate_bias=4.0, init=True)
    run_and_check(linac, op, inputs)


@pytest.mark.parametrize("op", OPS)
def test_o_only(linac, op):
    # Without -o final_state only o is written.
    inputs = make_inputs(210 + OPS.index(op), op, B=1, T=40, H=2, K=16, V=16, init=True)
    run_and_check(linac, op, inputs, final_state=False)
    assert not (linac.workdir / "out_final_state.npy").exists()


@pytest.mark.parametrize("op", OPS)
def test_k_differs_from_v(linac, op):
    inputs = make_inputs(300 + OPS.index(op), op, B=2, T=70, H=2, K=32, V=48, init=True)
    run_and_check(linac, op, inputs)


@pytest.mark.parametrize("op", OPS)
def test_non_power_of_two_head_dims(linac, op):
    inputs = make_inputs(400 + OPS.index(op), op, B=1, T=70, H=2, K=48, V=100, init=True)
    run_and_check(linac, op, inputs)


@pytest.mark.parametrize("op", OPS)
def test_head_dim_128(linac, op):
    # fla's DeltaNet head size: the default configuration of wide heads (chunks of 32, 8 warps in
    # bf16), two V blocks per head, recurrent form alongside.
    inputs = make_inputs(450 + OPS.index(op), op, B=1, T=100, H=2, K=128, V=128, l2norm=True, init=True)
    run_and_check(linac, op, inputs, l2norm=True)
    run_and_check(linac, op, inputs, options=["--recurrent"], l2norm=True)


@pytest.mark.parametrize("l2norm", [False, True], ids=["host_normalized", "l2norm_qk"])
@pytest.mark.parametrize("op", OPS)
def test_l2norm_qk(linac, op, l2norm):
    # With --l2norm-qk, q and k are raw randn rows (norm ~ sqrt(K)); without, k arrives normalized.
    inputs = make_inputs(500 + 2 * OPS.index(op) + l2norm, op, B=2, T=100, H=2, K=32, V=24, l2norm=l2norm,
                         init=True)
    run_and_check(linac, op, inputs, l2norm=l2norm)


@pytest.mark.parametrize("op", OPS)
def test_beta_near_one_with_similar_keys(linac, op):
    # beta = 0.99 and keys that share most of their direction: A's entries come close to 1, the case
    # where the triangular inverse has the most to do.
    rng = np.random.default_rng(600 + OPS.index(op))
    inputs = make_inputs(610 + OPS.index(op), op, B=1, T=100, H=2, K=32, V=32, beta=0.99, gate_bias=6.0,
                         init=True)
    common = rng.standard_normal((1, 1, 2, 32))
    k = common + 0.3 * rng.standard_normal((1, 100, 2, 32))
    inputs["k"] = reference_delta.l2normalize(k).astype(np.float32)
    run_and_check(linac, op, inputs)


@pytest.mark.parametrize("gate_bias", [8.0, -6.0], ids=["gates_near_zero", "strong_gates"])
def test_gate_strength(linac, gate_bias):
    # g ~ -3e-4 (the decay barely acts, b stays near 0 over a chunk) and g ~ -6 (exp(b) underflows within
    # a few tokens: every exponent must be masked or non-positive).
    inputs = make_inputs(700 + (gate_bias > 0), "gated_delta_rule", B=2, T=100, H=2, K=32, V=32,
                         gate_bias=gate_bias, init=True)
    run_and_check(linac, "gated_delta_rule", inputs)


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("stop", [-1e4, -3e38, -np.inf])
def test_very_negative_gates_inside_a_chunk(linac, chunk, stop):
    # A stretch of -1e4 gates that starts and ends inside chunks: the decays between rows are summed
    # directly (chunk_decays), so the small gates next to the -1e4 ones keep full precision. -inf (in
    # the gates' domain: the state is dropped) and -3e38 (sums overflow to -inf) likewise: no decay is
    # a difference, so none is -inf - -inf.
    inputs = make_inputs(710 + chunk, "gated_delta_rule", B=1, T=100, H=2, K=32, V=32, init=True)
    inputs["g"][:, 21:37] = stop
    run_and_check(linac, "gated_delta_rule", inputs, options=["--chunk-size", str(chunk)])


@pytest.mark.parametrize("op", OPS)
def test_chunk_sizes(linac, op):
    # 1, 2, 4 and 8 diagonal blocks of 16 rows per chunk: the forward substitution alone, then one to
    # three levels of block substitution.
    inputs = make_inputs(800 + OPS.index(op), op, B=1, T=130, H=2, K=32, V=32, gate_bias=3.0, init=True)
    for chunk in (16, 32, 64, 128):
        run_and_check(linac, op, inputs, options=["--chunk-size", str(chunk)])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["bv=16,warps=2", "bv=32,warps=8,stages=1", "chunk=32,bv=64,warps=4"])
def test_configs(linac, op, config):
    # Tuning parameters change speed, not results: narrow V blocks (several programs per head and
    # several U blocks per chunk), other warp counts, no pipelining.
    inputs = make_inputs(900 + OPS.index(op), op, B=1, T=70, H=2, K=32, V=40, init=True)
    run_and_check(linac, op, inputs, options=["--config", config])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["chunk=64,ut=32", "chunk=32,ut=16,bv=16,warps=2", "chunk=64,ut=32,bv=32,warps=8",
                                    "chunk=64,ut=32,split=1", "chunk=64,ut=32,segment=128"])
def test_ut_kernel_composes_two_halves(linac, op, config):
    # The UT kernel's W and U of a chunk composed from two UT transforms of half its rows (fwd.cpp,
    # build_delta_rule_wy): the same results with both states and a partial last chunk (T = 150: the
    # last chunk's second half is empty at chunk 64), V = 40 padded to 64, in every schedule that reads
    # W and U; --l2norm-qk (M takes the key norms); varlen sequences that start and end inside chunks
    # and halves.
    inputs = make_inputs(940 + OPS.index(op), op, B=2, T=150, H=2, K=32, V=40, gate_bias=4.0, init=True)
    run_and_check(linac, op, inputs, options=["--config", config])
    if "segment" in config:
        return  # dense inputs only; no --l2norm-qk with split
    if "split" not in config:
        inputs = make_inputs(942 + OPS.index(op), op, B=1, T=90, H=2, K=32, V=32, l2norm=True, gate_bias=4.0)
        run_and_check(linac, op, inputs, options=["--config", config], l2norm=True)
    cu = np.array([0, 1, 17, 80, 81, 150, 151], dtype=np.int32)
    inputs = make_inputs(944 + OPS.index(op), op, B=1, T=151, H=2, K=16, V=16, gate_bias=4.0, init=True,
                         N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    run_and_check(linac, op, inputs, options=["--config", config])


@pytest.mark.parametrize("stop", [-1e4, -np.inf])
def test_composed_ut_chunks_after_very_negative_gates(linac, stop):
    # Gates that drop the state inside chunks of 64 rows in halves of 32: inside a second half (rows
    # 40..44: M's rows after them are 0, the rows before them not), inside a first half (80..84: M's
    # columns before them are 0, the later ones not, and the state entering the chunk is not), across
    # the halves' border (150..165: M and exp(b_1) all 0), as the whole chunk's UT transform has them;
    # weak gates elsewhere, so that M W_1 S and M U_1 are well above the tolerance.
    inputs = make_inputs(946, "gated_delta_rule", B=1, T=260, H=2, K=32, V=32, gate_bias=4.0, init=True)
    for start, stop_row in ((40, 45), (80, 85), (150, 166)):
        inputs["g"][:, start:stop_row] = stop
    run_and_check(linac, "gated_delta_rule", inputs, options=["--config", "chunk=64,ut=32"])


@pytest.mark.parametrize("target, shape, extra, composes", [
    ("sm_90a", "B=8,T=4096,H=16,K=128", [], True),
    ("sm_90a", "B=8,T=4096,H=16,K=128", ["--l2norm-qk"], True),
    ("sm_90a", "B=2,T=16384,H=16,K=128", [], True),
    ("sm_90a", "B=8,T=1024,H=8,K=64", [], True),
    ("sm_90a", "B=4,T=2048,H=16,K=128", [], False),  # 64-column walks on 4 warps
    ("sm_80", "B=8,T=4096,H=16,K=128", [], False),
    ("sm_90a", "B=8,T=4096,H=16,K=128", ["--dtype", "fp32"], False)])
def test_where_the_ut_kernel_composes_by_default(linac, target, shape, extra, composes):
    # The forward's defaults (kernels/delta_rule/op.cpp): chunks of 64 composed from two 32-row UT
    # transforms in 16 bits up to head dim 128 on sm_90a, but not where the walk takes 64-column blocks on
    # 4 warps, on sm_80 or in fp32 (docs/ops/delta_rule.md, "Measured"). The default's
    # UT kernel is the one `--config chunk=64,ut=32` asks for exactly where it composes, else chunk 32's.
    def ut_kernel(*config):
        args = ["compile", "gated_delta_rule", "--shape", shape, "--target", target, "--emit", "tir"]
        r = linac.run(*args, *(["--dtype", "bf16"] if "--dtype" not in extra else []), *extra, *config)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("kernel @gated_delta_rule_wy(")[1].split("\nkernel @")[0]
    default, composed = ut_kernel(), ut_kernel("--config", "chunk=64,ut=32")
    assert (default == composed) == composes
    if not composes:
        assert default == ut_kernel("--config", "chunk=32")


def test_error_ut_configs(linac):
    inputs = make_inputs(948, "delta_rule", B=1, T=100, H=1, K=16, V=16)
    with pytest.raises(Exception, match="needs chunks of 32"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "chunk=64,ut=16"])
    with pytest.raises(Exception, match="no saved_"):
        linac.run_op("delta_rule", inputs, outputs=("o", "saved_w"), options=["--config", "chunk=64,ut=32"],
                     device=DEVICE)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["split=1", "split=1,chunk=16,bv=16,warps=2", "split=1,chunk=64,bv=32,warps=8"])
def test_split_schedule(linac, op, config):
    # A state pass storing the state before every chunk, then every chunk's outputs in parallel: the
    # same results, with value blocks (V=40 pads to 64), K != V, both states, a partial last chunk;
    # and varlen sequences that start and end inside chunks (the state table is indexed by global chunk).
    inputs = make_inputs(950 + OPS.index(op), op, B=2, T=70, H=2, K=32, V=40, init=True)
    run_and_check(linac, op, inputs, options=["--config", config])
    cu = np.array([0, 1, 17, 80, 81, 150, 151], dtype=np.int32)
    inputs = make_inputs(960 + OPS.index(op), op, B=1, T=151, H=2, K=16, V=16, init=True, N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    run_and_check(linac, op, inputs, options=["--config", config])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["segment=64", "segment=64,chunk=16,bv=16,warps=2",
                                    "segment=128,chunk=32,bv=32,warps=8"])
def test_segments(linac, op, config):
    # The segment-parallel walk (--config segment=L; by default where few walks leave the GPU idle): each
    # segment's transition product P and its walk from zero Q, combined in order from the initial state
    # (S' = P S + Q), then every segment walked from the state entering it. T = 150: whole segments and
    # a short last one; V = 40 padded to 64 and K = 48 padded to 64, so Q's and P's column blocks and
    # the identity P starts from cross the padding; slow gates carry the states across segments.
    inputs = make_inputs(1000 + OPS.index(op), op, B=2, T=150, H=2, K=48, V=40, gate_bias=4.0, init=True)
    run_and_check(linac, op, inputs, options=["--config", config])


@pytest.mark.parametrize("op", OPS)
def test_segments_l2norm_and_no_initial_state(linac, op):
    # --l2norm-qk: the segments' P and Q take the key norms as the walk does; no initial state: the
    # combine starts from zeros; the output alone (no final state wanted).
    inputs = make_inputs(1010 + OPS.index(op), op, B=1, T=200, H=3, K=32, V=32, l2norm=True, gate_bias=4.0)
    run_and_check(linac, op, inputs, options=["--config", "segment=64"], l2norm=True, final_state=False)
    run_and_check(linac, op, inputs, options=["--config", "segment=64,chunk=64"], l2norm=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["scores=1", "scores=1,chunk=32,bv=32", "scores=1,segment=64"])
def test_walk_reads_chunk_scores(linac, op, config):
    # --config scores=1: each chunk's scores formed once by delta_rule_scores (all chunks in parallel) and
    # read by the walk (fused, or in segments): the reference's results, and on the CPU bit for bit the
    # walk's own (the same fp32 products, rounded to the input dtype once either way): dense inputs
    # with both states, a partial last chunk and V = 40 padded; bf16; --l2norm-qk; varlen sequences
    # that start and end inside chunks (the table's rows are the sequences' own).
    without = config.replace("scores=1", "scores=0")
    check_schedule_cases(linac, op, config, without, 1040)
    if "segment" in config:
        return  # dense inputs only
    cu = np.array([0, 1, 17, 80, 81, 150, 151], dtype=np.int32)
    inputs = make_inputs(1046 + OPS.index(op), op, B=1, T=151, H=2, K=16, V=16, gate_bias=4.0, init=True,
                         N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    check_config_against(linac, op, config, without, inputs)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["tform=1", "tform=1,chunk=64,ut=32", "tform=1,chunk=64,ut=0",
                                    "tform=1,chunk=32,ut=16,bv=32", "tform=1,chunk=16", "tform=1,scores=1"])
def test_walk_forms_v_new_from_t(linac, op, config):
    # --config tform=1: the UT kernel stores each chunk's T alone and the walk forms
    # V_new = T (beta .* (V - r_k exp(b) .* K S)) from it and v, no W or U; with ut, T's blocks across
    # the two halves from 16-bit products (-T_2 A_21 T_1): the reference's results on
    # dense inputs with both states, a partial last chunk and V = 40 padded; bf16; --l2norm-qk (the
    # key norms on K S); varlen sequences that start and end inside chunks; gates of -inf (a decay
    # spanning one is 0 in K S's factor too).
    run_and_check(linac, op, make_inputs(1060 + OPS.index(op), op, B=2, T=150, H=2, K=32, V=40, gate_bias=4.0,
                                         init=True), options=["--config", config])
    run_and_check(linac, op, make_inputs(1062 + OPS.index(op), op, B=1, T=100, H=2, K=32, V=32, gate_bias=4.0,
                                         init=True), options=["--config", config, "--dtype", "bf16"], tol=BF16_TOL)
    run_and_check(linac, op, make_inputs(1064 + OPS.index(op), op, B=1, T=90, H=2, K=32, V=32, l2norm=True,
                                         gate_bias=4.0), options=["--config", config], l2norm=True)
    cu = np.array([0, 1, 17, 80, 81, 150, 151], dtype=np.int32)
    inputs = make_inputs(1066 + OPS.index(op), op, B=1, T=151, H=2, K=16, V=16, gate_bias=4.0, init=True,
                         N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    run_and_check(linac, op, inputs, options=["--config", config])
    if op == "gated_delta_rule":
        inputs = make_inputs(1068, op, B=1, T=130, H=2, K=32, V=32, gate_bias=4.0, init=True)
        inputs["g"][:, 40:45] = -np.inf
        run_and_check(linac, op, inputs, options=["--config", config])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("config", ["overlap=1", "overlap=1,scores=1", "overlap=1,tform=0,chunk=64,ut=32",
                                    "overlap=1,stages=3", "overlap=1,chunk=16"])
def test_walk_beside_the_ut_kernel(linac, op, config):
    # --config overlap=1: the walk runs beside the UT (and scores) kernels, waiting for each group of
    # chunks' flag (kernels/common/overlap.h); their grids take the heads first. The same results as
    # after them (bit for bit on the CPU, where launches run in order and the waits find their flags
    # set) and the reference's: dense inputs with both states, a partial last chunk and V = 40 padded;
    # bf16; --l2norm-qk (refused with the scores kernel: test_error_overlap_limits); gates of -inf.
    without = config.replace("overlap=1", "overlap=0")
    check_schedule_cases(linac, op, config, without, 1080, l2norm="scores=1" not in config)
    if op == "gated_delta_rule":
        inputs = make_inputs(1086, op, B=1, T=130, H=2, K=32, V=32, gate_bias=4.0, init=True)
        inputs["g"][:, 40:45] = -np.inf
        check_config_against(linac, op, config, without, inputs)


@pytest.mark.skipif(DEVICE == "cpu", reason="a race between launches needs the GPU (and the shape is large)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("l2norm", [False, True])
def test_walk_beside_the_ut_kernel_races_nothing(linac, op, l2norm):
    # At few heads, with --config overlap=1, the walk runs beside the UT (and scores) kernels, reading
    # each group of chunks once its flag counts them stored. Every kernel is deterministic, so the
    # outputs must equal, bit for bit, those of the walk run after them: a chunk read before its producer
    # stored it would differ. Sequences of 64 chunks (8 flags), 128 walk programs on 132 SMs. (It caught
    # the walk loading the first chunk's norms before its first wait.)
    # (With --l2norm-qk without the scores kernel: test_error_overlap_limits.)
    inputs = make_inputs(1090 + OPS.index(op), op, B=2, T=4096, H=16, K=128, V=128, l2norm=l2norm, gate_bias=4.0)
    options = ["--dtype", "bf16", *(["--l2norm-qk"] if l2norm else [])]
    scores = ",scores=0" if l2norm else ""
    plan = linac.run("plan", op, "--shape", "B=2,T=4096,H=16,K=128", *options[2:], "--config", "overlap=1" + scores)
    assert "beside the" in plan.stdout, plan.stdout
    beside = linac.run_op(op, inputs, outputs=("o", "final_state"),
                          options=[*options, "--config", "overlap=1" + scores], device=DEVICE)
    after = linac.run_op(op, inputs, outputs=("o", "final_state"), options=[*options, "--config", "overlap=0" + scores],
                         device=DEVICE)
    for name in beside:
        assert np.array_equal(beside[name], after[name]), name


def test_plan_shows_the_walk_beside_its_producers(linac):
    # overlap is not the default (measured no faster, docs/ops/delta_rule.md); asked for, the plan queues
    # the walk beside its producers (whose grids take the heads first) and clears the flags; the tuner
    # offers it at few heads.
    shape = ["--shape", "B=2,T=16384,H=16,K=128"]
    r = linac.run("plan", "gated_delta_rule", *shape)
    assert r.returncode == 0 and "beside" not in r.stdout and "chunk_ready" not in r.stdout, r.stdout + r.stderr
    r = linac.run("plan", "gated_delta_rule", *shape, "--config", "overlap=1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"launch gated_delta_rule_wy +grid \[32, 256, 1\]", r.stdout), r.stdout
    assert re.search(r"launch gated_delta_rule_fwd +grid \[4, 32, 1\], beside the 2 before it", r.stdout), r.stdout
    assert re.search(r"tensor chunk_ready +i32 +\[2, 32, 16\]", r.stdout), r.stdout
    r = linac.run("tune", "delta_rule", *shape, "--list")
    assert r.returncode == 0 and "overlap=1" in r.stdout.split(), r.stdout
    # The call's kernels: the producers signal, the walk waits.
    r = linac.run("compile", "delta_rule", *shape, "--config", "overlap=1", "--emit", "tir")
    assert r.returncode == 0 and "wait %chunk_ready" in r.stdout and "signal %chunk_ready" in r.stdout, r.stderr
    r = linac.run("tune", "delta_rule", "--shape", "B=8,T=4096,H=16,K=128", "--list")
    assert r.returncode == 0 and "overlap=1" not in r.stdout.split(), r.stdout


def test_error_overlap_limits(linac):
    # As many walk programs as SMs (the reference GPU's 132 without one) could leave the UT kernel none;
    # packed sequences are not dense.
    inputs = make_inputs(1087, "delta_rule", B=1, T=16, H=140, K=16, V=16)
    with pytest.raises(Exception, match="fewer walk programs"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "overlap=1"])
    cu = np.array([0, 30, 100], dtype=np.int32)
    inputs = make_inputs(1089, "delta_rule", B=1, T=100, H=2, K=16, V=16, N=2)
    inputs["cu_seqlens"] = cu
    with pytest.raises(Exception, match="dense inputs"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "overlap=1"])
    # With --l2norm-qk the scores kernel reads the norms the UT kernel writes: beside the walk both run at
    # once (a GPU run read zero norms: the first chunk's outputs came out zero), so not with scores=1.
    inputs = make_inputs(1091, "delta_rule", B=1, T=90, H=2, K=32, V=32, l2norm=True)
    with pytest.raises(Exception, match="scores=1 with --l2norm-qk"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "overlap=1,scores=1"], l2norm=True)
    run_and_check(linac, "delta_rule", inputs, options=["--config", "overlap=1,scores=0"], l2norm=True)


@pytest.mark.parametrize("key", ["tform=1", "overlap=1"])
@pytest.mark.parametrize("options", [["--config", "{},split=1"], ["--config", "{},segment=64"],
                                     ["--config", "{}", "--recurrent"]])
def test_error_fused_walk_configs(linac, key, options):
    # tform and overlap are options of the fused chunked walk: refused, naming themselves, with the
    # other schedules.
    inputs = make_inputs(1070, "delta_rule", B=1, T=100, H=2, K=16, V=16)
    with pytest.raises(Exception, match=key):
        run_and_check(linac, "delta_rule", inputs, options=[o.format(key) for o in options])


@pytest.mark.parametrize("op, target, shape, extra, scores", [
    ("gated_delta_rule", "sm_90a", "B=2,T=16384,H=16,K=128", [], True),  # 32-column walks
    ("gated_delta_rule", "sm_90a", "B=2,T=16384,H=16,K=128", ["--config", "split=1"], False),
    ("gated_delta_rule", "sm_90a", "B=8,T=4096,H=16,K=128", [], False),  # one block holds V
    ("delta_rule", "sm_90a", "B=2,T=16384,H=16,K=128", [], False),
    ("gated_delta_rule", "sm_80", "B=2,T=16384,H=16,K=128", [], False)])
def test_where_the_scores_kernel_runs_by_default(linac, op, target, shape, extra, scores):
    # The forward's defaults (kernels/delta_rule/op.cpp): the chunks' scores formed once where the gated
    # walk takes value blocks narrower than V on composed chunks of 64 (docs/ops/delta_rule.md,
    # "Measured", session 30); a schedule that takes none (split=1) is not refused for it.
    r = linac.run("compile", op, "--shape", shape, "--target", target, "--dtype", "bf16", "--emit", "tir", *extra)
    assert r.returncode == 0, r.stderr
    assert (f"kernel @{op}_scores(" in r.stdout) == scores
    assert (f"%scores: tensor" in r.stdout.split(f"kernel @{op}_fwd(")[-1]) == scores


@pytest.mark.parametrize("options, mentions", [(["--config", "scores=1,split=1"], "not split=1"),
                                               (["--config", "scores=1", "--recurrent"], "not --recurrent")])
def test_error_scores_configs(linac, options, mentions):
    inputs = make_inputs(1048, "delta_rule", B=1, T=100, H=1, K=16, V=16)
    with pytest.raises(Exception, match=mentions):
        run_and_check(linac, "delta_rule", inputs, options=options)


@pytest.mark.parametrize("config, mentions", [("segment=64,split=1", "not with split=1"),
                                              ("segment=64,chunk=128", "multiple of the chunk")])
def test_error_segment_configs(linac, config, mentions):
    inputs = make_inputs(1020, "delta_rule", B=1, T=100, H=1, K=16, V=16)
    with pytest.raises(Exception, match=mentions):
        run_and_check(linac, "delta_rule", inputs, options=["--config", config])


def test_error_segments_of_packed_sequences(linac):
    inputs = make_inputs(1030, "delta_rule", B=1, T=100, H=1, K=16, V=16, N=2)
    inputs["cu_seqlens"] = np.array([0, 40, 100], dtype=np.int32)
    with pytest.raises(Exception, match="dense inputs"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "segment=64"])
    with pytest.raises(Exception, match="not with --recurrent"):
        run_and_check(linac, "delta_rule", make_inputs(1031, "delta_rule", B=1, T=100, H=1, K=16, V=16),
                      options=["--recurrent", "--config", "segment=64"])


def test_split_schedule_refuses_l2norm(linac):
    inputs = make_inputs(970, "delta_rule", B=1, T=20, H=1, K=8, V=8)
    with pytest.raises(Exception, match="split=1 does not take --l2norm-qk"):
        run_and_check(linac, "delta_rule", inputs, options=["--config", "split=1"], l2norm=True)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_gated_walks_read_the_gate_sums_an_iteration_ahead(linac, backward):
    # Speed paths the numeric tests cannot see. The gated walks read the chunks' gate sums that
    # chunk_gate_sums stored (kernels/common/chunk_gate_sums.h): no scan of the gates in their loops.
    # Each loads the first chunk's sums before its loop and carries the next chunk's, loaded in the loop,
    # as [BT] fp32 loop values (loaded in their own iteration the gates held up the state update).
    args = ["compile", "gated_delta_rule", "--shape", "B=1,T=64,H=1,K=128", "--dtype", "bf16", "--emit", "tir"]
    r = linac.run(*args, *(["--backward"] if backward else []))
    assert r.returncode == 0, r.stderr
    assert "kernel @chunk_gate_sums(" in r.stdout
    names = ["gated_delta_rule_bwd_states", "gated_delta_rule_bwd_dstates"] if backward else ["gated_delta_rule_fwd"]
    sums = "tile<32xf32>" if backward else "tile<64xf32>"  # the default chunks at head dim 128 in 16 bits
    for name in names:
        kernel = r.stdout.split(f"kernel @{name}(")[1].split("\nkernel @")[0]
        assert "%g:" not in kernel.split("\n", 1)[0], f"{name}: still takes the gates"
        before, loop = kernel.split(" = for ", 1)
        assert re.search(rf"= load %gate_b\[.*: {sums}", before), f"{name}: no gate sums loaded before the loop"
        header = loop.split("\n", 1)[0]
        args = re.search(r"iter_args\((.*?)\) : \((.*?)\)", header)
        assert args, header
        pairs = [a.strip().split(" = ") for a in args.group(1).split(",")]
        types = [t.strip() for t in args.group(2).split(", ")]
        # Each table's sums carried: a loop value of that type whose initial value is their load.
        for table in ("gate_b", "gate_cuts"):
            carried = [arg for (arg, init), t in zip(pairs, types)
                       if t == sums and re.search(rf"{init} = load %{table}\[", before)]
            assert len(carried) == 1, f"{name}: {table} not carried: {header}"
            assert re.search(rf"= \w+ [^\n]*{carried[0]}\b", loop), f"{name}: carried {table} unused"
        assert re.search(rf"= load %gate_b\[.*: {sums}", loop), f"{name}: no gate sums loaded in the loop"
        assert "= scan " not in loop, f"{name}: the loop still scans"


@pytest.mark.parametrize("shape", ["B=1,T=64,H=1,K=128", "B=1,T=64,H=1,K=256"], ids=["one-kernel", "key-blocks"])
def test_gated_per_chunk_backward_reads_the_gate_sums(linac, shape):
    # The per-chunk backward kernels (one kernel up to head dim 128, key blocks above) take each chunk's
    # decays from the gates' sums as the walks do: no gates, no scan ([BT] or [BT, BT]) of them; the one
    # scan left is dg's suffix sums within the chunk, where dg is written.
    r = linac.run("compile", "gated_delta_rule", "--shape", shape, "--dtype", "bf16", "--emit", "tir", "--backward")
    assert r.returncode == 0, r.stderr
    names = re.findall(r"kernel @(gated_delta_rule_bwd_chunk\w*)\(", r.stdout)
    assert names == (["gated_delta_rule_bwd_chunk"] if shape.endswith("128") else
                     ["gated_delta_rule_bwd_chunk_keys", "gated_delta_rule_bwd_chunk_ut"]), names
    for name in names:
        kernel = r.stdout.split(f"kernel @{name}(")[1].split("\nkernel @")[0]
        assert "%g:" not in kernel.split("\n", 1)[0], f"{name}: still takes the gates"
        assert re.search(r"= load %gate_b\[.*: tile<32xf32>", kernel), f"{name}: no gate sums loaded"
        scans = re.findall(r"= scan .*", kernel)
        writes_dg = "store %dg[" in kernel
        assert len(scans) == int(writes_dg), f"{name}: scans {scans}"
        assert all("reverse = true} : tile<32xf32>" in sc for sc in scans), scans


def test_gate_sums_over_head_blocks(linac):
    # chunk_gate_sums takes 16 heads per program: 20 heads leave a partial second block, dense and packed.
    inputs = make_inputs(1040, "gated_delta_rule", B=2, T=70, H=20, K=16, V=16, init=True)
    run_and_check(linac, "gated_delta_rule", inputs)
    cu = np.array([0, 5, 70, 140], dtype=np.int32)
    inputs = make_inputs(1041, "gated_delta_rule", B=1, T=140, H=20, K=16, V=16, init=True, N=3)
    inputs["cu_seqlens"] = cu
    run_and_check(linac, "gated_delta_rule", inputs)


@pytest.mark.parametrize("op", OPS)
def test_varlen(linac, op):
    # Sequences of length 1 first, in the middle and at the end; one spans two chunks of 64 and none
    # starts on a chunk boundary of the packed axis.
    cu = np.array([0, 1, 17, 80, 81, 150, 151], dtype=np.int32)
    N = len(cu) - 1
    inputs = make_inputs(1000 + OPS.index(op), op, B=1, T=151, H=2, K=32, V=32, init=True, N=N)
    inputs["cu_seqlens"] = cu
    got = run_and_check(linac, op, inputs)
    assert got["final_state"].shape == (N, 2, 32, 32)
    run_and_check(linac, op, inputs, options=["--chunk-size", "16"], l2norm=True)


@pytest.mark.parametrize("op", OPS)
def test_explicit_scale(linac, op):
    inputs = make_inputs(1100 + OPS.index(op), op, B=1, T=40, H=2, K=16, V=24, init=True)
    run_and_check(linac, op, inputs, options=["--scale", "0.3"], scale=0.3)


@pytest.mark.parametrize("op", OPS)
def test_bf16(linac, op):
    inputs = make_inputs(1200 + OPS.index(op), op, B=1, T=100, H=2, K=32, V=32, init=True)
    # beta, g and the state are pre-rounded so the comparison holds whether or not the CLI casts them
    # (they are fp32 in the kernels); q, k, v are cast by the CLI itself.
    for name in ("beta", "g", "initial_state"):
        if name in inputs:
            inputs[name] = reference.round_to_bf16(inputs[name])
    got = linac.run_op(op, inputs, outputs=("o", "final_state"), options=["--dtype", "bf16"], device=DEVICE)
    rounded = {name: reference.round_to_bf16(x) for name, x in inputs.items()}
    o_ref, s_ref = ref_of(rounded)
    check_output("o", got["o"], o_ref, BF16_TOL)
    check_output("final_state", got["final_state"], s_ref, BF16_TOL)


@pytest.mark.parametrize("op", OPS)
def test_recurrent_matches_chunked(linac, op):
    # The decode form against the chunked form on the same (varlen, l2norm, initial-state) input.
    cu = np.array([0, 1, 40, 100], dtype=np.int64)
    inputs = make_inputs(1300 + OPS.index(op), op, B=1, T=100, H=2, K=48, V=40, l2norm=True, init=True, N=3)
    inputs["cu_seqlens"] = cu
    chunked = run_and_check(linac, op, inputs, l2norm=True)
    recurrent = run_and_check(linac, op, inputs, options=["--recurrent"], l2norm=True)
    for name in ("o", "final_state"):
        err = reference.rel_err(recurrent[name], chunked[name])
        assert err < FP32_TOL, f"{name}: recurrent vs chunked differ by {err:.3g}"


@pytest.mark.parametrize("op", OPS)
def test_recurrent_single_token(linac, op):
    # The decode step proper: one token from a given state.
    inputs = make_inputs(1400 + OPS.index(op), op, B=3, T=1, H=2, K=32, V=32, init=True)
    run_and_check(linac, op, inputs, options=["--recurrent", "--config", "bv=16"])


# ---------------------------------------------------------------------------------------------------
# Errors: exit status 1, exactly one line on stderr starting with "linac: error:", no output file.

ERROR_PREFIX = "linac: error:"


def expect_error(linac, args, mentions=None):
    before = linac.files()
    proc = linac.run(*args)
    assert proc.returncode == 1, f"expected exit status 1, got {proc.returncode}; stderr: {proc.stderr!r}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected one line on stderr, got: {proc.stderr!r}"
    assert lines[0].startswith(ERROR_PREFIX), f"stderr must start with {ERROR_PREFIX!r}: {lines[0]!r}"
    if mentions is not None:
        assert mentions in lines[0], f"error should mention {mentions!r}: {lines[0]!r}"
    assert linac.files() == before, f"files changed: {before} -> {linac.files()}"
    return lines[0]


def cli_args(linac, op, inputs, *options):
    args = ["run", op, *(f"{name}={linac.write(name, x)}" for name, x in inputs.items())]
    return [*args, "-o", "o=o.npy", "--device", "cpu", *options]


SMALL = dict(B=2, T=8, H=2, K=8, V=8)


@pytest.mark.parametrize("op", OPS)
def test_error_beta_wrong_shape(linac, op):
    inputs = make_inputs(1, op, **SMALL)
    inputs["beta"] = inputs["beta"][..., None]  # [B, T, H, 1] instead of [B, T, H]
    expect_error(linac, cli_args(linac, op, inputs), mentions="beta")


@pytest.mark.parametrize("op", OPS)
def test_error_missing_beta(linac, op):
    inputs = make_inputs(2, op, **SMALL)
    del inputs["beta"]
    expect_error(linac, cli_args(linac, op, inputs), mentions="beta")


def test_error_missing_gate(linac):
    inputs = make_inputs(3, "gated_delta_rule", **SMALL)
    del inputs["g"]
    expect_error(linac, cli_args(linac, "gated_delta_rule", inputs))


def test_error_gate_given_to_delta_rule(linac):
    inputs = make_inputs(4, "gated_delta_rule", **SMALL)
    expect_error(linac, cli_args(linac, "delta_rule", inputs), mentions="g")


def test_error_initial_state_wrong_shape(linac):
    inputs = make_inputs(5, "delta_rule", **SMALL, init=True)
    inputs["initial_state"] = inputs["initial_state"][:, :, :4]  # K = 4 instead of 8
    expect_error(linac, cli_args(linac, "delta_rule", inputs), mentions="initial_state")


def test_error_normalize_switch(linac):
    # --normalize belongs to linear_attn.
    inputs = make_inputs(6, "delta_rule", **SMALL)
    expect_error(linac, cli_args(linac, "delta_rule", inputs, "--normalize"), mentions="--normalize")


@pytest.mark.parametrize("shape, walk_columns, warps", [("B=8,T=64,H=16,K=128", 128, 8),   # 128 walks: enough
                                                        ("B=2,T=64,H=32,K=128", 64, 4),    # 64 walks: few
                                                        ("B=2,T=64,H=16,K=128", 32, 4)])   # 32 walks: few
def test_few_heads_narrow_the_walks_value_blocks_not_the_ut_kernels(linac, shape, walk_columns, warps):
    # Where (sequences x heads) walks leave most SMs idle, the forward's walk takes value blocks of 64 or
    # 32 columns on 4 warps (more programs: docs/ops/delta_rule.md, "Measured"); delta_rule_wy keeps U's
    # products at 64 columns or more (narrower ones measured slower), all 128 where it composes chunks
    # of 64 (two unrolled blocks of 64 spilled at its registers), and writes u as [B, T, H, V], from
    # which the walk reads its own columns (chunks of 64 at head dim 128 in 16 bits, but 32 where the
    # walk takes 64 columns on 4 warps: kernels/delta_rule/op.cpp). The SM count is the reference GPU's
    # without one (132). On chunks of 64 the walk forms V_new from T and v by default (tform; W and U
    # asked with tform=0): it reads its own columns of v.
    chunk = 32 if walk_columns == 64 else 64
    if chunk == 64:
        r = linac.run("compile", "delta_rule", "--shape", shape, "--dtype", "bf16", "--emit", "tir")
        assert r.returncode == 0, r.stderr
        walk = r.stdout.split("kernel @delta_rule_fwd(")[1].split("\nkernel @")[0]
        assert "store %u[" not in r.stdout and re.search(rf"= load %v\[.*: tile<64x{walk_columns}xbf16>", walk), walk
        assert f"num_warps = {warps}," in walk.split("\n", 1)[0]
    r = linac.run("compile", "delta_rule", "--shape", shape, "--dtype", "bf16", "--emit", "tir", "--config", "tform=0")
    assert r.returncode == 0, r.stderr
    wy = r.stdout.split("kernel @delta_rule_wy(")[1].split("\nkernel @")[0]
    walk = r.stdout.split("kernel @delta_rule_fwd(")[1].split("\nkernel @")[0]
    stored = re.findall(r"store %u\[.*\], (%\d+) ", wy)
    assert stored, wy
    for value in stored:
        assert re.search(rf"{value} = .*: tile<16x{128 if chunk == 64 else max(walk_columns, 64)}xbf16>", wy), value
    assert re.search(rf"= load %u\[.*: tile<{chunk}x{walk_columns}xbf16>", walk), walk
    assert f"num_warps = {warps}," in walk.split("\n", 1)[0]
    # The backward's state walks alike (the per-chunk kernel keeps its 4 warps, value steps prefetched).
    r = linac.run("compile", "delta_rule", "--shape", shape, "--dtype", "bf16", "--emit", "tir", "--backward")
    assert r.returncode == 0, r.stderr
    for name in ["delta_rule_bwd_states", "delta_rule_bwd_dstates"]:
        kernel = r.stdout.split(f"kernel @{name}(")[1].split("\nkernel @")[0]
        assert f"num_warps = {warps}," in kernel.split("\n", 1)[0], name
        assert re.search(rf"= load %do?\[.*: tile<32x{walk_columns}xbf16>|= load %u\[.*: tile<32x{walk_columns}xbf16>",
                         kernel), name
    assert "num_warps = 4, num_stages = 2," in r.stdout.split("kernel @delta_rule_bwd_chunk(")[1].split("\n", 1)[0]
