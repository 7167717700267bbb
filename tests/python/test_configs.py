"""Tuning parameters (--config) change speed, never results beyond rounding: every configuration of
linear_attn agrees with the float64 reference, and with the other configurations, on the interpreter
(and on the GPU when LINAC_TEST_DEVICE=cuda)."""
import os

import numpy as np
import pytest

import reference

DEVICE = os.environ.get("LINAC_TEST_DEVICE", "cpu")
# Every config must fit the GPU too: fp32 at chunk=128 with two pipeline stages needs ~250 KB of
# shared memory (more than an H200 has) and is rejected with a clear error, so chunk=128 runs one stage.
CONFIGS = ["chunk=16", "chunk=32,bv=16", "chunk=128,bv=32,stages=1", "bv=128,warps=8", "warps=2,stages=1", "stages=1"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("gated", [False, True])
def test_config_matches_reference(linac, config, gated):
    rng = np.random.default_rng(7)
    B, T, H, K, V = 2, 150, 2, 48, 100
    inputs = {
        "q": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "k": rng.standard_normal((B, T, H, K)).astype(np.float32),
        "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
        "initial_state": rng.standard_normal((B, H, K, V)).astype(np.float32),
    }
    if gated:
        inputs["g"] = np.log(1 / (1 + np.exp(-(rng.standard_normal((B, T, H)) + 3)))).astype(np.float32)
    out = linac.run_op("linear_attn", inputs, outputs=("o", "final_state"), options=["--config", config],
                       device=DEVICE)
    o_ref, s_ref = reference.linear_attn(**inputs)
    bound = 1e-5 if DEVICE == "cpu" else 1e-4
    assert reference.rel_err(out["o"], o_ref) < bound
    assert reference.rel_err(out["final_state"], s_ref) < bound


@pytest.mark.parametrize("bad", ["bv=48", "nosuchkey=1", "warps=x", "chunk"])
def test_bad_config_is_one_clear_error(linac, bad):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 1, 16)).astype(np.float32)
    proc = linac.run("run", "linear_attn", f"q={linac.write('q', x)}", f"k={linac.write('k', x)}",
                     f"v={linac.write('v', x)}", "-o", "o=o.npy", "--config", bad)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("linac: error:"), proc.stderr
    assert "o.npy" not in linac.files()


# Pipelines of three and four stages (one stage slack: compiler/passes/pipeline.h; on sm_90a the chunk
# loops' products on wgmma are then waited for an iteration late, compiler/passes/wgmma_waits.h) compute
# what two stages compute: the same products in the same order, so on the GPU the same bits; the
# interpreter has no pipeline, and there the configurations only have to plan and run. bf16 inputs, so
# that the products run on the tensor cores. The chunk is given: the default is the first chunk whose
# plan fits, which more stages can change (and with it the rounding).
STAGED_OPS = [
    ("linear_attn", ["--config", "chunk=64"], {}),
    ("gla", ["--config", "chunk=32"], {"g": "gk"}),
    ("gated_delta_rule", ["--config", "chunk=64"], {"g": "g", "beta": "beta"}),
    ("poly", [], {}),
]


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("op,options,extra", STAGED_OPS, ids=[o[0] for o in STAGED_OPS])
def test_more_stages_compute_the_same(linac, op, options, extra, stages):
    rng = np.random.default_rng(11)
    B, T, H, K = 2, 300, 2, 64
    inputs = {name: (rng.standard_normal((B, T, H, K)) * 0.5).astype(np.float32) for name in ("q", "k", "v")}
    if op == "gated_delta_rule":
        inputs["k"] /= np.linalg.norm(inputs["k"], axis=-1, keepdims=True)
    for name, kind in extra.items():
        shape = (B, T, H, K) if kind == "gk" else (B, T, H)
        inputs[name] = (-rng.random(shape) * 0.1).astype(np.float32) if kind != "beta" else \
            rng.random(shape).astype(np.float32)
    config = options[1] + "," if options else ""
    two = linac.run_op(op, inputs, options=["--dtype", "bf16", "--config", config + "stages=2"], device=DEVICE)["o"]
    more = linac.run_op(op, inputs, options=["--dtype", "bf16", "--config", config + f"stages={stages}"],
                        device=DEVICE)["o"]
    assert np.array_equal(two, more)


# Head dim 256 takes 128 value columns by default where the walks fill the GPU (wide_state_fits,
# kernels/linear_attn/op.cpp: the state [256, 128] fp32 in registers, the gated one updated in place);
# the small shapes of the tests pick 64, so the wide walk is asked for by name. bf16 (tensor cores) and
# fp32 (the fp32 path; gated it needs 240 KB of shared memory at 128 columns, more than a block has, and
# takes 64).
@pytest.mark.parametrize("dtype,gated", [("bf16", False), ("bf16", True), ("fp32", False)],
                         ids=["bf16-plain", "bf16-gated", "fp32-plain"])
def test_head_dim_256_at_128_columns(linac, dtype, gated):
    rng = np.random.default_rng(5)
    B, T, H, K = 1, 200, 2, 256
    inputs = {name: (rng.standard_normal((B, T, H, K)) * 0.5).astype(np.float32) for name in ("q", "k", "v")}
    inputs["initial_state"] = (rng.standard_normal((B, H, K, K)) * 0.1).astype(np.float32)
    if gated:
        inputs["g"] = np.log(1 / (1 + np.exp(-(rng.standard_normal((B, T, H)) + 3)))).astype(np.float32)
    if dtype == "bf16":  # the reference sees the values the kernel reads (states stay fp32 in it)
        inputs = {name: reference.round_to_bf16(x) for name, x in inputs.items()}
    out = linac.run_op("linear_attn", inputs, outputs=("o", "final_state"),
                       options=["--dtype", dtype, "--config", "bv=128"], device=DEVICE)
    o_ref, s_ref = reference.linear_attn(**inputs)
    bound = 1e-4 if dtype == "fp32" else 1e-2
    assert reference.rel_err(out["o"], o_ref) < bound
    assert reference.rel_err(out["final_state"], s_ref) < bound
