"""`linac plan`: what one call allocates on the device, without a GPU (a GPU run uploads exactly the
plan's tensors, once per call). Issue 5's memory requirement for the backward: device memory linear in
T, no buffer of T*K*V elements (chunk states are recomputed, never stored per token)."""
import json

import pytest


def plan(linac, op, shape, *options):
    proc = linac.run("plan", op, "--shape", shape, "--json", "plan.json", *options)
    assert proc.returncode == 0, proc.stderr
    assert "device memory" in proc.stdout
    return json.loads((linac.workdir / "plan.json").read_text())


@pytest.mark.parametrize("options", [["--backward", "--config", "split=0"], ["--backward", "--gated"], []],
                         ids=["bwd", "bwd_gated", "fwd"])
def test_linear_attn_memory_is_linear_in_t(linac, options):
    # (The backward's split schedule, the default at these two heads, stores per-chunk states: checked
    # with the others in test_backward_memory_is_linear_in_t.)
    B, H, K, V = 1, 2, 64, 64
    sizes = {}
    for T in (1024, 4096, 16384):
        p = plan(linac, "linear_attn", f"B={B},T={T},H={H},K={K},V={V}", *options)
        sizes[T] = p["device_bytes"]
        for name, t in p["tensors"].items():
            numel = 1
            for d in t["shape"]:
                numel *= d
            # O(T*D): nothing of T*K*V elements (per-token states) or anything between.
            assert numel <= B * T * H * max(K, V), f"T={T}: tensor {name} {t['shape']} grows faster than T*D"
    # a*T + c: the increments are exactly linear; c (per-sequence tables such as the gated forms'
    # chunk_offsets) is tiny.
    assert sizes[16384] - sizes[4096] == 4 * (sizes[4096] - sizes[1024]), sizes
    assert abs(sizes[1024] - (sizes[4096] - sizes[1024]) / 3) <= 1024, sizes  # c = the size at T = 0


@pytest.mark.parametrize("op, options, per_chunk_states", [
    ("linear_attn", ["--normalize"], False),
    ("linear_attn", [], True),
    ("gla", ["--config", "split=0"], False),
    ("gla", [], True),
    ("delta_rule", [], True),
    ("gated_delta_rule", [], True),
])
def test_backward_memory_is_linear_in_t(linac, op, options, per_chunk_states):
    # Every chunked backward: device memory exactly 4x per 4x T. gla's walks and normalized linear
    # attention recompute their states (nothing above T*D per tensor); the delta rules and gla's split
    # schedule (the default at these two heads) store the state before and its gradient after each
    # chunk (T*K*V/chunk elements each, chunks of 32 or more), never per token.
    B, H, K, V = 1, 2, 64, 64
    sizes = {}
    for T in (1024, 4096, 16384):
        p = plan(linac, op, f"B={B},T={T},H={H},K={K},V={V}", "--backward", *options)
        sizes[T] = p["device_bytes"]
        for name, t in p["tensors"].items():
            numel = 1
            for d in t["shape"]:
                numel *= d
            bound = B * T * H * K * V // 32 if per_chunk_states else B * T * H * max(K, V)
            assert numel <= bound, f"{op} T={T}: tensor {name} {t['shape']} exceeds {bound} elements"
    # a*T + c: the increments are exactly linear; c (per-sequence tables such as chunk_offsets) is tiny.
    assert sizes[16384] - sizes[4096] == 4 * (sizes[4096] - sizes[1024]), sizes
    slope = (sizes[4096] - sizes[1024]) / 3072
    assert abs(sizes[1024] - slope * 1024) <= 1024, sizes


def test_plan_lists_launches_and_tensors(linac):
    p = plan(linac, "linear_attn", "B=2,T=100,H=3,K=32,V=16", "--backward", "--gated")
    assert [l["kernel"] for l in p["launches"]] == ["chunk_gate_sums", "linear_attn_bwd_dq", "linear_attn_bwd_dk",
                                                     "linear_attn_bwd_dv", "linear_attn_bwd_dg"]
    assert set(p["tensors"]) >= {"q", "k", "v", "do", "g", "dq", "dk", "dv", "dg"}
    assert p["tensors"]["q"]["shape"] == [2, 100, 3, 32] and p["tensors"]["q"]["dtype"] == "bf16"
    assert p["device_bytes"] == sum(t["bytes"] for t in p["tensors"].values())


def test_plan_errors_are_one_line(linac):
    for args, mention in ((["nosuchop", "--shape", "B=1,T=8,H=1,K=16"], "unknown op"),
                          (["linear_attn", "--shape", "B=1,T=8,H=1,K=16", "--nope"], "--nope"),
                          (["linear_attn"], "--shape")):
        proc = linac.run("plan", *args)
        assert proc.returncode != 0
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("linac: error:") and mention in lines[0], proc.stderr


@pytest.mark.parametrize("shape, grid", [
    ("B=2,T=1024,H=16,K=128", [4, 32, 1]),   # 32 heads: 32-column blocks, 128 programs per walk
    ("B=4,T=1024,H=16,K=128", [2, 64, 1]),   # 64 heads: 64-column blocks
    ("B=8,T=1024,H=8,K=64", [2, 64, 1]),     # 64 heads at head dim 64: 32-column blocks
    ("B=1,T=1024,H=96,K=128", [1, 96, 1]),   # 96 heads and more: one program per head
    ("B=8,T=1024,H=16,K=128", [1, 128, 1]),
])
def test_backward_defaults_narrow_for_few_heads(linac, shape, grid):
    # With 64 walk programs or fewer the linear_attn backward's default column blocks halve (chunk 32,
    # 4 warps): on an H200 B2 T16384 H16 D128 went 3.25 -> 1.94 ms, --normalize 5.89 -> 4.99 ms (its
    # walks carry the denominator; the same gradients as the interpreter's). An explicit config is kept.
    def walks(*options):
        p = plan(linac, "linear_attn", shape, *options)
        w = [l for l in p["launches"] if l["kernel"] in ("linear_attn_bwd_dq", "linear_attn_bwd_dk", "linear_attn_bwd_dv")]
        assert len(w) == 3, p["launches"]
        return w
    # (split=0: at 32 heads the plain and the normalized forms' default is the split schedule,
    # test_linear_attn_backward_schedule_defaults and test_normalized_backward_takes_the_split_schedule.)
    for options in (["--backward", "--config", "split=0"], ["--backward", "--gated"],
                    ["--backward", "--normalize", "--config", "split=0"]):
        assert all(l["grid"] == grid for l in walks(*options)), options
    D = int(shape.split("K=")[1])
    p = plan(linac, "linear_attn", shape, "--backward", "--config", f"bk={D},bv={D},split=0")
    assert p["launches"][0]["grid"][0] == 1


@pytest.mark.parametrize("shape, dtype, grids", [
    ("B=8,T=1024,H=16,K=128", "bf16", [[1, 128, 1]]),  # 128 heads: whole 128-column value blocks, chunk 64
    ("B=4,T=1024,H=16,K=128", "bf16", [[2, 64, 1]]),   # 64 heads: 64-column blocks (more programs)
    ("B=8,T=1024,H=16,K=128", "fp32", [[2, 128, 1]]),  # fp32 keeps 64-column blocks
    # 32 heads: segments of 256 rows, S's and z's states, each combined, then the segments' outputs
    ("B=2,T=1024,H=16,K=128", "bf16", [[1, 32, 4], [1, 32, 1], [1, 32, 4], [1, 32, 1], [1, 32, 4]]),
])
def test_normalized_forward_defaults(linac, shape, dtype, grids):
    # H200, B8 T4096 H16 D128 bf16: chunk 64 with 128-column blocks 0.536 ms vs 0.707 at chunk 32 with 64;
    # B2 T16384 H16: segments 0.743 ms vs one walk per sequence 1.452 (docs/ops/linear_attn.md, "Segments").
    p = plan(linac, "linear_attn", shape, "--normalize", "--dtype", dtype)
    assert [l["grid"] for l in p["launches"]] == grids, p["launches"]
    if len(grids) > 1:
        assert [l["kernel"] for l in p["launches"]] == ["linear_attn_segment_states", "segment_combine"] * 2 + [
            "linear_attn_normalized_fwd"], p["launches"]


def test_normalized_backward_takes_the_split_schedule(linac):
    # 32 heads, 16-bit, no gate: N's and D's backwards on the split schedule, D's chunk kernel adding its
    # dq and dk to N's (no walks); with a gate the walks carry both.
    kernels = [l["kernel"] for l in plan(linac, "linear_attn", "B=2,T=1024,H=16,K=128", "--normalize",
                                         "--backward")["launches"]]
    assert kernels.count("linear_attn_bwd_chunk") == 2 and "linear_attn_bwd_dq" not in kernels, kernels
    kernels = [l["kernel"] for l in plan(linac, "linear_attn", "B=2,T=1024,H=16,K=128", "--normalize", "--gated",
                                         "--backward")["launches"]]
    assert "linear_attn_bwd_chunk" not in kernels and "linear_attn_bwd_dq" in kernels, kernels


@pytest.mark.parametrize("shape, dtype, split", [
    ("B=2,T=16384,H=16,K=128", "bf16", True),   # 32 heads: 5.22 ms split vs 9.23 walks (H200)
    ("B=4,T=2048,H=16,K=128", "bf16", True),    # 64 heads: 1.17 vs 1.27
    ("B=8,T=4096,H=16,K=128", "bf16", False),   # 128 heads: walks 2.90 vs 4.28
    ("B=2,T=512,H=16,K=128", "bf16", False),    # short sequences keep the walks
    ("B=2,T=4096,H=16,K=128", "fp32", False),   # fp32: unmeasured, walks
    ("B=2,T=4096,H=16,K=256", "bf16", False),   # split takes head dims up to 128
])
def test_gla_backward_schedule_defaults(linac, shape, dtype, split):
    p = plan(linac, "gla", shape, "--backward", "--dtype", dtype)
    kernels = [l["kernel"] for l in p["launches"]]
    assert ("gla_bwd_inter" in kernels) == split, kernels
    assert ("gla_bwd_dkdv" in kernels or "gla_bwd_dv" in kernels) == (not split), kernels


@pytest.mark.parametrize("shape, options, split", [
    ("B=2,T=16384,H=16,K=128", [], True),              # 32 heads: 1.23 ms split vs 1.93 walks (H200)
    ("B=4,T=2048,H=16,K=128", [], False),              # 64 heads: the tuner decides
    ("B=2,T=512,H=16,K=128", [], False),               # short sequences keep the walks
    ("B=2,T=4096,H=16,K=128", ["--gated"], False),     # the split schedule is the plain form's
    ("B=2,T=4096,H=16,K=128", ["--dtype", "fp32"], False),
])
def test_linear_attn_backward_schedule_defaults(linac, shape, options, split):
    p = plan(linac, "linear_attn", shape, "--backward", *options)
    kernels = [l["kernel"] for l in p["launches"]]
    assert ("linear_attn_bwd_chunk" in kernels) == split, kernels


@pytest.mark.parametrize("op", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("shape, blocks", [
    ("B=2,T=1024,H=16,K=128", 4),   # 32 heads: 32-column walks on 4 warps (docs/ops/delta_rule.md, session 25)
    ("B=4,T=1024,H=16,K=128", 2),   # 64 heads: 64-column walks
    ("B=8,T=1024,H=16,K=128", 1),   # 128 heads: whole 128-column walks
])
def test_delta_walks_narrow_for_few_heads(linac, op, shape, blocks):
    for options in ([], ["--backward"]):
        p = plan(linac, op, shape, *options)
        walks = [l for l in p["launches"] if l["kernel"].endswith(("_fwd", "_bwd_states", "_bwd_dstates"))]
        assert walks and all(l["grid"][0] == blocks for l in walks), (options, p["launches"])


@pytest.mark.parametrize("op", ["delta_rule", "gated_delta_rule"])
def test_delta_backward_walks_take_32_columns_above_head_dim_128(linac, op):
    # At K = V = 256 the backward's state walks carry [256, 32] states on 4 warps, whatever the heads:
    # at 128 columns the gated reverse walk spilled 1296 bytes and ran 5.60 ms against 3.47 (H200, B8
    # T2048 H32, docs/ops/delta_rule.md, "Measured"). The forward's walk keeps its 128 columns.
    p = plan(linac, op, "B=8,T=256,H=32,K=256", "--backward")
    walks = [l for l in p["launches"] if l["kernel"].endswith(("_bwd_states", "_bwd_dstates"))]
    assert walks and all(l["grid"][0] == 8 for l in walks), p["launches"]
    p = plan(linac, op, "B=8,T=256,H=32,K=256")
    walks = [l for l in p["launches"] if l["kernel"].endswith("_fwd")]
    assert walks and all(l["grid"][0] == 2 for l in walks), p["launches"]


def test_plan_of_a_huge_call_allocates_nothing(linac):
    # Issue 23: `plan` made the call's random inputs to print sizes (killed by the OOM killer at 24 GB for
    # T = 2^27), and B*T*H*K overflowed into negative sizes. Shapes alone now, and an overflow-safe limit.
    import time
    t0 = time.time()
    proc = linac.run("plan", "linear_attn", "--shape", "B=1,T=134217728,H=1,K=16")
    assert proc.returncode != 0 and "tensors of 2^31 or more elements are not supported" in proc.stderr, proc.stderr
    proc = linac.run("plan", "linear_attn", "--shape", "B=1,T=2147483647,H=2147483647,K=16")
    assert proc.returncode != 0 and "tensors of 2^31 or more elements are not supported" in proc.stderr, proc.stderr
    assert time.time() - t0 < 5
    proc = linac.run("compile", "linear_attn", "--shape", "B=1,T=134217728,H=1,K=16", "--emit", "tir")
    assert proc.returncode != 0 and "2^31" in proc.stderr, proc.stderr
    # Just under the limit (2^30 elements per input, 2 GB each in bf16, more in fp32 on the host):
    # the plan's sizes, with no host tensor of the call's size behind them.
    p = plan(linac, "gla", "B=1,T=4194304,H=2,K=128", "--backward")
    assert p["device_bytes"] > 4194304 * 2 * 128 * 2 * 4
    assert time.time() - t0 < 10


def test_argument_mistakes(linac):
    # Issue 23, point 6: accepted without a word before.
    proc = linac.run("plan", "linear_attn", "--shape", "B=1,B=2,T=4,H=1,K=16")
    assert proc.returncode != 0 and "--shape: B given twice" in proc.stderr, proc.stderr
    for bad in ("nan", "inf", "-0.5", "0"):
        with pytest.raises(Exception, match="scale must be a finite positive number"):
            linac.run_op("linear_attn", {n: __import__("numpy").ones((1, 4, 1, 8), "float32") for n in "qkv"},
                         options=["--scale", bad])
    import numpy as np
    files = [f"{n}={linac.write(n, np.ones((1, 4, 1, 8), np.float32))}" for n in "qkv"]
    proc = linac.run("run", "linear_attn", *files, "-o", "o=x.npy", "-o", "final_state=./x.npy", "--device", "cpu")
    assert proc.returncode != 0 and "outputs 'final_state' and 'o' would both be written to" in proc.stderr, proc.stderr


def test_compile_l2norm_qk_selects_that_call(linac):
    # `compile --shape .. --l2norm-qk`: the kernels of a call normalizing q and k inside them (their
    # norms' rsqrt in the IR), as the default rule picks them for it; ops without the option, calls
    # without --shape and .tir files say so.
    args = ("compile", "gated_delta_rule", "--shape", "B=2,T=200,H=2,K=64", "--emit", "tir")
    proc = linac.run(*args, "--l2norm-qk")
    assert proc.returncode == 0 and "rsqrt" in proc.stdout, proc.stderr
    # The norms formed once per chunk by the UT kernel, which writes them as tables that the walk reads.
    kernels = {k.split("(")[0]: k for k in proc.stdout.split("kernel @")[1:]}
    assert set(kernels) == {"chunk_gate_sums", "gated_delta_rule_wy", "gated_delta_rule_fwd"}
    for name in ("gated_delta_rule_wy", "gated_delta_rule_fwd"):
        assert "%q_norms: tensor" in kernels[name] and "%k_norms: tensor" in kernels[name], name
    assert "rsqrt" in kernels["gated_delta_rule_wy"] and "store %q_norms" in kernels["gated_delta_rule_wy"]
    assert "rsqrt" not in kernels["gated_delta_rule_fwd"]
    # q's rows, read by the UT kernel for their norms alone, are copied asynchronously with its other
    # loads (waited for one block at a time they cost 0.04 ms of 0.72 at the bar shape, docs/ops/delta_rule.md).
    q_loads = [line for line in kernels["gated_delta_rule_wy"].splitlines() if "= load %q[" in line]
    assert q_loads and all("prefetch = true" in line for line in q_loads), q_loads
    proc = linac.run(*args)
    assert proc.returncode == 0 and "rsqrt" not in proc.stdout and "norms" not in proc.stdout, proc.stderr
    proc = linac.run("compile", "linear_attn", "--shape", "B=2,T=200,H=2,K=64", "--l2norm-qk")
    assert proc.returncode != 0 and "linear_attn does not take --l2norm-qk" in proc.stderr, proc.stderr
    proc = linac.run("compile", "delta_rule", "--l2norm-qk")
    assert proc.returncode != 0 and "need --shape" in proc.stderr, proc.stderr


def test_plan_and_bench_take_l2norm_qk(linac):
    # `plan`/`bench --l2norm-qk`: the call normalizing q and k inside the kernels (how its default rule's
    # exclusion gets timed); ops without the option refuse it as compile does.
    proc = linac.run("plan", "gated_delta_rule", "--shape", "B=2,T=200,H=2,K=64", "--l2norm-qk")
    assert proc.returncode == 0 and "launch gated_delta_rule_wy" in proc.stdout, proc.stderr
    for cmd in ("plan", "bench"):
        proc = linac.run(cmd, "linear_attn", "--shape", "B=2,T=200,H=2,K=64", "--l2norm-qk")
        assert proc.returncode != 0 and "linear_attn does not take --l2norm-qk" in proc.stderr, proc.stderr


def test_compile_states_selects_the_stateful_call(linac):
    # `compile --shape .. --states`: the kernels of a call with an initial state and the final state
    # asked for (how session 21 read the chunk-128 racecheck report's kernel); ops without states say so.
    proc = linac.run("compile", "linear_attn", "--shape", "B=2,T=200,H=2,K=64", "--gated", "--states", "--emit", "tir")
    assert proc.returncode == 0, proc.stderr
    assert "%initial_state: tensor<?x?x?x?xf32>" in proc.stdout and "store %final_state" in proc.stdout
    proc = linac.run("compile", "linear_attn", "--shape", "B=2,T=200,H=2,K=64", "--gated", "--emit", "tir")
    assert proc.returncode == 0 and "%initial_state" not in proc.stdout, proc.stderr
    proc = linac.run("compile", "gated_delta_rule", "--shape", "B=2,T=200,H=2,K=64", "--states", "--backward",
                     "--emit", "tir")
    assert proc.returncode == 0 and "%dinitial_state" in proc.stdout, proc.stderr
    proc = linac.run("compile", "poly", "--shape", "B=1,T=256,H=2,K=64", "--states")
    assert proc.returncode != 0 and "--states: poly takes no initial state" in proc.stderr, proc.stderr
    proc = linac.run("compile", "linear_attn", "--states")
    assert proc.returncode != 0 and "need --shape" in proc.stderr, proc.stderr


def test_compile_saving_selects_the_training_pairs_forward(linac):
    # `compile --shape .. --saving`: the forward that also saves the backward's tensors (the walk storing
    # the state before each chunk, h, and V_new), the kernel `linac bench --backward` times first in the
    # training pair, readable without a GPU; ops whose forward saves nothing, and --backward, refuse it.
    shape = ("--shape", "B=2,T=200,H=2,K=64")
    proc = linac.run("compile", "gated_delta_rule", *shape, "--saving", "--emit", "tir")
    assert proc.returncode == 0, proc.stderr
    assert "%h: tensor<?x?x?x?xbf16>" in proc.stdout and "store %v_new" in proc.stdout
    proc = linac.run("compile", "gated_delta_rule", *shape, "--emit", "tir")
    assert proc.returncode == 0 and "%v_new" not in proc.stdout, proc.stderr
    proc = linac.run("compile", "linear_attn", *shape, "--saving")
    assert proc.returncode != 0 and "--saving: linear_attn's forward saves nothing" in proc.stderr, proc.stderr
    proc = linac.run("compile", "delta_rule", *shape, "--saving", "--backward")
    assert proc.returncode != 0 and "--saving selects the forward" in proc.stderr, proc.stderr
    proc = linac.run("compile", "delta_rule", "--saving")
    assert proc.returncode != 0 and "need --shape" in proc.stderr, proc.stderr
