"""`linac run gla` (chunked) through the CLI on the CPU interpreter, against the float64 token-by-token
reference of reference_gla.py.

The default chunk is 16 rows (one sub-chunk: no off-diagonal sub-chunk blocks), so the cases that test
the decay-aware secondary chunking pass --chunk-size 64 (4 sub-chunks) or compare several sizes.

Every case has its own fixed seed and randn-valued q, k, v; gates are logsigmoid(randn + bias) per
channel unless a test says otherwise. Shapes stay small: the interpreter runs every case.
"""

import re

import numpy as np
import pytest

import reference
import reference_gla

FP32_TOL = 1e-5
BF16_TOL = 2e-2


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, B, T, H, K, V, gate_bias=0.0, init=False, N=None):
    """float32 inputs: q, k, v ~ randn; g = logsigmoid(randn + gate_bias) [B, T, H, K];
    initial_state ~ randn [N or B, H, K, V] when `init`."""
    rng = np.random.default_rng(seed)
    inputs = {
        "q": rng.standard_normal((B, T, H, K)),
        "k": rng.standard_normal((B, T, H, K)),
        "v": rng.standard_normal((B, T, H, V)),
        "g": logsigmoid(rng.standard_normal((B, T, H, K)) + gate_bias),
    }
    if init:
        inputs["initial_state"] = rng.standard_normal((N or B, H, K, V))
    return {name: x.astype(np.float32) for name, x in inputs.items()}


def ref_of(inputs, scale=None):
    return reference_gla.gla(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                             initial_state=inputs.get("initial_state"), cu_seqlens=inputs.get("cu_seqlens"),
                             scale=scale)


def check_output(name, out, ref, tol=FP32_TOL):
    assert out.dtype == np.float32, f"{name}: dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"{name}: shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), f"{name}: non-finite values"
    err = reference.rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def run_and_check(linac, inputs, options=(), scale=None, final_state=True, tol=FP32_TOL):
    outputs = ("o", "final_state") if final_state else ("o",)
    got = linac.run_op("gla", inputs, outputs=outputs, options=options)
    o_ref, s_ref = ref_of(inputs, scale=scale)
    check_output("o", got["o"], o_ref, tol)
    if final_state:
        check_output("final_state", got["final_state"], s_ref, tol)
    return got


# ---------------------------------------------------------------------------------------------------
# Numerics


CHUNK64 = ["--chunk-size", "64"]


@pytest.mark.parametrize("T", [1, 17, 64, 100])
def test_seq_lengths(linac, T):
    # Chunks of 64: 100 = one full chunk and a masked one; 17 = one sub-chunk and one row of the next.
    run_and_check(linac, make_inputs(100 + T, B=2, T=T, H=2, K=32, V=32, gate_bias=2.0), options=CHUNK64)


@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
def test_initial_and_final_state(linac, init):
    # Slow decay (mean g ~ -0.05) so the state carried across chunks matters to the output.
    run_and_check(linac, make_inputs(200 + init, B=2, T=100, H=2, K=32, V=32, gate_bias=3.0, init=init))


def test_o_only(linac):
    inputs = make_inputs(210, B=1, T=40, H=2, K=16, V=16, init=True)
    run_and_check(linac, inputs, final_state=False)
    assert not (linac.workdir / "out_final_state.npy").exists()


def test_k_differs_from_v(linac):
    run_and_check(linac, make_inputs(300, B=2, T=70, H=2, K=32, V=16, gate_bias=2.0, init=True))


def test_non_power_of_two_head_dims(linac):
    # K = 48 and V = 100 are padded to 64 and 128 inside the kernels (masked loads).
    run_and_check(linac, make_inputs(310, B=1, T=50, H=2, K=48, V=100, gate_bias=2.0, init=True))


def test_chunk_sizes_agree(linac):
    # Chunks of 16 have no off-diagonal sub-chunk blocks; 32, 64 and 128 have 1, 6 and 28 per chunk.
    inputs = make_inputs(400, B=1, T=150, H=1, K=32, V=16, gate_bias=2.0, init=True)
    results = {chunk: run_and_check(linac, inputs, options=["--chunk-size", str(chunk)]) for chunk in (16, 32, 64, 128)}
    for chunk in (32, 64, 128):
        for name in ("o", "final_state"):
            err = reference.rel_err(results[chunk][name], results[16][name])
            assert err < FP32_TOL, f"{name}: chunk {chunk} vs 16 differ by {err:.3g}"


@pytest.mark.parametrize("chunk", [16, 32])
@pytest.mark.parametrize("gate_bias", [5.0, 0.0], ids=["mild_gate", "gate"])
def test_segments_agree_with_the_reference(linac, gate_bias, chunk):
    # The segment-parallel forward (--config segment=L; by default where few walks leave the GPU idle):
    # segments of 64 rows, the last one short (T = 200), three sequences x two heads, an initial state;
    # mild gates keep the earlier segments' states alive across segment ends, per channel.
    inputs = make_inputs(450 + chunk + int(gate_bias), B=3, T=200, H=2, K=32, V=16, gate_bias=gate_bias, init=True)
    options = ["--chunk-size", str(chunk), "--config", "segment=64"]
    got = run_and_check(linac, inputs, options=options)
    assert got["final_state"].shape == (3, 2, 32, 16)


def test_error_segment_and_split(linac):
    inputs = make_inputs(460, B=1, T=64, H=1, K=16, V=16)
    with pytest.raises(Exception, match="two schedules"):
        linac.run_op("gla", inputs, outputs=("o",), options=["--config", "split=1,segment=64"])


@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
def test_varlen(linac, init):
    # Sequences of length 1 first, in the middle and near the end; 130 tokens in all, packed in B=1.
    cu = np.array([0, 1, 17, 80, 81, 130], dtype=np.int32 if init else np.int64)
    N = len(cu) - 1
    inputs = make_inputs(500 + init, B=1, T=130, H=2, K=32, V=16, gate_bias=2.0, init=init, N=N)
    inputs["cu_seqlens"] = cu
    got = run_and_check(linac, inputs, options=CHUNK64)
    assert got["final_state"].shape == (N, 2, 32, 16)


@pytest.mark.parametrize("chunk", [16, 64])
def test_gates_clamped_at_minus_5(linac, chunk):
    # Fast decay: about half the gates sit at the clamp, -5 per token (exp(-5 * 16) within a
    # sub-chunk, exp(-5 * 64) over a chunk: both underflow-prone factors must stay finite).
    inputs = make_inputs(600, B=1, T=100, H=2, K=32, V=16, init=True)
    rng = np.random.default_rng(601)
    inputs["g"] = np.maximum(logsigmoid(3.0 * rng.standard_normal(inputs["g"].shape) - 4.0), -5.0).astype(np.float32)
    assert (inputs["g"] == -5.0).mean() > 0.3
    run_and_check(linac, inputs, options=["--chunk-size", str(chunk)])


@pytest.mark.parametrize("backward", [False, True], ids=["gla_chunk", "gla_bwd_intra"])
def test_intra_kernels_branch_on_the_gate_spread(linac, backward):
    # The factored diagonal blocks are a speed path (gla_intra 0.72 -> 0.34 ms on an H200): the numeric
    # tests pass without it, so the tile IR is checked for it: a branch on spread <= 60 whose first
    # region holds two exps of [16, K] tiles and the [16, 16] fp32 product.
    args = ["compile", "gla", "--shape", "B=1,T=64,H=1,K=128", "--dtype", "bf16", "--emit", "tir"]
    r = linac.run(*args, *(["--backward"] if backward else []))
    assert r.returncode == 0, r.stderr
    name = "gla_bwd_intra" if backward else "gla_chunk"
    kernel = r.stdout.split(f"kernel @{name}(")[1].split("\nkernel @")[0]
    assert "constant 60 : f32" in kernel
    then = kernel.split(" = if ")[1].split("} else {")[0]
    assert len(re.findall(r"= exp %\d+ : tile<16x128xf32>", then)) >= 2, then
    assert re.search(r"= dot %\d+, %\d+ : tile<16x16xf32>", then), then
    # That product on the tensor cores as three tf32 products for 16-bit inputs (docs/ops/gla.md,
    # "Measured", session 27), FMA loops for fp32 inputs.
    assert "tensor_core_f32 = 1}" in kernel.split("\n", 1)[0]
    r32 = linac.run(*args[:-4], "--dtype", "fp32", "--emit", "tir", *(["--backward"] if backward else []))
    assert r32.returncode == 0, r32.stderr
    header32 = r32.stdout.split(f"kernel @{name}(")[1].split("\n", 1)[0]
    assert "tensor_core_f32" not in header32, header32
    ptx = linac.run(*args[:-1], "ptx", "--target", "sm_90a", *(["--backward"] if backward else []))
    assert ptx.returncode == 0, ptx.stderr
    kernel_ptx = ptx.stdout.split(f".entry {name}(")[1].split(".entry ")[0]
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in kernel_ptx


@pytest.mark.parametrize("dtype,K,chunk,warps", [("bf16", 128, 32, 4), ("bf16", 64, 64, 4), ("bf16", 256, 64, 8),
                                                  ("fp32", 128, 16, 8)])
def test_walk_reads_prepared_chunks_at_the_measured_defaults(linac, dtype, K, chunk, warps):
    # gla_chunk prepares every chunk (qg, kg, the chunk's attention a, its log-decay) and gla_fwd walks
    # them carrying the state alone: no exp, cumsum or gate load in the walk (docs/ops/gla.md). Chunks and
    # the walk's warps as measured (docs/ops/gla.md, "Measured", session 26); gla_chunk on 4 warps, 8 above
    # head dim 128 (one program per SM there).
    r = linac.run("compile", "gla", "--shape", f"B=8,T=4096,H=16,K={K}", "--dtype", dtype, "--emit", "tir")
    assert r.returncode == 0, r.stderr
    prep = r.stdout.split("kernel @gla_chunk(")[1].split("\nkernel @")[0]
    walk = r.stdout.split("kernel @gla_fwd(")[1].split("\nkernel @")[0]
    assert f"num_warps = {8 if K > 128 else 4}," in prep.split("\n", 1)[0]
    assert f"num_warps = {warps}," in walk.split("\n", 1)[0]
    dt = "bf16" if dtype == "bf16" else "f32"
    assert re.search(rf"= load %a\[.*: tile<{chunk}x{chunk}x{dt}>", walk), walk
    assert re.search(rf"= load %kg\[.*: tile<{chunk}x{K}x{dt}>", walk), walk
    # (The state's decay is the one exp: of a [K] vector per chunk.)
    assert not re.search(r"= exp %\d+ : tile<\d+x\d+x|= cumsum |%g\b", walk.split("\n", 1)[1]), walk


@pytest.mark.parametrize("gate", [-4.0, -4.01], ids=["factored_at_limit", "elementwise_past_limit"])
def test_gate_spread_at_the_factored_limit(linac, gate):
    # gla_chunk factors a sub-chunk's diagonal block into exp(L - m) and exp(m - L) when the gates'
    # spread over its 16 rows is at most 60: a gate of -4 on every token spreads exactly 60 (15 steps),
    # the largest factors the factored form takes (exp(+-30)); -4.01 goes elementwise. Half the
    # channels decay slowly, so that rows far apart still matter to the output.
    inputs = make_inputs(650, B=1, T=100, H=2, K=32, V=16, init=True)
    inputs["g"][..., 0::2] = gate
    inputs["g"][..., 1::2] *= 0.05
    run_and_check(linac, inputs, options=["--chunk-size", "64"])


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("rows", [(64, 128), (80, 96)], ids=["chunk", "sub_chunk"])
def test_very_negative_gates(linac, rows, chunk):
    # g = -1e4 on a whole chunk of 64 (or on one sub-chunk in the middle of one) resets the state
    # there; the tokens after it, in the same chunk too, must still be accurate, and nothing may
    # overflow.
    inputs = make_inputs(700 + rows[0], B=1, T=160, H=1, K=32, V=16, gate_bias=2.0, init=True)
    inputs["g"][:, rows[0]:rows[1]] = -1e4
    run_and_check(linac, inputs, options=["--chunk-size", str(chunk)])


@pytest.mark.parametrize("chunk", [16, 64])
def test_non_finite_value_reaches_back_to_its_chunks_first_row(linac, chunk):
    # The contract of docs/ops/README.md ("Inputs at the edge of the contract"): the walk multiplies the
    # chunk's attention [C, C], zeros above its diagonal included, by all of the chunk's rows of V, so a
    # non-finite v at token t makes the outputs non-finite from the chunk's first row c0 on (0 * inf),
    # never before.
    inputs = make_inputs(820, B=1, T=160, H=1, K=16, V=16)
    t = 64 + 40
    inputs["v"][0, t, 0, 3] = np.inf
    o = linac.run_op("gla", inputs, outputs=("o",), options=["--chunk-size", str(chunk)])["o"]
    c0 = t - t % chunk
    assert np.all(np.isfinite(o[0, :c0])), "outputs before the chunk of the non-finite value"
    assert not np.all(np.isfinite(o[0, c0])), "the chunk's first row"
    assert not np.all(np.isfinite(o[0, t]))


def test_explicit_scale(linac):
    run_and_check(linac, make_inputs(800, B=1, T=40, H=2, K=16, V=24, init=True), options=["--scale", "0.3"], scale=0.3)


def test_bf16(linac):
    # q, k, v are cast to bf16 by the CLI; g and the states stay fp32. The reference runs on the
    # bf16-rounded q, k, v.
    inputs = make_inputs(900, B=1, T=100, H=2, K=32, V=32, gate_bias=2.0, init=True)
    got = linac.run_op("gla", inputs, outputs=("o", "final_state"), options=["--dtype", "bf16", *CHUNK64])
    rounded = {name: reference.round_to_bf16(x) if name in ("q", "k", "v") else x for name, x in inputs.items()}
    o_ref, s_ref = ref_of(rounded)
    check_output("o", got["o"], o_ref, BF16_TOL)
    check_output("final_state", got["final_state"], s_ref, BF16_TOL)


def test_config_keys(linac):
    # Tuning parameters change speed, never results beyond rounding.
    inputs = make_inputs(950, B=1, T=40, H=1, K=32, V=32, init=True)
    run_and_check(linac, inputs, options=["--config", "chunk=32,bv=16,warps=8,stages=1"])


SPLIT_CONFIGS = ["split=1,chunk=64,bv=64,warps=4", "split=1,chunk=32,bv=16,warps=2", "split=1,chunk=64,bv=64,stages=2",
                 "split=1,chunk=32,bv=16,sbk=16", "split=1,chunk=64,bv=32,sbk=32,stages=2"]


@pytest.mark.parametrize("config", SPLIT_CONFIGS)
@pytest.mark.parametrize("init", [False, True], ids=["zero_state", "initial_state"])
def test_split_schedule(linac, config, init):
    # The state pass + parallel outputs: T not a multiple of the chunk, several V blocks, K != V,
    # B > 1, both states.
    inputs = make_inputs(960 + init, B=2, T=150, H=2, K=48, V=40, gate_bias=2.0, init=init)
    run_and_check(linac, inputs, options=["--config", config])


@pytest.mark.parametrize("rows", [(64, 128), (80, 96), (16, 48)], ids=["chunk", "sub_chunk", "head_of_chunk"])
def test_split_schedule_very_negative_gates(linac, rows):
    # The state pass sums the decay after each row directly; -1e4 gates early in a chunk must not
    # cancel the precision of the decays after them. (Blocks of -1e4 that start or end inside a
    # 16-row sub-chunk lose precision in every schedule: the diagonal blocks take exp(L_r - L_c) of
    # cumulative sums, as fla does, of the gates floored at -128 (kernels/common/log_decay.h): ~2e-5, ~1e-3
    # before the floor; fla clamps gates at -5, where this does not arise.)
    inputs = make_inputs(980 + rows[0], B=1, T=160, H=1, K=32, V=16, gate_bias=2.0, init=True)
    inputs["g"][:, rows[0]:rows[1]] = -1e4
    run_and_check(linac, inputs, options=["--config", "split=1,chunk=64"])


def test_split_schedule_varlen_runs_fused(linac):
    cu = np.array([0, 1, 17, 80, 81, 130], dtype=np.int32)
    inputs = make_inputs(990, B=1, T=130, H=2, K=32, V=16, gate_bias=2.0, init=True, N=len(cu) - 1)
    inputs["cu_seqlens"] = cu
    run_and_check(linac, inputs, options=["--config", "split=1,chunk=64"])


# ---------------------------------------------------------------------------------------------------
# Errors: exit status 1, exactly one line on stderr starting with "linac: error:", no output file.

ERROR_PREFIX = "linac: error:"


def expect_error(linac, inputs, extra=(), mentions=None):
    args = ["run", "gla", *(f"{name}={linac.write(name, x)}" for name, x in inputs.items()), "-o", "o=o.npy",
            "--device", "cpu", *extra]
    before = linac.files()
    proc = linac.run(*args)
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}; stderr: {proc.stderr!r}"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), f"expected one error line, got: {proc.stderr!r}"
    if mentions is not None:
        assert mentions in lines[0], f"error should mention {mentions!r}: {lines[0]!r}"
    assert linac.files() == before, f"files changed: {before} -> {linac.files()}"


SMALL = dict(B=2, T=8, H=2, K=8, V=8)


def test_error_gate_per_head(linac):
    inputs = make_inputs(1, **SMALL)
    inputs["g"] = inputs["g"][..., 0]  # [B, T, H]: linear_attn's per-head gate, not gla's
    expect_error(linac, inputs, mentions="g")


def test_error_gate_wrong_k(linac):
    inputs = make_inputs(2, **SMALL)
    inputs["g"] = inputs["g"][..., :4]
    expect_error(linac, inputs, mentions="g")


def test_error_missing_gate(linac):
    inputs = make_inputs(3, **SMALL)
    del inputs["g"]
    expect_error(linac, inputs, mentions="g")


def test_error_initial_state_wrong_shape(linac):
    inputs = make_inputs(4, **SMALL, init=True)
    inputs["initial_state"] = inputs["initial_state"][:1]
    expect_error(linac, inputs, mentions="initial_state")


def test_error_bad_chunk_config(linac):
    expect_error(linac, make_inputs(5, **SMALL), extra=["--config", "chunk=48"], mentions="chunk")


@pytest.mark.parametrize("backward", [False, True], ids=["gla_chunk", "gla_bwd_intra"])
def test_per_chunk_kernels_prefetch_their_loads(linac, backward):
    # The per-chunk kernels' loads are prefetched cp.async copies, issued together and waited for at
    # first use (docs/ops/gla.md, "Measured", session 27): gla_chunk's chunk of q, k and gates (the
    # gates floored where sub-chunks read them, not at the load), gla_bwd_intra's q, k, gates, v and do
    # (q, k and the gates by AccessOptions::prefetch). Numerics pass without it, so the plan is checked.
    args = ["compile", "gla", "--shape", "B=8,T=4096,H=16,K=128", "--dtype", "bf16", "--target", "sm_90a",
            "--emit", "smem"]
    r = linac.run(*args, *(["--backward"] if backward else []))
    assert r.returncode == 0, r.stderr
    first_kernel = r.stdout.split("smem total")[0]  # gla_chunk / gla_bwd_intra are launched first
    prefetched = re.findall(r"tile<(\d+x\d+x\w+)> row_stride=\d+ prefetched", first_kernel)
    want = (["16x128xbf16"] * 4 + ["16x128xf32"]) if backward else (["32x128xbf16"] * 2 + ["32x128xf32"])
    assert sorted(prefetched) == sorted(want), first_kernel
