"""`linac tune OP --backward --list`: every candidate of every op's backward tuning space plans, runs on
the interpreter and gives the default configuration's gradients (fp32: the configurations change only
tiling, so the results agree to rounding). The GPU tuner additionally times them; this is what it may
pick from."""
import numpy as np
import pytest

import reference
import reference_delta

OPS = ["linear_attn", "gla", "delta_rule", "gated_delta_rule"]
B, T, H, K, V = 1, 70, 2, 32, 48


def candidates(linac, op):
    # linear_attn's inputs below carry its gate: list the gated call's space (the split schedule, plain
    # form only, is not in it; test_linear_attn_bwd checks that one).
    gated = ["--gated"] if op == "linear_attn" else []
    proc = linac.run("tune", op, "--shape", f"B={B},T={T},H={H},K={K},V={V}", "--dtype", "fp32", "--backward",
                     "--list", *gated)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines and lines[0] == "default", proc.stdout
    return lines


def inputs(op):
    rng = np.random.default_rng(OPS.index(op))
    x = {"q": rng.standard_normal((B, T, H, K)), "k": rng.standard_normal((B, T, H, K)),
         "v": rng.standard_normal((B, T, H, V)), "do": rng.standard_normal((B, T, H, V))}
    if op == "linear_attn":
        x["g"] = -np.logaddexp(0.0, -rng.standard_normal((B, T, H)) - 2.0)
    if op == "gla":
        x["g"] = -np.logaddexp(0.0, -rng.standard_normal((B, T, H, K)) - 2.0)
    if op in ("delta_rule", "gated_delta_rule"):
        x["k"] = reference_delta.l2normalize(x["k"])
        x["beta"] = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    if op == "gated_delta_rule":
        x["g"] = -np.logaddexp(0.0, -rng.standard_normal((B, T, H)) - 2.0)
    return {n: a.astype(np.float32) for n, a in x.items()}


@pytest.mark.parametrize("op", OPS)
def test_every_backward_candidate_agrees_with_the_default(linac, op):
    x = inputs(op)
    outs = ["dq", "dk", "dv"]
    base = linac.run_op(op, x, outputs=outs, options=["--backward"])
    for cand in candidates(linac, op)[1:]:
        got = linac.run_op(op, x, outputs=outs, options=["--backward", "--config", cand])
        for name in outs:
            err = reference.rel_err(got[name], base[name])
            assert err < 1e-5, f"{op} --config {cand}: {name} differs from the default by {err:.3g}"


def test_ops_without_a_backward_space_say_so(linac):
    proc = linac.run("tune", "poly", "--shape", "B=1,T=64,H=1,K=16", "--backward", "--list")
    assert proc.returncode == 1 and "no backward tuning space" in proc.stderr, proc.stderr


def test_few_heads_add_narrow_column_blocks(linac):
    """With few (batch, head) pairs every program walks every chunk of its head and most SMs idle: the
    linear_attn backward's space then offers 32-column blocks (four programs per head at D = 128)."""
    def listed(b, h):
        proc = linac.run("tune", "linear_attn", "--shape", f"B={b},T=4096,H={h},K=128", "--dtype", "bf16",
                         "--backward", "--list")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()
    narrow = {"bk=32,bv=32,chunk=64,warps=4", "bk=32,bv=32,chunk=32,warps=4"}
    assert narrow <= set(listed(2, 16))
    assert not narrow & set(listed(8, 16))
