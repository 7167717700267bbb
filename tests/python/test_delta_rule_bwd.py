"""`linac run delta_rule|gated_delta_rule ... do=.. [dfinal_state=..] --backward` (token by token with
checkpoints) against the float64 forward reference (reference_delta.delta_rule): every gradient by
directional central differences (gradcheck.py) of L = sum(o do) + sum(S_T dfinal)."""
import numpy as np
import pytest

import gradcheck
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


def check(linac, op, x):
    grads = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "initial_state": "dinitial_state"}
    grads = {n: d for n, d in grads.items() if n in x}
    got = linac.run_op(op, x, outputs=list(grads.values()), options=["--backward"])
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
def test_bf16(linac, op):
    x = make_inputs(60 + OPS.index(op), op, B=1, T=30, H=2, K=16, V=16, init=True, dfinal=True)
    outs = ("dq", "dk", "dv", "dbeta")
    got = linac.run_op(op, x, outputs=outs, options=["--backward", "--dtype", "bf16"])
    ref = linac.run_op(op, {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()},
                       outputs=outs, options=["--backward"])
    for name in outs:
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


def test_l2norm_is_rejected(linac):
    x = make_inputs(70, "delta_rule", B=1, T=8, H=1, K=8, V=8)
    proc = linac.run("run", "delta_rule", *(f"{n}={linac.write(n, a)}" for n, a in x.items()), "-o", "dq=dq.npy",
                     "--backward", "--l2norm-qk", "--device", "cpu")
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--l2norm-qk" in lines[0], proc.stderr
