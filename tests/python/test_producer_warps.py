"""Producer warps (`--config producer=4`, Kernel::producer_warps: compiler/passes/warp_roles.h): a
warpgroup of its own copies a walk's chunk loads with TMA while the others compute. A schedule: on the
GPU every output is bit for bit the one without it, dense (TMA copies every box) and packed (boxes that
cross a sequence's end are copied by the producer's threads instead); on the CPU (the interpreter runs no
warps) only what the compiler prints and refuses is checked."""
import os

import numpy as np
import pytest

DEVICE = os.environ.get("LINAC_TEST_DEVICE", "cpu")
on_gpu = pytest.mark.skipif(DEVICE != "cuda", reason="producer warps run on the GPU only (LINAC_TEST_DEVICE=cuda)")

CASES = [  # op, --config beside producer, extra inputs
    ("linear_attn", "", {}),
    ("linear_attn", "", {"g": "gate"}),  # gated by its input g
    ("delta_rule", "", {"beta": "beta"}),
    ("gated_delta_rule", "", {"g": "gate", "beta": "beta"}),
    ("gla", "", {"g": "channel_gate"}),  # a gate per key channel
    ("gla", "segment=256", {"g": "channel_gate"}),  # its segments' two walks
]


def make_inputs(seed, extra, B, T, H, K):
    rng = np.random.default_rng(seed)
    inputs = {name: (rng.standard_normal((B, T, H, K)) * 0.5).astype(np.float32) for name in ("q", "k", "v")}
    inputs["k"] /= np.linalg.norm(inputs["k"], axis=-1, keepdims=True)
    for name, kind in extra.items():
        per_channel = (K,) if kind == "channel_gate" else ()
        inputs[name] = rng.random((B, T, H)).astype(np.float32) if kind == "beta" else \
            (-rng.random((B, T, H) + per_channel) * 0.1).astype(np.float32)
    return inputs


@on_gpu
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("shape", [(2, 300, 2, 64), (1, 1000, 4, 128)], ids=["K64", "K128"])
@pytest.mark.parametrize("op,config,extra", CASES, ids=["linear_attn", "gated_linear_attn", "delta_rule",
                                                        "gated_delta_rule", "gla", "gla_segments"])
def test_producer_warps_compute_the_same(linac, op, config, extra, shape, packed):
    if packed and "segment" in config:
        pytest.skip("the segment-parallel forward takes dense inputs only")
    B, T, H, K = shape
    inputs = make_inputs(23, extra, B, T, H, K)
    if packed:  # one row of sequences: boxes cross their ends
        inputs = {name: a.reshape((1, B * T) + a.shape[2:]) for name, a in inputs.items()}
        inputs["cu_seqlens"] = np.array([0, 70, 71, B * T - 129, B * T], dtype=np.int32)
    def run(producer):
        configs = ",".join(c for c in (config, f"producer={producer}") if c)
        return linac.run_op(op, inputs, options=["--dtype", "bf16", "--config", configs], device=DEVICE)["o"]
    plain, produced = run(0), run(4)
    assert np.array_equal(plain, produced)


BWD_CASES = [  # op, options, extra inputs, gradients
    ("linear_attn", [], {}, ("dq", "dk", "dv")),
    ("linear_attn", [], {"g": "gate"}, ("dq", "dk", "dv", "dg")),
    ("linear_attn", ["--normalize"], {}, ("dq", "dk", "dv")),
    ("gla", [], {"g": "channel_gate"}, ("dq", "dk", "dv", "dg")),
]


@on_gpu
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("op,options,extra,grads", BWD_CASES,
                         ids=["linear_attn", "gated_linear_attn", "normalized_linear_attn", "gla"])
def test_producer_warps_compute_the_same_gradients(linac, op, options, extra, grads, packed):
    # The backward's walks (`--config producer` with --backward; at these 8 heads every form runs its walks,
    # not a split schedule); the forward's are the test above's.
    B, T, H, K = 2, 300, 4, 128
    inputs = make_inputs(29, extra, B, T, H, K)
    inputs["do"] = make_inputs(31, {}, B, T, H, K)["q"]
    if packed:
        inputs = {name: a.reshape((1, B * T) + a.shape[2:]) for name, a in inputs.items()}
        inputs["cu_seqlens"] = np.array([0, 70, 71, B * T - 129, B * T], dtype=np.int32)
    def run(producer):
        return linac.run_op(op, inputs, outputs=grads, device=DEVICE,
                            options=["--backward", "--dtype", "bf16", *options, "--config", f"producer={producer}"])
    plain, produced = run(0), run(4)
    for name in grads:
        assert np.array_equal(plain[name], produced[name]), name


def test_producer_warps_in_the_printed_stages(linac):
    shape = "B=8,T=4096,H=16,K=128"
    tir = linac.run("compile", "gated_delta_rule", "--shape", shape, "--config", "producer=4", "--emit", "tir")
    assert tir.returncode == 0, tir.stderr
    walk = [line for line in tir.stdout.splitlines() if line.startswith("kernel @gated_delta_rule_fwd(")]
    assert len(walk) == 1 and "producer_warps = 4" in walk[0]
    smem = linac.run("compile", "gated_delta_rule", "--shape", shape, "--config", "producer=4", "--emit", "smem",
                     "--target", "sm_90a")
    assert smem.returncode == 0, smem.stderr
    assert "full and empty per stage: filled by 4 producer warps" in smem.stdout
    ptx = linac.run("compile", "linear_attn", "--shape", shape, "--config", "producer=4", "--emit", "ptx",
                    "--target", "sm_90a")
    assert ptx.returncode == 0, ptx.stderr
    assert ".maxntid 384" in ptx.stdout and "setmaxnreg.dec.sync.aligned.u32 \t40;" in ptx.stdout
    assert "setmaxnreg.inc.sync.aligned.u32 \t232;" in ptx.stdout and "bar.sync \t1, 256;" in ptx.stdout
    # sm_80 has no TMA: the attribute stays, the warps do not come.
    ptx80 = linac.run("compile", "linear_attn", "--shape", shape, "--config", "producer=4", "--emit", "ptx",
                      "--target", "sm_80")
    assert ptx80.returncode == 0, ptx80.stderr
    assert ".maxntid 256" in ptx80.stdout and "setmaxnreg" not in ptx80.stdout


def test_producer_warps_refused_beside_flags(linac):
    # The walk beside its producers waits for their flags at each iteration's head; a producer warpgroup
    # running ahead would copy chunks not yet written.
    proc = linac.run("compile", "gated_delta_rule", "--shape", "B=2,T=16384,H=16,K=128", "--config",
                     "producer=4,overlap=1,scores=0", "--emit", "ptx", "--target", "sm_90a")
    assert proc.returncode != 0
    assert "producer warps (producer_warps = 4) need a kernel without wait_for" in proc.stderr


def test_producer_warps_default_only_where_the_ring_takes_them(linac):
    # The walk's default asks for producer warps only where its ring is copied by TMA (kernels/common/
    # fitting.h, producer_warps_apply): on sm_90a, chunks of 16 rows too (with producer warps every ring
    # load goes through TMA: compiler/passes/pipeline.cpp, min_tma_rows); on sm_80, which has no TMA,
    # not at all, rather than asking for what the plan would ignore.
    def walk_header(config, target):
        proc = linac.run("compile", "delta_rule", "--shape", "B=2,T=256,H=2,K=64", "--config", config, "--emit", "tir",
                         "--target", target)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if line.startswith("kernel @delta_rule_fwd(")][0]
    assert "producer_warps = 4" in walk_header("chunk=64", "sm_90a")
    assert "producer_warps = 4" in walk_header("chunk=16", "sm_90a")
    assert "producer_warps" not in walk_header("chunk=64", "sm_80")
    smem = linac.run("compile", "delta_rule", "--shape", "B=2,T=256,H=2,K=64", "--config", "chunk=16", "--emit", "smem",
                     "--target", "sm_90a")
    assert smem.returncode == 0, smem.stderr
    assert "full and empty per stage: filled by 4 producer warps" in smem.stdout
